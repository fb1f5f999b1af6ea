"""Blind answerers the triviality filter never used, run against the validated Track A benchmark.

    .venv/bin/python benchmarks/blind_attacks.py [--benchmark data/benchmark/validated.jsonl] [--seeds 20]

The filter holds eight blind answerers at chance (`validate.answerers`), among them a leave-one-scan-out atlas (the
median of all other scans), a 2-fold atlas, one other patient and the median of 3 other patients drawn per question
(`atlas_subject`, `atlas_3subjects`) and a text classifier on 2 folds. An answerer of the same kind in another form
could still find what the filter left. This script attacks the kept multiple-choice questions with:
- the atlas (median anatomy of the training scans) cross-fitted on 3 and on 5 folds of the scan families;
- the text classifier (question and options only) cross-fitted on 3 and on 5 folds;
- the median of k other patients, k = 2, 5, 10 (`validate.SubjectAtlasAnswerer`): for each question, groups of k
  original scans among those outside its family that know its structures (64 groups drawn), between the filter's
  one patient, its median of 3 and its median of all;
- for reference, the filter's own one patient and median of 3 (not unused attackers).
Each question counts by the answerer's expected rightness (ties and undecided questions as 1/m; drawn patients by
the share of groups that answer right; the others averaged over `--seeds` splits, seeds from 10 up, never
the filter's 0-7), and the script prints the MCA AVG and per-task accuracy with 95% intervals from a bootstrap over
scan families (2,000 replicates). Patients are taken from `--pool` (every generated question), so that each knows
every structure asked about it.
"""
from __future__ import annotations

import argparse
import collections

import numpy as np

from spatialvqa.core import read_records
from spatialvqa.counterfactual import scan_family
from spatialvqa.results import TABLE2_TASKS, task_matrix
from spatialvqa.stats import bootstrap_means
from spatialvqa.validate import AtlasAnswerer, SubjectAtlasAnswerer, TextAnswerer, cross_fit_answerers, expected_right, predictions


def line(name: str, records, right: dict) -> tuple[str, int, int]:
    """One table row (MCA AVG and the Table 2 tasks, 95% scan-family bootstrap intervals), and how many of its
    intervals miss chance (exact bounds, before rounding) out of how many."""
    vals = task_matrix([r["task"] for r in records], [right[r["qid"]] for r in records])
    est, reps = bootstrap_means(vals, [scan_family(r["scan_id"]) for r in records], 2000, 0)
    lo, hi = np.nanquantile(reps, [0.025, 0.975], axis=0)
    alo, ahi = np.quantile(np.nanmean(reps, axis=1), [0.025, 0.975])
    bounds = [(alo, ahi), *zip(lo, hi)]
    miss = lambda l, h: "" if l <= 0.25 <= h else " (misses chance)"
    cells = " | ".join(f"{100 * e:.1f} [{100 * l:.1f}, {100 * h:.1f}]{miss(l, h)}" for e, l, h in zip(est, lo, hi))
    row = f"| {name} | {100 * np.nanmean(est):.1f} [{100 * alo:.1f}, {100 * ahi:.1f}]{miss(alo, ahi)} | {cells} |"
    return row, sum(bool(miss(l, h)) for l, h in bounds), len(bounds)


def cross_fitted(records, make, folds: int, seeds) -> dict:
    right = collections.defaultdict(float)
    for s in seeds:
        a = make(s)
        got = cross_fit_answerers(records, [a], folds=folds, seed=s)
        for r in records: right[r["qid"]] += expected_right(r, got[r["qid"]][a.name]) / len(seeds)
    return right


def patients(records, pool, k: int) -> dict:
    """How often the median of k other patients answers right (`validate.SubjectAtlasAnswerer`: groups of k original
    scans outside the question's family that know its structures, all of them or 64 drawn; ties as 1/m), its
    patients taken from `pool`."""
    a = SubjectAtlasAnswerer(k=k).fit(pool)
    return {r["qid"]: expected_right(r, predictions(a, [r])[0]) for r in records}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--benchmark", default="data/benchmark/validated.jsonl")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--pool", default="data/benchmark/questions.jsonl",
                   help="the generated questions whose measurements make the patients (every structure asked about)")
    a = p.parse_args(argv)
    everything = read_records(a.benchmark)
    mc = [r for r in everything if r["format"] == "mc"]
    seeds = range(10, 10 + a.seeds)
    print(f"{len(mc)} multiple-choice questions; chance 25.0\n")
    print("| attacker | MCA AVG | " + " | ".join(TABLE2_TASKS) + " |")
    print("|---|---|" + "---|" * len(TABLE2_TASKS))
    pool = read_records(a.pool)
    rows = [*((f"{what}, {folds}-fold (mean of {a.seeds} splits)", lambda folds=folds, make=make: cross_fitted(mc, make, folds, seeds))
              for folds in (3, 5) for what, make in (("atlas", lambda s: AtlasAnswerer(seed=s)),
                                                     ("text classifier", lambda s: TextAnswerer(seed=s)))),
            *((f"median of {k} other patients (64 groups drawn)", lambda k=k: patients(mc, pool, k)) for k in (2, 5, 10))]
    reference = [(f"{name} (the filter's own, for reference)", lambda k=k: patients(mc, pool, k))
                 for k, name in ((1, "one other patient"), (3, "median of 3 other patients"))]
    missed = total = 0
    for i, (name, right) in enumerate(rows + reference):
        row, m, n = line(name, mc, right())
        print(row, flush=True)
        if i < len(rows): missed, total = missed + m, total + n
    print(f"\nattackers the filter never used: {missed} of {total} intervals miss chance (exact bounds)")


if __name__ == "__main__":
    main()
