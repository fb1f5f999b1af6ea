"""Fixtures shared by several test files, built once per test session (once per worker under pytest-xdist), each in
its own temporary folder (`tmp_path_factory`: distinct per worker, never a fixed path)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def phantom_benchmark(tmp_path_factory):
    """A small Track A benchmark made the pipeline's way: 4 phantoms of the default cohort, measured, with the default
    questions per scan: `dict(recs, table, scans, dir)` (`dir`: the cohort's folder)."""
    from spatialvqa.measure import measure_manifests
    from spatialvqa.phantom import make_cohort
    from spatialvqa.questions import generate_questions
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
    from spatialvqa.phantom import make_cohort
    from spatialvqa.questions import generate_questions
    d = tmp_path_factory.mktemp("two_phantoms")
    make_cohort(d, 2, seed=0, tumour_rate=0.5, workers=1)
    table, scans, rejected = measure_manifests([d / "cohort.json"], workers=1)
    assert rejected == []
    recs = generate_questions(table, seed=0, scans=scans)
    return dict(recs=recs, bench=write_jsonl(recs, d / "bench.jsonl"), dir=d)
