"""Benchmark: the Track A pipeline from convert to validated, per scan, at two cohort sizes, and on a local Dask cluster.

    .venv/bin/python benchmarks/bench_pipeline.py [--sizes 60,240] [--workers 2] [--dask 1,2,4] [--no-dask]
                                                  [--check] [--max-ratio 1.3] [--by wall|cpu]
                                                  [--real all|openkbp|none] [--keep DIR]      (make bench-pipeline)

Every size runs the same library calls as the DVC stages, each timed, with the settings of params.yaml:
`convert.datasets.convert_datasets` (the `datasets` list), `counterfactual.make_counterfactuals` (section
counterfactual, generate.min_voxels), `measure.measure_manifests` (scans and copies; measure.components), the generate
stage (`questions.generate.generate_questions` with the per-scan and per-source budgets, the counterfactual focus and
flip shares, `letters.balance_pairs`, and with generate.verify every answer re-derived from the label maps with
`questions.check.check_record`, as nbs/stages/generate.ipynb does) and `validate.pipeline.validate` (every setting of
section validate as nbs/stages/validate.ipynb passes it, the audit included; an LLM answerer, which needs a server, is
left out and said so). Convert, counterfactual and measure use `--workers` local processes (default executor.workers;
`spatialvqa.core.parallel_map`); generate and validate run in this process, as in their stages.

The cohort of a size N is params.yaml's `datasets` as they apply offline, read from ../shared/data (the mirror that
the fetch stage copies into data/raw): the fixed real scans (TotalSegmentator's s0001, DICOM and full examples,
pyradiomics' two chest CTs, NSCLC-Radiomics' LUNG1-001: 6 scans, each entry with its params.yaml options), then the
rest split evenly between OpenKBP patients (the first ones in `openkbp.patient_folders` order, at most the 116 there
are; a folder of symbolic links to their files) and phantoms (params.yaml's phantom settings), so that the real share
stays about the same: N = 60 is 6 fixed + 27 OpenKBP + 27 phantoms, N = 240 is 6 + 116 + 118. One phantom cohort of
the largest size is generated first (timed, not counted: a downloaded dataset has no such step); a smaller cohort
lists its first subjects. The 6 fixed real scans are in both cohorts and weigh more than their number (the full
CT's budgets, the copies of every real scan): a constant part, which pulls the ratio of a linear stage below 1.
`--real openkbp`: OpenKBP and phantoms only, half each (no constant part); `--real none`: phantoms only (the test's
tiny cohorts). A dataset whose folder is not reachable offline is left out and named.

Printed per size: the cohort, the seconds of every stage and per scan (scans: the converted originals, not the
counterfactual copies), with the CPU seconds of this process and its worker processes, the questions generated and
kept; then the scaling table: per stage the wall-clock seconds per scan at each size and the ratio larger/smaller,
and the same in CPU seconds (steadier than wall-clock when other jobs share the machine). A stage whose cost per scan
grows more than `--max-ratio` (1.3) from the smaller to the larger cohort (wall-clock, or CPU with `--by cpu`) is
flagged; with `--check` the exit status is then 1.

Then (unless `--no-dask`) the per-scan stages, convert, counterfactual and measure, run again on the smaller cohort
on a `dask.distributed.LocalCluster` (processes, one thread each) of each worker count of `--dask` (default 1, 2 and
4; 4 on a 2-core machine shows the ceiling), through the stages' own `scheduler` argument (params.yaml
executor.scheduler); the speed-ups are against the first count, and the structures table each cluster measures is
compared with the one the local processes measured. Cluster start-up is timed apart. The generate stage is not among
them: its questions are drawn scan after scan against one set of the questions already asked (a cross-case question
of two scans is asked once), so that drawing them in parallel could change the benchmark; its re-derivation (verify)
is per scan but runs inside the stage notebook and costs a few hundredths of a second per scan. Validate is not per
scan.

The machine's 1-minute load average is printed before and after each run: other jobs on a shared machine inflate
the figures (and the ratios, when they come and go between the sizes).
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("convert", "counterfactual", "measure", "generate", "validate")
PER_SCAN = ("convert", "counterfactual", "measure")       # the stages that run on the executor (processes or Dask)
MAX_RATIO = 1.3
OPENKBP_SHARE = 0.5                                       # of the scans beyond the fixed real ones


def cpu_seconds() -> float:
    "CPU seconds of this process and of its children that have ended (the executor's worker processes)."
    import resource
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def load_avg() -> str:
    try: return f"{os.getloadavg()[0]:.2f}"
    except OSError: return "n/a"


# ---------------------------------------------------------------------------------------------------------- cohort
@dataclass
class Cohort:
    size: int
    datasets: list[dict]                                  # entries of the `datasets` form, paths absolute
    parts: dict[str, int]                                 # scans planned per dataset name
    notes: list[str] = field(default_factory=list)


def offline_path(path: str) -> Path | None:
    "Where a params.yaml dataset path is read offline: data/raw/... from ../shared/data, another path as it is."
    from spatialvqa.core import shared_data
    parts = Path(path).parts
    if parts[:2] == ("data", "raw"):
        try: return shared_data(*parts[2:], root=ROOT)
        except FileNotFoundError: return None
    p = ROOT / path
    return p if p.exists() else None


def real_entries(params: Mapping) -> tuple[list[dict], list[str]]:
    """The fixed real datasets of params.yaml (every entry but openkbp and phantom) reachable offline, paths
    resolved, options as params.yaml gives them; and notes naming those left out."""
    out, notes = [], []
    for e in params["datasets"]:
        if e["kind"] in ("openkbp", "phantom"): continue
        p = offline_path(e["path"])
        if p is None: notes.append(f"{e['name']}: {e['path']} not reachable offline, left out"); continue
        out.append({"name": e["name"], "kind": e["kind"], "path": str(p), "options": dict(e.get("options") or {})})
    return out, notes


def count_scans(entry: Mapping) -> int:
    "How many scans a fixed real dataset gives (its converter's case list)."
    p, kind = Path(entry["path"]), entry["kind"]
    if kind == "pyradiomics": return len(list(p.glob("*_label.nrrd")))
    return 1                                              # the TotalSegmentator examples, one RTSTRUCT series


def plan(size: int, fixed: int, openkbp_available: int, real: bool = True) -> dict[str, int]:
    """Scans of each part of a cohort of `size`: the `fixed` real scans, then the rest split between OpenKBP
    (`OPENKBP_SHARE`, at most `openkbp_available`) and phantoms. Without `real`: phantoms only (`fixed` and
    `openkbp_available` 0: OpenKBP and phantoms)."""
    if not real: return {"fixed": 0, "openkbp": 0, "phantom": size}
    rest = size - fixed
    if rest < 2: raise ValueError(f"a cohort of {size} scans leaves no room beside the {fixed} fixed real scans")
    k = min(openkbp_available, round(rest * OPENKBP_SHARE)) if openkbp_available else 0
    return {"fixed": fixed, "openkbp": k, "phantom": rest - k}


def openkbp_root(params: Mapping) -> Path | None:
    e = next((e for e in params["datasets"] if e["kind"] == "openkbp"), None)
    return None if e is None else offline_path(e["path"])


def openkbp_subset(src: Path, n: int, out: Path) -> Path:
    "A folder holding the first `n` OpenKBP patients of `src` (same split folders; files linked, not copied)."
    from spatialvqa.openkbp import patient_folders
    if out.exists(): shutil.rmtree(out)
    for f in patient_folders(src)[:n]:
        d = out / f.parent.name / f.name
        d.mkdir(parents=True)
        for x in f.iterdir(): os.symlink(x.resolve(), d / x.name)
    return out


def make_phantoms(out: Path, n: int, params: Mapping, workers: int, spacing: Sequence[float] | None = None) -> list[dict]:
    "The phantom pool: `n` subjects with params.yaml's phantom settings (as the phantom stage makes them)."
    from spatialvqa.phantom.cohort import make_cohort
    ph = params["phantom"]
    return make_cohort(out, n_subjects=n, seed=int(ph["seed"]), tumour_rate=float(ph["tumour_rate"]), workers=workers,
                       rates=dict(ph["rates"]), max_lesions=int(ph["max_lesions"]), spacing=spacing)


def phantom_subset(pool: Path, n: int, out: Path) -> Path:
    "A phantom cohort folder listing the first `n` subjects of the pool at `pool` (absolute paths; nothing copied)."
    from spatialvqa.core import read_json, write_json
    entries = read_json(pool / "cohort.json")[:n]
    if len(entries) < n: raise ValueError(f"{pool} holds {len(entries)} phantoms, {n} asked for")
    abs_ = lambda e: {k: (str(pool / v) if k in ("image", "labels", "truth", "report") and v else v) for k, v in e.items()}
    out.mkdir(parents=True, exist_ok=True)
    write_json([abs_(e) for e in entries], out / "cohort.json")
    return out


def plan_for(size: int, params: Mapping, real: bool | str = True) -> tuple[dict[str, int], list[dict], Path | None, list[str]]:
    """`plan` for params.yaml's datasets as they are offline: (plan, fixed real entries, OpenKBP folder, notes).
    `real`: True (or "all") every dataset, "openkbp" OpenKBP and phantoms only, False (or "none") phantoms only."""
    real = {"all": True, "none": False}.get(real, real)
    fixed, notes = real_entries(params) if real is True else ([], [])
    ok_src = openkbp_root(params) if real else None
    if real and ok_src is None: notes.append("openkbp: not reachable offline, left out")
    ok_n = 0
    if ok_src is not None:
        from spatialvqa.openkbp import patient_folders
        ok_n = len(patient_folders(ok_src))
    return plan(size, sum(map(count_scans, fixed)), ok_n, real), fixed, ok_src, notes


def build_cohort(size: int, work: Path, params: Mapping, pool: Path | None, real: bool | str = True) -> Cohort:
    """The cohort of `size` scans under `work`: params.yaml's datasets in their order, the fixed real ones, a
    subset of OpenKBP and of the phantom pool (see the module docstring)."""
    p, fixed, ok_src, notes = plan_for(size, params, real)
    by_name = {e["name"]: e for e in fixed}
    datasets, parts = [], {}
    for e in params["datasets"]:
        if e["kind"] == "phantom":
            if p["phantom"] <= 0: continue
            if pool is None: raise ValueError("a phantom pool is needed")
            datasets.append({"name": e["name"], "kind": "phantom", "path": str(phantom_subset(pool, p["phantom"], work / "phantom")),
                             "options": dict(e.get("options") or {})})
            parts[e["name"]] = p["phantom"]
        elif e["kind"] == "openkbp":
            if p["openkbp"] <= 0 or ok_src is None: continue
            datasets.append({"name": e["name"], "kind": "openkbp", "path": str(openkbp_subset(ok_src, p["openkbp"], work / "openkbp")),
                             "options": dict(e.get("options") or {})})
            parts[e["name"]] = p["openkbp"]
        elif e["name"] in by_name:
            datasets.append(by_name[e["name"]])
            parts[e["name"]] = count_scans(by_name[e["name"]])
    return Cohort(size, datasets, parts, notes)


# ---------------------------------------------------------------------------------------------------------- stages
# Each stage takes the run's context (a dict: params, datasets, out, workers, scheduler and what earlier stages
# left) and leaves its outputs in it; `run_pipeline` times each call. Tests inject other stage functions.
def stage_convert(ctx: dict) -> None:
    from spatialvqa.convert.datasets import convert_datasets
    out = ctx["out"] / "scans"
    if out.exists(): shutil.rmtree(out)
    ctx["scans"] = convert_datasets(ctx["datasets"], out, workers=ctx["workers"], scheduler=ctx["scheduler"])
    ctx["manifest"] = out / "scans.json"


def stage_counterfactual(ctx: dict) -> None:
    from spatialvqa.counterfactual import make_counterfactuals
    cf, gen = ctx["params"]["counterfactual"], ctx["params"]["generate"]
    out = ctx["out"] / "counterfactual"
    if out.exists(): shutil.rmtree(out)
    ctx["copies"], ctx["copies_rejected"] = make_counterfactuals(
        ctx["manifest"], out, kinds=cf["kinds"].split(","), factors=[float(f) for f in str(cf["factors"]).split(",")],
        phantoms=int(cf["phantoms"]), seed=int(cf["seed"]), about=cf["about"], prefer=cf["prefer"].split(","),
        max_loss=float(cf["max_loss"]), min_voxels=int(gen["min_voxels"]), workers=ctx["workers"], scheduler=ctx["scheduler"])
    ctx["copy_manifest"] = out / "scans.json"


def stage_measure(ctx: dict) -> None:
    from spatialvqa.core import flag
    from spatialvqa.measure import measure_manifests
    ctx["table"], ctx["scan_table"], ctx["rejected"] = measure_manifests(
        [ctx["manifest"], ctx["copy_manifest"]], components=flag(ctx["params"]["measure"]["components"]),
        workers=ctx["workers"], scheduler=ctx["scheduler"])


def stage_generate(ctx: dict) -> None:
    "The generate stage's calls (nbs/stages/generate.ipynb): originals, their twins, and with `verify` the re-derivation."
    from spatialvqa.core import flag
    from spatialvqa.counterfactual import flip_predicates, pair_focus, split_copies
    from spatialvqa.letters import balance_pairs
    from spatialvqa.questions.check import check_record, structures_of
    from spatialvqa.questions.generate import generate_questions, parse_budget, parse_per_source
    from spatialvqa.questions.policy import policy_from_params
    from spatialvqa.scan import read_scan
    gen, table_all, scan_all = ctx["params"]["generate"], ctx["table"], ctx["scan_table"]
    t0 = time.perf_counter()
    table, scan_table, copy_table, copy_scans = split_copies(table_all, scan_all)
    originals = generate_questions(table, seed=int(gen["seed"]), per_scan=parse_budget(gen["per_scan"]), scans=scan_table,
                                   tumour_share=float(gen["tumour_share"]), min_voxels=int(gen["min_voxels"]),
                                   per_source=parse_per_source(gen["per_source"]), focus=pair_focus(copy_scans, table),
                                   focus_share=float(gen["focus_share"]),
                                   accept=flip_predicates(table_all, scan_all, int(gen["min_voxels"])),
                                   accept_share=float(gen["flip_share"]), policy=policy_from_params(gen),
                                   alternatives=True)
    # the generate stage's pairing: the letters chosen with the twins in view
    originals, twins, _ = balance_pairs(originals, copy_table, copy_scans, originals=table,
                                        min_voxels=int(gen["min_voxels"]), seed=int(gen["seed"]))
    by = {}
    for t in twins: by.setdefault(t["pair_of"], []).append(t)
    ctx["questions"] = [x for r in originals for x in (r, *by.get(r["qid"], []))]
    ctx.setdefault("detail", {})["generate: questions and twins"] = time.perf_counter() - t0
    if flag(gen["verify"]):
        t0 = time.perf_counter()
        measured, problems = {}, []
        edge = {s for r in ctx["questions"] if r["spec"].get("by") == "surface" for s in r["scan_ids"]}
        for _, s in scan_all.iterrows():
            lab = read_scan(s["labels"], None, s["scan_id"]).labels
            measured[s["scan_id"]] = structures_of(lab.array, lab.affine, near=s["scan_id"] in edge)
        for r in ctx["questions"]: problems += check_record(r, measured)
        if problems: raise AssertionError(f"{len(problems)} questions do not re-derive from their masks:\n" + "\n".join(problems[:20]))
        ctx["detail"]["generate: verify (label maps re-read)"] = time.perf_counter() - t0


def _none(v):
    return None if v is None or str(v).strip().lower() in ("", "none", "null") else v


def validate_config(params: Mapping):
    "The validate stage's config from params.yaml (an LLM answerer left out, said so)."
    from spatialvqa.validate.pipeline import ValidateConfig
    v, notes = params["validate"], []
    if _none(v.get("llm")) is not None: notes.append("validate.llm is set: the LLM answerers need a server and are left out")
    return ValidateConfig.from_params(v, llm=None), notes


def stage_validate(ctx: dict) -> None:
    from spatialvqa.validate.chance import is_real
    from spatialvqa.validate.pipeline import validate
    config, _ = validate_config(ctx["params"])
    ctx["validation"] = validate(ctx["questions"], ctx["table"], ctx["scan_table"], config, protect=is_real)


STAGE_FUNCTIONS: dict[str, Callable[[dict], None]] = {
    "convert": stage_convert, "counterfactual": stage_counterfactual, "measure": stage_measure,
    "generate": stage_generate, "validate": stage_validate}


@dataclass
class Run:
    size: int                    # the cohort size asked for
    scans: int                   # scans converted (the per-scan figures' denominator)
    seconds: dict[str, float]    # per stage, in order: wall-clock
    detail: dict[str, float]
    counts: dict[str, int]
    load: tuple[str, str]        # 1-minute load average before, after
    cpu: dict[str, float] = field(default_factory=dict)   # per stage: CPU seconds of this process and its workers

    def per_scan(self, stage: str, cpu: bool = False) -> float:
        return (self.cpu if cpu else self.seconds)[stage] / max(self.scans, 1)


def run_pipeline(cohort: Cohort, out: Path, params: Mapping, workers: int = 2, scheduler: str | None = None,
                 stages: Mapping[str, Callable[[dict], None]] | None = None) -> Run:
    "Every stage of `stages` (default `STAGE_FUNCTIONS`) in order on `cohort`, outputs under `out`, each timed."
    stages = dict(STAGE_FUNCTIONS if stages is None else stages)
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"params": params, "datasets": cohort.datasets, "out": out, "workers": workers, "scheduler": scheduler, "detail": {}}
    seconds, cpu, before = {}, {}, load_avg()
    for name, fn in stages.items():
        t0, c0 = time.perf_counter(), cpu_seconds()
        fn(ctx)
        seconds[name], cpu[name] = time.perf_counter() - t0, cpu_seconds() - c0
    counts = {"scans": len(ctx.get("scans") or []), "copies": len(ctx.get("copies") or []),
              "rejected": len(ctx.get("rejected") or []), "questions": len(ctx.get("questions") or [])}
    if "validation" in ctx:
        from spatialvqa.validate.chance import is_real
        counts.update(kept=len(ctx["validation"].kept), kept_real=sum(map(is_real, ctx["validation"].kept)))
    run = Run(cohort.size, counts["scans"] or cohort.size, seconds, dict(ctx["detail"]), counts, (before, load_avg()), cpu)
    run.ctx = ctx                                         # for callers that want the outputs (not printed)
    return run


# ---------------------------------------------------------------------------------------------------------- report
def scaling_rows(small: Run, large: Run, max_ratio: float = MAX_RATIO, by: str = "wall") -> list[dict]:
    """Per stage (both runs'), the seconds per scan at each size and their ratio larger/smaller, wall-clock and CPU
    (this process and its worker processes), and whether the ratio `by` ("wall" or "cpu") exceeds `max_ratio`;
    then a `total` row (never flagged)."""
    if by not in ("wall", "cpu"): raise ValueError(f"by: wall or cpu, got {by!r}")
    ratio = lambda a, b: b / a if a > 0 else (1.0 if b == 0 else math.inf)
    rows = []
    for st in [s for s in small.seconds if s in large.seconds]:
        r = {"stage": st, "small": small.per_scan(st), "large": large.per_scan(st)}
        r["ratio"] = ratio(r["small"], r["large"])
        if st in small.cpu and st in large.cpu:
            r["cpu_small"], r["cpu_large"] = small.per_scan(st, cpu=True), large.per_scan(st, cpu=True)
            r["cpu_ratio"] = ratio(r["cpu_small"], r["cpu_large"])
        r["flag"] = r["ratio" if by == "wall" else "cpu_ratio"] > max_ratio
        rows.append(r)
    tot = {"stage": "total", "small": sum(x["small"] for x in rows), "large": sum(x["large"] for x in rows), "flag": False}
    tot["ratio"] = ratio(tot["small"], tot["large"])
    if all("cpu_ratio" in x for x in rows):
        tot["cpu_small"], tot["cpu_large"] = sum(x["cpu_small"] for x in rows), sum(x["cpu_large"] for x in rows)
        tot["cpu_ratio"] = ratio(tot["cpu_small"], tot["cpu_large"])
    return [*rows, tot]


def format_scaling(rows: Sequence[Mapping], small: Run, large: Run, max_ratio: float = MAX_RATIO, by: str = "wall") -> str:
    """The scaling table: a header, one line per stage and the total (wall-clock seconds per scan at each size and
    the ratio; CPU seconds per scan and their ratio), then a FLAG line per flagged stage."""
    h1, h2 = f"s/scan @{small.scans}", f"s/scan @{large.scans}"
    lines = [f"{'stage':16s} {h1:>14s} {h2:>14s} {'larger/smaller':>15s}   {'CPU ' + h1:>18s} {'CPU ' + h2:>18s} {'CPU ratio':>10s}"]
    for r in rows:
        cpu = (f"   {r['cpu_small']:18.3f} {r['cpu_large']:18.3f} {r['cpu_ratio']:9.2f}x" if "cpu_ratio" in r else "")
        lines.append(f"{r['stage']:16s} {r['small']:14.3f} {r['large']:14.3f} {r['ratio']:14.2f}x{cpu}" + ("  FLAG" if r["flag"] else ""))
    what = "as much per scan" if by == "wall" else "as much CPU per scan"
    for r in rows:
        if r["flag"]:
            x = r["ratio" if by == "wall" else "cpu_ratio"]
            lines.append(f"FLAG: {r['stage']} costs {x:.2f}x {what} at {large.scans} scans as at {small.scans} "
                         f"(more than {max_ratio}x)")
    return "\n".join(lines)


def format_run(run: Run, cohort: Cohort) -> str:
    c = run.counts
    parts = ", ".join(f"{k} {v}" for k, v in cohort.parts.items())
    lines = [f"cohort of {cohort.size}: {parts}; {c['scans']} scans converted, {c['copies']} counterfactual copies, "
             f"{c['rejected']} rejected by measure; {c['questions']} questions generated"
             + (f", {c['kept']} validated ({c['kept_real']} from real scans)" if "kept" in c else "")
             + f"; load average {run.load[0]} before, {run.load[1]} after"]
    for k, s in run.seconds.items():
        cpu = f"; {run.cpu[k]:.1f} s CPU" if k in run.cpu else ""
        lines.append(f"  {k:40s} {s:8.1f} s  ({s / run.scans:.3f} s per scan{cpu})")
        for d, x in run.detail.items():
            if d.split(":")[0] == k: lines.append(f"    {d:38s} {x:8.1f} s  ({x / run.scans:.3f} s per scan)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- Dask
def dask_runs(cohort: Cohort, out: Path, params: Mapping, n_workers: Sequence[int], reference=None) -> list[dict]:
    """The per-scan stages (`PER_SCAN`) on a LocalCluster of each worker count (processes, one thread each), through
    their `scheduler` argument; per count: start-up seconds, seconds per stage, and whether the structures table
    equals `reference` (the local run's)."""
    from dask.distributed import LocalCluster
    stages = {k: STAGE_FUNCTIONS[k] for k in PER_SCAN}
    rows = []
    for k in n_workers:
        t0 = time.perf_counter()
        with LocalCluster(n_workers=k, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            startup = time.perf_counter() - t0
            run = run_pipeline(cohort, out / f"dask{k}", params, workers=0, scheduler=cluster.scheduler_address, stages=stages)
        same = None
        if reference is not None: same = _same_structures(reference, run.ctx["table"])
        rows.append({"workers": k, "startup": startup, "seconds": run.seconds, "same": same, "load": run.load, "scans": run.scans})
    return rows


def _same_structures(a, b) -> bool:
    key = ["scan_id", "label"]
    a, b = (t.sort_values(key).reset_index(drop=True) for t in (a, b))
    try:
        import pandas as pd
        pd.testing.assert_frame_equal(a, b)
        return True
    except AssertionError: return False


def format_dask(rows: Sequence[Mapping]) -> str:
    base = rows[0]
    lines = [f"{'stage':16s} " + " ".join(f"{str(r['workers']) + ' workers':>12s}" for r in rows)
             + "   speed-up vs " + f"{base['workers']} worker" + ("s" if base["workers"] != 1 else "")]
    for st in PER_SCAN:
        sp = " ".join(f"{base['seconds'][st] / r['seconds'][st]:5.2f}x" for r in rows[1:])
        lines.append(f"{st:16s} " + " ".join(f"{r['seconds'][st]:10.1f} s" for r in rows) + f"   {sp}")
    tot = lambda r: sum(r["seconds"][s] for s in PER_SCAN)
    lines.append(f"{'together':16s} " + " ".join(f"{tot(r):10.1f} s" for r in rows) + "   "
                 + " ".join(f"{tot(base) / tot(r):5.2f}x" for r in rows[1:]))
    lines.append("cluster start-up " + ", ".join(f"{r['workers']} workers {r['startup']:.1f} s" for r in rows)
                 + "; load average " + ", ".join(f"{r['load'][0]}->{r['load'][1]}" for r in rows))
    if any(r["same"] is not None for r in rows):
        lines.append("structures table as the local processes measured it: "
                     + ", ".join(f"{r['workers']} workers {'identical' if r['same'] else 'DIFFERENT'}" for r in rows))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- main
def warm_imports() -> None:
    "Import what the stages import lazily, so that the first cohort does not pay for it."
    import scipy.optimize, sklearn.feature_extraction, sklearn.linear_model  # noqa: F401
    import spatialvqa.convert.datasets, spatialvqa.counterfactual, spatialvqa.measure, spatialvqa.questions.generate  # noqa: F401
    import spatialvqa.scan, spatialvqa.validate.pipeline  # noqa: F401


def save_outputs(run: Run, out: Path) -> None:
    "The questions and the measure tables of a run, under `out` (with --keep: to rerun or profile a stage alone)."
    from spatialvqa.core import write_jsonl, write_parquet
    ctx = run.ctx
    if "questions" in ctx: write_jsonl(ctx["questions"], out / "questions.jsonl")
    if "table" in ctx:
        write_parquet(ctx["table"], out / "structures.parquet")
        write_parquet(ctx["scan_table"], out / "scans.parquet")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="60,240", help="the smaller and the larger cohort size (scans in total)")
    ap.add_argument("--workers", type=int, default=None, help="local processes of the per-scan stages (default: params.yaml executor.workers)")
    ap.add_argument("--dask", default="1,2,4", help="worker counts of the Dask runs (the first is the speed-ups' base)")
    ap.add_argument("--no-dask", action="store_true", help="skip the Dask runs")
    ap.add_argument("--check", action="store_true", help="exit 1 when a stage's cost per scan grows more than --max-ratio")
    ap.add_argument("--max-ratio", type=float, default=MAX_RATIO)
    ap.add_argument("--by", choices=("wall", "cpu"), default="wall",
                    help="the ratio --check reads: wall-clock (default) or CPU seconds (steadier on a shared machine)")
    ap.add_argument("--real", choices=("all", "openkbp", "none"), default="all",
                    help="openkbp: OpenKBP and phantoms, without the 6 fixed real scans (no constant part); none: phantoms only")
    ap.add_argument("--phantom-spacing", default=None, help="x,y,z mm of every phantom (default: drawn per subject, as the stage does)")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--keep", default=None, help="write the cohorts and outputs here (default: a temporary folder, removed)")
    return ap.parse_args(argv)


def main(argv=None, stages: Mapping[str, Callable[[dict], None]] | None = None) -> int:
    "Run the benchmark; returns the exit status (1 with --check when a stage is flagged). `stages`: for tests."
    a = parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from spatialvqa.core import load_params
    params = load_params(path=a.params)
    workers = int(params["executor"]["workers"]) if a.workers is None else a.workers
    sizes = sorted(int(s) for s in a.sizes.split(","))
    if len(sizes) != 2 or sizes[0] >= sizes[1]: raise SystemExit(f"--sizes: two different sizes, got {a.sizes!r}")
    real = a.real
    spacing = [float(v) for v in a.phantom_spacing.split(",")] if a.phantom_spacing else None
    tmp = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench_pipeline_"))
    tmp.mkdir(parents=True, exist_ok=True)
    warm_imports()
    try:
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; per-scan stages on "
              f"{workers} local processes; load average {load_avg()}", flush=True)
        _, vnotes = validate_config(params)
        cohorts = {n: None for n in sizes}
        t0 = time.perf_counter()
        n_ph = max(plan_for(n, params, real)[0]["phantom"] for n in sizes)
        pool = tmp / "phantom_pool"
        if n_ph: make_phantoms(pool, n_ph, params, workers, spacing)
        print(f"phantom pool: {n_ph} subjects in {time.perf_counter() - t0:.1f} s (not counted)", flush=True)
        runs = {}
        for n in sizes:
            cohorts[n] = build_cohort(n, tmp / f"cohort{n}", params, pool if n_ph else None, real)
            for note in [*cohorts[n].notes, *vnotes]: print(f"note: {note}")
            runs[n] = run_pipeline(cohorts[n], tmp / f"run{n}", params, workers=workers, stages=stages)
            print(format_run(runs[n], cohorts[n]), flush=True)
            if a.keep: save_outputs(runs[n], tmp / f"run{n}")
        small, large = runs[sizes[0]], runs[sizes[1]]
        rows = scaling_rows(small, large, a.max_ratio, a.by)
        print(f"\ncost per scan from {small.scans} to {large.scans} scans ({workers} local processes):")
        print(format_scaling(rows, small, large, a.max_ratio, a.by), flush=True)
        if not a.no_dask:
            ks = [int(k) for k in a.dask.split(",")]
            print(f"\nper-scan stages on a local Dask cluster (processes, 1 thread each), cohort of {small.scans} scans, "
                  f"{os.cpu_count()} cores:", flush=True)
            d = dask_runs(cohorts[sizes[0]], tmp / "dask", params, ks, reference=small.ctx.get("table"))
            print(format_dask(d), flush=True)
        flagged = [r["stage"] for r in rows if r["flag"]]
        return 1 if (a.check and flagged) else 0
    finally:
        if not a.keep: shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
