"""Why real-patient multiple-choice questions rarely survive the blind filter: how much a quantity varies between
patients against the spacing its options need.

For every OpenKBP original scan (116 patients) and every quantity a numeric multiple-choice question reads (organ
volumes, extents along each axis, distances between the centres the DIST questions use), this prints:

- `between`: the quantity's spread between patients, the standard deviation of its logarithm;
- `step`: the log of the smallest ratio between neighbouring options, `spatialvqa.questions.distractors.ladder_ratios` on the
  median patient (the larger of the two sides), with params.yaml's inter-reader margins and the grid's tolerances;
- `blind`: the accuracy of an answerer that sees no image and picks the option nearest the median patient, on
  evenly spaced ladders (`spatialvqa.questions.distractors._ladder`) built for every patient with the key at each of the four
  positions in turn (chance 0.25).

When `between` is smaller than `step`, every option but one lies farther from the median patient than the key does
for most patients: an answerer that knows only the average anatomy wins, and the filter rightly drops the question.

Then the same for direction (DIR): for every two of the structures and every axis, the offset between their centres of
mass. A key holds under a second reader when the offset exceeds the two structures' centroid margins (the pair's own
margin for the two parotids) and one voxel along the axis: `answerable` is the share of patients where it does, and
`majority` how often the more frequent sign is right among them (what an answerer that never sees the scan gets; chance
0.5). An offset with `majority` near 1 is anatomy; one near 0.5 that is rarely answerable lies under the margins.

Usage: python benchmarks/prior_vs_margin.py [--structures results/measure/structures.parquet]
       [--scans results/measure/scans.parquet] [--params params.yaml]
Needs the measure stage's outputs (dvc repro measure). Runs in 4 s on 2 cores (measured 2026-11-26).
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from spatialvqa.anatomy import counterpart
from spatialvqa.questions.core import Margins, pair_stem, shown, tol_extent
from spatialvqa.questions.readings import box_distance, phys_extent
from spatialvqa.questions.distractors import _clear, _ladder, ladder_ratios
from spatialvqa.questions.distance import _dist_tol
from spatialvqa.questions.volume import _vol_tol
from spatialvqa.questions.registry import EVALUATORS
from spatialvqa.questions.generate import contexts_from_tables

NAMES = ("brainstem", "parotid_gland_left", "parotid_gland_right", "larynx", "mandible")


def quantities(c):
    "(label, value, tol, subtask, spec) of every numeric quantity a question about scan context `c` can read."
    out = []
    for n in NAMES:
        if n not in c.structs or n in c.cut: continue
        s = c.s(n)
        out.append((f"volume {n}", s.volume_ml, _vol_tol(s), "VOL.value", {"a": n}))
        e = phys_extent(s, c.geom)
        for ax, w in enumerate(("LR", "AP", "SI")):
            out.append((f"extent {w} {n}", float(e[ax]), lambda x, ax=ax: tol_extent(x, ax, c.geom), "EXT.value", {"a": n, "axis": ax}))
    for a, b in itertools.combinations(NAMES, 2):
        if a in c.structs and b in c.structs and not c.cut_of([a, b]):
            out.append((f"distance {a} / {b}", box_distance(c.s(a), c.s(b)), _dist_tol(c.geom), "DIST.value",
                        {"a": a, "b": b, "by": "bbox_center"}))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = Path(__file__).resolve().parents[1]          # defaults: this repository's files, from any folder
    ap.add_argument("--structures", type=Path, default=root / "results/measure/structures.parquet")
    ap.add_argument("--scans", type=Path, default=root / "results/measure/scans.parquet")
    ap.add_argument("--params", type=Path, default=root / "params.yaml")
    args = ap.parse_args(argv)
    missing = [str(p) for p in (args.structures, args.scans, args.params) if not p.is_file()]
    if missing: sys.exit(f"prior_vs_margin: not found: {', '.join(missing)} (the measure stage writes the tables: dvc repro measure)")
    margins = yaml.safe_load(open(args.params))["generate"]["margins"]
    st = pd.read_parquet(args.structures)
    sc = pd.read_parquet(args.scans)
    keep = sc[(sc["source"] == "openkbp") & sc["counterfactual"].isna()]["scan_id"]
    st, sc = st[st["scan_id"].isin(keep)], sc[sc["scan_id"].isin(keep)]
    ctx = contexts_from_tables(st, sc, 50, margins)
    rows: dict[str, list] = {}
    for c in ctx.values():
        for label, v, tol, sub, spec in quantities(c):
            rows.setdefault(label, []).append((c, v, tol, sub, spec))
    out = []
    for label, items in sorted(rows.items()):
        vals = np.array([v for _, v, *_ in items])
        if len(vals) < 20 or (vals <= 0).any(): continue
        med = float(np.median(vals))
        c0, v0, tol0, sub0, spec0 = min(items, key=lambda x: abs(x[1] - med))
        down, up = ladder_ratios(shown(v0, "mm" if sub0 != "VOL.value" else "mL"), tol0, _clear(c0, sub0, spec0, EVALUATORS[sub0]))
        step = max(r for r in (down, up) if r is not None) if (down or up) else math.nan
        rng, right, asked = np.random.default_rng(0), 0, 0
        for c, v, tol, sub, spec in items:
            unit = "mL" if sub == "VOL.value" else "mm"
            for k in range(4):
                lad = _ladder(v, k, tol, unit, rng, None, _clear(c, sub, spec, EVALUATORS[sub]))
                if lad is None: continue
                asked += 1
                right += int(np.argmin([abs(math.log(x / med)) for x in lad]) == k)
        out.append(dict(quantity=label, patients=len(vals), median=round(med, 1), between=round(float(np.log(vals).std()), 3),
                        step=round(math.log(step), 3) if step == step else None, ladders=asked,
                        blind=round(right / asked, 3) if asked else None))
    df = pd.DataFrame(out)
    print(df.to_markdown(index=False))
    ok = df.dropna()
    print(f"\n{int((ok['between'] < ok['step']).sum())} of {len(ok)} quantities vary less between patients than their "
          f"options must be apart; median-patient answerer: {ok['blind'].median():.2f} (median over quantities; chance 0.25)")
    off = offsets(st, sc, Margins.from_dict(margins))
    print("\n" + off.to_markdown(index=False))
    open_ = off[(off["majority"] < 0.75) & (off["answerable"] >= 0.5)]
    print(f"\n{len(open_)} of {len(off)} offsets are answerable for at least half the patients with the majority sign right "
          f"under 75%; median over offsets: answerable {off['answerable'].median():.2f}, majority {off['majority'].median():.2f}")


def offsets(st: pd.DataFrame, sc: pd.DataFrame, margins: Margins) -> pd.DataFrame:
    "Per two structures of `NAMES` and axis: patients, the offset's median and spread, `answerable` and `majority`."
    vox = {s: np.abs(np.asarray([np.asarray(r, float) for r in a])[:3, :3]).sum(axis=1) for s, a in zip(sc["scan_id"], sc["affine"])}
    cen = st.set_index(["scan_id", "name"])[["centroid_x", "centroid_y", "centroid_z"]]
    out = []
    for a, b in itertools.combinations(NAMES, 2):
        scans = sorted(set(st.loc[st["name"] == a, "scan_id"]) & set(st.loc[st["name"] == b, "scan_id"]))
        if len(scans) < 20: continue
        m = margins.of("pair_centroid", pair_stem(a)) if counterpart(a) == b else margins.of("centroid", a) + margins.of("centroid", b)
        d = np.array([cen.loc[(s, a)].to_numpy(float) - cen.loc[(s, b)].to_numpy(float) for s in scans])
        for i, ax in enumerate(("LR", "AP", "SI")):
            thr = np.array([max(float(m[i]), float(vox[s][i])) for s in scans])
            far = d[:, i][np.abs(d[:, i]) > thr]
            out.append(dict(offset=f"{a} - {b}", axis=ax, patients=len(scans), median_mm=round(float(np.median(d[:, i])), 1),
                            sd_mm=round(float(d[:, i].std()), 1), threshold_mm=round(float(np.median(thr)), 1),
                            answerable=round(len(far) / len(scans), 3),
                            majority=round(max(float(np.mean(far > 0)), float(np.mean(far < 0))), 3) if len(far) else None))
    return pd.DataFrame(out)


if __name__ == "__main__":
    main()
