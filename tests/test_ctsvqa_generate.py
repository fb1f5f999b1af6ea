"""Report-grounded question generation (spatialvqa.ctsvqa): CT-RATE readers and download, phantom reports, the
rule-based generator, the category classifier and spatial filter against the published labels, and the LLM pipeline
against a local OpenAI-compatible server and a recorded cache. Offline; about 20 s.

Re-record tests/data/ctsvqa_llm_cache.jsonl after changing the prompts: `python tests/test_reports_generate.py --record`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from spatialvqa.ctsvqa import release as R_release, ctrate as R_ctrate, categories as R_categories, generate as R_generate, commands as R_commands
from spatialvqa.core import project_root, read_jsonl
from spatialvqa.scan import read_volume

ROOT = project_root(Path(__file__).parent)
CACHE = Path(__file__).parent / "data" / "ctsvqa_llm_cache.jsonl"


@pytest.fixture(scope="module")
def release() -> dict:
    "The CT-SpatialVQA release: the fetched copy, else the shared mirror ../shared (an error names the expected path)."
    return R_release.ctsvqa_release(R_release.find_ctsvqa_release(ROOT))


# ---------------------------------------------------------------- CT-RATE readers and download

META_CSV = ("VolumeName,Rows,XYSpacing,ZSpacing,RescaleSlope,RescaleIntercept,ImagePositionPatient,ImageOrientationPatient\n"
            'valid_7_a_1.nii.gz,512,"[0.7, 0.7]",2.0,1.0,-1024.0,"[-100.0, -120.0, -50.0]","[1, 0, 0, 0, 1, 0]"\n'
            'valid_7_a_2.nii.gz,512,"[0.5, 0.5]",1.0,2.0,-1000.0,"[10.0, 20.0, 30.0]","[-1, 0, 0, 0, -1, 0]"\n')


def _raw_nifti(path: Path, value: int = 1100) -> Path:
    "A raw CT-RATE-like volume: stored values, a meaningless unit header."
    a = np.full((5, 4, 3), value, np.int16)
    a[1, 2, 0] = value + 100
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(a, np.eye(4)), str(path))
    return path


@pytest.fixture
def hub(tmp_path, monkeypatch):
    "huggingface_hub.hf_hub_download replaced by a fake that serves a metadata CSV and raw volumes; records its calls."
    import huggingface_hub
    calls = []
    def fake(repo_id, filename, *, repo_type=None, revision=None, cache_dir=None, token=None, **kw):
        calls.append(dict(repo_id=repo_id, filename=filename, repo_type=repo_type, revision=revision, token=token))
        p = tmp_path / "hub" / filename
        if filename.endswith(".csv"): p.parent.mkdir(parents=True, exist_ok=True); p.write_text(META_CSV)
        elif "valid_7_a" in filename: _raw_nifti(p)
        else: raise FileNotFoundError(f"404 {filename}")
        return str(p)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_test_token")
    return calls


def test_ctrate_layout_and_readers(tmp_path):
    assert R_ctrate.ctrate_path("valid_1_a_1.nii.gz") == "dataset/valid/valid_1/valid_1_a/valid_1_a_1.nii.gz"
    assert R_ctrate.ctrate_path("train_10008_a_2.nii.gz", fixed=True) == "dataset/train_fixed/train_10008/train_10008_a/train_10008_a_2.nii.gz"
    with pytest.raises(ValueError, match="not a CT-RATE volume name"): R_ctrate.ctrate_path("phantom_001.nii.gz")
    (tmp_path / "m.csv").write_text(META_CSV)
    m = R_ctrate.read_ctrate_metadata(tmp_path / "m.csv")
    assert m["valid_7_a_2.nii.gz"]["orientation"] == (-1.0, 0.0, 0.0, 0.0, -1.0, 0.0) and m["valid_7_a_1.nii.gz"]["z_spacing"] == 2.0
    (tmp_path / "dup.csv").write_text(META_CSV + META_CSV.splitlines()[1] + "\n")
    with pytest.raises(ValueError, match="valid_7_a_1.nii.gz is listed twice"): R_ctrate.read_ctrate_metadata(tmp_path / "dup.csv")
    (tmp_path / "r.csv").write_text("VolumeName,ClinicalInformation_EN,Technique_EN,Findings_EN,Impressions_EN\n"
                                    'valid_7_a_1.nii.gz,,,"Nodule in the left lung.",Not given.\n')
    assert R_ctrate.read_ctrate_reports(tmp_path / "r.csv") == [dict(volume="valid_7_a_1.nii.gz", findings="Nodule in the left lung.",
                                                              impressions="", clinical_information="", technique="")]


def test_download_applies_metadata_through_hf_hub(tmp_path, hub):
    recs, rejected = R_ctrate.download_ctrate(["valid_7_a_1.nii.gz", "/x/valid_7_a_2.npy", "valid_9_b_1.nii.gz"], tmp_path / "ct")
    assert [c["filename"] for c in hub][0] == "dataset/metadata/validation_metadata.csv"
    assert {(c["repo_id"], c["repo_type"], c["token"]) for c in hub} == {("ibrahimhamamci/CT-RATE", "dataset", "hf_secret_test_token")}
    assert "dataset/valid/valid_7/valid_7_a/valid_7_a_2.nii.gz" in [c["filename"] for c in hub]
    assert [r["volume"] for r in rejected] == ["valid_9_b_1.nii.gz"]          # no metadata row: rejected, not guessed
    assert [(r["volume"], r["status"]) for r in recs] == [("valid_7_a_1.nii.gz", "fixed here"), ("valid_7_a_2.nii.gz", "fixed here")]
    assert "hf_secret_test_token" not in json.dumps(recs + rejected)
    v1, v2 = (read_volume(r["path"]) for r in recs)
    assert recs[0]["path"].endswith("dataset/valid_fixed/valid_7/valid_7_a/valid_7_a_1.nii.gz")
    # HU = raw * slope + intercept, int16
    assert np.asarray(v1.array).dtype == np.int16 and np.asarray(v1.array)[0, 0, 0] == 1100 - 1024 and np.asarray(v1.array)[1, 2, 0] == 176
    assert np.asarray(v2.array)[0, 0, 0] == 2 * 1100 - 1000
    # geometry: DICOM LPS from the metadata, read back in RAS+
    np.testing.assert_allclose(v1.affine, [[-0.7, 0, 0, 100], [0, -0.7, 0, 120], [0, 0, 2, -50], [0, 0, 0, 1]], atol=1e-5)
    np.testing.assert_allclose(v2.affine, [[0.5, 0, 0, -10], [0, 0.5, 0, -20], [0, 0, 1, 30], [0, 0, 0, 1]], atol=1e-5)
    again, _ = R_ctrate.download_ctrate(["valid_7_a_1.nii.gz"], tmp_path / "ct")
    # metadata + 2 volumes; nothing asked again
    assert again[0]["status"] == "present" and len(hub) == 3


def test_download_fixed_copies_and_needs_a_token(tmp_path, hub, monkeypatch):
    recs, rejected = R_ctrate.download_ctrate(["valid_7_a_1.nii.gz"], tmp_path / "ct", fixed=True)
    assert not rejected and recs[0]["status"] == "copied" and hub[-1]["filename"].startswith("dataset/valid_fixed/")
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(LookupError, match="set the environment variable HF_TOKEN"): R_ctrate.download_ctrate(["valid_7_a_2.nii.gz"], tmp_path / "other")


# ---------------------------------------------------------------- rule-based generation

def test_phantom_reports_give_back_every_tumour_location(tmp_path):
    subj = tmp_path / "phantom_000"; subj.mkdir()
    (subj / "report.txt").write_text("TECHNIQUE: CT.\n\nFINDINGS:\nLungs: A 12 mm solid nodule in the left upper lobe.\n"
                                     "Kidneys: There is a 2.1 cm hypodense lesion in the lower pole of the right kidney.\n"
                                     "Liver: No focal lesion.\n\nIMPRESSION:\n1. 12 mm nodule in the left upper lobe.\n")
    (subj / "truth.json").write_text(json.dumps({"subject_id": "phantom_000", "tumours": [
        {"name": "lung_tumor", "host": "lung_upper_lobe_left", "side": "left", "location": "left upper lobe"},
        {"name": "kidney_tumor", "host": "kidney_right", "side": "right", "location": "lower pole of the right kidney"}]}))
    folders = [tmp_path] + ([ROOT / "data/phantom"] if (ROOT / "data/phantom").is_dir() else [])
    for folder in folders:
        reps = R_generate.read_phantom_reports(folder)
        qa = R_generate.generate_rule_qa(reps)
        for rep in reps:
            answers = " | ".join(q["answer"].lower() for q in qa if q["volume"] == rep["volume"])
            for t in rep["tumours"]: assert t["location"].lower() in answers, (rep["volume"], t["location"], answers)
    qa = R_generate.generate_rule_qa(R_generate.read_phantom_reports(tmp_path))
    assert ("Which kidney contains the 2.1 cm hypodense lesion?", "The right kidney.") in [(q["question"], q["answer"]) for q in qa]
    assert not any("liver" in q["answer"].lower() for q in qa)                  # "No focal lesion" asks nothing


def test_rule_generator_is_deterministic_grounded_and_spatial(release):
    reps = R_release.read_ctsvqa_reports(release["reports"])[:300]
    a, b = R_generate.generate_rule_qa(reps), R_generate.generate_rule_qa(reps)
    assert a == b and len(a) > 1000
    assert len({r["qid"] for r in a}) == len(a) and all(r["qid"] == f"{r['volume']}::rule-{r['index']}" for r in a)
    per = {}
    for r in a: per[r["volume"]] = per.get(r["volume"], 0) + 1
    assert max(per.values()) <= 10
    for r in a:
        assert r["categories"] == R_categories.classify_categories(r["question"], r["answer"])
        # the report's own span
        if r["template"] == "where": assert r["answer"][3:-1].lower() in r["evidence"].lower(), r
    assert np.mean([r["spatial"] for r in a]) > 0.95
    # no question is asked twice in a report with different answers
    seen = {}
    for r in a: assert seen.setdefault((r["volume"], r["question"].lower()), r["answer"]) == r["answer"]


def test_negated_and_normal_sentences_ask_nothing():
    for s in ("No mass was detected in both lungs.", "Pleural and pericardial effusion was not detected.",
              "No enlarged lymph nodes in prevascular, pre-paratracheal, subcarinal or bilateral hilar-axillary pathological dimensions were detected.",
              "Trachea and both main bronchi are open."):
        assert R_generate.extract_facts(s) == [], s


# ---------------------------------------------------------------- classifier and filter against the published labels

def test_classifier_and_filter_against_published_labels(release):
    qs = R_release.read_ctsvqa_questions(release["questions"], release["categories"], release["cases"])
    test = [q for q in qs if R_categories.heldout(q["volume"])]
    s = R_categories.multilabel_scores([q["categories"] for q in test], [R_categories.classify_categories(q["question"], q["answer"]) for q in test]).set_index("label")
    assert s.loc["macro", "f1"] > 0.8 and s.loc["Laterality & Bilateral Symmetry", "f1"] > 0.95
    rel = release
    raw = R_release.published_filter_labels(R_release.read_ctsvqa_raw(rel["root"] / "qa/spatial_qa_output_full.json"), qs)
    assert (len(raw), sum(r["kept"] for r in raw)) == (14744, 9077)
    held = [r for r in raw if R_categories.heldout(r["volume"])]
    b = R_categories.binary_scores([r["kept"] for r in held], [R_categories.is_spatial(r["question"]) for r in held])
    assert b["f1"] > 0.88 and b["kappa"] > 0.7


# ---------------------------------------------------------------- LLM pipeline

REPORT = dict(volume="valid_7_a_1.nii.gz", findings="A 6 mm nodule is observed in the right lung lower lobe. "
              "Bilateral pleural effusion, more prominent on the left.", impressions="Right lower lobe nodule.")


def fake_reply(body: dict) -> str:
    "What a well-behaved but imperfect model answers: fenced JSON with a trailing comma; a judge that skips pair 3."
    user = body["messages"][-1]["content"]
    if "Label every pair" in user:
        n = user.count("\n   A: ")
        return json.dumps([{"index": i, "is_spatial": i != 2, "is_relevant": True} for i in range(1, n + 1) if i != 3])
    return ('```json\n[{"question": "Which lung contains the nodule?", "answer": "The right lung."},\n'
            ' {"question": "Is there a pleural effusion?", "answer": "Yes."},\n'
            ' {"question": "On which side is the effusion more prominent?", "answer": "On the left."},]\n```')


def run_pipeline(llm):
    gen, rej = R_generate.llm_generate_qa([REPORT], llm)
    judged, rej2 = R_generate.llm_judge_qa(gen, [REPORT], llm)
    return judged, rej + rej2


def check(judged, rejected):
    assert [r["qid"] for r in judged] == [f"valid_7_a_1.nii.gz::llm-{i}" for i in range(3)]
    assert [(r["judge_spatial"], r["judge_relevant"]) for r in judged] == [(True, True), (False, True), (None, None)]
    assert [R_generate.judge_keeps(r) for r in judged] == [True, False, False]
    assert [r["spatial"] for r in judged] == [True, False, True]                  # our own filter, for comparison
    assert len(rejected) == 1 and rejected[0]["step"] == "judge" and "missing [3]" in rejected[0]["reason"]


def test_llm_pipeline_against_a_local_server_then_replay(tmp_path):
    from spatialvqa.llm.openai import FakeOpenAIServer
    from spatialvqa.llm.registry import make_llm
    cache = tmp_path / "llm_cache" / "qa.jsonl"
    with FakeOpenAIServer(reply=fake_reply) as srv:
        live = make_llm({"backend": "openai", "model": "fake-qa", "base_url": srv.base_url, "cache": str(cache)})
        out = run_pipeline(live)
        assert len(srv.requests) == 2 and srv.requests[0]["body"]["response_format"] == {"type": "json_object"}
        assert srv.requests[0]["body"]["temperature"] == 0.2 and srv.requests[1]["body"]["temperature"] == 0.0
    check(*out)
    assert run_pipeline(make_llm(f"replay:{cache}")) == out                    # the server is gone: the cache answers


def test_llm_pipeline_from_recorded_responses():
    from spatialvqa.llm.registry import make_llm
    check(*run_pipeline(make_llm({"backend": "replay", "cache": str(CACHE)})))


def test_judge_join_is_by_index_not_position():
    class Judge:
        name = "scripted"
        def __init__(self, text): self.text = text
        def generate(self, prompts, **kw): return [self.text] * len(prompts)
    recs = [dict(qid=f"v::llm-{i}", volume="v", question=f"Q{i}", answer="A") for i in range(3)]
    rep = [dict(volume="v", findings="F", impressions="")]
    # out of order, one duplicated with another label, one out of range: only the unambiguous label is used
    out, rej = R_generate.llm_judge_qa(recs, rep, Judge('[{"index": 3, "is_spatial": true, "is_relevant": true}, '
                                               '{"index": 1, "is_spatial": true, "is_relevant": false}, '
                                               '{"index": 1, "is_spatial": false, "is_relevant": false}, {"index": 9}]'))
    assert [(r["judge_spatial"], r["judge_relevant"]) for r in out] == [(None, None), (None, None), (True, True)]
    assert "duplicated [1]" in rej[0]["reason"] and "out of range [9]" in rej[0]["reason"]
    out, rej = R_generate.llm_judge_qa(recs, rep, Judge("Sorry, I can't do that."))
    assert all(r["judge_spatial"] is None for r in out) and rej[0]["step"] == "judge"


def test_cli_report_qa(tmp_path):
    import argparse
    p = argparse.ArgumentParser(); R_commands.add_cli(p.add_subparsers())
    (tmp_path / "r.csv").write_text("VolumeName,ClinicalInformation_EN,Technique_EN,Findings_EN,Impressions_EN\n"
                                    'valid_7_a_1.nii.gz,,,"A 6 mm nodule is observed in the right lung lower lobe.",\n')
    args = p.parse_args(["report-qa", "--reports", str(tmp_path / "r.csv"), "--out", str(tmp_path / "q.jsonl")])
    assert args.func(args) == 0
    assert ("Which lung contains the 6 mm nodule?", "The right lung.") in [(r["question"], r["answer"]) for r in read_jsonl(tmp_path / "q.jsonl")]


def _record():
    "Re-record the cache of recorded responses with the fake server."
    from spatialvqa.llm.openai import FakeOpenAIServer
    from spatialvqa.llm.registry import make_llm
    CACHE.unlink(missing_ok=True)
    with FakeOpenAIServer(reply=fake_reply) as srv:
        run_pipeline(make_llm({"backend": "openai", "model": "fake-qa", "base_url": srv.base_url, "cache": str(CACHE), "cache_mode": "record"}))
    print(f"recorded {len(read_jsonl(CACHE))} responses in {CACHE}")


if __name__ == "__main__" and "--record" in sys.argv: _record()
