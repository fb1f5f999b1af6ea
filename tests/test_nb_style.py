"""The library notebooks read as a tutorial (issue 14): a "what and why" head, no walls of exported definition cells,
an example after every exported definition. scripts/nb_style.py holds the rules; `python scripts/nb_style.py` lists
every finding with its cell numbers."""
from __future__ import annotations

import collections
import json
from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]

# Findings still in the notebooks, per (notebook, rule): the allow-list shrinks as they are fixed and must never grow.
# Empty: every wall is split and every exported definition has its example (rules: 'wall', 'example', 'head').
ALLOWED: dict[tuple[str, str], int] = {}


def _style():
    return load_script("scripts/nb_style.py")


def test_notebooks_follow_the_rhythm():
    s = _style()
    found = s.report()
    counts = collections.Counter((nb, rule) for nb, fs in found.items() for rule, _ in fs)
    new = {k: v for k, v in counts.items() if v > ALLOWED.get(k, 0)}
    details = "\n".join(f"{nb}: {rule}: {d}" for nb, fs in found.items() for rule, d in fs if (nb, rule) in new)
    assert not new, f"notebook rhythm broken (prose and an example between exported definitions):\n{details}"
    stale = {k: (ALLOWED[k], counts.get(k, 0)) for k in ALLOWED if counts.get(k, 0) < ALLOWED[k]}
    assert not stale, f"fixed, so shrink ALLOWED in tests/test_nb_style.py (allowed, found): {stale}"


def _nb(tmp_path, cells) -> Path:
    p = tmp_path / "99_x.ipynb"
    p.write_text(json.dumps({"cells": [{"cell_type": t, "source": s, "metadata": {}} for t, s in cells]}))
    return p


HEAD = [("code", "#| default_exp x"), ("code", "#| export\nimport os\nlog = get_logger(__name__)"),
        ("markdown", "# x\n\n> One line on what it is for."),
        ("markdown", "Why it exists: " + "a reason worth reading for a newcomer " * 4)]


def test_checker_finds_walls_heads_and_missing_examples(tmp_path):
    s = _style()
    good = _nb(tmp_path, HEAD + [("code", "#| export\ndef f(): return 1"), ("code", "test_eq(f(), 1)"),
                                 ("markdown", "Then g."), ("code", "#| export\ndef g(): return 2"), ("code", "g()")])
    assert s.check(good) == []
    wall = _nb(tmp_path, HEAD + [("code", "#| export\ndef f(): return 1"), ("code", "#| export\nclass G: pass"),
                                 ("code", "#| export\nX = 3"), ("code", "f()")])
    assert [r for r, _ in s.check(wall)] == ["wall"] and "3 consecutive" in s.check(wall)[0][1]
    no_example = _nb(tmp_path, HEAD + [("code", "#| export\ndef f(): return 1"), ("markdown", "More."),
                                       ("code", "#| export\ndef g(): return 2"), ("code", "g()")])
    assert [r for r, _ in s.check(no_example)] == ["example"]
    headless = _nb(tmp_path, [HEAD[0], ("code", "#| export\ndef f(): return 1"), ("code", "f()"), HEAD[2]])
    assert [r for r, _ in s.check(headless)] == ["head"]
    short = _nb(tmp_path, HEAD[:3] + [("code", "#| export\ndef f(): return 1"), ("code", "f()")])
    assert [r for r, _ in s.check(short)] == ["head"] and "words of prose" in s.check(short)[0][1]


def test_imports_for_annotations_only_are_not_a_definition():
    s = _style()
    cell = lambda src: {"cell_type": "code", "source": src, "metadata": {}}
    assert not s.defines(cell("#| export\nimport numpy as np\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pandas as pd"))
    assert s.defines(cell("#| export\nimport numpy as np\nif np.__version__: X = 1"))
