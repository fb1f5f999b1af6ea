"""Every DVC stage lists the code it runs: the import closure of its notebook (scripts/stage_deps.py), so that a change
to any module a stage runs makes the stage `changed` in `dvc status`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SD = load_script("scripts/stage_deps.py")
DVC = Path(sys.executable).parent / "dvc"


def _root_with(tmp_path: Path, dvc_yaml: str) -> Path:
    "A project root that shares this one's package and notebooks but has its own dvc.yaml."
    for name in ("spatialvqa", "nbs", "pyproject.toml"): (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "dvc.yaml").write_text(dvc_yaml)
    return tmp_path


def test_every_stage_lists_the_closure_of_its_notebook():
    gone = SD.missing()
    assert not gone, "stages whose deps leave out modules they run:\n" + "\n".join(f"{s}: {m}" for s, m in gone.items())
    assert len(SD.needed()) >= 30                                      # every stage with a notebook was looked at


def test_lazy_and_plugin_imports_count():
    g = SD.module_graph()
    assert "vlm" in g["models.registry"]              # an adapter module loaded through the entry-point group
    assert "agents" in g["validate.answerers"]       # the specialists, through theirs
    assert "inflate" in SD.closure({"measure"}, g)    # imported inside a function


def test_the_check_fails_when_a_module_is_removed(tmp_path):
    text = (ROOT / "dvc.yaml").read_text()
    stage = next(s for s, mods in SD.needed().items() if not SD.declared(SD.stages()[s])[1] and "inflate" in mods)
    cut = "".join(l for l in text.splitlines(keepends=True) if l.strip() != "- spatialvqa/inflate.py")
    assert cut != text
    gone = SD.missing(_root_with(tmp_path, cut))
    assert "inflate" in gone.get(stage, []), gone


def test_a_subpackage_folder_covers_its_modules(tmp_path):
    "A stage that runs every module of a subpackage lists its folder (`spatialvqa/questions`); without it, it misses them."
    text, modules = (ROOT / "dvc.yaml").read_text(), set(SD.module_graph())
    stage = next(s for s, mods in SD.needed().items() if "spatialvqa/questions" in SD.code_deps(mods, modules))
    sub = {m for m in modules if m.startswith("questions.")}
    assert len(sub) > 5 and sub <= SD.declared(SD.stages()[stage], modules)[0]
    cut = "".join(l for l in text.splitlines(keepends=True) if l.strip() != "- spatialvqa/questions")
    assert cut != text
    assert sub <= set(SD.missing(_root_with(tmp_path, cut)).get(stage, []))


def test_touching_a_module_a_stage_runs_makes_it_changed(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    for f in ("dvc.yaml", "dvc.lock"): shutil.copy(ROOT / f, clone / f)     # the working tree's, committed or not
    stage = "measure"
    assert "inflate" in SD.needed(clone)[stage]
    with open(clone / "spatialvqa" / "inflate.py", "a") as f: f.write("\n# touched\n")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    out = subprocess.run([str(DVC), "status", stage, "--json"], cwd=clone, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    changed = json.loads(out.stdout).get(stage, [])
    deps = {k: v for d in changed if isinstance(d, dict) for k, v in d.get("changed deps", {}).items()}
    assert deps.get("spatialvqa/inflate.py") == "modified", changed


def test_a_file_the_params_name_is_a_dep(tmp_path):
    """A stage whose params name a file another stage writes (infer.models' patient atlases read their `pool`,
    data/benchmark/questions.jsonl) lists it among its deps; cut from the draws stage's deps, the check names it."""
    text = (ROOT / "dvc.yaml").read_text()
    assert SD.param_files() == {}
    lines = text.splitlines(keepends=True)
    at = next(i for i, l in enumerate(lines) if l.startswith("  draws:"))
    cut_at = next(i for i in range(at, len(lines)) if lines[i].strip().startswith("- data/benchmark/questions.jsonl"))
    cut = "".join(lines[:cut_at] + lines[cut_at + 1:])
    for name in ("params.yaml",): (tmp_path / name).symlink_to(ROOT / name)
    assert SD.param_files(_root_with(tmp_path, cut)) == {"draws": ["data/benchmark/questions.jsonl"]}
