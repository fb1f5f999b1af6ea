"""How long did each DVC stage take? Read from the clocks a `dvc repro` leaves in reports/times/.

    python benchmarks/stage_times.py [--times reports/times] [--reports reports/notebooks] [--markdown] [--wall SECONDS]

Every stage runs its notebook through papermill, which records when the kernel started and when the last cell ended.
`spatialvqa-stage` takes that clock out of the executed copy (so that two runs write the same copy and dvc.lock stays
put) and writes it to `reports/times/<notebook>.json` (`start_time`, `end_time`, `duration`), which neither git nor
DVC tracks; an executed notebook from before that (papermill's `metadata.papermill.start_time` / `end_time` still in
it) is read for its own clock when it has no clock file. A stage with `foreach` (infer@random, ...) leaves
one notebook per entry; they are listed under their stage and summed in its row. Printed: per stage, in the order
`dvc.yaml` lists them, the seconds, the share of the sum, and the time of day it began, then the sum; with
`--wall` (the wall-clock seconds of the whole `dvc repro`, e.g. from `time make repro`) also what DVC itself spent
between and around the notebooks (hashing, checking, starting processes). Run it after a cold `make repro` on a fresh
clone: a stage DVC skipped keeps an older notebook, and its start time shows it (`--since` leaves out notebooks that
began before a given ISO time). A stage whose notebook is missing is named.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def stage_notebooks(dvc_yaml: Path) -> dict[str, str]:
    """Each stage of `dvc_yaml` (in order) and the stem of the executed notebook it writes (`reports/notebooks/<stem>`;
    `<prefix>_*` for a `foreach` stage, one notebook per entry)."""
    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
    out = {}
    for name, st in stages.items():
        cmd = st["do"]["cmd"] if "do" in st else st["cmd"]
        # `spatialvqa-stage NAME` writes reports/notebooks/NAME.ipynb (NAME_<key>.ipynb for each foreach entry)
        out[name] = ((name + "_*" if "foreach" in st else name) if cmd.split()[:2] == ["spatialvqa-stage", name] else None)
    return out


def clocks(reports: Path, times: Path | None = None) -> dict[str, dict]:
    """Each notebook's clock: the clock files under `times` (`<notebook>.json`), and for an executed notebook under
    `reports` with none, papermill's metadata in the notebook itself."""
    out = {}
    for p in sorted(reports.glob("*.ipynb")):
        out[p.stem] = json.loads(p.read_text()).get("metadata", {}).get("papermill") or {}
    for p in sorted(times.glob("*.json")) if times else []: out[p.stem] = json.loads(p.read_text())
    return out


def read_times(reports: Path, since: datetime | None = None, times: Path | None = None) -> list[dict]:
    "One row per notebook with a clock (`clocks`): its name, start, end and seconds."
    rows = []
    for stem, meta in sorted(clocks(reports, times).items()):
        if not meta.get("start_time") or not meta.get("end_time"): continue
        start, end = datetime.fromisoformat(meta["start_time"]), datetime.fromisoformat(meta["end_time"])
        if since and start < since: continue
        rows.append({"notebook": stem, "start": start, "end": end, "seconds": (end - start).total_seconds()})
    return rows


def table(stages: dict[str, str | None], rows: list[dict]) -> tuple[list[dict], list[str]]:
    "Per stage: its notebooks' seconds summed and the earliest start; and the stages with no notebook."
    out, missing = [], []
    for name, stem in stages.items():
        many = bool(stem) and stem.endswith("_*")
        mine = [r for r in rows if stem and (r["notebook"].startswith(stem[:-1]) if many else r["notebook"] == stem)]
        if not mine: missing.append(name); continue
        out.append({"stage": name, "notebooks": len(mine), "seconds": sum(r["seconds"] for r in mine),
                    "start": min(r["start"] for r in mine)})
    return out, missing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--times", default=str(ROOT / "reports" / "times"), help="the stages' clock files")
    ap.add_argument("--reports", default=str(ROOT / "reports" / "notebooks"), help="executed notebooks (older clocks)")
    ap.add_argument("--dvc-yaml", default=str(ROOT / "dvc.yaml"))
    ap.add_argument("--since", help="leave out notebooks that began before this ISO time (e.g. 2026-11-26T16:00+00:00)")
    ap.add_argument("--wall", type=float, help="wall-clock seconds of the whole run: prints what DVC spent besides")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    a = ap.parse_args(argv)
    since = datetime.fromisoformat(a.since) if a.since else None
    rows, missing = table(stage_notebooks(Path(a.dvc_yaml)), read_times(Path(a.reports), since, Path(a.times)))
    if not rows:
        print(f"no stage clocks under {a.times} and no executed notebooks with one under {a.reports}", file=sys.stderr)
        return 2
    total = sum(r["seconds"] for r in rows)
    fmt = lambda s: f"{int(s // 60)} min {s % 60:04.1f} s" if s >= 60 else f"{s:.1f} s"
    if a.markdown:
        print("| stage | notebooks | time | share |\n|:---|---:|---:|---:|")
        for r in sorted(rows, key=lambda r: r["start"]):
            print(f"| `{r['stage']}` | {r['notebooks']} | {fmt(r['seconds'])} | {100 * r['seconds'] / total:.1f}% |")
        print(f"| **sum of the stages** | {sum(r['notebooks'] for r in rows)} | **{fmt(total)}** | 100% |")
        if a.wall: print(f"| DVC around them (of {fmt(a.wall)} wall-clock) | | {fmt(a.wall - total)} | |")
    else:
        print(f"{'stage':32} {'nbs':>4} {'seconds':>9} {'share':>7}  began")
        for r in sorted(rows, key=lambda r: r["start"]):
            print(f"{r['stage']:32} {r['notebooks']:4d} {r['seconds']:9.1f} {100 * r['seconds'] / total:6.1f}%  "
                  f"{r['start']:%H:%M:%S}")
        print(f"{'sum of the stages':32} {sum(r['notebooks'] for r in rows):4d} {total:9.1f}  ({fmt(total)})")
        if a.wall: print(f"{'DVC around them':32} {'':4} {a.wall - total:9.1f}  (wall-clock {fmt(a.wall)})")
    if missing: print(f"no executed notebook for: {', '.join(missing)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
