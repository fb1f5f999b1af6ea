"""The library reads in data order: every `spatialvqa.X` import of an exported module (at the top or inside a
function, by `import`, `from ... import` or `importlib.import_module("spatialvqa.X")`) goes to a module whose
notebook has a lower number, so there is no cycle and no module reaches back to a later phase."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
PKG = "spatialvqa"
SD = load_script("scripts/stage_deps.py")


def notebook_order(nbs: Path = ROOT / "nbs") -> dict[str, tuple[tuple[int, ...], str]]:
    """Module name -> (number, notebook), from the `#| default_exp` of every numbered library notebook. A subpackage's
    notebooks sit in a numbered folder (`24_validate/01_answerers.ipynb`: number (24, 1)), read in its order."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for p in load_script("scripts/nb_style.py").library_notebooks(nbs):
        rel = p.relative_to(nbs).with_suffix("")
        number = tuple(int(re.match(r"\d+", part).group()) for part in rel.parts)
        for c in json.loads(p.read_text())["cells"]:
            m = re.match(r"#\|\s*default_exp\s+(\S+)", "".join(c["source"]).strip())
            if c["cell_type"] == "code" and m:
                assert m.group(1) not in out, f"{m.group(1)} exported by two notebooks: {out[m.group(1)][1]} and {rel}"
                out[m.group(1)] = (number, str(rel))
                break
    return out


def imports_of(source: str, module: str, modules: set[str]) -> set[str]:
    """The `spatialvqa` modules of `modules` that `source` (the module `module`, dotted below the package) imports,
    anywhere in it (scripts/stage_deps.py's reading: relative imports, lazy ones, module names as strings)."""
    return SD._imports(ast.parse(source), set(modules), module) - {module}


def graph(pkg: Path = ROOT / PKG) -> dict[str, set[str]]:
    "Module -> the spatialvqa modules it imports, for every exported module (`validate.chance` for a subpackage's)."
    files = SD.module_files(pkg.parent)
    return {m: imports_of(p.read_text(), m, set(files)) for m, p in files.items()}


def violations(g: dict[str, set[str]], order: dict[str, tuple[int, str]]) -> list[str]:
    "Every import that goes to an unknown module or to one with the same or a higher notebook number."
    bad = []
    for m, deps in sorted(g.items()):
        for d in sorted(deps):
            if d not in order: bad.append(f"{m} imports spatialvqa.{d}, which no notebook exports")
            elif order[d][0] >= order[m][0]: bad.append(f"{m} ({order[m][1]}) imports {d} ({order[d][1]})")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    "Import cycles (each as the path that closes it), by depth-first search."
    found, state = [], {}
    def visit(n, path):
        state[n] = "open"
        for d in sorted(g.get(n, ())):
            if state.get(d) == "open": found.append(path[path.index(d):] + [d])
            elif d not in state: visit(d, path + [d])
        state[n] = "done"
    for n in sorted(g):
        if n not in state: visit(n, [n])
    return found


def test_every_module_has_a_notebook():
    order = notebook_order()
    assert set(graph()) == set(order), f"modules without a notebook: {set(graph()) - set(order)}; notebooks without a module: {set(order) - set(graph())}"


def test_imports_go_to_lower_numbers_only():
    bad = violations(graph(), notebook_order())
    assert not bad, "imports that reach forward or sideways:\n" + "\n".join(bad)


def test_no_import_cycle():
    assert not cycles(graph())


def test_the_checks_can_fail():
    src = "import os\nfrom .core import x\ndef f():\n    from spatialvqa import late\n    import spatialvqa.stats\n" \
          "PLUGINS = ('spatialvqa.cli',)\nGROUP = 'spatialvqa.adapters'\n"
    assert imports_of(src, "mid", {"core", "late", "stats", "cli", "mid"}) == {"core", "late", "stats", "cli"}
    order = {"core": ((0,), "00_core"), "stats": ((1,), "01_stats"), "mid": ((20,), "20_mid"), "late": ((40,), "40_late"),
             "cli": ((49,), "49_cli")}
    assert violations({"mid": imports_of(src, "mid", set(order))}, order) == ["mid (20_mid) imports cli (49_cli)", "mid (20_mid) imports late (40_late)"]
    sub = "from .answerers import x\nfrom ..core import y\nfrom spatialvqa.validate import chance\n"
    assert imports_of(sub, "validate.pipeline", {"core", "validate.answerers", "validate.chance", "validate.pipeline"}) == \
        {"core", "validate.answerers", "validate.chance"}
    order |= {"validate.answerers": ((24, 1), "24_validate/01_answerers"), "validate.pipeline": ((24, 3), "24_validate/03_pipeline")}
    assert violations({"validate.answerers": {"validate.pipeline", "core"}}, order) == \
        ["validate.answerers (24_validate/01_answerers) imports validate.pipeline (24_validate/03_pipeline)"]
    assert violations({"mid": {"ghost"}}, order) == ["mid imports spatialvqa.ghost, which no notebook exports"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
