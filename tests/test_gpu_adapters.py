"""benchmarks/gpu_adapters.py, the check a session with a GPU runs, dry-run on the CPU so that it still runs when a
GPU is lent: every family loads from a saved folder and answers, and a batching fault is reported as a failure. No
speed is asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_adapters.py"


def test_dry_run_on_cpu_passes_every_check(tmp_path):
    out = tmp_path / "report.json"
    args = ["--device", "cpu", "--n", "2", "--throughput-n", "1", "--batch-sizes", "1", "--json", str(out)]
    r = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "every check passed" in r.stdout
    rep = json.loads(out.read_text())
    assert [f["family"] for f in rep["families"]] == ["qwen2_5_vl", "qwen3_vl", "gemma3", "llava_onevision"]
    for f in rep["families"]:
        assert f["on_device"] and f["dtypes_right"] and f["batch4_vs_batch1"] == f["n"] == 2, f
        assert f["device_vs_cpu"] == 2 and f["max_logit_diff"] == 0.0, f          # the CPU against itself
    (t,) = rep["throughput"]
    assert t["questions"] == 1 and t["image_tokens_per_question"] == 3 * 256, t   # 448 px / 14 px patches, 2x2 merge


def test_a_batching_fault_is_a_failure(tmp_path, monkeypatch):
    "An adapter whose batches answer differently from its single questions fails the check (status 1 in the script)."
    g = load_script("benchmarks/gpu_adapters.py")
    from spatialvqa import vlm
    real = vlm.HFVLM.predict
    def skewed(self, batch):   # batches of more than one question answer the first question's text for all
        out = real(self, batch)
        return out if len(batch) == 1 or self.batch_size == 1 else ["skew"] * len(out)
    monkeypatch.setattr(vlm.HFVLM, "predict", skewed)
    inputs = vlm.tiny_inputs(tmp_path / "in", n=2, views=1)
    r = g.check_family("gemma3", g.saved(g.FAMILIES["gemma3"], tmp_path / "gemma3"), inputs, "cpu")
    assert r["batch4_vs_batch1"] == 0 and r["device_vs_cpu"] == 2, r
    assert g.family_failures(r) == ["gemma3: batches of 4 answer differently from batches of 1"]
