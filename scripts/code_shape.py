"""The shape of the library, in the figures issue 24 sets limits on: long modules, long functions, long exported
notebook cells, and public names defined in more than one module.

    python scripts/code_shape.py [--top 10]

Limits: a module at most MODULE_LINES lines (`_modidx.py` aside), a function at most FUNCTION_LINES, an exported cell
at most CELL_LINES, and at most CROWDED_LINES lines or CROWDED_DEFINITIONS functions and classes (fastcore's cells
hold one idea each; a data table, a cell of assignments only, aside), and every public name (no leading underscore;
`add_cli`, which each module with commands defines, and `log`, a module's logger, aside) defined at module level in
one module only. Lines over LINE_CHARS characters are counted too: the code keeps fastcore's one-line style, which
`ruff format` would undo (it makes the package 44% longer), so long lines are held to a ceiling instead of formatted.
tests/test_code_shape.py prints these figures and holds them to their ceilings, so that a change can shrink them but
never grow them.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nb_style import library_notebooks  # noqa: E402  (the one list of library notebooks)

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES, FUNCTION_LINES, CELL_LINES = 800, 60, 60
LINE_CHARS = 120                                   # ruff's line-length in pyproject.toml
LINE_FOLDERS = ("spatialvqa", "tests", "scripts", "benchmarks")
CROWDED_LINES, CROWDED_DEFINITIONS = 40, 3
SHARED_NAMES = {"add_cli", "log"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    "Module name -> file, for every module of the package (`_modidx` aside)."
    pkg = root / "spatialvqa"
    return {".".join(p.relative_to(root).with_suffix("").parts): p for p in sorted(pkg.rglob("*.py"))
            if p.name != "_modidx.py" and "__pycache__" not in p.parts}


def module_lines(root: Path = ROOT) -> dict[str, int]:
    return {m: len(p.read_text().splitlines()) for m, p in modules(root).items()}


def function_lines(root: Path = ROOT) -> dict[str, int]:
    "`module.function` (methods as `module.Class.method`) -> lines from `def` to its last line, decorators excluded."
    out = {}
    for m, p in modules(root).items():
        def walk(node, prefix):
            for n in ast.iter_child_nodes(node):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{prefix}.{n.name}"] = n.end_lineno - n.lineno + 1
                    walk(n, f"{prefix}.{n.name}")
                elif isinstance(n, ast.ClassDef): walk(n, f"{prefix}.{n.name}")
        walk(ast.parse(p.read_text()), m)
    return out


def exported_cells(root: Path = ROOT) -> dict[str, str]:
    "`notebook#cell-id` -> the code of each exported cell of the library notebooks (subpackages' too), `#|` lines dropped."
    out = {}
    nbs = root / "nbs"
    for nb in library_notebooks(nbs):
        for i, c in enumerate(json.loads(nb.read_text())["cells"]):
            src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            if c["cell_type"] == "code" and re.search(r"^#\|\s*exports?\b", src, re.M):
                out[f"{nb.relative_to(nbs)}#{c.get('id', i)}"] = "\n".join(l for l in src.splitlines() if not l.startswith("#|"))
    return out


def cell_lines(root: Path = ROOT) -> dict[str, int]:
    "`notebook#cell-id` -> lines of each exported code cell (the `#|` directives excluded)."
    return {k: len(code.splitlines()) for k, code in exported_cells(root).items()}


def crowded_cells(root: Path = ROOT) -> dict[str, int]:
    """`notebook#cell-id` -> lines of each exported cell over CROWDED_LINES lines or with more than CROWDED_DEFINITIONS
    functions and classes; a data table (only imports and assignments at the top level) is not counted."""
    out = {}
    for key, code in exported_cells(root).items():
        try: body = ast.parse(code).body
        except SyntaxError: body = []
        if body and all(isinstance(n, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.Expr)) for n in body): continue
        defs = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in body)
        if len(code.splitlines()) > CROWDED_LINES or defs > CROWDED_DEFINITIONS: out[key] = len(code.splitlines())
    return out


def long_lines(root: Path = ROOT) -> dict[str, int]:
    """`path:line` -> characters, for every line over LINE_CHARS in the package (exported code) and the Python of
    tests/, scripts/ and benchmarks/."""
    out = {}
    for folder in LINE_FOLDERS:
        for p in sorted((root / folder).rglob("*.py")):
            if p.name == "_modidx.py" or "__pycache__" in p.parts: continue
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if len(line) > LINE_CHARS: out[f"{p.relative_to(root)}:{i}"] = len(line)
    return out


def _patched(n: ast.FunctionDef) -> bool:
    "A function written with fastcore's `@patch` (`@patch_to`): a method of a class defined elsewhere in the module."
    names = {(d.func if isinstance(d, ast.Call) else d) for d in n.decorator_list}
    return any((x.id if isinstance(x, ast.Name) else getattr(x, "attr", "")) in ("patch", "patch_to") for x in names)


def public_definitions(root: Path = ROOT) -> dict[str, list[str]]:
    "Public name -> the modules that define it at module level (def, class or assignment)."
    seen: dict[str, list[str]] = {}
    for m, p in modules(root).items():
        names = set()
        for n in ast.parse(p.read_text()).body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _patched(n): continue    # a method
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): names.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    names.update(x.id for x in ast.walk(t) if isinstance(x, ast.Name))
        for name in names:
            if not name.startswith("_") and name not in SHARED_NAMES and name != "__all__": seen.setdefault(name, []).append(m)
    return {k: v for k, v in sorted(seen.items()) if len(v) > 1}


def figures(root: Path = ROOT) -> dict[str, dict]:
    "Each limit with what exceeds it: {'modules': {name: lines}, 'functions': ..., 'cells': ..., 'names': {name: modules}}."
    over = lambda d, lim: dict(sorted(((k, v) for k, v in d.items() if v > lim), key=lambda kv: -kv[1]))
    return {"modules": over(module_lines(root), MODULE_LINES), "functions": over(function_lines(root), FUNCTION_LINES),
            "cells": over(cell_lines(root), CELL_LINES), "crowded": over(crowded_cells(root), 0),
            "long_lines": long_lines(root), "names": public_definitions(root)}


def report(f: dict[str, dict], top: int = 10) -> str:
    lines = []
    for key, what, lim in (("modules", "modules over", MODULE_LINES), ("functions", "functions over", FUNCTION_LINES),
                           ("cells", "exported cells over", CELL_LINES)):
        items = list(f[key].items())
        lines.append(f"{len(items)} {what} {lim} lines" + (": " + ", ".join(f"{k} {v}" for k, v in items[:top]) if items else ""))
        if len(items) > top: lines[-1] += f", ... ({len(items) - top} more)"
    n = len(f["crowded"])
    lines.append(f"{n} exported cells over {CROWDED_LINES} lines or with more than {CROWDED_DEFINITIONS} functions and classes (data tables aside)")
    per = {}
    for k in f["long_lines"]: per[k.rsplit(":", 1)[0]] = per.get(k.rsplit(":", 1)[0], 0) + 1
    worst = sorted(per.items(), key=lambda kv: -kv[1])[:3]
    lines.append(f"{len(f['long_lines'])} lines over {LINE_CHARS} characters in {', '.join(LINE_FOLDERS)}"
                 + (" (most: " + ", ".join(f"{k} {v}" for k, v in worst) + ")" if worst else ""))
    lines.append(f"{len(f['names'])} public names defined in more than one module"
                 + (": " + "; ".join(f"{k} in {', '.join(v)}" for k, v in f["names"].items()) if f["names"] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/code_shape.py", description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=10, help="how many of each to name (default 10)")
    a = ap.parse_args(argv)
    print(report(figures(), a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
