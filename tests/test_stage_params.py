"""Every stage notebook's `parameters` cell is read by papermill's own parser as Python reads it; every `-p NAME` that a
dvc.yaml command passes is a parameter papermill finds in that stage's notebook; and parameters reach a notebook one way:
the runner (`spatialvqa-stage`, spatialvqa.runner) gives it the params.yaml values the stage lists, so no command spells
out a `${...}` value of params.yaml, and every listed value finds its parameter. papermill's parser reads one
assignment per line and gives up on a line with a second `=` (in a comment too: `# "" = none` lost the `draws`
parameter of the tables stage, and `-p draws ...` then only warned "Passed unknown parameter")."""
from __future__ import annotations

import ast
import logging
import re
import shlex
from pathlib import Path

import nbformat
import pytest
import yaml
from papermill.inspection import inspect_notebook
from papermill.translators import PythonTranslator

ROOT = Path(__file__).resolve().parents[1]
STAGE_NBS = sorted((ROOT / "nbs" / "stages").glob("*.ipynb"))


def parameters_cell(path: Path):
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{path.name}: {len(cells)} cells tagged `parameters` (papermill needs exactly one)"
    return cells[0]


def assigned(src: str) -> list[str]:
    "The names a parameters cell assigns, as Python reads it."
    return [t.id for n in ast.parse(src).body if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)]


def stage_commands(root: Path = ROOT) -> dict[str, str]:
    "Each dvc.yaml stage's cmd string (a `foreach` stage's `do.cmd`), unresolved: `-p` names are literal."
    dvc = yaml.safe_load((root / "dvc.yaml").read_text())
    return {name: (st.get("do") or st)["cmd"] for name, st in dvc["stages"].items()}


def passed(cmd: str) -> tuple[str, list[str]]:
    "(the stage notebook a cmd runs, the names of its `-p` options)."
    words = shlex.split(re.sub(r"\$\{[^}]*\}", "X", cmd))
    stage = words[words.index("spatialvqa-stage") + 1]
    return f"nbs/stages/{stage}.ipynb", [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-p", "--parameter")]


def test_fixtures_found():
    assert len(STAGE_NBS) >= 30
    cmds = stage_commands()
    assert "tables" in cmds and "infer" in cmds
    nb, names = passed(cmds["tables"])
    assert nb == "nbs/stages/tables.ipynb" and "draws" in names


@pytest.mark.parametrize("path", STAGE_NBS, ids=lambda p: p.stem)
def test_parameters_cell_parses(path, caplog):
    "papermill's parser finds every parameter Python assigns, without a warning."
    cell = parameters_cell(path)
    with caplog.at_level(logging.WARNING, logger="papermill"):
        found = [p.name for p in PythonTranslator.inspect(cell)]
    assert not [r.getMessage() for r in caplog.records if "Unable to parse" in r.getMessage()]
    assert found == assigned(cell.source), f"{path.name}: papermill reads {found}"
    assert list(inspect_notebook(str(path))) == found


def test_a_second_equals_sign_loses_the_parameter():
    "The fault this file guards against, shown on papermill itself."
    cell = nbformat.v4.new_code_cell('a = 1\ndraws = "x.parquet"   # "" = none\nb = 2')
    assert [p.name for p in PythonTranslator.inspect(cell)] == ["a", "b"]
    assert assigned(cell.source) == ["a", "draws", "b"]


@pytest.mark.parametrize("stage", sorted(stage_commands()))
def test_dvc_passes_only_known_parameters(stage):
    "Every `-p NAME` of the stage's cmd is a parameter of its notebook (papermill would only warn, and run the default)."
    nb, names = passed(stage_commands()[stage])
    known = set(inspect_notebook(str(ROOT / nb)))
    assert not set(names) - known, f"{stage}: dvc.yaml passes {sorted(set(names) - known)}, which {nb} does not declare"
    assert len(names) == len(set(names)), f"{stage}: a parameter passed twice"


def keys_of(stage: str) -> list[str | None]:
    "The keys a stage runs for, as the runner reads them (`runner.foreach_keys`); [None] for a stage without entries."
    from spatialvqa.runner import foreach_keys, stage_spec
    keys = foreach_keys(stage_spec(stage, ROOT / "dvc.yaml")[2], yaml.safe_load((ROOT / "params.yaml").read_text()))
    return [None] if keys is None else keys


@pytest.mark.parametrize("stage", sorted(stage_commands()))
def test_parameters_arrive_one_way(stage, monkeypatch):
    """A command names files, never a params.yaml value (`${section.name}`): those come from the stage's `params:` list,
    and every value listed there finds a parameter of the notebook (the runner refuses one that does not)."""
    from spatialvqa.runner import stage_parameters_of
    cmd = stage_commands()[stage]
    assert cmd.split()[:2] == ["spatialvqa-stage", stage], cmd
    assert not re.findall(r"\$\{(?!key\})[^}]*\}", cmd), f"{stage}: a params.yaml value spelled out in its cmd"
    monkeypatch.chdir(ROOT)
    for key in keys_of(stage):
        words = shlex.split(cmd.replace("${key}", key or ""))
        given = {words[i + 1]: words[i + 2] for i, w in enumerate(words[:-2]) if w == "-p"}
        nb, values = stage_parameters_of(stage, given, key)
        assert nb == Path("nbs/stages") / f"{stage}.ipynb" and set(given) <= set(values)


def test_a_value_given_two_ways_is_refused(monkeypatch):
    "The runner's guard, on the real pipeline: validate lists its section, so the command may not pass `tol` too."
    from spatialvqa.runner import stage_parameters_of
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match="tol given in the command, but params.yaml gives it"):
        stage_parameters_of("validate", {"tol": 0.5})
