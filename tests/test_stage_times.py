"""benchmarks/stage_times.py reads each stage's time from the clocks spatialvqa-stage leaves in reports/times/, or
from an older executed notebook papermill stamped (issue 22's table)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import stage_times  # noqa: E402


def _nb(path, start, end):
    meta = {"papermill": {"start_time": f"2026-01-01T10:{start}+00:00", "end_time": f"2026-01-01T10:{end}+00:00"}}
    path.write_text(json.dumps({"cells": [], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))


def test_stage_times(tmp_path, capsys):
    (tmp_path / "dvc.yaml").write_text("""stages:
  a:
    cmd: spatialvqa-stage a -p x 1
  a_twin:
    cmd: spatialvqa-stage a_twin
  infer:
    foreach: ${models}
    do:
      cmd: spatialvqa-stage infer --key ${key} -p model ${key}
  never:
    cmd: spatialvqa-stage never
  other:
    cmd: python make_it.py
""")
    r = tmp_path / "nbs"; r.mkdir()
    _nb(r / "a.ipynb", "00:00", "01:30")          # 90 s
    _nb(r / "a_twin.ipynb", "02:00", "02:10")     # 10 s: not a foreach entry of `a`
    _nb(r / "infer_random.ipynb", "01:30", "01:40")
    _nb(r / "infer_oracle.ipynb", "00:00", "00:01")   # an older copy: its clock file below wins
    t = tmp_path / "times"; t.mkdir()
    clock = {"start_time": "2026-01-01T10:01:40+00:00", "end_time": "2026-01-01T10:02:00+00:00", "duration": 20.0}
    (t / "infer_oracle.json").write_text(json.dumps(clock))
    stages = stage_times.stage_notebooks(tmp_path / "dvc.yaml")
    assert stages == {"a": "a", "a_twin": "a_twin", "infer": "infer_*", "never": "never", "other": None}
    rows, missing = stage_times.table(stages, stage_times.read_times(r, times=t))
    assert {x["stage"]: (x["notebooks"], x["seconds"]) for x in rows} == {"a": (1, 90), "a_twin": (1, 10), "infer": (2, 30)}
    assert missing == ["never", "other"]               # no notebook ran, or none is run by the stage
    assert stage_times.main(["--reports", str(r), "--times", str(t), "--dvc-yaml", str(tmp_path / "dvc.yaml"), "--markdown",
                             "--wall", "200"]) == 0
    out = capsys.readouterr()
    assert "| **sum of the stages** | 4 | **2 min 10.0 s** | 100% |" in out.out
    assert "1 min 10.0 s" in out.out and "never" in out.err
    assert stage_times.main(["--reports", str(tmp_path / "none"), "--times", str(tmp_path / "none"), "--dvc-yaml",
                             str(tmp_path / "dvc.yaml")]) == 2
