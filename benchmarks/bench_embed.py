"""Embedding the retrieval corpus (all-MiniLM-L6-v2, the bundled copy): passages per second of the previous way
(`SentenceTransformer.encode` in batches of 64 on torch's default threads) beside `embed.sbert_embed` now (each text
alone on one thread, so that its vector depends on the text only; `workers` processes; the content-hash cache), cold
and warm (a rerun: every vector from the cache). Also checks that the new vectors do not depend on the workers.

    python benchmarks/bench_embed.py [--n 256] [--workers 2]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from spatialvqa import embed as E
from spatialvqa.retrieval import report_passages

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--reports", default="data/external/ct-spatialvqa/reports/validation_reports_output.json")
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    texts = [p["text"] for p in report_passages(a.reports, 60)][:a.n]
    st = E.load_sbert(); st.encode(texts[:4])          # loaded and warmed up once, outside the timings
    print(f"{len(texts)} report passages, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    t = time.perf_counter()
    st.encode(texts, batch_size=64, show_progress_bar=False, convert_to_numpy=True, normalize_embeddings=True)
    before = time.perf_counter() - t
    print(f"{'before: encode(batch 64, default threads)':<52} {len(texts) / before:8.1f} passages/s")
    with tempfile.TemporaryDirectory() as d:
        runs = {}
        for name, kw in (("now, cold: alone, 1 thread, 1 process", dict(workers=1)),
                         (f"now, cold: alone, 1 thread, {a.workers} processes", dict(workers=a.workers)),
                         ("now, warm: every vector from the cache", dict(workers=1, cache=d))):
            E._SBERT_CACHE.clear()
            if "warm" in name: E.sbert_embed(texts, cache=d); E._SBERT_CACHE.clear()   # fill the cache first
            t = time.perf_counter(); runs[name] = E.sbert_embed(texts, **kw); s = time.perf_counter() - t
            print(f"{name:<52} {len(texts) / s:8.1f} passages/s")
        v = list(runs.values())
        print("vectors identical across workers and the cache:", all(np.array_equal(v[0], x) for x in v[1:]),
              f"(load average now {os.getloadavg()[0]:.1f})")
