"""The library reads in data order: every `spatialvqa.X` import of an exported module (at the top or inside a
function, by `import`, `from ... import` or `importlib.import_module("spatialvqa.X")`) goes to a module whose
notebook has a lower number, so there is no cycle and no module reaches back to a later phase."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "spatialvqa"


def notebook_order(nbs: Path = ROOT / "nbs") -> dict[str, tuple[int, str]]:
    "Module name -> (number, notebook stem), from the `#| default_exp` of every numbered library notebook."
    out: dict[str, tuple[int, str]] = {}
    for p in sorted(nbs.glob("[0-9]*.ipynb")):
        for c in json.loads(p.read_text())["cells"]:
            m = re.match(r"#\|\s*default_exp\s+(\S+)", "".join(c["source"]).strip())
            if c["cell_type"] == "code" and m:
                assert m.group(1) not in out, f"{m.group(1)} exported by two notebooks: {out[m.group(1)][1]} and {p.stem}"
                out[m.group(1)] = (int(re.match(r"\d+", p.stem).group()), p.stem)
                break
    return out


def imports_of(source: str, module: str, modules: set[str] | None = None) -> set[str]:
    """The `spatialvqa` modules that `source` (the module `module`) imports, anywhere in it. A string constant that
    names one of `modules` ("spatialvqa.x": `importlib.import_module` arguments, plugin lists) counts as an import."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith(PKG + ".")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:                                   # from .x import y / from . import x
                base = node.module.split(".")[0] if node.module else None
                found |= {base} if base else {a.name for a in node.names}
            elif node.module == PKG: found |= {a.name for a in node.names}
            elif node.module and node.module.startswith(PKG + "."): found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(PKG + r"\.\w+", node.value):
            if modules is None or node.value.split(".")[1] in modules: found.add(node.value.split(".")[1])
    return found - {module}


def graph(pkg: Path = ROOT / PKG) -> dict[str, set[str]]:
    "Module -> the spatialvqa modules it imports, for every exported module."
    files = [p for p in sorted(pkg.glob("*.py")) if not p.stem.startswith("_")]
    return {p.stem: imports_of(p.read_text(), p.stem, {f.stem for f in files}) for p in files}


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
    order = {"core": (0, "00_core"), "stats": (1, "01_stats"), "mid": (20, "20_mid"), "late": (40, "40_late"), "cli": (49, "49_cli")}
    assert violations({"mid": imports_of(src, "mid", set(order))}, order) == ["mid (20_mid) imports cli (49_cli)", "mid (20_mid) imports late (40_late)"]
    assert violations({"mid": {"ghost"}}, order) == ["mid imports spatialvqa.ghost, which no notebook exports"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
