"""How much of a task's kept count is the generator's and how much the draw's: the generate stage's questions (its
params, the measure stage's tables) drawn at several generator seeds, each validated as the validate stage does, with
the kept questions per task, the real originals and the real patients printed per seed, then their mean, min and max.
With `--compare`, each seed is also paired the earlier way (`pair_questions`, the letters as the generator set them)
beside `balance_pairs` (the letters chosen with the twins in view), so that the two are measured on the same draw.

    python benchmarks/draw_spread.py [--seeds 0,1,2] [--compare] [--out results.csv]

Needs the measure stage's outputs (`dvc repro measure`). About 4 min per seed and pairing on this 2-core machine.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("SPATIALVQA_PROGRESS", "0")
os.environ.setdefault("SPATIALVQA_LOG", "WARNING")

import pandas as pd

from spatialvqa.core import load_params
from spatialvqa.counterfactual import (flip_predicates, ladder_steps, pair_focus, pair_questions, scan_family,
                                      split_copies)
from spatialvqa.letters import balance_pairs
from spatialvqa.questions.core import TASKS, Margins
from spatialvqa.questions.generate import generate_questions, parse_budget, parse_per_source
from spatialvqa.questions.policy import policy_from_params
from spatialvqa.validate.chance import is_real
from spatialvqa.validate.pipeline import ValidateConfig, validate


def draw(table_all: pd.DataFrame, scan_all: pd.DataFrame, g: dict, seed: int, balanced: bool) -> list[dict]:
    "The generate stage's records (originals, each followed by its twins) at generator `seed`."
    table, scan_table, copy_table, copy_scans = split_copies(table_all, scan_all)
    mv = int(g["min_voxels"])
    orig = generate_questions(table, seed=seed, per_scan=parse_budget(g["per_scan"]), scans=scan_table,
                              tumour_share=float(g["tumour_share"]), min_voxels=mv,
                              per_source=parse_per_source(g["per_source"]),
                              focus=pair_focus(copy_scans, table), focus_share=float(g["focus_share"]),
                              accept=flip_predicates(table_all, scan_all, mv), accept_share=float(g["flip_share"]),
                              margins=Margins.from_dict(g.get("margins")), steps=ladder_steps(copy_scans),
                              policy=policy_from_params(g), alternatives=balanced)
    if balanced: orig, twins, _ = balance_pairs(orig, copy_table, copy_scans, originals=table, min_voxels=mv, seed=seed)
    else: twins, _ = pair_questions(orig, copy_table, copy_scans, originals=table, min_voxels=mv)
    by = {}
    for t in twins: by.setdefault(t["pair_of"], []).append(t)
    return [x for r in orig for x in (r, *by.get(r["qid"], []))]


def row(kept: list[dict], seed: int, pairing: str, seconds: float) -> dict:
    orig = [r for r in kept if not r.get("pair_of")]
    real = [r for r in orig if is_real(r)]
    return {"seed": seed, "pairing": pairing, **{t: sum(r["task"] == t for r in kept) for t in TASKS},
            "kept": len(kept),
            "real_share": round(len(real) / max(1, len(orig)), 3), "real_patients": len({scan_family(r) for r in real}),
            "seconds": round(seconds)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2", help="generator seeds, comma-separated")
    ap.add_argument("--compare", action="store_true", help="also pair each seed the earlier way (pair_questions)")
    ap.add_argument("--structures", default="results/measure/structures.parquet")
    ap.add_argument("--scans", default="results/measure/scans.parquet")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default=None, help="also write the table as CSV here")
    a = ap.parse_args()
    missing = [f for f in (a.structures, a.scans, a.params) if not os.path.exists(f)]
    if missing: raise SystemExit(f"draw_spread: {', '.join(missing)} not found: run it from the project's root after "
                                 "`dvc repro measure`, or pass --structures, --scans and --params")
    g, v = load_params("generate", a.params), load_params("validate", a.params)
    config = ValidateConfig.from_params({k: x for k, x in v.items() if k in ValidateConfig.param_names()}, audit="")
    table_all, scan_all = pd.read_parquet(a.structures), pd.read_parquet(a.scans)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    rows = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        for balanced in ([True, False] if a.compare else [True]):
            t = time.perf_counter()
            recs = draw(table_all, scan_all, g, seed, balanced)
            val = validate(recs, table_all, scan_all, config, protect=is_real)
            rows.append(row(val.kept, seed, "balance_pairs" if balanced else "pair_questions", time.perf_counter() - t))
            print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    df = pd.DataFrame(rows)
    cols = [*TASKS, "kept", "real_share", "real_patients"]
    print("\nper pairing over the seeds:")
    print(df.groupby("pairing")[cols].agg(["mean", "min", "max"]).T.round(3).to_string())
    if a.out: df.to_csv(a.out, index=False)
