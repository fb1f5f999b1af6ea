"""README.md is written from nbs/index.ipynb (scripts/readme.py), and its module table lists every library notebook."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _writer():
    spec = importlib.util.spec_from_file_location("readme_writer", ROOT / "scripts" / "readme.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_readme_is_written_from_index(tmp_path):
    w = _writer()
    assert (ROOT / "README.md").read_text() == w.readme(ROOT / "nbs" / "index.ipynb"), \
        "README.md differs from nbs/index.ipynb: edit the notebook and run `make readme`"
    assert w.main(["--out", str(tmp_path / "R.md")]) == 0 and (tmp_path / "R.md").read_text() == (ROOT / "README.md").read_text()
    assert w.main(["--check"]) == 0 and w.main(["--check", "--out", str(tmp_path / "absent.md")]) == 1
    assert not (ROOT / "--check").exists()


def test_writer_shows_code_but_not_hidden_cells(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["# T\n", "text"]},
                    {"cell_type": "code", "source": ["#| hide\n", "import x"]},
                    {"cell_type": "code", "source": ["print(1)"]}]}
    (tmp_path / "i.ipynb").write_text(json.dumps(nb))
    assert _writer().readme(tmp_path / "i.ipynb") == "# T\ntext\n\n```python\nprint(1)\n```\n"


def notebooks() -> dict[str, str]:
    "Library notebook stem -> the module it exports (`#| default_exp`)."
    out = {}
    for p in sorted((ROOT / "nbs").glob("[0-9]*.ipynb")):
        for c in json.loads(p.read_text())["cells"]:
            m = re.match(r"#\|\s*default_exp\s+(\S+)", "".join(c["source"]).strip())
            if c["cell_type"] == "code" and m: out[p.stem] = m.group(1); break
    return out


def test_module_table_lists_every_notebook():
    rows = dict(re.findall(r"^\| `(\d\d_\w+)` \| `(\w+)` \|", (ROOT / "README.md").read_text(), re.M))
    assert rows == notebooks(), "the README's module table must list every library notebook with its module"
