"""The resumable runner (spatialvqa.models.run_inference / `spatialvqa infer`): killed with SIGKILL or interrupted
with SIGINT mid-run and restarted, every qid ends up exactly once and no finished record is asked again; a lost
HTTP server leaves error records that a rerun completes; failing records are written with their error."""
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from spatialvqa import models as M
from spatialvqa.core import read_jsonl, write_jsonl
from spatialvqa.llm import FakeOpenAIServer

N = 40
# the console script's `infer` subcommand, independent of which plugins spatialvqa.cli registers
CLI = ("import argparse, sys; from spatialvqa.models import add_cli; p = argparse.ArgumentParser(); "
       "add_cli(p.add_subparsers()); a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")


def _records():
    mc = [{"qid": f"mc{i:02d}", "format": "mc", "question": f"Question {i}?", "options": ["w", "x", "y", "z"], "unit": None}
          for i in range(N - 10)]
    num = [{"qid": f"num{i:02d}", "format": "numeric", "question": f"Volume {i}?", "options": None, "unit": "mL"} for i in range(10)]
    return mc + num


@pytest.fixture
def bench(tmp_path):
    f = tmp_path / "bench.jsonl"
    write_jsonl(_records(), f)
    return f


def _start(bench, out, calls, delay):
    env = {**os.environ, "SPATIALVQA_PROGRESS": "0"}
    args = [sys.executable, "-c", CLI, "infer", "--model", "random", "--benchmark", str(bench), "--out", str(out),
            "--batch-size", "2", "--config", f"delay={delay}", f"call_log={calls}"]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(path, n, proc, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.exists() and len(read_jsonl(path)) >= n: return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise TimeoutError(f"{path}: fewer than {n} records after {timeout} s")


def _check_resumed(bench, out, calls, finished_before):
    rows = read_jsonl(out)
    assert Counter(r["qid"] for r in rows) == Counter(r["qid"] for r in read_jsonl(bench))       # every qid exactly once
    assert all(r["error"] is None and r["raw"] for r in rows)
    assert not M.partial_path(out).exists() and not out.with_name(out.name + ".partial.lock").exists()
    log = read_jsonl(calls)
    pids = list(dict.fromkeys(c["pid"] for c in log))
    second = [c["qid"] for c in log if c["pid"] == pids[-1]]
    assert not set(second) & finished_before                    # nothing finished was asked again
    assert len(second) == len(set(second))                      # nothing asked twice in the rerun
    # the same answers as an uninterrupted run (the random baseline is deterministic per qid)
    ref = M.make_adapter("random").predict([M.ModelInput(r, "") for r in read_jsonl(bench)])
    assert [r["raw"] for r in rows] == ref


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_run_resumes_without_loss_or_duplicates(tmp_path, bench, sig):
    out, calls = tmp_path / "pred" / "random.jsonl", tmp_path / "calls.jsonl"
    p = _start(bench, out, calls, delay=0.05)
    _wait_for(M.partial_path(out), 10, p)
    p.send_signal(sig)
    rc = p.wait(timeout=30)
    assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 130), p.communicate()
    assert not out.exists()                                     # not complete: only the partial log
    done = read_jsonl(M.partial_path(out))
    assert 10 <= len(done) < N and len({r["key"] for r in done}) == len(done)
    p2 = _start(bench, out, calls, delay=0)
    assert p2.wait(timeout=60) == 0, p2.communicate()
    _check_resumed(bench, out, calls, {r["qid"] for r in done})


def test_torn_last_line_is_tolerated(tmp_path, bench):
    out = tmp_path / "random.jsonl"
    recs = read_jsonl(bench)
    M.run_inference(M.make_adapter("random"), recs[:5], out)
    part = M.partial_path(out)
    part.write_text(out.read_text() + '{"qid": "mc05", "key": "mc05@')      # a writer killed mid-line
    s = M.run_inference(M.make_adapter("random"), recs, out)
    assert (s.skipped, s.answered, s.complete) == (5, N - 5, True)
    assert Counter(r["qid"] for r in read_jsonl(out, strict=True)) == Counter(r["qid"] for r in recs)


def test_lost_server_records_errors_then_rerun_completes(tmp_path, bench):
    recs, out = read_jsonl(bench), tmp_path / "served.jsonl"
    cfg = {"model": "tiny", "api_key_env": None, "max_attempts": 2, "backoff": 0.01, "timeout": 5, "workers": 1}
    seen = []
    with FakeOpenAIServer(reply=lambda body: "B") as srv:
        def inputs(record, prompt):                              # the server goes away after 12 records
            seen.append(record["qid"])
            if len(seen) == 13: srv.__exit__(None, None, None)
            return M.ModelInput(record, prompt)
        a = M.make_adapter("openai", {**cfg, "base_url": srv.base_url})
        s = M.run_inference(a, recs, out, inputs, batch_size=4, max_retries=1, retry_wait=0.01)
        srv.__enter__()                                          # (restarted only so that the context manager can close it)
    rows = read_jsonl(out)
    assert len(rows) == N and s.errors == N - 12 and s.complete      # complete: every qid has a row, some with errors
    assert all("cannot connect" in r["error"] or "connection" in r["error"].lower() for r in rows if r["error"])
    assert all(r["attempts"] >= 2 for r in rows if r["error"])
    with FakeOpenAIServer(reply=lambda body: "B") as srv2:       # back, on another port: same keys (base_url is runtime)
        a2 = M.make_adapter("openai", {**cfg, "base_url": srv2.base_url})
        s2 = M.run_inference(a2, recs, out, batch_size=4)
    assert (s2.skipped, s2.answered, s2.errors) == (12, N - 12, 0)
    assert len(srv2.requests) == N - 12
    rows = read_jsonl(out)
    assert Counter(r["qid"] for r in rows) == Counter(r["qid"] for r in recs) and all(r["raw"] == "B" for r in rows)


def test_keys_follow_model_prompt_and_decoding(tmp_path, bench):
    recs, out = read_jsonl(bench)[:6], tmp_path / "p.jsonl"
    base = M.run_inference(M.make_adapter("random", {"seed": 0}), recs, out)
    again = M.run_inference(M.make_adapter("random", {"seed": 0, "delay": 0.0}), recs, out)   # runtime option: same key
    assert again.skipped == 6 and again.config_hash == base.config_hash
    for kw in ({"prompt_style": "radiologist"},):
        assert M.run_inference(M.make_adapter("random", {"seed": 0}), recs, out, **kw).answered == 6
    assert M.run_inference(M.make_adapter("random", {"seed": 1}), recs, out).answered == 6
    rows = read_jsonl(out)
    assert len(rows) == 6 and len({r["key"] for r in rows}) == 6
    assert all(r["key"].startswith(r["qid"] + "@") for r in rows)
    assert set(M.PREDICTION_FIELDS) <= set(rows[0])


def test_repeated_qid_and_concurrent_runs_are_refused(tmp_path, bench):
    recs = read_jsonl(bench)
    with pytest.raises(ValueError, match="repeats a qid"):
        M.run_inference(M.make_adapter("random"), recs + recs[:1], tmp_path / "x.jsonl")
    out = tmp_path / "busy.jsonl"
    with M._Lock(M.partial_path(out).with_name(M.partial_path(out).name + ".lock")):
        with pytest.raises(RuntimeError, match="another run"):
            M.run_inference(M.make_adapter("random"), recs, out)


def test_failing_inputs_are_written_with_their_error(tmp_path, bench):
    recs = read_jsonl(bench)[:5]
    def inputs(record, prompt):
        if record["qid"] == "mc02": raise FileNotFoundError("image.nii.gz: no such file")
        return M.ModelInput(record, prompt)
    s = M.run_inference(M.make_adapter("random"), recs, tmp_path / "p.jsonl", inputs)
    rows = {r["qid"]: r for r in read_jsonl(tmp_path / "p.jsonl")}
    assert len(rows) == 5 and s.errors == 1 and "no such file" in rows["mc02"]["error"] and rows["mc02"]["raw"] is None
