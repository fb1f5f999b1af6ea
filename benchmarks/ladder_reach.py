"""Can a counterfactual copy carry a real organ's volume key to the next option? The step a volume ladder needs,
against the resize a real head-and-neck CT allows.

A real patient's volume question is answered by anatomy alone (`benchmarks/prior_vs_margin.py`). A twin on a copy whose
organ is grown or shrunk by exactly one step of the option ladder moves the key to the neighbouring option with the
text unchanged, so an answerer that reads only the text is right on at most one member of the group
(`spatialvqa.counterfactual.ladder_copies` makes the copies, `ladder_steps` hands their ratio to the generator;
params.yaml `counterfactual.ladders` and `ladder_factors`). This measures, on OpenKBP, for the structures a ladder copy
can resize (glands and organs clear of the scan's border), which rule for judging options a copy can serve:

- `need_down`, `need_up`: the smallest ratio between neighbouring VOL.value options below and above the key, as the
  generator computes it (`ladder_ratios` with params.yaml's inter-reader margins and the grid's tolerances: an option is
  wrong only when it lies beyond both tolerances, widened by the margins, of every measurement within the margins);
  median over the patients;
- `nearest`: the ratio VOL.closest needs instead, whose key is the option nearest every volume within the margin:
  exp(2 x the structure's volume margin) (the generator adds 3 % for rounding, `CLOSEST_SLACK`);
- `x<f>`: for each linear factor, the volume ratio the grid gives (median) and the share of patients where the resize
  passes `ladder_copies`' checks (clear of the scan's border, at most `--max-loss` of any other structure taken, the
  new volume within the anatomical reference range).

A copy moves the key of a ladder only where its volume ratio reaches the step the ladder needs. Measured 2026-11-27 on
30 patients: VOL.value needs x2.1-2.9 above the key and x2.6-5.4 below, which only a parotid tripled in volume reaches
(linear 1.45, half the patients); VOL.closest needs x1.5-2.14, which linear 1.32/0.76 (x2.30/x0.44) gives.

Usage: python benchmarks/ladder_reach.py [--patients 30] [--factors 1.25,1.32,1.45] [--seed 0]
Needs the convert and measure stages' outputs (dvc repro measure). Runs in about 35 s on 2 cores for 30 patients.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from spatialvqa.counterfactual import CounterfactualError, _resize_checked, read_manifests, resizable
from spatialvqa.measure import measure_labels
from spatialvqa.questions.core import Margins, shown
from spatialvqa.questions.distractors import _clear, ladder_ratios
from spatialvqa.questions.generate import contexts_from_tables
from spatialvqa.questions.volume import _ev_vol_value, _vol_tol
from spatialvqa.scan import read_scan


def needs(c, names) -> dict[str, tuple[float | None, float | None]]:
    "Per structure of scan context `c`: `ladder_ratios` of its VOL.value ladder (below, above)."
    out = {}
    for n in names:
        if n not in c.pool or n in c.cut: continue
        s = c.s(n)
        out[n] = ladder_ratios(shown(s.volume_ml, "mL"), _vol_tol(s), _clear(c, "VOL.value", {"a": n}, _ev_vol_value))
    return out


def reach(rec: dict, names, factors, max_loss: float) -> dict[tuple[str, float], float | None]:
    "Per (structure, linear factor): the volume ratio of the resize where it passes the checks, else None."
    scan = read_scan(rec["labels"], rec.get("image") or None, str(rec["scan_id"]))
    lab = scan.labels
    ss = {s.name: s for s in measure_labels(lab.array, lab.affine, components=False, labelmap=rec.get("label_names"))}
    out = {}
    for n in names:
        for f in factors:
            try: out[n, f] = _resize_checked(scan, ss, n, f, rec.get("label_names"), max_loss)[1]["volume_ratio"]
            except (CounterfactualError, KeyError): out[n, f] = None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = Path(__file__).resolve().parents[1]          # defaults: this repository's files, from any folder
    ap.add_argument("--structures", type=Path, default=root / "results/measure/structures.parquet")
    ap.add_argument("--scans", type=Path, default=root / "results/measure/scans.parquet")
    ap.add_argument("--manifest", type=Path, default=root / "data/scans/scans.json")
    ap.add_argument("--params", type=Path, default=root / "params.yaml")
    ap.add_argument("--patients", type=int, default=30, help="OpenKBP patients resized (drawn with --seed; 0: all 116)")
    ap.add_argument("--factors", default="1.25,1.32,1.45", help="linear factors above 1, each tried with its inverse")
    ap.add_argument("--max-loss", type=float, default=None, help="default: params.yaml counterfactual.max_loss")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    missing = [str(p) for p in (args.structures, args.scans, args.manifest, args.params) if not p.is_file()]
    if missing: sys.exit(f"ladder_reach: not found: {', '.join(missing)} (dvc repro measure writes them)")
    params = yaml.safe_load(open(args.params))
    margins = Margins.from_dict(params["generate"]["margins"])
    max_loss = params["counterfactual"]["max_loss"] if args.max_loss is None else args.max_loss
    ups = [float(x) for x in args.factors.split(",")]
    if any(f <= 1 for f in ups): sys.exit("ladder_reach: --factors are linear factors above 1")
    factors = [f for u in ups for f in (u, 1 / u)]
    st, sc = pd.read_parquet(args.structures), pd.read_parquet(args.scans)
    keep = sc[(sc["source"] == "openkbp") & sc["counterfactual"].isna()]["scan_id"].astype(str)
    ctx = contexts_from_tables(st[st["scan_id"].isin(keep)], sc[sc["scan_id"].isin(keep)], 50, margins)
    names = sorted({n for c in ctx.values() for n in c.pool if resizable(n)})
    recs = {str(r["scan_id"]): r for r in read_manifests([args.manifest]) if str(r["scan_id"]) in ctx}
    ids = sorted(recs)
    if 0 < args.patients < len(ids):
        ids = sorted(np.random.default_rng(args.seed).choice(ids, args.patients, replace=False).tolist())
    need = {sid: needs(ctx[sid], names) for sid in ctx}
    got = {sid: reach(recs[sid], names, factors, max_loss) for sid in ids}
    rows = []
    for n in names:
        nd = [need[s][n] for s in need if n in need[s]]
        row = dict(structure=n, patients=len(nd),
                   need_down=np.nanmedian([d if d else np.nan for d, _ in nd]) if nd else None,
                   need_up=np.nanmedian([u if u else np.nan for _, u in nd]) if nd else None,
                   nearest=math.exp(2 * margins.of("volume", n)))
        for f in factors:
            r = [got[s][n, f] for s in ids if (n, f) in got[s]]
            ok = [x for x in r if x is not None]
            row[f"x{f:.3g}"] = f"{np.median(ok):.2f} ({len(ok)}/{len(r)})" if ok else f"- (0/{len(r)})"
        rows.append(row)
    df = pd.DataFrame(rows)
    print(f"OpenKBP: VOL.value ladder steps needed ({len(ctx)} patients) and what a resize reaches "
          f"({len(ids)} patients,"
          f" max_loss {max_loss}): volume ratio, median (patients where both the resize passes)")
    print(df.to_markdown(index=False, floatfmt=".2f"))
    for n, r in zip(names, rows):
        up_ok = [f for f in ups if r["need_up"] and np.isfinite(r["need_up"]) and f ** 3 >= r["need_up"]]
        print(f"{n}: the smallest linear factor whose volume ratio reaches the step above the key: "
              f"{min(up_ok) if up_ok else 'none of ' + args.factors}; for VOL.closest: "
              f"{r['nearest'] ** (1 / 3):.3f}")


if __name__ == "__main__":
    main()
