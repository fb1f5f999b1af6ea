"""Write README.md from nbs/index.ipynb, the README's source (pyproject's `readme_nb`).

The notebook's markdown cells become the README, separated by blank lines; a code cell is shown as a Python block
unless it is marked `#| hide`. Run `python scripts/readme.py` (or `make readme`) after editing the notebook;
tests/test_readme.py checks that README.md is what this writes.

The pipeline diagram is one markdown cell of the notebook, written from `dvc dag` (`--dag`, which `make readme`
passes): every stage, a `foreach` stage's members as one node, Track B's stages (`ctsvqa_*`) in a box of their own.
tests/test_readme.py checks that the cell is what `dvc dag` gives for today's dvc.yaml.

A table the README shows from a committed result follows a marker line, `<!-- table: results/tables/table2.md
without Size, Backbones -->`; `--tables` (which `make readme` passes) rewrites it from that file (its first markdown
table, the named columns dropped), and tests/test_readme.py checks that every such table is the committed file's:
a figure in a README table is then the measurement of the commit that ships it.
"""
from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAG_MARK = "<!-- the pipeline, written from `dvc dag` by scripts/readme.py --dag: edit dvc.yaml, not this cell -->"


def dag_edges(root: str | Path = ROOT) -> tuple[list[str], list[tuple[str, str]]]:
    "(stages, edges) of `dvc dag` in `root`, a `foreach` stage's members as one stage (`--collapse-foreach-matrix`)."
    out = subprocess.run(["dvc", "dag", "--dot", "--collapse-foreach-matrix"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    edges = re.findall(r'^"([^"]+)" -> "([^"]+)";$', out, re.M)
    nodes = re.findall(r'^"([^"]+)";$', out, re.M)
    return nodes, edges


def reduce_edges(edges: list[tuple[str, str]]) -> list[tuple[str, str]]:
    "The edges no longer path of `edges` implies (transitive reduction of a DAG): the same order, fewer arrows."
    succ: dict[str, set[str]] = {}
    for a, b in edges: succ.setdefault(a, set()).add(b)
    def reach(a: str, skip: tuple[str, str]) -> set[str]:
        seen, todo = set(), [b for b in succ.get(a, ()) if (a, b) != skip]
        while todo:
            n = todo.pop()
            if n not in seen: seen.add(n); todo.extend(succ.get(n, ()))
        return seen
    return [(a, b) for a, b in edges if b not in reach(a, (a, b))]


def topological(nodes: list[str], edges: list[tuple[str, str]]) -> list[str]:
    "`nodes` in an order where every edge points forward; among the nodes ready at once, by name."
    into = {n: 0 for n in nodes}
    for _, b in set(edges): into[b] += 1
    ready, out = sorted(n for n, k in into.items() if k == 0), []
    while ready:
        n = ready.pop(0); out.append(n)
        for a, b in sorted(set(edges)):
            if a == n:
                into[b] -= 1
                if into[b] == 0: ready = sorted(ready + [b])
    return out


def dag_cell(root: str | Path = ROOT, dag: tuple | None = None) -> str:
    """The notebook cell that shows the pipeline: a Mermaid flowchart of `dvc dag` (or of `dag`, what `dag_edges` gave),
    each arrow one that no other path implies."""
    nodes, edges = dag or dag_edges(root)
    rank = {n: i for i, n in enumerate(topological(nodes, edges))}      # dvc's own order varies from run to run
    nodes, edges = sorted(nodes, key=rank.get), sorted(set(edges), key=lambda e: (rank[e[0]], rank[e[1]]))
    foreach = set(re.findall(r"^  (\w+):\n    foreach:", (Path(root) / "dvc.yaml").read_text(), re.M))
    ident = lambda n: re.sub(r"\W", "_", n)
    label = lambda n: f"{n}@…" if n in foreach else n
    box = lambda n: "data" if n.endswith(".dvc") else "B" if n.startswith("ctsvqa") else "A"
    lines = [DAG_MARK, "", "```mermaid", "flowchart TD"]
    for key, title in (("data", "external data"), ("A", "Track A: multiple choice and numbers from label maps"),
                       ("B", "Track B: CT-SpatialVQA, free text from reports")):
        lines += [f'  subgraph {key}["{title}"]'] + [f'    {ident(n)}["{label(n)}"]' for n in nodes if box(n) == key] + ["  end"]
    lines += [f"  {ident(a)} --> {ident(b)}" for a, b in reduce_edges(edges)]
    return "\n".join(lines + ["```"])


def write_dag(notebook: str | Path = ROOT / "nbs" / "index.ipynb", root: str | Path = ROOT) -> bool:
    "Rewrite the notebook's pipeline cell (the one that starts with `DAG_MARK`) from `dvc dag`; True if it changed."
    nb = json.loads(Path(notebook).read_text())
    cell = next(c for c in nb["cells"] if "".join(c["source"]).startswith(DAG_MARK))
    new = dag_cell(root)
    if "".join(cell["source"]) == new: return False
    cell["source"] = new.splitlines(True)
    Path(notebook).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return True


TABLE_MARK = re.compile(r"^<!-- table: (\S+?)(?: without (.+?))? -->$")


def result_table(path: str | Path, without: tuple[str, ...] = ()) -> list[str]:
    "The first markdown table of a result file, as lines, without the columns named in `without`."
    lines = Path(path).read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("|"))
    rows = list(itertools.takewhile(lambda l: l.startswith("|"), lines[start:]))
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    missing = set(without) - set(cells[0])
    if missing: raise KeyError(f"{path} has no column {sorted(missing)}")
    keep = [j for j, h in enumerate(cells[0]) if h not in without]
    return ["| " + " | ".join(r[j] for j in keep) + " |" for r in cells]


def fill_tables(text: str, root: str | Path = ROOT) -> tuple[str, list[str]]:
    """`text` with the table after every `TABLE_MARK` line replaced by the result file's (`result_table`), and the
    files whose table that changed."""
    lines, out, stale, i = text.split("\n"), [], [], 0
    while i < len(lines):
        out.append(lines[i])
        i += 1
        if m := TABLE_MARK.match(out[-1]):
            without = tuple(c.strip() for c in m.group(2).split(",")) if m.group(2) else ()
            old = list(itertools.takewhile(lambda l: l.startswith("|"), lines[i:]))
            table = result_table(Path(root) / m.group(1), without)
            if table != old: stale.append(m.group(1))
            out += table
            i += len(old)
    return "\n".join(out), stale


def write_tables(notebook: str | Path = ROOT / "nbs" / "index.ipynb", root: str | Path = ROOT,
                 write: bool = True) -> list[str]:
    """The files whose marked table in the notebook's markdown cells differs from the file; with `write`, those tables
    are rewritten from them."""
    nb, stale = json.loads(Path(notebook).read_text()), []
    for c in nb["cells"]:
        if c["cell_type"] != "markdown": continue
        new, files = fill_tables("".join(c["source"]), root)
        if files: c["source"], stale = new.splitlines(True), stale + files
    if stale and write: Path(notebook).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return stale


def stale_tables(notebook: str | Path = ROOT / "nbs" / "index.ipynb", root: str | Path = ROOT) -> list[str]:
    "The marked tables of the notebook that differ from their result files (nothing is written)."
    return write_tables(notebook, root, write=False)


def cell_text(cell: dict) -> str | None:
    "The README text of one notebook cell, or None for a cell that is not shown."
    src = "".join(cell.get("source") or []).strip("\n")
    if cell["cell_type"] == "markdown": return src
    if cell["cell_type"] == "code":
        if not src.strip() or any(l.strip().startswith("#|") and "hide" in l for l in src.splitlines()): return None
        return f"```python\n{src}\n```"
    return None


def readme(notebook: str | Path = ROOT / "nbs" / "index.ipynb") -> str:
    "The README text written from `notebook`."
    nb = json.loads(Path(notebook).read_text())
    parts = [t for t in map(cell_text, nb["cells"]) if t and t.strip()]
    return "\n\n".join(parts).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    "Write README.md (or `--out`); `--check`: write nothing, status 1 when README.md differs from the notebook."
    import argparse
    ap = argparse.ArgumentParser(prog="scripts/readme.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "README.md", help="where to write (default README.md)")
    ap.add_argument("--check", action="store_true", help="only compare README.md with the notebook")
    ap.add_argument("--dag", action="store_true", help="first write the notebook's pipeline diagram from `dvc dag`")
    ap.add_argument("--tables", action="store_true",
                    help="first rewrite the notebook's marked tables from their result files")
    a = ap.parse_args(argv)
    if a.dag and not a.check and write_dag(): print("wrote the pipeline diagram into nbs/index.ipynb")
    if a.tables and not a.check:
        for path in write_tables(): print(f"rewrote the table from {path} in nbs/index.ipynb")
    text = readme()
    if a.check:
        same = a.out.exists() and a.out.read_text() == text
        print(f"{a.out} is {'up to date' if same else 'out of date: run make readme'}")
        return 0 if same else 1
    a.out.write_text(text)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
