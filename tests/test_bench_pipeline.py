"""benchmarks/bench_pipeline.py on a tiny cohort: the scaling table's structure, and `--check` failing on a stage
that is made superlinear (and not on one that is linear). No figure of the real stages is asserted: the machine
may be busy; the injected stages sleep for a known time."""
import contextlib
import io
import re
import time
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load():
    return load_script("benchmarks/bench_pipeline.py")


bp = _load()
NUM = r"(\d+\.\d+)"


def _sleeps(unit: float, power: int):
    "A stage that sleeps unit x scans**power seconds: its cost per scan grows as scans**(power - 1)."
    def stage(ctx):
        time.sleep(unit * len(ctx["scans"]) ** power)
    return stage


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    "The script's main on 3 and 6 coarse phantoms, no Dask, --check; a linear and a quadratic stage injected."
    out = tmp_path_factory.mktemp("bench_pipeline")
    stages = {**bp.STAGE_FUNCTIONS, "linear": _sleeps(0.05, 1), "quadratic": _sleeps(0.01, 2)}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = bp.main(["--sizes", "3,6", "--real", "none", "--phantom-spacing", "4,4,6", "--no-dask", "--check",
                      "--keep", str(out)], stages=stages)
    return rc, buf.getvalue(), out


def _table(text: str) -> list[str]:
    lines = text.splitlines()
    i = next(i for i, l in enumerate(lines) if l.startswith("cost per scan from"))
    return lines[i + 1:]


def test_table_structure(tiny):
    _, text, _ = tiny
    assert "cost per scan from 3 to 6 scans" in text
    table = _table(text)
    assert re.match(r"stage\s+s/scan @3\s+s/scan @6\s+larger/smaller\s+CPU s/scan @3\s+CPU s/scan @6\s+CPU ratio$", table[0])
    names = [*bp.STAGES, "linear", "quadratic", "total"]
    rows = table[1:1 + len(names)]
    assert [r.split()[0] for r in rows] == names
    for r in rows:
        m = re.match(rf"(\S+)\s+{NUM}\s+{NUM}\s+{NUM}x\s+{NUM}\s+{NUM}\s+{NUM}x(  FLAG)?$", r)
        assert m, r
        small, large, ratio = map(float, m.groups()[1:4])
        if small >= 0.05: assert ratio == pytest.approx(large / small, rel=0.05, abs=0.02), r
    # every size's run lists every stage with its seconds per scan
    for n in (3, 6):
        block = text.split(f"cohort of {n}: ")[1].split("\n\n")[0].split("cohort of")[0]
        assert f"phantom {n}; {n} scans converted" in block
        for st in names[:-1]:
            assert re.search(rf"^  {st}\s+{NUM} s  \({NUM} s per scan; {NUM} s CPU\)$", block, re.M), st
        assert re.search(r"^    generate: verify", block, re.M)


def test_check_fails_on_a_superlinear_stage(tiny):
    rc, text, _ = tiny
    assert rc == 1
    rows = {r.split()[0]: r for r in _table(text)[1:] if r and not r.startswith("FLAG")}
    assert rows["quadratic"].endswith("FLAG")
    assert not rows["linear"].endswith("FLAG")
    assert not rows["total"].endswith("FLAG")
    flags = [l for l in text.splitlines() if l.startswith("FLAG: ")]
    assert any(l.startswith("FLAG: quadratic costs ") for l in flags)
    assert not any(l.startswith("FLAG: linear ") for l in flags)
    ratio = float(re.search(rf"^quadratic\s+{NUM}\s+{NUM}\s+{NUM}x", rows["quadratic"]).group(3))
    assert 1.6 < ratio < 2.4                      # 6**2/6 over 3**2/3


def _run(size, seconds, cpu=None):
    return bp.Run(size, size, dict(seconds), {}, {}, ("0", "0"), dict(cpu or seconds))


def test_scaling_rows_flag_and_status():
    small = _run(10, {"a": 10.0, "b": 10.0, "c": 0.0})
    large = _run(40, {"a": 40.0 * 1.29, "b": 40.0 * 1.31, "c": 0.0}, {"a": 40.0 * 2, "b": 40.0, "c": 0.0})
    rows = {r["stage"]: r for r in bp.scaling_rows(small, large, 1.3)}
    assert rows["a"]["ratio"] == pytest.approx(1.29) and not rows["a"]["flag"]
    assert rows["b"]["ratio"] == pytest.approx(1.31) and rows["b"]["flag"]
    assert rows["c"]["ratio"] == 1.0 and not rows["c"]["flag"]          # a stage that costs nothing at either size
    assert not rows["total"]["flag"]
    by_cpu = {r["stage"]: r["flag"] for r in bp.scaling_rows(small, large, 1.3, by="cpu")}
    assert by_cpu == {"a": True, "b": False, "c": False, "total": False}
    text = bp.format_scaling(list(rows.values()), small, large, 1.3)
    assert [l.split()[1] for l in text.splitlines() if l.startswith("FLAG")] == ["b"]


def test_cohort_plan():
    assert bp.plan(60, 6, 116) == {"fixed": 6, "openkbp": 27, "phantom": 27}
    assert bp.plan(240, 6, 116) == {"fixed": 6, "openkbp": 116, "phantom": 118}
    assert bp.plan(8, 6, 116, real=False) == {"fixed": 0, "openkbp": 0, "phantom": 8}
    with pytest.raises(ValueError): bp.plan(7, 6, 116)
    from spatialvqa.core import load_params
    params = load_params(path=ROOT / "params.yaml")
    p, fixed, ok, notes = bp.plan_for(60, params)
    # every dataset of params.yaml but OpenKBP and the phantoms is a fixed real one, reached offline with its options
    want = [e for e in params["datasets"] if e["kind"] not in ("openkbp", "phantom")]
    assert [e["name"] for e in fixed] == [e["name"] for e in want] and not notes
    assert [e["options"] for e in fixed] == [dict(e.get("options") or {}) for e in want]
    assert p == {"fixed": 6, "openkbp": 27, "phantom": 27} and ok is not None


def test_per_scan_stages_on_dask(tiny, tmp_path):
    "convert, counterfactual and measure through their `scheduler` on a LocalCluster measure what local processes do."
    import pandas as pd
    from spatialvqa.core import load_params
    keep = tiny[2]
    params = load_params(path=ROOT / "params.yaml")
    cohort = bp.build_cohort(3, tmp_path / "cohort3", params, keep / "phantom_pool", real="none")
    ref = pd.read_parquet(keep / "run3" / "structures.parquet")
    rows = bp.dask_runs(cohort, tmp_path / "dask", params, [1, 2], reference=ref)
    assert [r["workers"] for r in rows] == [1, 2] and all(r["same"] for r in rows)
    assert all(set(r["seconds"]) == set(bp.PER_SCAN) for r in rows)
    text = bp.format_dask(rows)
    assert "identical" in text and "DIFFERENT" not in text
