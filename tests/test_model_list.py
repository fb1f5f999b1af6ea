"""One model list: a VLM added under `infer.models` in params.yaml is run, scored and tabled without editing `dvc.yaml`
or any other list. Checked on a copy of params.yaml with a fake model added: the derived model list, the expanded
pipeline, and DVC's own graph of it."""
from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from spatialvqa.models.commands import scored_models
from test_pipeline_ownership import ROOT, declared, owns, stages

FAKE = {"adapter": "openai", "representation": "three_views",
        "config": {"model": "Qwen/Qwen2.5-VL-7B-Instruct", "base_url": "http://127.0.0.1:8000/v1", "max_tokens": 32}}


def params_with_fake():
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    q = copy.deepcopy(p)
    q["infer"]["models"]["my_new_vlm"] = FAKE
    return p, q


def test_scored_models_follow_infer_models():
    p, q = params_with_fake()
    before = scored_models(p["infer"]["models"])
    assert before == list(p["infer"]["models"]) and len(before) >= 5
    assert scored_models(q["infer"]["models"]) == [*before, "my_new_vlm"]
    assert "score" not in p                                  # no second list of models in params.yaml


def test_new_model_needs_no_dvc_yaml_edit():
    p, q = params_with_fake()
    st = stages(ROOT, q)                     # the unchanged dvc.yaml, expanded with the new params
    out = "results/predictions/my_new_vlm.jsonl"
    assert [o for o, _, _ in declared(st["infer@my_new_vlm"])][0] == out
    assert any(owns(d, out) for d in st["score"]["deps"]), "the score stage must depend on the new model's predictions"
    names = [*p["infer"]["models"], "my_new_vlm"]
    for s in ("score", "tables", "figures"):                 # no stage after infer names a model
        text = yaml.safe_dump(st[s])
        assert not [m for m in names if re.search(rf"\b{m}\b", text)], (s, [m for m in names if re.search(rf"\b{m}\b", text)])


def test_dvc_orders_the_new_model_before_score(tmp_path):
    "DVC's own graph of the unchanged dvc.yaml with the new model: infer@my_new_vlm runs before score."
    _, q = params_with_fake()
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(q, sort_keys=False))
    dvc = Path(sys.executable).with_name("dvc")
    subprocess.run([str(dvc), "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    dot = subprocess.run([str(dvc), "dag", "--dot"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    edges = {tuple(x.strip().strip('";').split('" -> "')) for x in dot.splitlines() if "->" in x}
    assert ("infer@my_new_vlm", "score") in edges, dot
    assert {(f"infer@{m}", "score") for m in q["infer"]["models"]} <= edges
    assert ("score", "tables") in edges and ("tables", "figures") in edges
