"""Byte for byte: the library's writers give the same bytes whatever the thread settings (OMP, MKL, OpenBLAS, torch)
and the string hash seed, shown on fixtures: Table 2 and its values, a figure with its CSV, the probe on the toy CTs,
and the text metrics with SBERT. Two processes run the same script under different settings; their files must be equal.
Also `benchmarks/check_repro.py compare` on two trees."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import sys, torch
from pathlib import Path
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(int(sys.argv[2]))
import matplotlib; matplotlib.use("Agg")
from spatialvqa.results.scores import score_models
from spatialvqa.results.pairs import toy_pairs
from spatialvqa.results.table2 import table2_values, table2, chance_values
from spatialvqa.results.writers import write_table
from spatialvqa.results.breakdowns import score_metrics
from spatialvqa import figures as F
from spatialvqa.core import save_figure, write_csv, write_json, RESULT_DIGITS
recs, preds = toy_pairs()
scored = score_models(recs, preds)
values = table2_values(scored, n_boot=300)
write_csv(values, out / "table2_values.csv")
write_table(table2(values, chance=chance_values(scored)), out / "table2", "caption", latex=True)
write_json(score_metrics(scored), out / "metrics.json", digits=RESULT_DIGITS)
fig = F.plot_task_bars(values)
save_figure(fig if not isinstance(fig, tuple) else fig[0], out / "task_accuracy.png", values)
from spatialvqa.ctsvqa.metrics import text_metrics
m = text_metrics(["The liver is enlarged.", "No lesion in the left kidney.", "right lung"],
                 ["Hepatomegaly.", "The left kidney has no lesion.", "In the right lung."], meteor=False)
write_json(m, out / "text_metrics.json", digits=RESULT_DIGITS)
from spatialvqa.models.protocol import ModelInput
from spatialvqa.vlm import Probe, toy_probe_records, toy_extractor
from spatialvqa.embed import sbert_embed
toy = toy_probe_records(out / "toy")
probe = Probe(folds=2, encoder="toy", cache_dir=str(out / "probe_cache"), extractor=toy_extractor)   # real MiniLM text embeddings
probe.prepare(toy)
(out / "probe.txt").write_text("\n".join(probe.predict([ModelInput(r, "", [], None, {}) for r in toy])) + "\n")
"""


def _run(folder: Path, threads: int, hashseed: int):
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "PYTHONHASHSEED": str(hashseed), "SPATIALVQA_PROGRESS": "0", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(threads)], env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]


def test_same_bytes_whatever_the_threads(tmp_path):
    _run(tmp_path / "a", 1, 1)
    _run(tmp_path / "b", 3, 2)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file() and "probe_cache" not in p.parts
                   and "toy" not in p.parts)
    assert {"table2_values.csv", "table2.csv", "table2.md", "table2.tex", "metrics.json", "task_accuracy.png", "task_accuracy.csv",
            "text_metrics.json", "probe.txt"} <= {str(f) for f in files}
    differ = [str(f) for f in files if (tmp_path / "a" / f).read_bytes() != (tmp_path / "b" / f).read_bytes()]
    assert not differ, differ
    assert b"Matplotlib" not in (tmp_path / "a" / "task_accuracy.png").read_bytes()
    assert "0.2123101052573635" not in (tmp_path / "a" / "table2_values.csv").read_text()   # no raw float noise
    longest = max(len(x.split("e")[0].lstrip("-").replace(".", "").lstrip("0")) for x in
                  (tmp_path / "a" / "table2_values.csv").read_text().replace("\n", ",").split(",") if x.replace(".", "").replace("-", "").isdigit())
    assert longest <= 4, longest                                                          # 4 significant digits at most


def test_check_repro_compare(tmp_path):
    for side in ("a", "b"):
        (tmp_path / side / "results").mkdir(parents=True)
        (tmp_path / side / "results" / "t.csv").write_text("x\n0.1235\n")
    same = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "check_repro.py"), "compare", str(tmp_path / "a"), str(tmp_path / "b")],
                          capture_output=True, text=True)
    assert same.returncode == 0 and "identical" in same.stdout
    (tmp_path / "b" / "results" / "t.csv").write_text("x\n0.1236\n")
    (tmp_path / "b" / "results" / "new.json").write_text("{}")
    diff = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "check_repro.py"), "compare", str(tmp_path / "a"), str(tmp_path / "b")],
                          capture_output=True, text=True)
    assert diff.returncode == 1 and "differs: results/t.csv" in diff.stdout and "only in" in diff.stdout and "results/new.json" in diff.stdout
