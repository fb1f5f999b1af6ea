"""Benchmark: the phantom cohort before and after issue 9's anatomical variation, side by side.

    .venv/bin/python benchmarks/bench_phantom.py [--n 16] [--seed 0] [--before 705cb9f] [--json out.json]

Generates the first `--n` subjects of the default cohort (`params.yaml` seed; default grids, default lesions) twice:
with the phantom module as it was at commit `--before` (read from git history, so no old checkout is needed) and
with the current one (variants assigned as `make_cohort` assigns them). Subjects are made alternately, old and
new, in one process, so machine load hits both alike; the time is `make_subject` only (no writing).

Prints, per structure, the between-subject spread of the centroid (RMS of the per-axis SDs, in the body's own
frame: the patient's offset on the table removed) and the coefficient of variation of the volume, before and
after; then a leave-one-subject-out atlas on pairwise relations (which of two structures is more to the right,
anterior, superior, or larger, predicted from the other subjects' medians), before and after; and seconds per
subject. With `--questions`, both cohorts are also written, measured and turned into Track A questions
(`spatialvqa.questions` defaults), and `spatialvqa.validate.answerers.AtlasAnswerer`, fitted on the other scans, answers the
multiple-choice ones: the review's own measure, before any filtering.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spatialvqa.phantom.cohort import cohort_variants, make_cohort, subject_seed     # noqa: E402
from spatialvqa.phantom.subject import make_subject                                 # noqa: E402
from spatialvqa.phantom.variation import (ATLAS_STRUCTURES, RELATIONS, atlas_agreement, atlas_summary,  # noqa: E402
                                         cohort_variation)
from spatialvqa.core import load_params                                            # noqa: E402


def load_old(commit: str):
    "The phantom module as it was at `commit`, imported as `spatialvqa._phantom_<commit>`."
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:spatialvqa/phantom.py"], check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "phantom_old.py"
    path.write_text(src)
    name = f"spatialvqa._phantom_{commit}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--seed", type=int, default=None, help="cohort seed (default: params.yaml phantom.seed)")
    ap.add_argument("--before", default="705cb9f", help="commit holding the phantom module before the change")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--questions", action="store_true",
                    help="also generate both cohorts' Track A questions and score a leave-one-scan-out atlas on them")
    a = ap.parse_args(argv)
    p = load_params("phantom", ROOT / "params.yaml")
    seed = int(p["seed"]) if a.seed is None else a.seed
    rates = {k: float(v) for k, v in p.get("rates", {}).items()} or None
    old = load_old(a.before)
    variants = cohort_variants(a.n, seed, rates)
    truths, times = {"before": [], "after": []}, {"before": [], "after": []}
    for i in range(a.n):
        sd = subject_seed(seed, i)
        for which in ("before", "after"):
            t0 = time.perf_counter()
            if which == "before": s = old.make_subject(f"phantom_{i:03d}", sd, tumour_rate=float(p["tumour_rate"]))
            else: s = make_subject(f"phantom_{i:03d}", sd, tumour_rate=float(p["tumour_rate"]), rates=rates,
                                       variants=variants[i], max_lesions=int(p.get("max_lesions", 3)))
            times[which].append(time.perf_counter() - t0)
            truths[which].append(s.truth)
        print(f"subject {i:3d}: before {times['before'][-1]:.2f} s, after {times['after'][-1]:.2f} s, "
              f"variants {','.join(truths['after'][-1]['variants']) or '-'}", file=sys.stderr)
    var = {w: cohort_variation(truths[w], frame="body") for w in truths}
    atlas = {w: atlas_summary(atlas_agreement(truths[w], frame="world")) for w in truths}
    out = dict(n=a.n, seed=seed, before_commit=a.before,
               seconds_per_subject={w: round(statistics.mean(v), 3) for w, v in times.items()},
               variation={w: v.reset_index().to_dict(orient="records") for w, v in var.items()}, atlas=atlas)
    print(f"\n{a.n} subjects of cohort seed {seed}; before = commit {a.before}, after = this tree\n")
    print("| structure | n before | n after | centroid spread before (mm) | after (mm) | volume CV before | after |")
    print("|---|---|---|---|---|---|---|")
    b, f = var["before"], var["after"]
    for name in ATLAS_STRUCTURES:
        if name in b.index and name in f.index:
            print(f"| {name} | {b.loc[name, 'n']} | {f.loc[name, 'n']} | {b.loc[name, 'spread_mm']:.1f} | {f.loc[name, 'spread_mm']:.1f} "
                  f"| {b.loc[name, 'volume_cv']:.3f} | {f.loc[name, 'volume_cv']:.3f} |")
    print("\n| relation | atlas right before | after | cases before | after | contested pairs before | after (of pairs) |")
    print("|---|---|---|---|---|---|---|")
    for rel in (*RELATIONS, "all"):
        b, f = atlas["before"][rel], atlas["after"][rel]
        print(f"| {rel} | {b['accuracy']:.3f} | {f['accuracy']:.3f} | {b['n']} | {f['n']} | {b['contested']} | {f['contested']} ({f['pairs']}) |")
    print(f"\nseconds per subject (make_subject, default grid): before {out['seconds_per_subject']['before']:.2f}, "
          f"after {out['seconds_per_subject']['after']:.2f}")
    if a.questions:
        out["question_atlas"] = question_atlas(old, a.n, seed, float(p["tumour_rate"]), rates, int(p.get("max_lesions", 3)))
        print("\nLeave-one-scan-out atlas (spatialvqa.validate.answerers.AtlasAnswerer) on the generated multiple-choice questions, "
              "before any filtering:\n\n| task | before | after | questions before | after |\n|---|---|---|---|---|")
        qa = out["question_atlas"]
        for task in qa["after"]:
            b, f = qa["before"].get(task, {}), qa["after"][task]
            print(f"| {task} | {b.get('accuracy', float('nan')):.3f} | {f['accuracy']:.3f} | {b.get('n', 0)} | {f['n']} |")
    if a.json: Path(a.json).write_text(json.dumps(out, indent=1))
    return out


def question_atlas(old, n: int, seed: int, tumour_rate: float, rates, max_lesions: int) -> dict:
    """Write both cohorts, measure them, generate the Track A questions (spatialvqa.questions defaults) and answer the
    multiple-choice ones with the atlas of the other scans (leave one scan out): accuracy per task and overall."""
    import numpy as np
    from spatialvqa.validate import answerers as VA
    from spatialvqa.measure import measure_manifests
    from spatialvqa.questions.generate import generate_questions
    res = {}
    for which in ("before", "after"):
        d = Path(tempfile.mkdtemp()) / which
        if which == "before": old.make_cohort(d, n, seed=seed, tumour_rate=tumour_rate, workers=0)
        else: make_cohort(d, n, seed=seed, tumour_rate=tumour_rate, workers=0, rates=rates, max_lesions=max_lesions)
        table, scans, rejected = measure_manifests([d / "cohort.json"], workers=0)
        recs = [r for r in generate_questions(table, seed=0, scans=scans) if r["format"] == "mc"]
        preds = VA.cross_fit_answerers(recs, VA.make_answerers("atlas"), folds=n, seed=0)
        hits = {}
        for r in recs: hits.setdefault(r["task"], []).append(VA.is_right(r, preds[r["qid"]]["atlas"]["pred"]))
        hits["all"] = [h for k in list(hits) for h in hits[k]]
        res[which] = {k: dict(accuracy=round(float(np.mean(v)), 4), n=len(v)) for k, v in hits.items()}
    return res


if __name__ == "__main__":
    main()
