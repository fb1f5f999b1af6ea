"""The second outside reviewer's attack (benchmarks/outside_attack_2.py) on a small made-up benchmark: `main` writes
every file, its accuracies are fractions, an answer-position cue planted in the data is found, flip pairs are the
twins whose answer differs; and the script stays independent of spatialvqa."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "benchmarks/outside_attack_2.py"
N_FAM, N_REAL, N_MIRROR, N_RESIZE = 20, 5, 10, 5   # families; the first N_REAL real; twins of the first few DIR.level
ATTACKERS = ["prior(subtask pos)", "heuristic-select", "text-LR(hash)", "GBM(hand feats)", "GBM+cf-flag",
             "atlas-rules(fixed)", "distractor-structure(fixed)", "stacker"]
ASK = "? Answer with the option's letter."


def _questions(f: int, rng) -> list[tuple[str, str, list[str]]]:
    "(task, subtask, question, options with the key first) of family f"
    vol, width = int(rng.integers(900, 2000)), int(rng.integers(60, 140))
    return [
        ("DIR", "DIR.level", "Which lies more superior, the left kidney or the right kidney" + ASK,
         ["The left kidney, by more than 10 mm", "The right kidney, by more than 10 mm",
          "The left kidney, by less than 10 mm", "The right kidney, by less than 10 mm"]),
        ("VOL", "VOL.value", "What is the volume of the liver" + ASK,
         [f"{vol} mL", f"{vol // 2} mL", f"{vol * 2} mL", f"{vol // 3} mL"]),
        ("DIST", "DIST.closest", "Which structure is closest to the liver" + ASK,
         list(rng.permutation(["gallbladder", "spleen", "urinary bladder", "left kidney"]))),
        ("EXT", "EXT.value", "What is the left-right width of the spleen" + ASK,
         [f"{width} mm", f"{width + 40} mm", f"{width - 30} mm", f"{width * 2} mm"]),
        ("COMP", "COMP.extreme", "Which of these structures is the largest" + ASK,
         list(rng.permutation(["liver", "spleen", "gallbladder", "left kidney"]))),
    ]


def _benchmark(path: Path) -> dict:
    """A validated.jsonl whose key is always option A (the planted cue), N_FAM families of 5 MC questions, a +mirror
    twin with the other side as its key for N_MIRROR DIR.level questions (flip pairs), a +resize twin with the same key
    for N_RESIZE (not flip pairs), and rows the attack skips (an open question, a VOLEST one). The expected counts."""
    rng = np.random.default_rng(0)
    rows = []

    def add(scan, source, task, subtask, question, options, pair_of=None, fmt="mc"):
        rows.append({"qid": f"q{len(rows):03d}", "scan_id": scan, "source": source, "task": task, "subtask": subtask,
                     "format": fmt, "question": question, "options": options, "answer_letter": "A",
                     "answer_text": options[0] if options else "", "pair_of": pair_of})
        return rows[-1]["qid"]

    for f in range(N_FAM):
        src = "openkbp" if f < N_REAL else "phantom"
        for task, subtask, question, options in _questions(f, rng):
            qid = add(f"fam{f:02d}~ct", src, task, subtask, question, options)
            if subtask == "DIR.level" and f < N_MIRROR:   # mirrored: the key is the other side
                add(f"fam{f:02d}~ct_mirror", src + "+mirror", task, subtask, question,
                    [options[1], options[0], options[3], options[2]], pair_of=qid)
            if subtask == "DIR.level" and N_MIRROR <= f < N_MIRROR + N_RESIZE:   # resized: the same key
                add(f"fam{f:02d}~ct_resize", src + "+resize", task, subtask, question, options, pair_of=qid)
    add("fam00~ct", "openkbp", "VOL", "VOL.value", "What is the volume of the liver?", [], fmt="open")
    add("fam00~ct", "openkbp", "VOLEST", "VOLEST.value", "What is the volume of the liver" + ASK, ["1 mL"] * 4)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mc = [r for r in rows if r["format"] == "mc" and r["task"] != "VOLEST"]
    assert len(mc) == N_FAM * 5 + N_MIRROR + N_RESIZE
    return {"n_questions": len(mc), "n_orig": N_FAM * 5, "n_flip_pairs": N_MIRROR, "n_families": N_FAM,
            "n_real": sum(r["source"].startswith("openkbp") for r in mc)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    oa = load_script(SCRIPT)
    tmp = tmp_path_factory.mktemp("outside_attack")
    expected = _benchmark(tmp / "validated.jsonl")
    summary = oa.main(tmp / "validated.jsonl", tmp / "out", n_repeats=1, verbose=False)
    return summary, tmp / "out", expected


def test_every_file_written_and_the_summary_is_what_main_returns(run):
    summary, out, expected = run
    assert sorted(p.name for p in out.iterdir()) == ["corr.npz", "qmeta.csv", "summary.json", "table.txt"]
    assert json.loads((out / "summary.json").read_text()) == summary
    assert {k: summary[k] for k in expected} == expected
    assert list(summary["attackers"]) == ATTACKERS and summary["n_repeats"] == 1
    corr = np.load(out / "corr.npz")
    assert sorted(corr.files) == sorted(ATTACKERS)
    for a in ATTACKERS:
        assert corr[a].shape == (1, expected["n_questions"])
        assert ((corr[a] >= 0) & (corr[a] <= 1)).all(), a
    q = pd.read_csv(out / "qmeta.csv")
    assert len(q) == expected["n_questions"] and set(q.cf) == {"orig", "mirror", "resize"}
    assert set(q.src) == {"openkbp", "phantom"}
    table = (out / "table.txt").read_text()
    assert f"flip pairs={expected['n_flip_pairs']}" in table and "real only per subtask" in table


def test_accuracies_are_fractions_and_the_planted_cue_is_found(run):
    summary = run[0]
    for a, s in summary["attackers"].items():
        cells = [s["all"], s["orig"], s["real"], s["flip_both"], *s["tasks"].values()]
        assert len(s["tasks"]) == 5
        for c in cells:
            assert 0 <= c["lo"] <= c["hi"] <= 1 and 0 <= c["acc"] <= 1, (a, c)
    prior = summary["attackers"]["prior(subtask pos)"]
    # the key is always A: the answer-position prior answers everything, flip pairs included
    assert prior["all"]["acc"] == pytest.approx(1) and prior["flip_both"]["acc"] == pytest.approx(1)
    assert prior["real"]["n"] == summary["n_real"] and prior["flip_both"]["n"] == summary["n_flip_pairs"]


def test_the_script_imports_nothing_from_spatialvqa():
    tree = ast.parse((ROOT / SCRIPT).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [m for m in names if m.split(".")[0] == "spatialvqa"], names
    calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert not [f for f in calls if getattr(f, "attr", getattr(f, "id", "")) in ("import_module", "__import__")]
