"""Real OpenKBP patients end to end (issue 21): converted, measured and asked with the pipeline's own parameters, no
question names a radiotherapy target (PTV) although the label maps keep them, and every question about a side keeps the
patient's own left and right (the converter's axis convention, checked here on the questions themselves)."""
import shutil

import pytest

from spatialvqa.anatomy import TARGETS
from spatialvqa.convert.openkbp import convert_openkbp
from spatialvqa.core import load_params, shared_data, write_json
from spatialvqa.measure import measure_manifests
from spatialvqa.questions.core import Margins
from spatialvqa.questions.policy import policy_from_params
from spatialvqa.validate.filters import structure_problems
from spatialvqa.questions.generate import generate_questions, parse_budget, parse_per_source

PATIENTS = ("pt_242", "pt_243", "pt_245", "pt_246", "pt_247", "pt_248")   # of test-pats, all holding PTVs


@pytest.fixture(scope="module")
def asked(tmp_path_factory):
    src = shared_data("real-ct", "openkbp")
    d = tmp_path_factory.mktemp("openkbp")
    for p in PATIENTS:   # a split folder holding just these patients
        shutil.copytree(src / "provided-data" / "test-pats" / p, d / "test-pats" / p)
    recs = convert_openkbp(d / "test-pats", d / "scans", workers=0)
    table, scans, rejected = measure_manifests(write_json(recs, d / "scans.json"), workers=0)
    p = load_params("generate")
    qs = generate_questions(table, seed=0, scans=scans, per_scan=parse_budget(p["per_scan"]),
                            per_source=parse_per_source(p["per_source"]), min_voxels=int(p["min_voxels"]),
                            margins=Margins.from_dict(p.get("margins")), policy=policy_from_params(p))
    return recs, table, rejected, qs


def test_ptvs_stay_labels_and_are_never_asked(asked):
    recs, table, rejected, qs = asked
    assert rejected == []
    targets = set(TARGETS.values())
    # the label maps keep the targets (every one of the six patients has them) ...
    assert table.scan_id[table.name.isin(targets)].nunique() == len(PATIENTS)
    # ... and no question, option or measurement names one
    assert len(qs) > 30   # 35: no DIST here since DIST asks edge to edge from a lesion (generate.edge_distances)
    for q in qs:
        names = {m["name"] for m in (q.get("measurements") or {}).get("structures") or []}
        assert not names & targets, q["qid"]
        assert "ptv" not in q["question"].lower() and "target volume" not in q["question"].lower(), q["qid"]
        assert not any("target volume" in str(o).lower() for o in q.get("options") or []), q["qid"]


def test_left_structures_lie_left_in_world_space(asked):
    # RAS+: x grows toward the patient's right, so a right structure's centroid has the larger x, on the converted label maps of every patient
    _, table, _, _ = asked
    pairs = 0
    for sid, sub in table.set_index("name").groupby("scan_id"):
        for left, right in (("parotid_gland_left", "parotid_gland_right"),):
            if left in sub.index and right in sub.index:
                # parotids lie ~10 cm apart
                assert sub.loc[right, "centroid_x"] > sub.loc[left, "centroid_x"] + 40, sid
                pairs += 1
    assert pairs >= 5


@pytest.mark.parametrize("split,patient,slivers", [
    ("validation-pats", "pt_214", ["parotid_gland_right"]),
    ("test-pats", "pt_322", ["parotid_gland_left", "parotid_gland_right"])])
def test_parotid_slivers_are_implausible(tmp_path, split, patient, slivers):
    """A blinded reader's case: pt_214's right parotid is an 82-voxel sliver (no left parotid contoured), pt_322's two
    are 5.2-5.3 mL rims; the parotid's plausible floor (6.5 mL: half the smallest of 140 expert contours in the
    two-reader set) drops every question about them at the validate stage's plausibility filter."""
    shutil.copytree(shared_data("real-ct", "openkbp") / "provided-data" / split / patient, tmp_path / split / patient)
    recs = convert_openkbp(tmp_path / split, tmp_path / "scans", workers=0)
    table, scans, rejected = measure_manifests(write_json(recs, tmp_path / "scans.json"), workers=0)
    assert rejected == []
    probs = structure_problems(table, scans, border=False)
    sid = f"openkbp_{patient}"
    for n in slivers:
        assert table.set_index("name").loc[n, "volume_ml"] < 6.0
        assert probs[(sid, n)].startswith("volume"), probs
