"""The resumable runner (spatialvqa.models.run.run_inference / `spatialvqa infer`): killed with SIGKILL or interrupted
with SIGINT mid-run and restarted, every qid ends up exactly once and no finished record is asked again; a lost
HTTP server leaves error records that a rerun completes; failing records are written with their error."""
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from spatialvqa.models.commands import infer
from spatialvqa.models.protocol import ModelInput
from spatialvqa.models.registry import make_adapter
from spatialvqa.models.run import PREDICTION_FIELDS, _Lock, lock_path, partial_path, run_inference, times_path
from spatialvqa.questions.tables import with_rotations
from spatialvqa.core import read_jsonl, write_jsonl
from spatialvqa.llm.openai import FakeOpenAIServer

N = 40
# the console script's `infer` subcommand, independent of which plugins spatialvqa.cli registers
CLI = ("import argparse, sys; from spatialvqa.models.commands import add_cli; p = argparse.ArgumentParser(); "
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
    # a job started in the background by a non-interactive shell inherits SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler: give the child the default disposition, as a terminal would
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(path, n, proc, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.exists() and len(read_jsonl(path)) >= n: return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise TimeoutError(f"{path}: fewer than {n} records after {timeout} s")


def _check_resumed(bench, out, calls, finished_before):
    rows = read_jsonl(out)
    # every qid exactly once
    assert Counter(r["qid"] for r in rows) == Counter(r["qid"] for r in read_jsonl(bench))
    assert all(r["error"] is None and r["raw"] for r in rows)
    assert not partial_path(out).exists() and not out.with_name(out.name + ".partial.lock").exists()
    log = read_jsonl(calls)
    pids = list(dict.fromkeys(c["pid"] for c in log))
    second = [c["qid"] for c in log if c["pid"] == pids[-1]]
    assert not set(second) & finished_before                    # nothing finished was asked again
    assert len(second) == len(set(second))                      # nothing asked twice in the rerun
    # the same answers as an uninterrupted run (the random baseline is deterministic per qid)
    ref = make_adapter("random").predict([ModelInput(r, "") for r in read_jsonl(bench)])
    assert [r["raw"] for r in rows] == ref
    straight = out.with_name("straight.jsonl")                  # ... byte for byte: the clocks live apart
    run_inference(make_adapter("random"), read_jsonl(bench), straight, batch_size=2)
    assert out.read_bytes() == straight.read_bytes()
    clocks = read_jsonl(times_path(out))                        # a clock for every answer written, the lost ones' too
    assert {t["key"] for t in clocks} == {r["key"] for r in rows} and len(clocks) >= len(rows)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_run_resumes_without_loss_or_duplicates(tmp_path, bench, sig):
    out, calls = tmp_path / "pred" / "random.jsonl", tmp_path / "calls.jsonl"
    p = _start(bench, out, calls, delay=0.05)
    _wait_for(partial_path(out), 10, p)
    p.send_signal(sig)
    rc = p.wait(timeout=30)
    assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 130), p.communicate()
    assert not out.exists()                                     # not complete: only the partial log
    done = read_jsonl(partial_path(out))
    assert 10 <= len(done) < N and len({r["key"] for r in done}) == len(done)
    p2 = _start(bench, out, calls, delay=0)
    assert p2.wait(timeout=60) == 0, p2.communicate()
    _check_resumed(bench, out, calls, {r["qid"] for r in done})


def test_torn_last_line_is_tolerated(tmp_path, bench):
    out = tmp_path / "random.jsonl"
    recs = read_jsonl(bench)
    run_inference(make_adapter("random"), recs[:5], out)
    part = partial_path(out)
    part.write_text(out.read_text() + '{"qid": "mc05", "key": "mc05@')      # a writer killed mid-line
    s = run_inference(make_adapter("random"), recs, out)
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
            return ModelInput(record, prompt)
        a = make_adapter("openai", {**cfg, "base_url": srv.base_url})
        s = run_inference(a, recs, out, inputs, batch_size=4, max_retries=1, retry_wait=0.01)
        # (restarted only so that the context manager can close it)
        srv.__enter__()
    rows = read_jsonl(out)
    assert len(rows) == N and s.errors == N - 12 and s.complete      # complete: every qid has a row, some with errors
    assert all("cannot connect" in r["error"] or "connection" in r["error"].lower() for r in rows if r["error"])
    assert all(r["attempts"] >= 2 for r in rows if r["error"])
    # back, on another port: same keys (base_url is runtime)
    with FakeOpenAIServer(reply=lambda body: "B") as srv2:
        a2 = make_adapter("openai", {**cfg, "base_url": srv2.base_url})
        s2 = run_inference(a2, recs, out, batch_size=4)
    assert (s2.skipped, s2.answered, s2.errors) == (12, N - 12, 0)
    assert len(srv2.requests) == N - 12
    rows = read_jsonl(out)
    assert Counter(r["qid"] for r in rows) == Counter(r["qid"] for r in recs) and all(r["raw"] == "B" for r in rows)


def test_keys_follow_model_prompt_and_decoding(tmp_path, bench):
    recs, out = read_jsonl(bench)[:6], tmp_path / "p.jsonl"
    base = run_inference(make_adapter("random", {"seed": 0}), recs, out)
    again = run_inference(make_adapter("random", {"seed": 0, "delay": 0.0}), recs, out)   # runtime option: same key
    assert again.skipped == 6 and again.config_hash == base.config_hash
    for kw in ({"prompt_style": "radiologist"},):
        assert run_inference(make_adapter("random", {"seed": 0}), recs, out, **kw).answered == 6
    assert run_inference(make_adapter("random", {"seed": 1}), recs, out).answered == 6
    rows = read_jsonl(out)                                     # every configuration's rows are kept, one per key
    assert len(rows) == 18 and len({r["key"] for r in rows}) == 18 and len({r["config_hash"] for r in rows}) == 3
    assert all(r["key"].startswith(r["qid"] + "@") for r in rows)
    assert set(PREDICTION_FIELDS) <= set(rows[0])


def test_repeated_qid_and_concurrent_runs_are_refused(tmp_path, bench):
    recs = read_jsonl(bench)
    with pytest.raises(ValueError, match="repeats the qid 'mc00'"):
        run_inference(make_adapter("random"), recs + recs[:1], tmp_path / "x.jsonl")
    out = tmp_path / "busy.jsonl"
    with _Lock(lock_path(out)):
        with pytest.raises(ValueError, match="another run is writing this output"):
            run_inference(make_adapter("random"), recs, out)


def test_failing_inputs_are_written_with_their_error(tmp_path, bench):
    recs = read_jsonl(bench)[:5]
    def inputs(record, prompt):
        if record["qid"] == "mc02": raise FileNotFoundError("image.nii.gz: no such file")
        return ModelInput(record, prompt)
    s = run_inference(make_adapter("random"), recs, tmp_path / "p.jsonl", inputs)
    rows = {r["qid"]: r for r in read_jsonl(tmp_path / "p.jsonl")}
    assert len(rows) == 5 and s.errors == 1 and "no such file" in rows["mc02"]["error"] and rows["mc02"]["raw"] is None


# --- circular evaluation: every option rotation answered, the originals untouched ---------------------------------

@pytest.fixture(scope="module")
def phantom_bench(two_phantoms):
    "A small Track A benchmark over two phantoms (label maps on disk), as a JSONL file: conftest's `two_phantoms`."
    import copy
    return copy.deepcopy(two_phantoms["recs"]), two_phantoms["bench"]


def test_circular_run_answers_rotations_and_resumes(tmp_path):
    bench, out = tmp_path / "bench.jsonl", tmp_path / "random.jsonl"
    write_jsonl([dict(r, answer_letter="A", answer="A") if r["format"] == "mc" else r for r in _records()], bench)
    plain = infer("random", bench, out, {})
    assert plain.total == N
    # switched on later: only the rotations are asked
    s = infer("random", bench, out, {"circular": True})
    assert (s.total, s.skipped, s.answered) == (N + 3 * (N - 10), N, 3 * (N - 10))
    rows = {r["qid"]: r for r in read_jsonl(out)}
    assert {f"mc00#rot{k}" for k in (1, 2, 3)} <= set(rows) and "num00#rot1" not in rows
    again = infer("random", bench, out, {"circular": True})
    assert (again.skipped, again.answered) == (s.total, 0)


def test_oracle_is_right_under_every_rotation(tmp_path, phantom_bench):
    from spatialvqa.scoring import circular_eval, score_predictions
    recs, f = phantom_bench
    out = tmp_path / "oracle.jsonl"
    s = infer("oracle", f, out, {"circular": True})
    mc = sum(r["format"] == "mc" for r in recs)
    assert s.total == len(recs) + 3 * mc and s.errors == 0
    scored = score_predictions(with_rotations(recs), read_jsonl(out), "oracle")
    assert scored["correct"].map(lambda c: c is True).all()
    circ = circular_eval(scored)
    assert len(circ) == mc and circ["complete"].all() and (circ["circular"] == 1.0).all()


@pytest.mark.parametrize("name", ["prior", "blind_text"])
def test_cross_fitted_answers_unchanged_by_rotations(phantom_bench, name):
    recs, _ = phantom_bench
    plain, circ = make_adapter(name, {"seed": 0}), make_adapter(name, {"seed": 0})
    plain.prepare(recs)
    circ.prepare(with_rotations(recs))
    assert {q: circ._preds[q] for q in plain._preds} == plain._preds            # never trained on the rotated copies
    assert all(r["qid"] in circ._preds for r in with_rotations(recs))


@pytest.mark.parametrize("timed", ["1", "0"])
def test_log_lines_carry_the_time_of_day_unless_told_not_to(timed):
    "A stage's kernel runs with SPATIALVQA_LOG_TIME=0 (spatialvqa.runner): the log lines its copy keeps hold no clock."
    r = subprocess.run([sys.executable, "-c", "from spatialvqa.core import get_logger; get_logger('x').info('hello')"],
                       env={**os.environ, "SPATIALVQA_LOG_TIME": timed}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    if timed == "1": assert line[:9].count(":") == 2 and line[9:] == "INFO spatialvqa.x: hello", line
    else: assert line == "INFO spatialvqa.x: hello", line
