"""Does the pipeline reproduce itself byte for byte? Two ways to ask:

    python benchmarks/check_repro.py compare TREE_A TREE_B [--paths results figures]
        the files under `paths` that differ between two result trees (two checkouts, or two copies of results/ and
        figures/), and those only one of them has; exit status 1 when any differs

    python benchmarks/check_repro.py run --stages ctsvqa_score,tables [--threads 1,2] [--keep DIR]
        runs `dvc repro -f -s STAGE` for each stage once per thread setting (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
        MKL_NUM_THREADS, torch's default threads, and a different PYTHONHASHSEED each time, so set iteration order
        changes too), copies the files each stage declares (outs, metrics, plots, and the executed notebook under
        reports/notebooks/, whose clocks the runner moves to reports/times/) after each setting, and prints the ones
        that differ between settings. The stages' inputs must be in the working tree. `make repro-check` runs it
        (STAGES=..., THREADS=...).

Exit status: 0 when every file is identical, 1 when some differ, 2 on a usage error or a failed stage.
"""
from __future__ import annotations

import argparse
import filecmp
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
_VAR = re.compile(r"\$\{\s*([^}]+?)\s*\}")


def _lookup(ctx: dict, dotted: str):
    v = ctx
    for k in dotted.split("."):
        v = v[k]
    return v


def _interpolate(obj, ctx: dict):
    if isinstance(obj, str):
        m = _VAR.fullmatch(obj.strip())
        if m: return _lookup(ctx, m.group(1))
        return _VAR.sub(lambda m: str(_lookup(ctx, m.group(1))), obj)
    if isinstance(obj, list): return [_interpolate(v, ctx) for v in obj]
    if isinstance(obj, dict): return {_interpolate(k, ctx): _interpolate(v, ctx) for k, v in obj.items()}
    return obj


def stage_outputs(root: Path = ROOT) -> dict[str, list[str]]:
    "Each dvc.yaml stage (`name@key` for foreach stages) -> the paths it declares (outs, metrics, plots), resolved."
    ctx = dict(yaml.safe_load((root / "params.yaml").read_text()))
    dvc = yaml.safe_load((root / "dvc.yaml").read_text())
    for v in dvc.get("vars") or []:
        if isinstance(v, dict): ctx.update(v)
    out: dict[str, list[str]] = {}
    for name, st in (dvc.get("stages") or {}).items():
        items = {}
        if "foreach" in st:
            each = _interpolate(st["foreach"], ctx)
            for key in (each if isinstance(each, dict) else {k: k for k in each}):
                items[f"{name}@{key}"] = _interpolate(st["do"], {**ctx, "key": key})
        else: items[name] = st
        for full, s in items.items():
            paths = []
            for kind in ("outs", "metrics", "plots"):
                for o in s.get(kind) or []:
                    paths.append(next(iter(o)) if isinstance(o, dict) else o)
            out[full] = [str(_interpolate(p, ctx)) for p in paths]
    return out


def files_under(base: Path, rels) -> dict[str, Path]:
    "Every file at or under each relative path of `rels` in `base`: relative path -> file."
    found = {}
    for rel in rels:
        p = base / rel
        if p.is_file(): found[str(rel)] = p
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file(): found[str(f.relative_to(base))] = f
    return found


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def compare(a: Path, b: Path, rels) -> list[str]:
    "Lines naming every file that differs between trees `a` and `b` (or is in one only); empty when all are identical."
    fa, fb = files_under(a, rels), files_under(b, rels)
    lines = []
    for rel in sorted(set(fa) | set(fb)):
        if rel not in fb: lines.append(f"only in {a}: {rel}")
        elif rel not in fa: lines.append(f"only in {b}: {rel}")
        elif not filecmp.cmp(fa[rel], fb[rel], shallow=False):
            lines.append(f"differs: {rel}  ({digest(fa[rel])} vs {digest(fb[rel])})")
    print(f"{len(set(fa) | set(fb))} files compared, {len(lines)} differ")
    return lines


def thread_env(n: int, hashseed: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n), MKL_NUM_THREADS=str(n), PYTHONHASHSEED=str(hashseed),
               HF_HUB_OFFLINE="1", SPATIALVQA_PROGRESS="0")
    env.setdefault("NLTK_DATA", str(ROOT / ".venv" / "nltk_data"))
    return env


def run(stages: list[str], threads: list[int], keep: Path | None) -> int:
    outs = stage_outputs()
    unknown = [s for s in stages if s not in outs]
    if unknown: print(f"unknown stage(s): {unknown}", file=sys.stderr); return 2
    rels = [p for s in stages for p in outs[s]]
    work = keep or Path(tempfile.mkdtemp(prefix="check_repro-"))
    snaps = []
    for i, n in enumerate(threads):
        env = thread_env(n, hashseed=1 + i)
        for s in stages:
            t = time.monotonic()
            r = subprocess.run(["dvc", "repro", "-f", "-s", s], cwd=ROOT, env=env, capture_output=True, text=True)
            if r.returncode:
                print(r.stdout[-3000:], r.stderr[-3000:], sep="\n", file=sys.stderr)
                print(f"{s} failed with {n} threads", file=sys.stderr); return 2
            print(f"{s}: {n} thread(s), PYTHONHASHSEED={1 + i}: {time.monotonic() - t:.0f} s")
        snap = work / f"threads-{n}"
        for rel, f in files_under(ROOT, rels).items():
            (snap / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, snap / rel)
        snaps.append(snap)
    bad = []
    for other in snaps[1:]:
        bad += compare(snaps[0], other, rels)
    print("\n".join(bad) if bad else f"identical bytes under every setting ({', '.join(map(str, threads))} threads)")
    print(f"snapshots in {work}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="the files that differ between two result trees")
    c.add_argument("a", type=Path); c.add_argument("b", type=Path)
    c.add_argument("--paths", nargs="+", default=["results", "figures"])
    r = sub.add_parser("run", help="run stages under several thread settings and compare their outputs")
    r.add_argument("--stages", required=True, help="comma-separated dvc.yaml stages (their inputs must exist)")
    r.add_argument("--threads", default="1,2", help="comma-separated thread counts, one run each")
    r.add_argument("--keep", type=Path, help="folder for the snapshots (default: a temporary folder)")
    a = ap.parse_args(argv)
    if a.cmd == "compare":
        lines = compare(a.a, a.b, a.paths)
        print("\n".join(lines) if lines else "identical")
        return 1 if lines else 0
    return run([s.strip() for s in a.stages.split(",") if s.strip()], [int(x) for x in a.threads.split(",")], a.keep)


if __name__ == "__main__":
    sys.exit(main())
