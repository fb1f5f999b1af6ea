"""CT-SpatialVQA scoring: the `ctsvqa-jury` / `ctsvqa-text` command contract, reproduction of the published
jury and text-metric figures from the release's own files, and the join by key that corrects the jury."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from spatialvqa.ctsvqa.jury import jury_accuracy
from spatialvqa.ctsvqa.metrics import exact_match, normalise_answer, text_metrics, wordnet_missing
from spatialvqa.ctsvqa.commands import add_cli
from spatialvqa.ctsvqa.release import ctsvqa_release, find_ctsvqa_release

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("m3d", "med3dvlm", "radfm")


@pytest.fixture(scope="module")
def release() -> dict:
    return ctsvqa_release(find_ctsvqa_release(ROOT))     # the fetched copy, else ../shared (an error names the path)


def run(argv: list[str]) -> int:
    "Run one of our subcommands through a parser that only has them (the lead's `spatialvqa` parser adds the same)."
    p = argparse.ArgumentParser(prog="spatialvqa")
    add_cli(p.add_subparsers(dest="command", required=True))
    a = p.parse_args(argv)
    return a.func(a)


def jury_cli(tmp_path: Path, preds, judges, align: str, name: str = "out.json") -> dict:
    out = tmp_path / name
    assert run(["ctsvqa-jury", "--predictions", str(preds), "--judgments", *map(str, judges),
                "--align", align, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- the jury ---------------------------------------------------------------------------------------------

def test_jury_published_alignment_reproduces_published(release, tmp_path):
    pub = {r["model"]: r for r in json.loads(release["published"]["llm_jury_accuracy"].read_text())}
    for m in MODELS:
        judges = list(release["judgments"][m].values())          # gemini2.5, gpt, qwen as upstream
        res = jury_cli(tmp_path, release["predictions"][m], judges, "published", f"{m}.json")
        assert set(res) == {"model", "count", "jury_accuracy", "misattributed"}
        assert res["model"] == m
        assert res["count"] == pub[m]["count"]
        assert abs(res["jury_accuracy"] - pub[m]["llm_jury_accuracy"]) < 1e-4
        assert isinstance(res["misattributed"], int)


def test_jury_key_alignment_on_release(release, tmp_path):
    got = {}
    for m in MODELS:
        judges = list(release["judgments"][m].values())
        pb = jury_cli(tmp_path, release["predictions"][m], judges, "published", f"{m}_p.json")
        ky = jury_cli(tmp_path, release["predictions"][m], judges, "key", f"{m}_k.json")
        assert ky["count"] == 9077 and ky["misattributed"] == 0
        got[m] = (pb["misattributed"], ky["jury_accuracy"] - pb["jury_accuracy"])
    # Gemini skipped 3 answers of M3D and Med3DVLM: every later row of its file is shifted against the others
    assert got["radfm"] == (0, 0.0)
    assert got["m3d"][0] > 1000 and got["med3dvlm"][0] > 1000
    assert got["m3d"][1] != 0 and got["med3dvlm"][1] != 0


def test_key_alignment_fixes_a_shifted_judge(tmp_path):
    # all judges: q1 right, q2 wrong, q3 right; judge 1 skipped q2, so by row position its verdict on q3 sits on q2
    preds = [dict(question=q, answer="A", prediction="P") for q in ("q1", "q2", "q3")]
    v = lambda q, ok: dict(question=q, answer="A", prediction="P", is_correct=ok)
    j1 = [v("q1", True), v("q3", True)]
    j2 = [v("q1", True), v("q2", False), v("q3", True)]
    j3 = [v("q1", True), v("q2", False), v("q3", True)]
    p = write_jsonl(tmp_path / "toy_predictions.jsonl", preds)
    files = [tmp_path / f"toy_{j}_eval.json" for j in ("gemini2.5", "gpt", "qwen")]
    for f, j in zip(files, (j1, j2, j3)): f.write_text(json.dumps(j))
    pub = jury_cli(tmp_path, p, files, "published", "pub.json")
    key = jury_cli(tmp_path, p, files, "key", "key.json")
    # positional: 2 rows (q3 dropped), row 2 = q3's verdict + q2's two verdicts = 1/3 -> wrong; 1 verdict misattributed
    assert pub == dict(model="toy", count=2, jury_accuracy=0.5, misattributed=1)
    # by key: q2 scored by the two judges that saw it (0/2), q1 and q3 by all three
    assert key == dict(model="toy", count=3, jury_accuracy=pytest.approx(2 / 3), misattributed=0)
    r = jury_accuracy(preds, [j1, j2, j3], "key")
    assert r.items["n_votes"].tolist() == [3, 2, 3] and r.items["average"].tolist() == [1.0, 0.0, 1.0]


def test_key_alignment_two_of_three_and_missing_verdicts():
    preds = [dict(question=f"q{i}", answer="A", prediction="P") for i in range(4)]
    v = lambda i, ok: dict(question=f"q{i}", answer="A", prediction="P", is_correct=ok)
    j1 = [v(0, True), v(1, True), v(2, None), v(3, False)]
    j2 = [v(0, True), v(1, False), v(2, True), v(3, None)]
    j3 = [v(0, False), v(1, False), v(2, True), v(3, None)]
    r = jury_accuracy(preds, [j1, j2, j3], "key")
    # q0 2/3 -> right; q1 1/3 -> wrong; q2 2/2 (no verdict left out) -> right; q3 0/1 -> wrong
    assert r.items["correct"].tolist() == [True, False, True, False]
    assert r.items["n_votes"].tolist() == [3, 3, 2, 1]
    # a question no judge gave a verdict on is not scored
    r2 = jury_accuracy(preds + [dict(question="q9", answer="A", prediction="P")], [j1, j2, j3], "key")
    assert (r2.count, r2.dropped) == (4, 1)


def test_jury_cli_errors_through_main(tmp_path):
    from spatialvqa import cli
    with pytest.raises(SystemExit) as e: cli.main(["ctsvqa-jury", "--help"])
    assert e.value.code == 0
    p = write_jsonl(tmp_path / "p.jsonl", [dict(question="q", answer="a", prediction="p")])
    bad = tmp_path / "j.json"; bad.write_text(json.dumps({"verdicts": []}))
    assert cli.main(["ctsvqa-jury", "--predictions", str(p), "--judgments", str(bad), "--out", str(tmp_path / "o.json")]) == 2
    assert not (tmp_path / "o.json").exists()


def test_console_script(release, tmp_path):
    exe = Path(sys.executable).with_name("spatialvqa")
    assert exe.exists(), f"{exe}: the spatialvqa console script is not installed (make setup)"
    h = subprocess.run([str(exe), "ctsvqa-jury", "--help"], capture_output=True, text=True)
    assert h.returncode == 0, h.stderr
    out = tmp_path / "radfm.json"
    r = subprocess.run([str(exe), "ctsvqa-jury", "--predictions", str(release["predictions"]["radfm"]), "--judgments",
                        *map(str, release["judgments"]["radfm"].values()), "--align", "published", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["count"] == 9077


# --- exact match and text metrics ----------------------------------------------------------------------

@pytest.mark.parametrize("text,norm", [
    ("  The LEFT lung.  ", "the left lung"),
    ("Right-sided; (posterior)!", "right sided posterior"),
    ("T12/L1\n level", "t12 l1 level"),
    ("5.2 cm", "5 2 cm"),
    ("", ""), (None, ""), ("...", ""),
])
def test_normalise_answer(text, norm):
    assert normalise_answer(text) == norm


def test_exact_match():
    assert exact_match(["Left.", " NO", "left lung", "Both lungs"], ["left", "no!", "Left", "both  lungs"]) == [True, True, False, True]
    with pytest.raises(ValueError): exact_match(["a"], [])


def test_text_cli_contract(tmp_path):
    p = write_jsonl(tmp_path / "toy_predictions_full.jsonl", [
        dict(question="Where?", answer="In the left lung.", prediction="left lung"),
        dict(question="Side?", answer="Right.", prediction="right"),
        dict(question="Empty?", answer="Yes.", prediction="  ")])
    out = tmp_path / "t.json"
    assert run(["ctsvqa-text", "--predictions", str(p), "--no-sbert", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert {"model", "count", "exact_match", "bleu", "rouge1_f", "rouge2_f", "rougeL_f", "meteor", "sbert_cosine"} <= set(res)
    assert (res["model"], res["count"], res["exact_match"]) == ("toy", 2, 0.5)   # the empty prediction is skipped
    assert res["sbert_cosine"] is None and res["missing"]["sbert_cosine"] == "not requested"
    assert 0 < res["rouge1_f"] <= 1
    assert (res["meteor"] is None) == ("meteor" in res.get("missing", {}))


def test_text_metrics_reproduce_published(release):
    "BLEU and ROUGE to 1e-3, METEOR to 1e-2 (when WordNet is installed) for the 3 models; SBERT in the slow test."
    pub = pd.read_csv(release["published"]["text_metrics_summary"]).set_index("model")
    meteor = wordnet_missing() is None
    for m in MODELS:
        rows = [json.loads(l) for l in release["predictions"][m].read_text().splitlines() if l.strip()]
        res = text_metrics([r["prediction"] for r in rows], [r["answer"] for r in rows], sbert=False, meteor=meteor)
        ref = pub.loc[f"{m}_full"]
        assert res["count"] == ref["count"]
        for k in ("bleu", "rouge1_f", "rouge2_f", "rougeL_f"): assert abs(res[k] - ref[k]) < 1e-3, (m, k)
        if meteor: assert abs(res["meteor"] - ref["meteor"]) < 1e-2, m
        else: assert "WordNet" in res["missing"]["meteor"]


@pytest.mark.slow
def test_text_cli_reproduces_published_with_sbert(release, tmp_path):
    "The full `ctsvqa-text` (SBERT over 9k pairs: about a minute per model on 2 cores)."
    from spatialvqa.embed import sbert_missing
    assert sbert_missing() is None, sbert_missing()
    pub = pd.read_csv(release["published"]["text_metrics_summary"]).set_index("model")
    for m in MODELS:
        out = tmp_path / f"{m}.json"
        assert run(["ctsvqa-text", "--predictions", str(release["predictions"][m]), "--out", str(out)]) == 0
        res = json.loads(out.read_text())
        ref = pub.loc[f"{m}_full"]
        assert res["count"] == ref["count"]
        for k, tol in (("bleu", 1e-3), ("rouge1_f", 1e-3), ("rouge2_f", 1e-3), ("rougeL_f", 1e-3), ("sbert_cosine", 1e-2)):
            assert abs(res[k] - ref[k]) < tol, (m, k)
        if res["meteor"] is not None: assert abs(res["meteor"] - ref["meteor"]) < 1e-2
