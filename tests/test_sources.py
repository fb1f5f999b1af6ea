"""Every record carries its dataset's `source`, from the converted manifest through measure into the questions,
including names of counterfactual copies such as `<source>+mirror`."""
import json

import pytest

from spatialvqa.convert.phantom import convert_phantom
from spatialvqa.core import write_json
from spatialvqa.measure import measure_manifests
from spatialvqa.phantom.cohort import make_cohort
from spatialvqa.questions.generate import RECORD_FIELDS, generate_questions
from spatialvqa.questions.tables import to_frame


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    d = tmp_path_factory.mktemp("sources")
    make_cohort(d / "cohort", n_subjects=4, seed=3, workers=2)
    recs = convert_phantom(d / "cohort", d / "scans")
    # two of the subjects stand in for a counterfactual copy of the cohort (another helper builds the real ones)
    for r in recs[2:]: r["source"] = "phantom+mirror"
    manifest = write_json(recs, d / "scans.json")
    return measure_manifests(manifest, workers=2)


def test_measure_tables_carry_source(measured):
    table, scans, rejected = measured
    assert rejected == []
    assert scans.set_index("scan_id").source.to_dict() == {
        "phantom_000": "phantom", "phantom_001": "phantom", "phantom_002": "phantom+mirror", "phantom_003": "phantom+mirror"}
    assert (table.source == table.scan_id.map(scans.set_index("scan_id").source)).all()


def test_questions_carry_source(measured):
    table, scans, _ = measured
    recs = generate_questions(table, seed=0, scans=scans)
    assert recs and "source" in RECORD_FIELDS
    src = scans.set_index("scan_id").source.to_dict()
    for r in recs:
        assert r["source"] == src[r["scan_id"]], r["qid"]
        assert {src[s] for s in r["scan_ids"]} == {r["source"]}     # cross-case questions pair one source's scans
    assert {r["source"] for r in recs} == {"phantom", "phantom+mirror"}
    # a cross-case question pairs two scans of one patient (a follow-up); none here has two, a copy is not a second scan
    assert not any(len(r["scan_ids"]) == 2 for r in recs)
    assert list(to_frame(recs).source.unique()) == ["phantom", "phantom+mirror"]
    json.dumps(recs)   # plain JSON values
