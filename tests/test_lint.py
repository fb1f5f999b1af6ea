"""Lint: ruff with pyproject.toml's rules (pyflakes: unused imports and variables, undefined names) on all the code:
the notebooks (library and stages; a finding in an exported cell is fixed there), the package exported from them,
tests/, scripts/ and benchmarks/."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("nbs", "spatialvqa", "tests", "scripts", "benchmarks")


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=cwd, capture_output=True, text=True)


def test_notebooks_package_tests_scripts_and_benchmarks_are_clean():
    r = _ruff(*FOLDERS)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_rules_catch_what_they_are_for(tmp_path):
    "The project's configuration, on a file with an unused import, an unused variable and an undefined name."
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n\ndef f():\n    x = 1\n    return y\n")
    r = _ruff("bad.py", cwd=tmp_path)
    assert r.returncode == 1
    assert {"F401", "F841", "F821"} <= {w for w in r.stdout.split() if w.startswith("F") and w[1:].isdigit()}, r.stdout


def test_notebooks_are_linted_cell_by_cell(tmp_path):
    "A notebook is read as the sequence of its code cells: a name defined in one cell and used in a later one is fine."
    import json
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    cell = lambda s: {"cell_type": "code", "execution_count": None, "id": str(abs(hash(s)))[:8], "metadata": {}, "outputs": [], "source": s}
    nb = {"cells": [cell("import os\nx = 1"), cell("print(x)\nprint(z)")], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "n.ipynb").write_text(json.dumps(nb))
    r = _ruff("n.ipynb", cwd=tmp_path)
    assert r.returncode == 1 and "F401" in r.stdout and "`z`" in r.stdout and "`x`" not in r.stdout, r.stdout
