"""Check the library notebooks read as a tutorial: a "what and why" head, and no walls of export cells.

Rules (BRIEF's notebook rhythm, issue 14):
- head: the notebook opens with a `# title` cell holding a `> purpose` line, and before its first exported
  definition there is prose (at least HEAD_WORDS words of markdown, title and purpose included) saying what the
  module does and why;
- walls: an exported definition cell (`#| export`/`#| exports` defining a function, class or name, not imports only)
  is never directly followed by another exported definition cell: prose or an example comes between;
- examples: every exported definition is followed, before the next exported definition, by a code cell that is not
  exported (its example, which is also a test).

`python scripts/nb_style.py` prints every finding (notebook, rule, cell numbers); tests/test_nb_style.py runs it.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAD_WORDS = 30


def _src(c: dict) -> str:
    s = c.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def is_export(c: dict) -> bool:
    return c["cell_type"] == "code" and bool(re.search(r"^#\|\s*exports?\b", _src(c), re.M))


def defines(c: dict) -> bool:
    "An exported cell that defines something (not only imports, typing-only imports, `__all__`, the module's logger or comments)."
    if not is_export(c): return False
    body = [l for l in _src(c).splitlines() if l.strip() and not l.lstrip().startswith("#")]
    return any(not re.match(r"\s*(from\s+\S+\s+import|import\s|\)|__all__|log(ger)?\s*=|if TYPE_CHECKING:)", l) and not l.startswith((" ", "\t"))
               or re.match(r"\s*(def|class|async def)\s", l) for l in body)


def words(md: str) -> int:
    return len(re.findall(r"[A-Za-z][\w'-]*", md))


def check(nb_path: Path) -> list[tuple[str, str]]:
    "The findings for one notebook: (rule, detail) pairs; cells are counted from 0."
    cells = json.loads(Path(nb_path).read_text())["cells"]
    out = []
    first_def = next((i for i, c in enumerate(cells) if defines(c)), len(cells))
    head = [_src(c) for c in cells[:first_def] if c["cell_type"] == "markdown"]
    if not any(re.match(r"#\s+\S", h.strip()) and re.search(r"^>\s*\S", h, re.M) for h in head):
        out.append(("head", "no `# title` cell with a `> purpose` line before the first exported definition"))
    elif sum(words(h) for h in head) < HEAD_WORDS:
        out.append(("head", f"only {sum(words(h) for h in head)} words of prose before the first exported definition "
                            f"(cell {first_def}); say what the module does and why in at least {HEAD_WORDS}"))
    run: list[int] = []
    for i, c in enumerate(cells + [{"cell_type": "markdown", "source": ""}]):
        if defines(c): run.append(i); continue
        if len(run) > 1: out.append(("wall", f"{len(run)} consecutive exported definition cells: {run[0]}-{run[-1]}"))
        run = [] if not is_export(c) else run
    defs = [i for i, c in enumerate(cells) if defines(c)]
    for i, j in zip(defs, defs[1:] + [len(cells)]):
        if not any(c["cell_type"] == "code" and not is_export(c) and _src(c).strip() for c in cells[i + 1:j]):
            if j == i + 1: continue   # already reported as part of a wall
            out.append(("example", f"exported definition in cell {i} has no example before cell {j}"))
    return out


def library_notebooks(nbs: Path = ROOT / "nbs") -> list[Path]:
    """The library notebooks (`nbs/NN_name.ipynb`, and a subpackage's `nbs/NN_name/MM_part.ipynb`), in data order: the
    one list every script and test reads (docs, code shape, the README's module table, the import graph)."""
    return sorted([*nbs.glob("[0-9][0-9]_*.ipynb"), *nbs.glob("[0-9][0-9]_*/[0-9][0-9]_*.ipynb")], key=lambda p: p.relative_to(nbs))


def report() -> dict[str, list[tuple[str, str]]]:
    return {str(p.relative_to(ROOT / "nbs")): f for p in library_notebooks() if (f := check(p))}


if __name__ == "__main__":
    r = report()
    for nb, fs in r.items():
        for rule, detail in fs: print(f"{nb}: {rule}: {detail}")
    print(f"{sum(map(len, r.values()))} findings in {len(r)} of {len(library_notebooks())} notebooks")
    sys.exit(1 if r else 0)
