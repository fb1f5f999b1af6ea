"""Benchmark: the Track A pipeline from convert to validated, per scan, on a cohort of phantoms plus the real scans.

    .venv/bin/python benchmarks/bench_pipeline.py [--phantoms 200] [--workers 2] [--keep DIR]

A phantom cohort of `--phantoms` subjects is generated first (timed, but not part of the per-scan figure: a
downloaded dataset has no such step), then the same library calls as the DVC stages run, each timed:
`convert.convert_datasets` (the phantoms and the real TotalSegmentator and pyradiomics scans of ../shared/data),
`counterfactual.make_counterfactuals` (mirrored and resized copies of the real scans and of params.yaml's sample of
phantoms), `measure.measure_manifests` (scans and copies), `questions.generate_questions` with the counterfactual
focus and flip share and `counterfactual.pair_questions` (the budgets of params.yaml) and `validate.validate` (the
filter members, rule, splits, band and method of params.yaml). Convert, counterfactual and measure use `--workers`
processes (spatialvqa.core's executor); generation and validation run in this process. Prints one line per step and
the figure: seconds per scan from convert to validated (scans: the converted ones, not the copies), and the questions
kept.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phantoms", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", default=None, help="write the cohort and outputs here (default: a temporary folder)")
    a = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from spatialvqa.convert import convert_datasets
    from spatialvqa.core import load_params, shared_data
    from spatialvqa.measure import measure_manifests
    from spatialvqa.phantom import make_cohort
    from spatialvqa.counterfactual import flip_predicates, make_counterfactuals, pair_focus, pair_questions, split_copies
    from spatialvqa.questions import generate_questions, parse_budget
    from spatialvqa.validate import is_real, validate

    params = load_params(path=ROOT / "params.yaml")
    gen, val, cf = params["generate"], params["validate"], params["counterfactual"]
    tmp = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench_pipeline_"))
    tmp.mkdir(parents=True, exist_ok=True)
    times = {}

    def timed(name, fn):
        t0 = time.perf_counter()
        out = fn()
        times[name] = time.perf_counter() - t0
        return out

    timed("phantoms (not counted)", lambda: make_cohort(tmp / "phantom", a.phantoms, seed=0, workers=a.workers))
    ts = shared_data("real-ct", "totalsegmentator")
    datasets = [{"name": "totalseg_s0001", "kind": "totalsegmentator", "path": str(ts / "s0001")},
                {"name": "totalseg_dicom", "kind": "totalsegmentator", "path": str(ts / "dicom_example")},
                {"name": "pyradiomics", "kind": "pyradiomics", "path": str(shared_data("real-ct", "pyradiomics"))},
                {"name": "phantom", "kind": "phantom", "path": str(tmp / "phantom")}]
    scans_out = tmp / "scans"
    if scans_out.exists(): shutil.rmtree(scans_out)
    recs = timed("convert", lambda: convert_datasets(datasets, scans_out, workers=a.workers))
    copies, _ = timed("counterfactual", lambda: make_counterfactuals(
        scans_out / "scans.json", tmp / "counterfactual", kinds=cf["kinds"].split(","),
        factors=[float(f) for f in str(cf["factors"]).split(",")], phantoms=int(cf["phantoms"]), seed=int(cf["seed"]),
        about=cf["about"], prefer=cf["prefer"].split(","), max_loss=float(cf["max_loss"]), min_voxels=int(gen["min_voxels"]),
        workers=a.workers))
    table, scan_table, rejected = timed("measure", lambda: measure_manifests(
        [scans_out / "scans.json", tmp / "counterfactual" / "scans.json"], components=True, workers=a.workers))

    def generate():
        st, sc, cst, csc = split_copies(table, scan_table)
        orig = generate_questions(st, seed=int(gen["seed"]), per_scan=parse_budget(gen["per_scan"]), scans=sc,
                                  tumour_share=float(gen["tumour_share"]), min_voxels=int(gen["min_voxels"]),
                                  per_source=gen["per_source"], focus=pair_focus(csc, st), focus_share=float(gen["focus_share"]),
                                  accept=flip_predicates(table, scan_table, int(gen["min_voxels"])),
                                  accept_share=float(gen["flip_share"]))
        twins, _ = pair_questions(orig, cst, csc, originals=st, min_voxels=int(gen["min_voxels"]))
        by = {}
        for t in twins: by.setdefault(t["pair_of"], []).append(t)
        return [x for r in orig for x in (r, *by.get(r["qid"], []))]
    qs = timed("generate", generate)
    v = timed("validate", lambda: validate(qs, table, scan_table, answerers=str(val["answerers"]), rule=str(val["rule"]),
                                           folds=int(val["folds"]), seed=int(val["seed"]), protect=is_real, audit=None,
                                           splits=int(val["splits"]), tol=float(val["tol"]), method=str(val["method"]),
                                           family_cap=float(val["family_cap"]), letter_slack=float(val["letter_slack"])))
    scans = split_copies(table, scan_table)[1]
    n = len(scans)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; workers={a.workers}")
    twins = [r for r in qs if r.get("pair_of")]
    print(f"cohort: {a.phantoms} phantoms + {n - a.phantoms} real scans = {n} scans ({len(rejected)} rejected) and "
          f"{len(copies)} counterfactual copies; {len(qs)} questions generated ({len(twins)} twins, "
          f"{sum(bool(t['flipped']) for t in twins)} flip), {len(v.kept)} validated ({sum(map(is_real, v.kept))} from real "
          f"scans, {sum(bool(r.get('pair_of')) for r in v.kept)} twins)")
    for k, s in times.items(): print(f"  {k:24s} {s:8.1f} s  ({s / n:.3f} s per scan)")
    total = sum(s for k, s in times.items() if "not counted" not in k)
    print(f"convert -> validated: {total:.1f} s for {n} scans = {total / n:.2f} s per scan")


if __name__ == "__main__":
    main()
