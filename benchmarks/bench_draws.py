"""The `draws` stage's seeded baselines: `results.draws.seed_draws` (one read of the benchmark, answers in memory, each
distinct answer scored once) beside `results.draws.seed_draws_by_infer` (the previous implementation: every seed a real
`infer` run into a prediction file, scored from the file), per model, on the same benchmark and seeds. Checks that
the two give identical values and prints seconds per model side by side.

    python benchmarks/bench_draws.py [--benchmark data/benchmark/validated.jsonl] [--n 3] [--models random,prior,...]
    [--only new]   # time the new implementation alone (e.g. at the stage's n=100)
    [--workers 2]  # the new implementation with its processes, all models in one call (as the stage runs it)
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("SPATIALVQA_PROGRESS", "0")
os.environ.setdefault("SPATIALVQA_LOG", "WARNING")

import pandas as pd

from spatialvqa.core import load_params
from spatialvqa.results.draws import seed_draws, seed_draws_by_infer

DRAWS = "random,prior,blind_text,atlas,atlas_loso,atlas_subject,atlas_3subjects,textbook,name_cue"

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--benchmark", default="data/benchmark/validated.jsonl")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--models", default=DRAWS)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--only", choices=("new", "both"), default="both")
    ap.add_argument("--workers", type=int, default=1, help="processes of seed_draws (all models at once when > 1)")
    a = ap.parse_args()
    entries = load_params("infer", a.params)["models"]
    print(f"{a.benchmark}, n={a.n} seeds per model, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':<16} {'by infer (s)':>13} {'seed_draws (s)':>15}  identical")
    tot = [0.0, 0.0]
    if a.workers > 1:             # the stage's way: every model's seeds shared among the processes, in one call
        t = time.perf_counter(); seed_draws(a.benchmark, {m: entries[m] for m in a.models.split(",")}, a.n, workers=a.workers)
        print(f"{'all, ' + str(a.workers) + ' workers':<16} {'-':>13} {time.perf_counter() - t:15.2f}   (load average now {os.getloadavg()[0]:.1f})")
        raise SystemExit(0)
    for m in a.models.split(","):
        t = time.perf_counter(); new = seed_draws(a.benchmark, {m: entries[m]}, a.n); t_new = time.perf_counter() - t
        if a.only == "new":
            print(f"{m:<16} {'-':>13} {t_new:15.2f}"); tot[1] += t_new; continue
        t = time.perf_counter(); old = seed_draws_by_infer(a.benchmark, {m: entries[m]}, a.n); t_old = time.perf_counter() - t
        pd.testing.assert_frame_equal(new, old)
        tot[0] += t_old; tot[1] += t_new
        print(f"{m:<16} {t_old:13.2f} {t_new:15.2f}  yes")
    print(f"{'all':<16} {tot[0]:13.2f} {tot[1]:15.2f}   (load average now {os.getloadavg()[0]:.1f})")
