"""The closed radiologist review (spatialvqa.review and the `review` stage): synthetic filled reader sheets change
the benchmark exactly as the inclusion rule says, kappa per pair of readers matches scikit-learn, bad sheets fail
with a sentence naming the file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score

from spatialvqa import review as R
from spatialvqa.core import read_jsonl, write_jsonl
from spatialvqa.scoring import toy_records

ROOT = Path(__file__).resolve().parents[1]


def _fill(records, scores, path):
    df = R.reader_sheet(records)
    for k, c in enumerate(R.REVIEW_CRITERIA): df[c] = ["" if scores.get(q) is None else scores[q][k] for q in df["qid"]]
    df.to_csv(path, index=False)
    return str(path)


@pytest.fixture
def bench(tmp_path):
    recs = toy_records(n_scans=2, per_scan=4, numeric_per_scan=0)
    qs = [r["qid"] for r in recs]
    a = {qs[0]: (2, 2, 2), qs[1]: (0, 0, 1), qs[2]: (2, 1, 1), qs[3]: (1, 1, 1), qs[4]: (2, 2, 2), qs[5]: (1, 0, 0)}
    b = {qs[0]: (2, 1, 2), qs[1]: (0, 1, 0), qs[2]: (1, 1, 1), qs[3]: (1, 0, 1), qs[4]: (2, 2, 1), qs[5]: (1, 1, 0),
         qs[6]: (2, 2, 2)}
    c = {qs[0]: (2, 2, 2), qs[1]: (1, 0, 0), qs[6]: (0, 0, 0)}
    return recs, qs, [_fill(recs, a, tmp_path / "reader_a.csv"), _fill(recs, b, tmp_path / "reader_b.csv"),
                      _fill(recs, c, tmp_path / "reader_c.csv")]


def test_review_changes_the_benchmark(bench):
    recs, qs, sheets = bench
    scores = R.read_reader_sheets(sheets)
    kept, removed, summary = R.apply_review(recs, scores)
    # means over readers and criteria: q0 1.89, q1 0.33, q2 1.17, q3 0.83, q4 1.83, q5 0.5, q6 1.0 (not above 1.0)
    assert [r["qid"] for r in removed] == [qs[1], qs[3], qs[5], qs[6]]
    assert [r["qid"] for r in kept] == [qs[0], qs[2], qs[4], qs[7]]            # qs[7]: unrated, kept by default
    assert removed[-1]["reason"] == "radiologist review: mean score 1.00 <= 1.0"
    assert summary["rated"] == 7 and summary["included"] == 3
    assert [r["qid"] for r in R.apply_review(recs, scores, unrated="drop")[0]] == [qs[0], qs[2], qs[4]]
    k = R.pair_kappas(scores)
    assert sorted(set(zip(k.reader_a, k.reader_b))) == [("reader_a", "reader_b"), ("reader_a", "reader_c"), ("reader_b", "reader_c")]
    w = scores.pivot_table(index=["qid", "criterion"], columns="reader", values="score")
    ab = w[["reader_a", "reader_b"]].dropna()
    got = k[(k.reader_a == "reader_a") & (k.reader_b == "reader_b") & (k.criterion == "all")].iloc[0]
    assert got.n == 18 and got.kappa == pytest.approx(cohen_kappa_score(ab.reader_a, ab.reader_b, labels=[0, 1, 2]), abs=1e-4)


def test_bad_sheets(tmp_path, bench):
    recs, qs, sheets = bench
    df = pd.read_csv(sheets[0], dtype=str, keep_default_na=False)
    df.loc[2, "quantitative_consistency"] = "yes"
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    with pytest.raises(ValueError, match=r"bad.csv: quantitative_consistency of .* is 'yes'; scores are 0, 1 or 2"):
        R.read_reader_sheets([bad])
    pd.concat([df.iloc[:2], df.iloc[:1]]).to_csv(bad, index=False)
    with pytest.raises(ValueError, match="appears more than once"): R.read_reader_sheets([bad])


def test_review_stage(tmp_path, bench):
    "The stage notebook, run as DVC runs it, on the synthetic sheets: the reviewed benchmark loses what they reject."
    recs, qs, sheets = bench
    q = tmp_path / "validated.jsonl"
    write_jsonl(recs, q)
    cmd = [sys.executable, "-m", "papermill", "--kernel", "spatialvqa", "--cwd", str(ROOT), "--log-level", "WARNING",
           "--no-progress-bar", str(ROOT / "nbs/stages/review.ipynb"), str(tmp_path / "review.ipynb"),
           "-p", "questions", str(q), "-p", "sheets", ",".join(sheets), "-p", "out", str(tmp_path / "data"),
           "-p", "results", str(tmp_path / "results")]
    subprocess.run(cmd, check=True, capture_output=True)
    kept = read_jsonl(tmp_path / "data/reviewed.jsonl")
    assert [r["qid"] for r in kept] == [qs[0], qs[2], qs[4], qs[7]]
    assert [r["qid"] for r in read_jsonl(tmp_path / "data/removed.jsonl")] == [qs[1], qs[3], qs[5], qs[6]]
    summary = json.loads((tmp_path / "results/summary.json").read_text())
    assert summary["readers"] == ["reader_a", "reader_b", "reader_c"] and "reader_a|reader_b|all" in summary["kappa"]
    sheet = pd.read_csv(tmp_path / "results/reader_sheet.csv")
    assert list(sheet["qid"]) == qs and list(sheet.columns[-4:]) == [*R.REVIEW_CRITERIA, "comment"]
