"""Every DVC stage's code dependencies are the import closure of the notebook it runs.

A stage notebook (`nbs/stages/<stage>.ipynb`, run by `spatialvqa-stage`, whose module `runner` counts too) imports some `spatialvqa` modules; those import others, at the top or
inside a function (lazy imports count), by name or through an entry-point group (`spatialvqa.adapters` loads
`spatialvqa.vlm`, `spatialvqa.answerers` loads `spatialvqa.agents`). A change to any module of that closure can change
the stage's outputs, so `dvc.yaml` must list every one of them in the stage's `deps` (or the package folder
`spatialvqa`, which covers all, or a subpackage's folder such as `spatialvqa/questions`, which covers its modules),
else `dvc status` stays clean while the results go stale.

    python scripts/stage_deps.py            # print, per stage, the modules its deps leave out (status 1 if any)
    python scripts/stage_deps.py --write    # rewrite dvc.yaml: each stage's spatialvqa deps become its closure

`tests/test_stage_deps.py` runs the check and shows that touching a module makes a stage `changed` in `dvc status`.
"""
from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "spatialvqa"
FOLDER_SHARE = 0.6     # a stage whose closure holds at least this share of the modules depends on the package folder


def _targets(dotted: str, modules: set[str]) -> set[str]:
    "The modules an absolute `spatialvqa.…` name reaches: the module itself, or every module of a subpackage."
    rel = dotted[len(PKG) + 1:] if dotted.startswith(PKG + ".") else ""
    if not rel: return set()
    if rel in modules: return {rel}
    return {m for m in modules if m.startswith(rel + ".")}


def _imports(tree: ast.AST, modules: set[str], module: str = "") -> set[str]:
    """The spatialvqa modules (dotted below the package: `measure`, `validate.chance`) a parsed source imports
    anywhere; `module` is the importing module's own name, against which relative imports resolve. A string constant
    naming a module counts, as plugin lists and `importlib.import_module` arguments do."""
    found: set[str] = set()
    here = [PKG, *module.split(".")[:-1]] if module else [PKG]          # the importing module's package
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names: found |= _targets(a.name, modules)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) if node.level \
                else (node.module or "")
            if not base.startswith(PKG): continue
            for a in node.names:                                      # `from pkg import module` or `from module import name`
                found |= _targets(f"{base}.{a.name}", modules) or _targets(base, modules)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(PKG + r"(\.\w+)+", node.value):
            found |= _targets(node.value, modules)
    return found & modules


@functools.lru_cache(maxsize=None)
def _source_imports(src: str, modules: frozenset[str], module: str = "") -> frozenset[str]:
    "`_imports` of a module's source text, parsed once per process (the tests ask for the graph of the same sources again)."
    return frozenset(_imports(ast.parse(src), set(modules), module))


def module_files(root: Path = ROOT) -> dict[str, Path]:
    "Every exported module, by its dotted name below the package (`validate.chance`), and its file."
    return {".".join(p.relative_to(root / PKG).with_suffix("").parts): p for p in sorted((root / PKG).rglob("*.py"))
            if not p.name.startswith("_") and "__pycache__" not in p.parts}


def entry_point_modules(root: Path = ROOT) -> dict[str, set[str]]:
    "Entry-point group -> the spatialvqa modules it loads (pyproject.toml)."
    eps = tomllib.loads((root / "pyproject.toml").read_text())["project"].get("entry-points", {})
    return {g: {v.split(":")[0].split(".", 1)[1] for v in table.values() if v.startswith(PKG + ".")}
            for g, table in eps.items() if g.startswith(PKG + ".")}


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    "Module -> the spatialvqa modules it imports (directly, lazily, or through an entry-point group it names)."
    files = module_files(root)
    groups = entry_point_modules(root)
    out = {}
    for m, p in files.items():
        src = p.read_text()
        deps = set(_source_imports(src, frozenset(files), m))
        for g, mods in groups.items():
            if f'"{g}"' in src or f"'{g}'" in src: deps |= mods
        out[m] = deps - {m}
    return out


def notebook_modules(path: Path, modules: set[str]) -> set[str]:
    "The spatialvqa modules the code cells of a notebook import."
    cells = json.loads(Path(path).read_text())["cells"]
    src = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    src = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("!", "%")))
    return _imports(ast.parse(src), modules)


def closure(start: set[str], graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m in seen: continue
        seen.add(m); todo += sorted(graph.get(m, ()))
    return seen


def stages(root: Path = ROOT) -> dict[str, dict]:
    "Stage name -> its dvc.yaml entry (a foreach stage's `do` block)."
    import yaml
    doc = yaml.safe_load((root / "dvc.yaml").read_text())
    return {k: (v.get("do") if "foreach" in v else v) for k, v in doc["stages"].items()}


RUNNER = "runner"      # `spatialvqa-stage` (spatialvqa.runner) hands every stage notebook its parameters: it runs too


def stage_notebook(entry: dict) -> str | None:
    "The notebook a stage's cmd runs: `spatialvqa-stage NAME` runs nbs/stages/NAME.ipynb (or a path the cmd names)."
    cmd = str(entry.get("cmd", ""))
    if m := re.search(r"\bspatialvqa-stage\s+(\w+)", cmd): return f"nbs/stages/{m.group(1)}.ipynb"
    m = re.search(r"nbs/stages/[\w.-]+\.ipynb", cmd)
    return m.group(0) if m else None


def needed(root: Path = ROOT) -> dict[str, set[str]]:
    "Stage -> the modules of its notebook's import closure."
    graph = module_graph(root)
    out = {}
    for name, entry in stages(root).items():
        nb = stage_notebook(entry)
        if nb:
            runner = {RUNNER} if "spatialvqa-stage" in str(entry.get("cmd", "")) and RUNNER in graph else set()
            out[name] = closure(notebook_modules(root / nb, set(graph)) | runner, graph)
    return out


def subpackages(modules: set[str]) -> dict[str, set[str]]:
    "Each subpackage (`questions`, `validate` ...) and its modules."
    out: dict[str, set[str]] = {}
    for m in modules:
        if "." in m: out.setdefault(m.split(".")[0], set()).add(m)
    return out


def declared(entry: dict, modules: set[str] = frozenset()) -> tuple[set[str], bool]:
    """The modules a stage's deps list (a file `spatialvqa/x.py`, or a subpackage's folder `spatialvqa/questions`: each
    of `modules` inside it), and whether it lists the whole package folder."""
    deps = [str(d).split("#")[0].strip().rstrip("/") for d in entry.get("deps") or []]
    files = {".".join(Path(d).relative_to(PKG).with_suffix("").parts) for d in deps if d.startswith(PKG + "/") and d.endswith(".py")}
    subs = subpackages(set(modules))
    folders = {m for d in deps if d.startswith(PKG + "/") and (s := d[len(PKG) + 1:]) in subs for m in subs[s]}
    return files | folders, PKG in deps


def code_deps(mods: set[str], modules: set[str]) -> list[str]:
    """A closure as deps: the package folder when it holds `FOLDER_SHARE` of all modules; else a subpackage's folder where
    the closure holds every module of it, and the other modules' files."""
    if len(mods) >= FOLDER_SHARE * len(modules): return [PKG]
    whole = {s for s, ms in subpackages(modules).items() if ms <= mods}
    deps = {f"{PKG}/{s}" for s in whole} | {f"{PKG}/{m.replace('.', '/')}.py" for m in mods if m.split(".")[0] not in whole}
    return sorted(deps)


def missing(root: Path = ROOT) -> dict[str, list[str]]:
    "Stage -> the modules of its closure that its deps leave out (stages that miss none are absent)."
    st, out, modules = stages(root), {}, set(module_graph(root))
    for name, mods in needed(root).items():
        have, folder = declared(st[name], modules)
        if not folder and (gone := sorted(mods - have)): out[name] = gone
    return out


def _interpolate(text: str, params: dict) -> str:
    "A dvc.yaml string with its `${a.b}` references to params.yaml filled in (references it cannot resolve stay)."
    def look(m):
        v = params
        for k in m.group(1).split("."):
            if not isinstance(v, dict) or k not in v: return m.group(0)
            v = v[k]
        return str(v)
    return re.sub(r"\$\{([\w.]+)\}", look, text)


def _leaves(tree) -> list[str]:
    "Every string value inside a params subtree."
    if isinstance(tree, dict): return [s for v in tree.values() for s in _leaves(v)]
    if isinstance(tree, list): return [s for v in tree for s in _leaves(v)]
    return [tree] if isinstance(tree, str) else []


def param_files(root: Path = ROOT) -> dict[str, list[str]]:
    """Stage -> the files its params name that another stage writes but its deps leave out. A stage that lists
    `infer.models` reads every path inside it (a patient atlas's `pool`), so a new version of that file must make the
    stage `changed`, as a dep does; a params entry alone tracks the path's text, not the file."""
    import yaml
    params = yaml.safe_load((root / "params.yaml").read_text()) or {}
    st = stages(root)
    clean = lambda d: _interpolate(str(d).split("#")[0].strip(), params).rstrip("/")
    outs = {clean(o if isinstance(o, str) else next(iter(o))) for e in st.values() for o in e.get("outs") or []}
    out = {}
    for name, entry in st.items():
        deps = {clean(d) for d in entry.get("deps") or []}
        named = set()
        for key in (k for k in entry.get("params") or [] if isinstance(k, str)):
            tree = params
            for k in key.split("."): tree = tree.get(k, {}) if isinstance(tree, dict) else {}
            named |= {v for v in _leaves(tree) if v in outs}
        if gone := sorted(v for v in named if not any(v == d or v.startswith(d + "/") for d in deps)): out[name] = gone
    return out


def write(root: Path = ROOT) -> int:
    """Rewrite dvc.yaml: in every stage with a notebook, the `spatialvqa` code deps become the closure (`code_deps`);
    other deps stay as they are."""
    path = root / "dvc.yaml"
    lines = path.read_text().splitlines(keepends=True)
    need, out, i, changed = needed(root), [], 0, 0
    modules = set(module_graph(root))
    subs = subpackages(modules)
    current = None
    while i < len(lines):
        line = lines[i]
        if m := re.match(r"^  (\w[\w@-]*):\s*$", line): current = m.group(1)
        if re.match(r"^\s+deps:\s*$", line) and current in need:
            indent = re.match(r"^(\s+)", lines[i + 1]).group(1) if i + 1 < len(lines) else "      "
            block, j = [], i + 1
            while j < len(lines) and lines[j].startswith(indent + "- "):
                block.append(lines[j]); j += 1
            keep = [l for l in block if not re.match(rf"^\s+- {PKG}(/[\w./]+\.py|/({'|'.join(subs)}))?/?\s*(#.*)?$", l)]
            code = [f"{indent}- {d}\n" for d in code_deps(need[current], modules)]
            nb_at = next((k for k, l in enumerate(keep) if "nbs/stages/" in l), 0)
            new = keep[:nb_at + 1] + code + keep[nb_at + 1:]
            changed += new != block
            out += [line, *new]
            i = j
            continue
        out.append(line); i += 1
    path.write_text("".join(out))
    return changed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite dvc.yaml's spatialvqa deps from the closures")
    a = p.parse_args(argv)
    if a.write:
        print(f"{write()} stages' deps rewritten")
    gone, files = missing(), param_files()
    for s, mods in sorted(gone.items()): print(f"{s}: deps leave out {', '.join(mods)}")
    for s, paths in sorted(files.items()): print(f"{s}: its params name {', '.join(paths)}, which its deps leave out")
    if not gone: print(f"every stage's deps hold the import closure of its notebook ({len(needed())} stages)")
    if not files: print("every file a stage's params name and another stage writes is among its deps")
    return 1 if gone or files else 0


if __name__ == "__main__":
    sys.exit(main())
