"""Write README.md from nbs/index.ipynb, the README's source (pyproject's `readme_nb`).

The notebook's markdown cells become the README, separated by blank lines; a code cell is shown as a Python block
unless it is marked `#| hide`. Run `python scripts/readme.py` (or `make readme`) after editing the notebook;
tests/test_readme.py checks that README.md is what this writes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    a = ap.parse_args(argv)
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
