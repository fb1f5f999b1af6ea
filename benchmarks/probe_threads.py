"""The probe (`infer.models.probe`) under different thread settings: each setting runs in its own process with
OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS and torch's threads set to N, computes the CT features of the
probe's cohort afresh (a temporary feature cache) and answers the benchmark. Prints, per pair of settings, how many
features and answers differ, and the seconds each setting took. Before the fix the encoder ran on whatever threads
torch had, and its features moved with them; now it runs on `vlm.PROBE_THREADS` and the head reads features rounded
to `vlm.FEATURE_DECIMALS`.

    python benchmarks/probe_threads.py [--threads 1,3] [--benchmark data/benchmark/validated.jsonl] [--scans N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, numpy as np, torch
n, bench, cache, out, scans, encoder = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "1"
torch.set_num_threads(n)
from spatialvqa import vlm
from spatialvqa.core import load_params, read_records
from spatialvqa.models.protocol import ModelInput
from spatialvqa.models.registry import make_adapter
entry = load_params("infer")["models"]["probe"]
cfg = dict(entry["config"], cache_dir=cache)
if encoder: cfg["threads"] = n            # the encoder itself on n threads: what the probe did before the fix
if scans: cfg["scans"] = ",".join(cfg["scans"].split(",")[:scans])
recs = read_records(bench)
t = time.time()
answers = {}
for decimals in (vlm.FEATURE_DECIMALS, 8):   # as the head reads them now; 8: unrounded, as before
    vlm.FEATURE_DECIMALS = decimals
    probe = make_adapter("probe", cfg)
    probe.prepare(recs)
    answers[str(decimals)] = {r["qid"]: a for r, a in ((r, probe._preds.get(r["qid"])) for r in recs) if a is not None}
feats = {p.name.split("-", 2)[-1]: np.load(p).tolist() for p in sorted(__import__("pathlib").Path(cache).glob("*.npy"))}
json.dump({"seconds": time.time() - t, "torch_threads": torch.get_num_threads(), "answers": answers, "features": feats}, open(out, "w"))
"""

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,3")
    ap.add_argument("--benchmark", default="data/benchmark/validated.jsonl")
    ap.add_argument("--scans", type=int, default=0, help="only the first N scans of the probe's cohort (0: all)")
    ap.add_argument("--encoder-threads", action="store_true",
                    help="run the encoder itself on N threads (config `threads`): the probe as it was before the fix")
    a = ap.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory() as d:
        for n in [int(x) for x in a.threads.split(",")]:
            env = {**os.environ, "OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n), "OPENBLAS_NUM_THREADS": str(n),
                   "SPATIALVQA_PROGRESS": "0", "HF_HUB_OFFLINE": "1"}
            out = Path(d) / f"run{n}.json"
            t = time.time()
            subprocess.run([sys.executable, "-c", CHILD, str(n), a.benchmark, str(Path(d) / f"cache{n}"), str(out), str(a.scans),
                            "1" if a.encoder_threads else "0"], env=env, check=True)
            runs[n] = json.loads(out.read_text())
            print(f"{n} thread(s){' in the encoder' if a.encoder_threads else ' outside'}: {len(runs[n]['features'])} CTs encoded, "
                  f"{len(next(iter(runs[n]['answers'].values())))} answers, "
                  f"{time.time() - t:.0f} s (load average {os.getloadavg()[0]:.1f})", flush=True)
    ns = list(runs)
    base = runs[ns[0]]
    for n in ns[1:]:
        r = runs[n]
        fd = sum(int(x != y) for k in base["features"] for x, y in zip(base["features"][k], r["features"].get(k, [])))
        print(f"{ns[0]} vs {n} threads: {fd} feature values differ (of {sum(len(v) for v in base['features'].values())})")
        for dec, ans in base["answers"].items():
            ad = sum(ans[q] != r["answers"][dec].get(q) for q in ans)
            print(f"   head reading features rounded to {dec} decimals: {ad} answers differ (of {len(ans)})")
