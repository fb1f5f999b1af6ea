"""Blind answerers the triviality filter never used, run against the validated Track A benchmark.

    .venv/bin/python benchmarks/blind_attacks.py [--benchmark data/benchmark/validated.jsonl] [--seeds 20]

The filter holds six blind answerers at chance (`validate.answerers`), among them a leave-one-scan-out and a 2-fold
atlas and a text classifier on 2 folds. An answerer of the same kind in another form could still find what the
filter left. This script attacks the kept multiple-choice questions with:
- the atlas (median anatomy of the training scans) cross-fitted on 3 and on 5 folds of the scan families;
- the text classifier (question and options only) cross-fitted on 3 and on 5 folds;
- a single-subject atlas: each question answered from ONE other (original) scan's measurements, averaged over every
  such scan outside its family (what a model that memorised one patient would know).
Each question counts by the answerer's expected rightness (ties and undecided questions as 1/m; cross-fitted
answerers averaged over `--seeds` splits, seeds from 10 up, never the filter's 0-3), and the script prints the
MCA AVG and per-task accuracy with 95% intervals from a bootstrap over scan families (2,000 replicates).
"""
from __future__ import annotations

import argparse
import collections

import numpy as np

from spatialvqa.core import read_records
from spatialvqa.counterfactual import scan_family
from spatialvqa.stats import bootstrap_means
from spatialvqa.validate import AtlasAnswerer, TextAnswerer, cross_fit, expected_right

TASKS = ("DIR", "DIST", "EXT", "VOL", "COMP")


def line(name: str, records, right: dict) -> str:
    vals = np.full((len(records), len(TASKS)), np.nan)
    for i, r in enumerate(records): vals[i, TASKS.index(r["task"])] = right[r["qid"]]
    est, reps = bootstrap_means(vals, [scan_family(r["scan_id"]) for r in records], 2000, 0)
    lo, hi = np.nanquantile(reps, [0.025, 0.975], axis=0)
    avg = np.nanmean(reps, axis=1)
    cells = " | ".join(f"{100 * e:.1f} [{100 * l:.1f}, {100 * h:.1f}]" for e, l, h in zip(est, lo, hi))
    return f"| {name} | {100 * np.nanmean(est):.1f} [{100 * np.quantile(avg, 0.025):.1f}, {100 * np.quantile(avg, 0.975):.1f}] | {cells} |"


def cross_fitted(records, make, folds: int, seeds) -> dict:
    right = collections.defaultdict(float)
    for s in seeds:
        a = make(s)
        got = cross_fit(records, [a], folds=folds, seed=s)
        for r in records: right[r["qid"]] += expected_right(r, got[r["qid"]][a.name]) / len(seeds)
    return right


def single_subject(records, pool) -> dict:
    """Each question's expected rightness from ONE other scan at a time (`validate.AtlasAnswerer` fitted on that scan's
    measurements alone, taken from `pool`, every generated question, so that a scan knows every structure asked about
    it; ties and undecided questions as 1/m), averaged over every original scan outside the question's family that
    holds all the structures it names (counterfactual copies are not subjects: a mirrored scan is no patient)."""
    per = collections.defaultdict(list)
    for r in pool:
        for m in (r.get("measurements") or {}).get("structures") or []: per[m["scan_id"]].append(m)
    atlases = {s: AtlasAnswerer().fit([{"measurements": {"structures": ms}}]) for s, ms in per.items() if scan_family(s) == s}
    right = {}
    for r in records:
        k, own = "ABCD".index(r["answer_letter"]), scan_family(r["scan_id"])
        vals = [a.proba(r)[k] for s, a in atlases.items() if s != own and all(n in a.atlas for n in r["structures"])]
        right[r["qid"]] = float(np.mean(vals)) if vals else 1 / len(r["options"])
    return right


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--benchmark", default="data/benchmark/validated.jsonl")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--pool", default="data/benchmark/questions.jsonl",
                   help="the generated questions whose measurements make the single-subject atlases (every structure asked about)")
    a = p.parse_args(argv)
    everything = read_records(a.benchmark)
    mc = [r for r in everything if r["format"] == "mc"]
    seeds = range(10, 10 + a.seeds)
    print(f"{len(mc)} multiple-choice questions; chance 25.0\n")
    print("| attacker (never used by the filter) | MCA AVG | " + " | ".join(TASKS) + " |")
    print("|---|---|" + "---|" * len(TASKS))
    for folds in (3, 5):
        print(line(f"atlas, {folds}-fold (mean of {a.seeds} splits)", mc, cross_fitted(mc, lambda s: AtlasAnswerer(seed=s), folds, seeds)), flush=True)
        print(line(f"text classifier, {folds}-fold (mean of {a.seeds} splits)", mc, cross_fitted(mc, lambda s: TextAnswerer(seed=s), folds, seeds)), flush=True)
    print(line("single-subject atlas (mean over other scans)", mc, single_subject(mc, read_records(a.pool))))


if __name__ == "__main__":
    main()
