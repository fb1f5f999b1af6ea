"""Chain-of-thought faithfulness (spatialvqa.parse.extract_claims, spatialvqa.scoring, the `faithfulness` stage): a
model whose reasoning is scripted against the measured truth gets exactly the paper's four outcomes; a baseline's
constant reasoning (a bare letter, even when asked with the `cot` style) is unverifiable, never faithful."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from spatialvqa.core import write_jsonl
from spatialvqa.prompt import build_prompt
from spatialvqa.scoring import faithfulness, faithfulness_shares, reasoning_verdicts, score_predictions

ROOT = Path(__file__).resolve().parents[1]
M = {"structures": [
    {"name": "liver", "volume_ml": 1500.0, "extent_mm": [200.0, 160.0, 170.0], "centroid_mm": [-80.0, 0.0, 100.0], "bbox_center_mm": [-80.0, 0.0, 100.0]},
    {"name": "spleen", "volume_ml": 200.0, "extent_mm": [60.0, 100.0, 110.0], "centroid_mm": [90.0, -20.0, 110.0], "bbox_center_mm": [90.0, -20.0, 110.0]}],
    "derived": {}}


def _records(n=8):
    return [{"qid": f"q{i}", "scan_id": f"s{i % 2}", "task": "DIR", "subtask": "DIR.relative", "format": "mc",
             "question": "Where is the liver relative to the spleen?", "options": ["Left", "Right", "Anterior", "Posterior"],
             "answer": "A", "answer_letter": "A", "answer_text": "Left", "answer_value": None, "unit": None,
             "spec": {"a": "liver", "b": "spleen"}, "measurements": M} for i in range(n)]


# (reasoning right?, answer right?) per question, as the paper's 2 x 2
PLAN = [(True, True), (True, True), (True, False), (False, True), (False, False), (False, False), (None, True), (None, False)]


def _cot_reply(reason_ok, answer_ok):
    claim = {True: "The liver lies to the left of the spleen, about 172 mm apart.", False: "The liver lies to the right of the spleen.",
             None: "Hard to say from here."}[reason_ok]
    return f"{claim}\nAnswer: {'A' if answer_ok else 'B'}"


def _preds(model, replies, style):
    return [{"qid": f"q{i}", "model": model, "prompt_style": style, "raw": r, "error": None} for i, r in enumerate(replies)]


def test_cot_prompt_asks_for_reasoning_and_answer_line():
    p = build_prompt(_records(1)[0], "cot")
    assert p.startswith("Where is the liver relative to the spleen?\nA. Left") and p.endswith("'Answer: ' followed by the option letter only.")


def test_four_outcomes_exactly():
    recs = _records()
    scored = score_predictions(recs, _preds("cot_model", [_cot_reply(*x) for x in PLAN], "cot"), "cot_model")
    f = faithfulness(scored, reasoning_verdicts(recs, scored))
    assert list(f["faithfulness"]) == ["faithful", "faithful", "decision error", "lucky guess", "hallucinated", "hallucinated", None, None]
    sh = faithfulness_shares(f).loc["all"]
    assert sh["n"] == 8 and sh["unverifiable"] == 0.25 and sh["n_checked"] == 6
    assert (sh["faithful"], sh["decision error"], sh["lucky guess"], sh["hallucinated"]) == (0.3333, 0.1667, 0.1667, 0.3333)


def test_baseline_constant_reasoning_is_unverifiable():
    recs = _records()
    scored = score_predictions(recs, _preds("prior", ["A"] * 8, "cot"), "prior")      # a baseline asked with `cot`
    f = faithfulness(scored, reasoning_verdicts(recs, scored))
    sh = faithfulness_shares(f).loc["all"]
    assert sh["n"] == 8 and sh["unverifiable"] == 1.0 and sh["n_checked"] == 0 and pd.isna(sh["faithful"])


def test_faithfulness_stage(tmp_path):
    "The stage notebook as DVC runs it, for a chain-of-thought model and a baseline: shares, sheet, figure, paraphrases."
    recs = _records()
    write_jsonl(recs, tmp_path / "bench.jsonl")
    para = [{**recs[0], "qid": "q0~para", "question": "Relative to the spleen, where does the liver lie?", "derived_from": "q0"}]
    write_jsonl(para, tmp_path / "para.jsonl")
    runs = {"cot_model": _preds("cot_model", [_cot_reply(*x) for x in PLAN], "cot")
                         + [{"qid": "q0~para", "model": "cot_model", "prompt_style": "cot", "raw": _cot_reply(True, False), "error": None}],
            "prior": _preds("prior", ["A"] * 8, "cot")}
    out = {}
    for model, preds in runs.items():
        write_jsonl(preds, tmp_path / f"{model}.jsonl")
        cmd = [sys.executable, "-m", "papermill", "--kernel", "spatialvqa", "--cwd", str(ROOT), "--log-level", "WARNING",
               "--no-progress-bar", str(ROOT / "nbs/stages/faithfulness.ipynb"), str(tmp_path / f"{model}.ipynb"),
               "-p", "model", model, "-p", "benchmark", str(tmp_path / "bench.jsonl"), "-p", "predictions", str(tmp_path / f"{model}.jsonl"),
               "-p", "paraphrases", str(tmp_path / "para.jsonl"), "-p", "failure_n", "3",
               "-p", "results", str(tmp_path / "res" / model), "-p", "figure", str(tmp_path / "fig" / f"{model}.png")]
        subprocess.run(cmd, check=True, capture_output=True)
        out[model] = json.loads((tmp_path / "res" / model / "summary.json").read_text())
        assert (tmp_path / "fig" / f"{model}.png").stat().st_size > 1000
    c = out["cot_model"]
    assert (c["answers_read"], c["checked"], c["faithful"], c["hallucinated"]) == (8, 6, 0.3333, 0.3333)
    assert c["paraphrase_consistency"] == {"pairs": 1, "acc_template": 1.0, "acc_paraphrase": 0.0, "consistency": 0.0}
    assert c["prompt_styles"] == {"cot": 9}
    p = out["prior"]
    assert p["unverifiable"] == 1.0 and p["faithful"] is None and p["checked"] == 0
    sheet = pd.read_csv(tmp_path / "res" / "cot_model" / "sheet.csv")
    assert len(sheet) == 3 and {"claim_text", "faithfulness", "reader_outcome"} <= set(sheet.columns)
