"""Lint: ruff with pyproject.toml's rules (pyflakes: unused imports and variables, undefined names) on the code that is
not exported from notebooks: tests/, scripts/, benchmarks/."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("tests", "scripts", "benchmarks")


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=cwd, capture_output=True, text=True)


def test_tests_scripts_and_benchmarks_are_clean():
    r = _ruff(*FOLDERS)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_rules_catch_what_they_are_for(tmp_path):
    "The project's configuration, on a file with an unused import, an unused variable and an undefined name."
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n\ndef f():\n    x = 1\n    return y\n")
    r = _ruff("bad.py", cwd=tmp_path)
    assert r.returncode == 1
    assert {"F401", "F841", "F821"} <= {w for w in r.stdout.split() if w.startswith("F") and w[1:].isdigit()}, r.stdout
