"""Fixtures shared by several test files, built once per test session (once per worker under pytest-xdist), each in
its own temporary folder (`tmp_path_factory`: distinct per worker, never a fixed path); phantom cohorts that several
files read (`cohorts`) once per session for all workers, in the session's temporary folder. And the order in which
pytest-xdist hands the files out (`LONGEST_FIRST`)."""
from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

# The test files that cost the most, in CPU seconds (tests, fixtures and the processes they start) on a fresh clone,
# 2-core machine, 2026-11-26: longest first. `make pytest` runs `-n 2 --dist loadfile --no-loadscope-reorder`, so
# pytest-xdist hands whole files to the two workers in collection order, the next file to whichever worker is nearly
# done; with the longest first, the end of the run is short files filling in, not one worker busy with a long file while
# the other idles (xdist's own order, by number of tests, put test_docs.py and test_repro.py near the end). Files not
# listed follow in their usual order. Only the order changes: every test runs, in its file's order, with its fixtures.
LONGEST_FIRST = {"test_hardening.py": 95, "test_phantom.py": 45, "test_docs.py": 42, "test_bench_pipeline.py": 37,
                 "test_validity.py": 35, "test_cli_faults.py": 34, "test_rtstruct.py": 23, "test_counterfactual.py": 21,
                 "test_views.py": 18, "test_ctsvqa.py": 18, "test_interreader.py": 16, "test_ctsvqa_judge.py": 16,
                 "test_repro.py": 16, "test_results.py": 15, "test_questions.py": 13, "test_validate.py": 12,
                 "test_cli.py": 11, "test_convert.py": 10, "test_stage_deps.py": 9, "test_sources.py": 6, "test_export.py": 6}


ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str) -> ModuleType:
    """A script of the repository that is not part of the package (`scripts/readme.py`, `benchmarks/bench_pipeline.py`),
    loaded as a module named after its stem and registered in `sys.modules` (dataclasses look their module up there).
    Test files import it: `from conftest import load_script`."""
    p = ROOT / path
    spec = importlib.util.spec_from_file_location(p.stem, p)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[p.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def pytest_collection_modifyitems(items):
    "Whole files, longest first (`LONGEST_FIRST`), each file's tests in their own order."
    rank = {f: i for i, f in enumerate(sorted(LONGEST_FIRST, key=LONGEST_FIRST.get, reverse=True))}
    first: dict[str, int] = {}
    for i, it in enumerate(items): first.setdefault(str(it.path), i)
    items.sort(key=lambda it: (rank.get(it.path.name, len(rank)), first[str(it.path)]))


def shared_cohort(tmp_path_factory, n: int, seed: int, tumour_rate: float = 0.5) -> Path:
    """The folder of `make_cohort(folder, n, seed=seed, tumour_rate=tumour_rate)`, built once per test session for all
    the tests that ask for this very cohort, whichever pytest-xdist worker runs them (the first builds it, under a file
    lock, in the session's own temporary folder; a fresh session builds it again). The cohort is the same bytes whoever
    builds it and with any number of processes (tests/test_phantom.py checks that); the tests only read it."""
    from spatialvqa.phantom.cohort import make_cohort
    base = tmp_path_factory.getbasetemp()
    # xdist: <session>/popen-gwN
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared_cohorts"
    root.mkdir(exist_ok=True)
    d = root / f"n{n}_seed{seed}_tumours{tumour_rate:g}"
    with open(f"{d}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # released when the file closes
        if not (d / "cohort.json").exists():
            part = root / f"{d.name}.partial"
            shutil.rmtree(part, ignore_errors=True)
            make_cohort(part, n, seed=seed, tumour_rate=tumour_rate, workers=2)
            part.rename(d)                     # complete or absent: cohort.json's paths are relative to the folder
    return d


@pytest.fixture(scope="session")
def cohorts(tmp_path_factory):
    "`cohorts(n, seed, tumour_rate=0.5)`: the folder of that phantom cohort, built once per session (`shared_cohort`)."
    return lambda n, seed, tumour_rate=0.5: shared_cohort(tmp_path_factory, n, seed, tumour_rate)


@pytest.fixture(scope="session")
def phantom_benchmark(tmp_path_factory):
    """A small Track A benchmark made the pipeline's way: 4 phantoms of the default cohort, measured, with the default
    questions per scan: `dict(recs, table, scans, dir)` (`dir`: the cohort's folder)."""
    from spatialvqa.measure import measure_manifests
    from spatialvqa.phantom.cohort import make_cohort
    from spatialvqa.questions.generate import generate_questions
    d = tmp_path_factory.mktemp("phantom_benchmark")
    make_cohort(d, 4, seed=0, tumour_rate=0.5, workers=1)
    table, scans, rejected = measure_manifests([d / "cohort.json"], workers=1)
    assert rejected == []
    return dict(recs=generate_questions(table, seed=0, scans=scans), table=table, scans=scans, dir=d)


@pytest.fixture(scope="session")
def two_phantoms(tmp_path_factory):
    """Two phantoms (the default cohort's seed, tumour rate 0.5) measured, their questions and the questions as a JSONL
    file: `dict(recs, bench, dir)`. Shared by test_models and test_runner; each takes a deep copy of the records."""
    from spatialvqa.core import write_jsonl
    from spatialvqa.measure import measure_manifests
    from spatialvqa.phantom.cohort import make_cohort
    from spatialvqa.questions.generate import generate_questions
    d = tmp_path_factory.mktemp("two_phantoms")
    make_cohort(d, 2, seed=0, tumour_rate=0.5, workers=1)
    table, scans, rejected = measure_manifests([d / "cohort.json"], workers=1)
    assert rejected == []
    recs = generate_questions(table, seed=0, scans=scans)
    return dict(recs=recs, bench=write_jsonl(recs, d / "bench.jsonl"), dir=d)
