"""Issue 11, hardening: no command destroys data or leaks a key, and no number is read wrong without an error.
One test per case of the issue, named after it (data loss, secrets, wrong numbers); the every-subcommand fault test
is tests/test_cli_faults.py."""
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from spatialvqa.models.commands import model_entry
from spatialvqa.models.registry import make_adapter
from spatialvqa.models.run import _Lock, lock_path, partial_path, run_inference
from spatialvqa.cli import main
from spatialvqa.core import SecretOptionError, read_jsonl, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-hardening-test-0123456789abcdef"       # what an API key looks like; must never reach a file or a log


def _bench(path: Path, n: int = 6) -> Path:
    recs = [{"qid": f"q{i}", "format": "mc", "question": f"Question {i}?", "options": ["w", "x", "y", "z"], "unit": None,
             "answer_letter": "A"} for i in range(n)]
    write_jsonl(recs, path)
    return path


def run(capsys, *argv):
    "`spatialvqa ARGV` in this process: (status, stderr)."
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err or rc == 1, err
    return rc, err


# --- data loss: --out ---------------------------------------------------------------------------------------------

def test_out_equal_to_input_is_refused_measure(tmp_path, capsys):
    lab = tmp_path / "same.nii.gz"
    lab.write_bytes(b"\x1f\x8b label map")
    rc, err = run(capsys, "measure", lab, "--out", lab)
    assert rc == 2 and "is the input" in err and lab.read_bytes() == b"\x1f\x8b label map"


def test_out_equal_to_input_is_refused_infer(tmp_path, capsys):
    b = _bench(tmp_path / "b.jsonl")
    before = b.read_bytes()
    for out in (b, tmp_path / "." / "b.jsonl"):
        rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", out)
        assert rc == 2 and "is the input" in err and "b.jsonl" in err
    assert b.read_bytes() == before


def test_out_hard_link_to_input_is_refused(tmp_path, capsys):
    b = _bench(tmp_path / "b.jsonl")
    os.link(b, tmp_path / "alias.jsonl")                                   # another name, the same inode
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "alias.jsonl")
    assert rc == 2 and "is the input" in err


def test_input_inside_output_folder_is_not_replaced(tmp_path, capsys):
    d = tmp_path / "exp"
    b = _bench(d / "bench.jsonl")
    before = b.read_bytes()
    # would write exp/bench.jsonl over its input
    rc, err = run(capsys, "export", b, "--out", d, "--name", "bench")
    assert rc == 2 and "is the input" in err and "bench.jsonl" in err
    assert b.read_bytes() == before


def test_out_folder_is_refused(tmp_path, capsys):
    b = _bench(tmp_path / "b.jsonl")
    (tmp_path / "outdir").mkdir()
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "outdir")
    assert rc == 2 and "outdir" in err and "is a folder" in err


def test_out_device_is_refused(tmp_path, capsys):
    b = _bench(tmp_path / "b.jsonl")
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", "/dev/null")
    assert rc == 2 and "/dev/null" in err and "device" in err
    assert Path("/dev/null").is_char_device()


def test_out_symlink_is_refused(tmp_path, capsys):
    b = _bench(tmp_path / "b.jsonl")
    target = tmp_path / "precious.json"
    target.write_text('{"keep": 1}')
    (tmp_path / "link.json").symlink_to(target)
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "link.json")
    assert rc == 2 and "symbolic link" in err and target.read_text() == '{"keep": 1}'


def test_out_file_where_a_folder_is_written_is_refused(tmp_path, capsys):
    b = _bench(tmp_path / "b.jsonl")
    (tmp_path / "afile").write_text("x")
    rc, err = run(capsys, "export", b, "--out", tmp_path / "afile")
    assert rc == 2 and "must be a folder" in err and (tmp_path / "afile").read_text() == "x"


# --- data loss: infer keeps every configuration ------------------------------------------------------------------

def test_infer_keeps_other_configs_predictions(tmp_path, capsys):
    b, out = _bench(tmp_path / "b.jsonl"), tmp_path / "p.jsonl"
    assert run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", out, "--config", "seed=0")[0] == 0
    first = read_jsonl(out)
    assert run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", out, "--config", "seed=1")[0] == 0
    assert run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", out, "--prompt-style", "radiologist")[0] == 0
    rows = read_jsonl(out)
    assert len(rows) == 18 and len({r["config_hash"] for r in rows}) == 3 and len({r["key"] for r in rows}) == 18
    assert all(r in rows for r in first)                                      # the first run's rows, untouched
    # the scorer never picks one of them silently (issue 23): it refuses the file, naming the runs; split_runs scores each
    from spatialvqa.results.scores import read_predictions, split_runs
    with pytest.raises(ValueError, match="p.jsonl: holds 3 runs"): read_predictions(tmp_path, ["p"])
    assert sorted(len(v) for v in split_runs(rows).values()) == [6, 6, 6]


def test_infer_refuses_unrelated_jsonl_unless_overwrite(tmp_path, capsys):
    b, out = _bench(tmp_path / "b.jsonl"), tmp_path / "notes.jsonl"
    write_jsonl([{"note": "my own records"}], out)
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", out)
    assert rc == 2 and "notes.jsonl is not a predictions file" in err and "--overwrite" in err
    assert read_jsonl(out) == [{"note": "my own records"}]
    assert run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", out, "--overwrite")[0] == 0
    assert len(read_jsonl(out)) == 6


def test_infer_finishing_keeps_other_configs_partial(tmp_path, capsys):
    b, out = _bench(tmp_path / "b.jsonl"), tmp_path / "p.jsonl"
    # an interrupted run of seed 1: three answers in the partial log, nothing in `out`
    other = tmp_path / "other.jsonl"
    run_inference(make_adapter("random", {"seed": 1}), read_jsonl(b)[:3], other)
    write_jsonl(read_jsonl(other), partial_path(out))
    assert run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", out, "--config", "seed=0")[0] == 0
    assert len(read_jsonl(partial_path(out))) == 3                          # seed 1's partial rows are still there
    s = run_inference(make_adapter("random", {"seed": 1}), read_jsonl(b), out)
    assert (s.skipped, s.answered) == (3, 3) and not partial_path(out).exists()
    assert len(read_jsonl(out)) == 12


def test_infer_concurrent_run_is_status_2(tmp_path, capsys):
    b, out = _bench(tmp_path / "b.jsonl"), tmp_path / "p.jsonl"
    with _Lock(lock_path(out)):
        rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", out)
    assert rc == 2 and "another run is writing this output" in err and "p.jsonl" in err


def test_infer_lock_file_is_never_removed_while_held(tmp_path):
    b, out = _bench(tmp_path / "b.jsonl"), tmp_path / "p.jsonl"
    lock = lock_path(out)
    with _Lock(lock) as held:
        assert lock.exists()
        ino = os.fstat(held.f.fileno()).st_ino
    run_inference(make_adapter("random"), read_jsonl(b), out)
    # the same file: never deleted and re-made
    assert lock.exists() and os.stat(lock).st_ino == ino
    # outputs, clocks
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jsonl", "p.jsonl", "p.jsonl.times.jsonl"]


# --- secrets ---------------------------------------------------------------------------------------------------------

class EchoServer:
    "An OpenAI-style server that echoes the request headers back: in the completion, in a non-JSON body, in odd JSON."
    def __init__(self, mode: str = "completion"):
        self.mode = mode

    def __enter__(self):
        srv = self
        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a): pass
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                h = dict(self.headers)
                echo = json.dumps({"Authorization": h.pop("Authorization", None), **h})   # the key first: never cut off
                if srv.mode == "completion":
                    data = json.dumps({"choices": [{"message": {"content": f"A (you sent {echo})"}, "finish_reason": "stop"}]})
                elif srv.mode == "not-json": data = f"<html>proxy error, headers: {echo}</html>"
                elif srv.mode == "unexpected": data = json.dumps({"echo": echo})
                else: data = json.dumps({"error": echo}); self.send_response(400)
                if srv.mode != "http-error": self.send_response(200)
                self.send_header("Content-Length", str(len(data.encode())))
                self.end_headers()
                self.wfile.write(data.encode())
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        return self

    def __exit__(self, *exc): self.httpd.shutdown(); self.httpd.server_close()


@pytest.mark.parametrize("mode", ["completion", "not-json", "unexpected", "http-error"])
def test_echoing_server_key_never_reaches_predictions(tmp_path, capsys, monkeypatch, mode):
    monkeypatch.setenv("HARDENING_API_KEY", KEY)
    b, out = _bench(tmp_path / "b.jsonl", 3), tmp_path / "p.jsonl"
    with EchoServer(mode) as srv:
        rc, err = run(capsys, "infer", "--model", "echo", "--adapter", "openai", "--representation", "none", "--benchmark", b,
                      "--out", out, "--max-retries", "0",
                      "--config", "model=m", f"base_url={srv.url}", "api_key_env=HARDENING_API_KEY", "max_attempts=1", "workers=1")
    assert KEY not in err and KEY[:12] not in err
    # every answer an error: status 2 quoting the first, masked; no file (issue 23)
    if mode != "completion":
        assert rc == 2 and "all 3 answers of echo are errors" in err and "Bearer ***" in err, err
        assert not out.exists()
        return
    assert rc == 0, err
    text = out.read_text()
    assert KEY not in text and KEY[:12] not in text
    rows = read_jsonl(out)
    assert all("Bearer ***" in r["raw"] for r in rows), rows[0]["raw"]          # the echo is there, the key masked


def test_llm_error_paths_mask_the_key(monkeypatch):
    from spatialvqa.llm.openai import OpenAICompatible
    from spatialvqa.llm.protocol import LLMError
    monkeypatch.setenv("HARDENING_API_KEY", KEY)
    for mode in ("not-json", "unexpected", "http-error"):
        with EchoServer(mode) as srv:
            llm = OpenAICompatible("m", srv.url, api_key_env="HARDENING_API_KEY", max_attempts=1)
            with pytest.raises(LLMError) as e: llm.complete("hi")
        assert KEY not in str(e.value) and "Bearer ***" in str(e.value), (mode, str(e.value))


@pytest.mark.parametrize("item", [f"api_key={KEY}", f"API-Key={KEY}", '{"extra_body": {"token": "t0ken-value"}}', "password=hunter22"])
def test_api_key_in_config_is_refused(tmp_path, capsys, item):
    b = _bench(tmp_path / "b.jsonl")
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "p.jsonl", "--config", item)
    assert rc == 2 and "--config" in err and "api_key_env" in err and KEY not in err
    assert not (tmp_path / "p.jsonl").exists()


def test_api_key_in_params_yaml_is_refused(tmp_path, capsys):
    b = _bench(tmp_path / "b.jsonl")
    (tmp_path / "params.yaml").write_text(f"infer:\n  models:\n    gpt:\n      adapter: openai\n      config: {{model: m, Secret: {KEY}}}\n")
    rc, err = run(capsys, "infer", "--model", "gpt", "--params", tmp_path / "params.yaml", "--benchmark", b, "--out", tmp_path / "p.jsonl")
    assert rc == 2 and "infer.models.gpt.config.Secret" in err and "api_key_env" in err and KEY not in err


@pytest.mark.parametrize("section,read", [
    ("validate.llm", lambda cfg: __import__("spatialvqa.validate.answerers", fromlist=["x"]).LLMAnswerer(cfg)),
    ("ctsvqa_score.llm", lambda cfg: __import__("spatialvqa.llm.registry", fromlist=["x"]).make_llm(cfg)),
    ("ctsvqa_generate.llm", lambda cfg: __import__("spatialvqa.llm.registry", fromlist=["x"]).make_llm(cfg)),
    ("infer.models.x", lambda cfg: model_entry("x", {"adapter": "openai", "config": cfg})),
])
def test_api_key_in_every_llm_config_section_is_refused(section, read):
    for cfg in ({"backend": "openai", "model": "m", "api_key": KEY}, {"backend": "openai", "model": "m", "extra_body": {"Token": KEY}}):
        with pytest.raises(SecretOptionError, match="api_key_env") as e: read(cfg)
        assert KEY not in str(e.value)


def test_stage_run_writes_the_key_nowhere(tmp_path, monkeypatch):
    """The infer stage notebook run as DVC runs it (papermill), against a server that echoes the key back, with the key
    in the environment: no file the run wrote, the executed notebook included, holds the key."""
    monkeypatch.setenv("HARDENING_API_KEY", KEY)
    b = _bench(tmp_path / "b.jsonl", 4)
    with EchoServer("completion") as srv, EchoServer("not-json") as bad:
        (tmp_path / "params.yaml").write_text(
            "infer:\n  models:\n"
            f"    echo: {{adapter: openai, representation: none, config: {{model: m, base_url: '{srv.url}', api_key_env: HARDENING_API_KEY, max_attempts: 1}}}}\n"
            f"    broken: {{adapter: openai, representation: none, max_retries: 0, config: {{model: m, base_url: '{bad.url}', api_key_env: HARDENING_API_KEY, max_attempts: 1}}}}\n")
        for model in ("echo", "broken"):
            r = subprocess.run([sys.executable, "-m", "papermill", "--kernel", "spatialvqa", "--cwd", str(ROOT), "--log-level", "WARNING",
                                "--no-progress-bar", str(ROOT / "nbs/stages/infer.ipynb"), str(tmp_path / f"infer_{model}.ipynb"),
                                "-p", "model", model, "-p", "benchmark", str(b), "-p", "out", str(tmp_path / "pred" / f"{model}.jsonl"),
                                "-p", "params_file", str(tmp_path / "params.yaml"), "-p", "cache_dir", str(tmp_path / "cache")],
                               capture_output=True, text=True, env={**os.environ, "SPATIALVQA_PROGRESS": "0"})
            assert r.returncode == 0, r.stderr[-3000:]
            assert KEY not in r.stdout + r.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name not in ("b.jsonl", "params.yaml")]
    assert {p.name for p in written} >= {"infer_echo.ipynb", "infer_broken.ipynb", "echo.jsonl", "broken.jsonl"}
    for p in written: assert KEY.encode() not in p.read_bytes() and KEY[:12].encode() not in p.read_bytes(), p
    nb = (tmp_path / "infer_broken.ipynb").read_text()
    assert "Bearer ***" in nb                                                   # the errors are printed, masked


def test_dvc_stage_refuses_a_secret_in_params_before_papermill_writes(tmp_path):
    """papermill writes every parameter into the executed notebook before the first cell runs, so a check inside the
    notebook comes too late: the runner every dvc.yaml stage goes through (`spatialvqa-stage`) checks params.yaml first."""
    import yaml
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert all((st.get("do") or st)["cmd"].startswith("spatialvqa-stage ") for st in stages.values())
    llm = json.dumps({"backend": "openai", "model": "m", "api_key": KEY})
    (tmp_path / "params.yaml").write_text(f"validate:\n  llm: '{llm}'\n")
    cmd = f"spatialvqa-stage validate --dvc-file {ROOT / 'dvc.yaml'} --params params.yaml -p questions q.jsonl"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "params.yaml: validate.llm.api_key" in r.stderr and KEY not in r.stderr + r.stdout
    assert not (tmp_path / "reports").exists()                                   # papermill never started
    r = subprocess.run(["bash", "-c", "spatialvqa check-params params.yaml"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr                                           # the project's own params are clean


def test_dvc_stage_from_another_folder_says_where_the_pipeline_is(tmp_path):
    "`spatialvqa-stage` outside the project's root: status 2 naming the missing dvc.yaml and the package's own."
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-c", "spatialvqa-stage tables"], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"dvc.yaml: no such pipeline file in {tmp_path}" in r.stderr, r.stderr
    assert f"--dvc-file {ROOT / 'dvc.yaml'}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.iterdir())         # nothing written there


# --- wrong numbers: parse_number ------------------------------------------------------------------------------------

def test_parse_negative_volume_is_not_read_as_positive():
    from spatialvqa.parse import parse_number
    from spatialvqa.scoring import score_predictions
    assert parse_number("-12 mL").value == -12.0 and parse_number("The volume is −12 mL.").value == -12.0
    rec = {"qid": "v", "format": "numeric", "task": "VOLEST", "answer_value": 12.0, "unit": "mL", "tolerance": 1.0, "scan_id": "s"}
    row = score_predictions([rec], [{"qid": "v", "raw": "-12 mL", "error": None}], "m").iloc[0]
    assert row["correct"] is False and row["mra"] == 0.0                       # -12 scores as wrong, not full credit


def test_parse_decimal_comma_is_not_truncated():
    from spatialvqa.parse import extract_number
    assert extract_number("12,5 mL") == 12.5 and extract_number("about 3,14 L") == 3140.0


def test_parse_decimal_comma_litres_are_not_zero():
    from spatialvqa.parse import extract_number
    assert extract_number("0,5 L") == 500.0 and extract_number("0,500 L") == 500.0


def test_parse_thousands_separator_rule():
    from spatialvqa.parse import extract_number, parse_number
    assert [extract_number(t) for t in ("1,200 mL", "12,500 mL", "1,234,567 mm³")] == [1200.0, 12500.0, 1234.567]
    assert parse_number("options 1,2,3 mL").status == "no_answer"                 # a list is not one number
    assert extract_number("150-170 mL") == 160.0                                  # a hyphen after a number: a range


# --- wrong numbers: jury verdicts, empty predictions, bad benchmark records ------------------------------------------

def _jury_files(tmp_path, verdict):
    preds = tmp_path / "m3d_predictions_full.jsonl"
    write_jsonl([{"question": "Q1", "answer": "A1", "prediction": "P1"}, {"question": "Q2", "answer": "A2", "prediction": "P2"}], preds)
    judge = tmp_path / "m3d_gpt_eval.json"
    judge.write_text(json.dumps([{"question": "Q1", "answer": "A1", "prediction": "P1", "is_correct": True},
                                 {"question": "Q2", "answer": "A2", "prediction": "P2", "is_correct": verdict}]))
    return preds, judge


@pytest.mark.parametrize("verdict", ["true", "False", 1, 0.0, [True]])
def test_jury_verdict_that_is_not_a_boolean_is_an_error(tmp_path, capsys, verdict):
    preds, judge = _jury_files(tmp_path, verdict)
    rc, err = run(capsys, "ctsvqa-jury", "--predictions", preds, "--judgments", judge, "--out", tmp_path / "o.json")
    assert rc == 2 and "m3d_gpt_eval.json: row 1" in err and "is not true, false or null" in err
    assert not (tmp_path / "o.json").exists()


def test_jury_null_verdict_is_no_vote(tmp_path, capsys):
    preds, judge = _jury_files(tmp_path, None)
    assert run(capsys, "ctsvqa-jury", "--predictions", preds, "--judgments", judge, "--out", tmp_path / "o.json")[0] == 0
    assert json.loads((tmp_path / "o.json").read_text())["count"] == 1


@pytest.mark.parametrize("cmd", ["ctsvqa-jury", "ctsvqa-text"])
def test_empty_predictions_file_is_a_clear_error(tmp_path, capsys, cmd):
    preds, judge = _jury_files(tmp_path, True)
    preds.write_text("")
    extra = ["--judgments", judge] if cmd == "ctsvqa-jury" else ["--no-sbert", "--no-meteor"]
    rc, err = run(capsys, cmd, "--predictions", preds, *extra, "--out", tmp_path / "o.json")
    assert rc == 2 and "m3d_predictions_full.jsonl: no predictions" in err


def test_empty_jury_result_writes_null_not_nan(tmp_path):
    from spatialvqa.core import write_json
    from spatialvqa.ctsvqa.jury import jury_accuracy
    res = jury_accuracy([], [[]], "key", "m")
    write_json(res.summary(), tmp_path / "o.json")
    text = (tmp_path / "o.json").read_text()
    assert "NaN" not in text and json.loads(text)["jury_accuracy"] is None


def test_json_writers_refuse_nan_and_infinity(tmp_path):
    from spatialvqa.core import write_json, write_jsonl
    write_jsonl([{"x": float("nan")}], tmp_path / "a.jsonl")
    assert (tmp_path / "a.jsonl").read_text() == '{"x": null}\n'
    with pytest.raises(ValueError, match="not valid JSON"): write_json({"x": float("inf")}, tmp_path / "b.json")
    assert not (tmp_path / "b.json").exists()


def test_threshold_nan_is_rejected(tmp_path, capsys):
    preds, judge = _jury_files(tmp_path, True)
    for t in ("nan", "1.5", "-0.1"):
        rc, err = run(capsys, "ctsvqa-jury", "--predictions", preds, "--judgments", judge, "--threshold", t, "--out", tmp_path / "o.json")
        assert rc == 2 and f"--threshold {float(t)}" in err


def test_malformed_judgment_json_names_the_file(tmp_path, capsys):
    preds, judge = _jury_files(tmp_path, True)
    judge.write_text('[{"question": "Q1", "is_correct": tru')
    rc, err = run(capsys, "ctsvqa-jury", "--predictions", preds, "--judgments", judge, "--out", tmp_path / "o.json")
    assert rc == 2 and "m3d_gpt_eval.json: not valid JSON" in err and "line 1" in err


@pytest.mark.parametrize("bad,why", [({"answer_value": 0}, "answer_value 0 "), ({"answer_value": None}, "answer_value None"),
                                     ({"answer_value": float("nan")}, "answer_value nan"), ({"answer_value": "abc"}, "answer_value 'abc'"),
                                     ({"tolerance": "x"}, "tolerance 'x'")])
def test_score_bad_benchmark_record_names_the_qid(bad, why):
    from spatialvqa.scoring import score_predictions, toy_records
    recs = toy_records(2, 2, 2)
    i = next(i for i, r in enumerate(recs) if r["format"] == "numeric")
    recs[i] = dict(recs[i], **bad)
    preds = [{"qid": r["qid"], "raw": "A", "error": None} for r in recs]
    with pytest.raises(ValueError, match=f"b.jsonl: qid {recs[i]['qid']}: {why}"): score_predictions(recs, preds, "m", source="b.jsonl")
    # unanswered too
    with pytest.raises(ValueError, match=f"benchmark record {recs[i]['qid']}"): score_predictions(recs, [], "m")


def test_score_stage_names_the_benchmark_file():
    "The score stage scores through results.scores.score_models, which passes the benchmark file on to the error."
    from spatialvqa.results.scores import score_models
    from spatialvqa.scoring import toy_records
    recs = toy_records(2, 2, 2)
    i = next(i for i, r in enumerate(recs) if r["format"] == "numeric")
    recs[i] = dict(recs[i], answer_value=None)
    preds = {"m": [{"qid": r["qid"], "raw": "A", "error": None} for r in recs]}
    with pytest.raises(ValueError, match=f"validated.jsonl: qid {recs[i]['qid']}"):
        score_models(recs, preds, source="data/benchmark/validated.jsonl")


# --- every fault: status 2 and a sentence ----------------------------------------------------------------------------

def test_permission_error_on_out_is_status_2(tmp_path, capsys):
    # root ignores permissions: a read-only bind is not available
    if os.geteuid() == 0:
        ro = Path("/proc/version")                             # a file nobody may replace
        b = _bench(tmp_path / "b.jsonl")
        rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", ro)
        assert rc == 2 and "/proc/version" in err
        return
    d = tmp_path / "ro"; d.mkdir(); d.chmod(0o500)
    b = _bench(tmp_path / "b.jsonl")
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", d / "p.jsonl")
    assert rc == 2 and "Permission denied" in err


def test_is_a_directory_and_file_exists_on_out_are_status_2(tmp_path, capsys):
    b = _bench(tmp_path / "b.jsonl")
    (tmp_path / "f").write_text("x")
    # a file on the path
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "f" / "p.jsonl")
    assert rc == 2 and "a folder on its path is a file" in err
    # a file where a folder goes
    rc, err = run(capsys, "phantom", "--out", tmp_path / "f", "-n", "1")
    assert rc == 2 and "must be a folder" in err


def test_jsonl_line_that_is_a_list_names_file_and_line(tmp_path, capsys):
    b = tmp_path / "b.jsonl"
    b.write_text('{"qid": "a", "question": "Q?"}\n[1, 2]\n')
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "p.jsonl")
    assert rc == 2 and "b.jsonl:2: a record must be a JSON object, not list" in err


def test_missing_field_names_file_line_and_field(tmp_path, capsys):
    b = tmp_path / "b.jsonl"
    b.write_text('{"qid": "a", "question": "Q?"}\n{"question": "no qid"}\n')
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "p.jsonl")
    assert rc == 2 and "b.jsonl:2: the record has no field 'qid'" in err
    p = tmp_path / "m3d_predictions_full.jsonl"
    p.write_text('{"question": "Q", "prediction": "P"}\n')
    rc, err = run(capsys, "ctsvqa-text", "--predictions", p, "--no-sbert", "--no-meteor", "--out", tmp_path / "o.json")
    assert rc == 2 and "m3d_predictions_full.jsonl:1: the record has no field 'answer'" in err


def test_duplicate_qids_name_the_qid_and_file(tmp_path, capsys):
    b = _bench(tmp_path / "b.jsonl", 3)
    b.write_text(b.read_text() + b.read_text().splitlines()[1] + "\n")
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "p.jsonl")
    assert rc == 2 and "b.jsonl: the benchmark repeats the qid 'q1'" in err


@pytest.mark.parametrize("limit", ["0", "-2"])
def test_limit_zero_or_negative_is_rejected(tmp_path, capsys, limit):
    b = _bench(tmp_path / "b.jsonl")
    rc, err = run(capsys, "infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "p.jsonl", "--limit", limit)
    assert rc == 2 and f"--limit {limit}" in err and not (tmp_path / "p.jsonl").exists()


def test_file_exists_error_under_out_is_status_2(tmp_path, capsys):
    (tmp_path / "ph").mkdir()
    (tmp_path / "ph" / "phantom_000").write_text("a file where a subject folder goes")
    rc, err = run(capsys, "phantom", "--out", tmp_path / "ph", "-n", "1", "--workers", "0")
    # refused before anything is generated (it was a FileExistsError midway): the file is left as it was
    assert rc == 2 and "ph: already holds phantom_000" in err and "Nothing written" in err
    assert (tmp_path / "ph" / "phantom_000").read_text() == "a file where a subject folder goes"


# === issue 23: what a new user trips over ===========================================================================
# Every case runs the console script in its own process, as a user does, and checks the status, the one sentence, no
# traceback, the inputs unchanged and nothing written outside --out.

EXE = Path(sys.executable).parent / "spatialvqa"


def cli(*argv, cwd=None, env=None):
    "`spatialvqa ARGV` as its own process: (status, stdout, stderr)."
    r = subprocess.run([str(EXE), *map(str, argv)], capture_output=True, text=True, cwd=cwd, timeout=600,
                       env={**os.environ, "SPATIALVQA_PROGRESS": "0", **(env or {})})
    return r.returncode, r.stdout, r.stderr


def tree(folder: Path) -> dict:
    "Every file under `folder` (relative path -> bytes): what a command may not change outside its --out."
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def refused(r, cmd: str, *want: str) -> str:
    "Assert status 2, no traceback and exactly one error sentence holding every `want`; return the sentence."
    rc, out, err = r
    assert rc == 2, (rc, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    lines = [l for l in err.splitlines() if l.startswith(f"spatialvqa {cmd}: error: ")]
    assert len(lines) == 1, err[-3000:]
    for w in want: assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def phantom_bench(tmp_path_factory):
    """Two phantoms, their measurements and a few generated questions, in a folder `b/` whose benchmark names the
    scans by paths relative to itself."""
    from spatialvqa.measure import measure_manifests
    from spatialvqa.phantom.cohort import make_cohort
    from spatialvqa.questions.generate import generate_questions
    d = tmp_path_factory.mktemp("pb") / "b"
    make_cohort(d / "scans", n_subjects=2, seed=3, workers=0)
    table, scans, _ = measure_manifests([d / "scans" / "cohort.json"], workers=0)
    # DIR 3: with 2, one phantom had no DIR.relative, and validate cannot cross-fit a subtask over one scan (VOLEST 2: with
    # 1, phantom 4 left each VOLEST subtask on one scan; VOL 3: with 2, the per-task streams left VOL.sum and VOL.range on one)
    recs = generate_questions(table, seed=0, per_scan={"DIR": 3, "VOL": 3, "VOLEST": 2}, scans=scans,
                              tasks=("DIR", "VOL", "VOLEST"))
    rel = lambda p: os.path.relpath(p, d)
    for r in recs:
        for k in ("images", "label_maps"):
            if r.get(k): r[k] = [rel(p) for p in r[k]]
    write_jsonl(recs, d / "bench.jsonl")
    return d / "bench.jsonl"


def test_i23_infer_refuses_a_notes_file(tmp_path):
    "Item 1: any existing file that holds no predictions is refused unless --overwrite."
    b = _bench(tmp_path / "b.jsonl")
    for name, text in (("n.txt", "notes\n"), ("empty.jsonl", ""), ("other.json", '{"a": 1}\n')):
        f = tmp_path / name
        f.write_text(text)
        before = tree(tmp_path)
        refused(cli("infer", "--model", "random", "--benchmark", b, "--out", f), "infer", f"{name} is not a predictions file", "--overwrite")
        assert tree(tmp_path) == before
    assert cli("infer", "--model", "random", "--benchmark", b, "--out", tmp_path / "n.txt", "--overwrite")[0] == 0
    assert len(read_jsonl(tmp_path / "n.txt")) == 6


def test_i23_infer_refuses_a_second_model_in_one_file(tmp_path):
    "Item 2: a predictions file holds one model unless --mixed; the scorer never reports 0 for rows it did not pick."
    b = _bench(tmp_path / "b.jsonl")
    pred = tmp_path / "predictions" / "random.jsonl"
    assert cli("infer", "--model", "random", "--benchmark", b, "--out", pred)[0] == 0
    before = tree(tmp_path)
    refused(cli("infer", "--model", "oracle", "--benchmark", b, "--out", pred), "infer", "random.jsonl holds predictions of random, not of oracle", "--mixed")
    assert tree(tmp_path) == before
    assert cli("infer", "--model", "coin", "--adapter", "random", "--config", "seed=5", "--benchmark", b, "--out", pred, "--mixed")[0] == 0
    from spatialvqa.results.scores import read_predictions
    with pytest.raises(ValueError, match=r"random.jsonl: holds 2 runs \(random: 6 rows, coin: 6 rows\)"):
        read_predictions(pred.parent, ["random"])


def test_i23_infer_image_model_without_representation_is_refused(tmp_path):
    "Item 4: a model that reads images is not run blind by default."
    b = _bench(tmp_path / "b.jsonl")
    before = tree(tmp_path)
    refused(cli("infer", "--model", "qwen", "--adapter", "openai", "--benchmark", b, "--out", tmp_path / "q.jsonl",
                "--config", "model=Qwen/Qwen2.5-VL-7B-Instruct", "base_url=http://127.0.0.1:9/v1"),
            "infer", "model qwen", "reads images", "--representation")
    assert tree(tmp_path) == before


def test_i23_infer_all_errors_is_a_failure_quoting_the_first(phantom_bench, tmp_path):
    "Item 4: a run whose rows all end in errors exits non-zero with the first error; a missing scan is not retried."
    bad = tmp_path / "bad.jsonl"
    write_jsonl([dict(r, label_maps=["nowhere/" + p for p in r["label_maps"]]) for r in read_jsonl(phantom_bench)], bad)
    before = tree(tmp_path)
    import time
    t0 = time.monotonic()
    line = refused(cli("infer", "--model", "oracle", "--benchmark", bad, "--out", tmp_path / "o.jsonl"), "infer",
                   "o.jsonl: all", "answers of oracle are errors, the first", "ScanError", "nowhere/")
    assert time.monotonic() - t0 < 60, "a missing scan must not be retried with back-off"
    assert tree(tmp_path) == before, line


def test_i23_scan_paths_resolve_relative_to_the_benchmark(phantom_bench, tmp_path):
    "Item 4: the same benchmark answered from another working directory reads the same scans."
    elsewhere = tmp_path / "elsewhere"; elsewhere.mkdir()
    rc, out, err = cli("infer", "--model", "oracle", "--benchmark", phantom_bench, "--out", tmp_path / "o.jsonl", cwd=elsewhere)
    assert rc == 0, err
    rows = read_jsonl(tmp_path / "o.jsonl")
    assert len(rows) == len(read_jsonl(phantom_bench)) and all(r["error"] is None for r in rows)
    assert not list(elsewhere.iterdir())


def test_i23_credentials_in_urls_never_leak(tmp_path):
    "Item 5: a key inside a URL or a header is refused in params and configs, and masked in every text."
    secret = "sk-url-0123456789abcdef"
    b = _bench(tmp_path / "b.jsonl")
    before = tree(tmp_path)
    r = cli("infer", "--model", "q", "--adapter", "openai", "--representation", "none", "--benchmark", b, "--out", tmp_path / "q.jsonl",
            "--config", "model=m", f"base_url=http://u:{secret}@127.0.0.1:9/v1")
    refused(r, "infer", "--config.base_url", "credentials", "api_key_env")
    assert secret not in r[1] + r[2]
    preds = tmp_path / "p.jsonl"
    write_jsonl([{"question": "Q", "answer": "A", "prediction": "P"}], preds)
    before = tree(tmp_path)
    r = cli("ctsvqa-judge", "--predictions", preds, "--judge", f"openai:m@http://u:{secret}@127.0.0.1:9/v1", "--out", tmp_path / "j.jsonl")
    refused(r, "ctsvqa-judge", "base_url", "credentials")
    assert secret not in r[1] + r[2] and tree(tmp_path) == before
    for text in (f"infer:\n  models:\n    q: {{adapter: openai, config: {{model: m, base_url: 'http://u:{secret}@h/v1'}}}}\n",
                 f"infer:\n  models:\n    q: {{adapter: openai, config: {{model: m, extra_headers: {{Authorization: 'Bearer {secret}'}}}}}}\n",
                 f"x:\n  url: 'https://h/v1/models?alt=json&key={secret}'\n"):
        (tmp_path / "params.yaml").write_text(text)
        r = cli("check-params", tmp_path / "params.yaml")
        refused(r, "check-params", "params.yaml: ")
        assert secret not in r[1] + r[2]
    from spatialvqa.core import mask_secrets
    assert mask_secrets(f"GET http://u:{secret}@h/v1?key={secret} Authorization: Bearer {secret}") == \
        "GET http://***@h/v1?key=*** Authorization: Bearer ***"


RELEASE = ROOT.parent / "shared" / "data" / "ct-spatialvqa"


def test_i23_jury_numbers_come_from_the_given_predictions(tmp_path):
    "Item 3: the published alignment refuses predictions that are not the release's; a key join below 95% is an error."
    assert (RELEASE / "predictions").is_dir(), f"shared data missing: {RELEASE}"
    m3d = sorted(str(p) for p in (RELEASE / "judgments").glob("m3d_*"))
    three = tmp_path / "m3d_three.jsonl"
    write_jsonl(read_jsonl(RELEASE / "predictions" / "m3d_predictions_full.jsonl")[:3], three)
    before = tree(tmp_path)
    refused(cli("ctsvqa-jury", "--predictions", three, "--judgments", *m3d, "--align", "published", "--out", tmp_path / "j.json"),
            "ctsvqa-jury", "m3d_three.jsonl: not the predictions these judges judged", "its 3 rows", "--align key")
    line = refused(cli("ctsvqa-jury", "--predictions", RELEASE / "predictions" / "radfm_predictions_full.jsonl", "--judgments", *m3d,
                       "--align", "key", "--out", tmp_path / "j.json"), "ctsvqa-jury", "radfm_predictions_full.jsonl: only", "of its 9077 predictions")
    assert "95%" in line
    assert tree(tmp_path) == before
    rc, out, err = cli("ctsvqa-jury", "--predictions", RELEASE / "predictions" / "m3d_predictions_full.jsonl", "--judgments", *m3d,
                       "--align", "published", "--out", tmp_path / "j.json")
    assert rc == 0, err
    res = json.loads((tmp_path / "j.json").read_text())
    assert res["count"] == 9074 and abs(res["jury_accuracy"] - 0.3057) < 5e-5


def test_i23_jury_wrong_typed_field_is_a_sentence(tmp_path):
    "Clear errors: a number where a text goes names the file, the row and the field."
    preds, judge = _jury_files(tmp_path, True)
    write_jsonl([{"question": 7, "answer": "A1", "prediction": "P1"}], preds)
    refused(cli("ctsvqa-jury", "--predictions", preds, "--judgments", judge, "--out", tmp_path / "o.json"), "ctsvqa-jury",
            "m3d_predictions_full.jsonl: row 0: the field 'question' is int 7, not text")
    write_jsonl([{"question": "Q1", "answer": "A1", "prediction": "P1"}], preds)
    judge.write_text(json.dumps([{"question": "Q1", "answer": ["A1"], "prediction": "P1", "is_correct": True}]))
    refused(cli("ctsvqa-jury", "--predictions", preds, "--judgments", judge, "--out", tmp_path / "o.json"), "ctsvqa-jury",
            "m3d_gpt_eval.json: row 0: the field 'answer' is list")
    assert not (tmp_path / "o.json").exists()


def test_i23_export_name_escape_and_licences(phantom_bench, tmp_path):
    "Item 6: --name is a plain file name (nothing outside --out); the card and LICENSE.md carry every scan's licence."
    from PIL import Image
    recs = read_jsonl(phantom_bench)
    b = write_jsonl(recs, tmp_path / "in" / "b.jsonl")
    (tmp_path / "in" / "v").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "in" / "v" / "a.png")
    write_jsonl([{"qid": r["qid"], "files": ["v/a.png"]} for r in recs], tmp_path / "in" / "index.jsonl")
    ids = sorted({s for r in recs for s in r["scan_ids"]})
    (tmp_path / "in" / "scans.json").write_text(json.dumps([{"scan_id": s, "source": "tcia", "licence": "CC BY 4.0"} for s in ids]))
    (tmp_path / "work").mkdir()
    before = tree(tmp_path)
    refused(cli("export", b, "--out", tmp_path / "work" / "o", "--views", tmp_path / "in" / "index.jsonl", "--name", "../../escape"),
            "export", "--name '../../escape'", "plain file name")
    refused(cli("export", b, "--out", tmp_path / "work" / "o", "--views", tmp_path / "in" / "index.jsonl"),
            "export", "source 'phantom' has no licence", "--scans")
    assert tree(tmp_path) == before and not list(tmp_path.parent.glob("escape*"))
    rc, out, err = cli("export", b, "--out", tmp_path / "work" / "o", "--views", tmp_path / "in" / "index.jsonl",
                       "--scans", tmp_path / "in" / "scans.json", cwd=tmp_path / "work")
    assert rc == 0, err
    assert f"| tcia | {len(ids)} scans; CC BY 4.0 |" in (tmp_path / "work" / "o" / "LICENSE.md").read_text()
    assert f"- tcia: {len(ids)} scans; CC BY 4.0" in (tmp_path / "work" / "o" / "README.md").read_text()
    # every file in --out, but the key from the released ids back to the benchmark's, beside it (never released)
    assert {p for p in tree(tmp_path) if p not in before and not p.startswith("work/o/")} == {"work/o_key.jsonl"}
    assert "key\t" in out and read_jsonl(tmp_path / "work" / "o_key.jsonl")[0]["internal_qid"] in {r["qid"] for r in recs}
    again = ("export", b, "--out", tmp_path / "work" / "o", "--views", tmp_path / "in" / "index.jsonl", "--scans",
             tmp_path / "in" / "scans.json")
    refused(cli(*again, cwd=tmp_path / "work"), "export", "spatialvqa_trackA.parquet: already there", "--overwrite")
    assert cli(*again, "--overwrite", cwd=tmp_path / "work")[0] == 0


# --- issue 23: clear errors instead of tracebacks or silence ---------------------------------------------------------

def _ct_and_labels(d: Path):
    "A 24-voxel-wide CT and a label map with a spleen (1) and a liver (5), written as NIfTI."
    from spatialvqa.scan import Volume, write_volume
    lab = np.zeros((24, 24, 12), np.uint8); lab[3:9, 5:15, 2:9] = 1; lab[13:21, 5:15, 2:9] = 5
    aff = np.diag([2.0, 2.0, 3.0, 1.0])
    return (write_volume(Volume(np.full(lab.shape, -100, np.int16), aff), d / "ct.nii.gz"),
            write_volume(Volume(lab, aff), d / "labels.nii.gz"))


@pytest.mark.parametrize("args,want", [(["--size", "0"], "argument --size: 0 is out of range: it must be from 16 to 4096"),
                                       (["--size", "100000"], "argument --size: 100000 is out of range"),
                                       (["--margin-mm", "-5"], "argument --margin-mm: -5 is out of range")])
def test_i23_views_size_and_margin_are_bounded(tmp_path, args, want):
    ct, lab = _ct_and_labels(tmp_path)
    before = tree(tmp_path)
    refused(cli("views", ct, lab, "--structures", "spleen", "--out", tmp_path / "v", *args), "views", want)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("cmd,args,want", [
    ("phantom", ["-n", "-3", "--out", "{d}/ph"], "argument -n: -3 is out of range: it must be from 1 to 100000"),
    ("phantom", ["-n", "0", "--out", "{d}/ph"], "argument -n: 0 is out of range"),
    ("report-qa", ["--reports", "{d}/r.jsonl", "--max-per-report", "-1", "--out", "{d}/q.jsonl"], "argument --max-per-report: -1 is out of range"),
    ("views", ["{d}/ct.nii.gz", "{d}/labels.nii.gz", "--structures", "spleen", "--margin-mm", "-1", "--out", "{d}/v"], "--margin-mm: -1 is out of range")])
def test_i23_negative_counts_and_margins_are_refused(tmp_path, cmd, args, want):
    _ct_and_labels(tmp_path)
    (tmp_path / "r.jsonl").write_text('{"volume": "v1", "findings": "The liver is enlarged."}\n')
    before = tree(tmp_path)
    refused(cli(cmd, *[a.replace("{d}", str(tmp_path)) for a in args]), cmd, want)
    assert tree(tmp_path) == before


def test_i23_ctrate_download_without_token_is_a_sentence(tmp_path):
    (tmp_path / "q.jsonl").write_text('{"qid": "a", "volume": "valid_1_a_1.nii.gz", "question": "Q?", "answer": "A"}\n')
    before = tree(tmp_path)
    env = {k: "" for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    r = cli("ctrate-download", "--questions", tmp_path / "q.jsonl", "--out", tmp_path / "d", env=env)
    refused(r, "ctrate-download", "CT-RATE is gated", "set the environment variable HF_TOKEN")
    assert "internal error" not in r[2] and tree(tmp_path) == before


def test_i23_report_qa_names_the_file_and_the_field(tmp_path):
    (tmp_path / "r.jsonl").write_text('{"findings": "The liver is enlarged.", "impressions": "x"}\n')
    before = tree(tmp_path)
    refused(cli("report-qa", "--reports", tmp_path / "r.jsonl", "--out", tmp_path / "q.jsonl"), "report-qa",
            "r.jsonl:1: the record has no field 'volume'")
    (tmp_path / "r.jsonl").write_text('{"volume": "v1", "findings": 3}\n')
    refused(cli("report-qa", "--reports", tmp_path / "r.jsonl", "--out", tmp_path / "q.jsonl"), "report-qa",
            "r.jsonl: report 1: the field 'findings' is int, not text")
    # r.jsonl rewritten, nothing added
    assert not (tmp_path / "q.jsonl").exists() and sorted(tree(tmp_path)) == sorted(before)


def test_i23_scaled_label_map_and_nonfinite_ct_are_refused(tmp_path):
    "A label map whose header scales (scl_slope 2 turns spleen 1 into kidney_right 2) and a CT with NaN/inf are refused."
    import nibabel as nib
    ct, lab = _ct_and_labels(tmp_path)
    img = nib.load(str(lab))
    scaled = nib.Nifti1Image(np.asarray(img.dataobj).astype(np.int16), img.affine); scaled.header.set_slope_inter(2, 0)
    nib.save(scaled, tmp_path / "scaled.nii.gz")
    before = tree(tmp_path)
    refused(cli("measure", tmp_path / "scaled.nii.gz", "--out", tmp_path / "m.json"), "measure",
            "scaled.nii.gz: the header scales the stored values (scl_slope 2, scl_inter 0)")
    assert tree(tmp_path) == before
    a = np.asarray(nib.load(str(ct)).dataobj).astype(np.float32); a[0, 0, 0] = np.nan; a[1, 1, 1] = np.inf
    nib.save(nib.Nifti1Image(a, img.affine), tmp_path / "ct_nan.nii.gz")
    before = tree(tmp_path)
    refused(cli("measure", lab, "--image", tmp_path / "ct_nan.nii.gz", "--out", tmp_path / "m.json"), "measure",
            "ct_nan.nii.gz: 2 of 6912 voxels are NaN or infinite")
    refused(cli("views", tmp_path / "ct_nan.nii.gz", lab, "--structures", "spleen", "--out", tmp_path / "v"), "views",
            "ct_nan.nii.gz: 2 of 6912 voxels are NaN or infinite")
    assert tree(tmp_path) == before


# --- issue 23: every pipeline step has a command ---------------------------------------------------------------------

def readme_block(title: str) -> str:
    "The first ```bash block of the README section `title`."
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_i23_walkthrough_runs_from_a_folder_outside_the_repository(tmp_path):
    "The README's 'Your own data, without DVC' block, as it stands, from convert to table and export, outside the repository."
    assert ROOT not in tmp_path.parents
    env = {**os.environ, "PATH": f"{EXE.parent}{os.pathsep}{os.environ['PATH']}", "SPATIALVQA_PROGRESS": "0"}
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block("Your own data, without DVC")], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    # nothing beside what the block names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_ts", "work"]
    t2 = (tmp_path / "work" / "tables" / "table2.md").read_text()
    oracle = next(l for l in t2.splitlines() if l.startswith("| Oracle"))
    # the scores: every one the oracle has is 100
    cells = [c.strip() for c in oracle.strip("|").split("|")][4:]
    # MCA AVG, DIR, DIST, Volume MRA (measured at ea524ab: 32 kept, none of EXT, VOL or COMP from 4 phantoms and two
    # filter answerers)
    assert all(c in ("100.0 [100.0, 100.0]", "-") for c in cells) and cells.count("100.0 [100.0, 100.0]") >= 4, cells
    assert "| Random" in t2
    # phantoms in TotalSegmentator's layout keep their own source and licence (never TotalSegmentator's CC BY 4.0)
    assert "| phantom | 4 scans; Apache-2.0 (generated by spatialvqa) |" in (tmp_path / "work" / "export" / "LICENSE.md").read_text()
    # the files name their scans relative to themselves: the work folder moved elsewhere still answers
    moved = tmp_path / "elsewhere"; moved.mkdir()
    (tmp_path / "work").rename(moved / "work"); (tmp_path / "my_ts").rename(moved / "my_ts")
    rc, out, err = cli("infer", "--model", "oracle", "--benchmark", moved / "work/valid/validated.jsonl", "--out", moved / "again.jsonl", cwd=tmp_path)
    assert rc == 0 and all(r["error"] is None for r in read_jsonl(moved / "again.jsonl")), err


def test_i23_stage_commands_show_the_pipelines_defaults():
    "validate's (and every stage command's) defaults are what dvc.yaml passes from params.yaml, and --help shows them."
    import yaml
    from spatialvqa.cli import STAGE_COMMANDS, stage_parameters
    from spatialvqa.runner import stage_values
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    differ = []
    for stage in STAGE_COMMANDS:
        ours = stage_parameters(stage)
        values, _ = stage_values(stages[stage]["params"], params, ours)
        for name, value in values.items():
            if name == STAGE_COMMANDS[stage].get("positional"): continue       # an input the command requires
            if name in ours and ours[name][0] != value and not (isinstance(value, (int, float)) and ours[name][0] == value):
                differ.append(f"{stage}.{name}")
    # the pipeline's own sources' budgets: no default for other data
    assert differ == ["generate.per_source"], differ
    h = cli("validate", "--help", env={"COLUMNS": "500"})[1]
    for want in ("(default: chance)", "(default: 8)", "(default: prior,text,atlas,atlas_2fold,atlas_subject,atlas_3subjects,textbook,name_cue)",
                 "(default: 0.015)", "--out"):
        assert want in h, want
    for cmd in ("generate", "render", "score", "tables"):
        rc, h, err = cli(cmd, "--help", env={"COLUMNS": "500"})
        assert rc == 0 and "--out" in h and "(default: " in h, (cmd, err)


def test_i23_validate_needs_two_scans_and_says_so(phantom_bench, tmp_path):
    one = tmp_path / "one.jsonl"
    recs = read_jsonl(phantom_bench)
    write_jsonl([r for r in recs if r["scan_id"] == recs[0]["scan_id"]], one)
    before = tree(tmp_path)
    refused(cli("validate", one, "--out", tmp_path / "v"), "validate",
            "one.jsonl: the questions are about 1 scan", "needs questions about at least 2 scans")
    assert tree(tmp_path) == before


def test_i23_validate_wrong_field_types_name_the_file_and_write_nothing(phantom_bench, tmp_path):
    recs = read_jsonl(phantom_bench)
    i = next(i for i, r in enumerate(recs) if r["format"] == "numeric")
    recs[i]["answer_value"] = "12 mL"
    bad = write_jsonl(recs, tmp_path / "bad.jsonl")
    before = tree(tmp_path)
    refused(cli("validate", bad, "--out", tmp_path / "v"), "validate", f"bad.jsonl:{i + 1}: the field 'answer_value' is str '12 mL'")
    assert tree(tmp_path) == before


def test_i23_measure_json_feeds_validate_as_it_is(phantom_bench, tmp_path):
    "`spatialvqa measure`'s JSON (its scan id from the folder, not 'labels') is what validate --structures takes."
    scans = sorted({p for r in read_jsonl(phantom_bench) for p in r["label_maps"]})
    jsons = []
    for p in scans:
        lab = (phantom_bench.parent / p).resolve()
        jsons.append(tmp_path / f"{lab.parent.name}.json")
        rc, out, err = cli("measure", lab, "--out", jsons[-1])
        assert rc == 0, err
        assert json.loads(jsons[-1].read_text())["scan"]["scan_id"] == lab.parent.name
    rc, out, err = cli("validate", phantom_bench, "--structures", ",".join(map(str, jsons)), "--answerers", "prior,text",
                       "--rule", "soft_majority", "--out", tmp_path / "v")
    assert rc == 0, err[-3000:]
    assert (tmp_path / "v" / "validated.jsonl").exists() and (tmp_path / "v" / "filter_report.json").exists()


def test_a_rerun_into_the_same_out_replaces_nothing_without_overwrite(phantom_bench, tmp_path):
    "measure and a stage command (generate) refuse to replace what an earlier run left at --out; --overwrite replaces it."
    lab = (phantom_bench.parent / read_jsonl(phantom_bench)[0]["label_maps"][0]).resolve()
    m = tmp_path / "m.json"
    assert cli("measure", lab, "--out", m)[0] == 0
    m.write_text(m.read_text().replace('"scan_id": ', '"scan_id":  '))      # the user's own edit of that file
    mine = m.read_bytes()
    refused(cli("measure", lab, "--out", m), "measure", "m.json: already there", "--overwrite")
    assert m.read_bytes() == mine
    assert cli("measure", lab, "--out", m, "--overwrite")[0] == 0 and m.read_bytes() != mine
    r = cli("generate", "--structures", m, "--out", tmp_path / "g")
    assert r[0] == 0, r[2][-3000:]
    before = tree(tmp_path / "g")
    (tmp_path / "g" / "notes.txt").write_text("my notes")
    sentence = refused(cli("generate", "--structures", m, "--seed", "1", "--out", tmp_path / "g"), "generate",
                       "already there", "--overwrite")
    assert str(tmp_path / "g") in sentence
    assert tree(tmp_path / "g") == {**before, "notes.txt": b"my notes"}
    assert cli("generate", "--structures", m, "--seed", "1", "--out", tmp_path / "g", "--overwrite")[0] == 0
    after = tree(tmp_path / "g")
    assert after["notes.txt"] == b"my notes" and after != {**before, "notes.txt": b"my notes"}


def test_i23_stage_command_failing_leaves_no_output(phantom_bench, tmp_path):
    (tmp_path / "structures.parquet").write_bytes(b"PAR1 not parquet")
    before = tree(tmp_path)
    r = cli("generate", "--structures", tmp_path / "structures.parquet", "--scans", tmp_path / "structures.parquet", "--out", tmp_path / "g")
    assert r[0] == 2 and "Traceback" not in r[2] and "structures.parquet" in r[2], r[2][-2000:]
    assert tree(tmp_path) == before and not (tmp_path / "g").exists()


def test_i23_score_scores_each_run_of_a_mixed_file_under_its_own_name(phantom_bench, tmp_path):
    "Item 2: a file that holds two runs is scored as two rows, each by its own answers; no run reads as missing."
    pred = tmp_path / "random.jsonl"
    assert cli("infer", "--model", "random", "--benchmark", phantom_bench, "--out", pred)[0] == 0
    assert cli("infer", "--model", "oracle", "--benchmark", phantom_bench, "--out", pred, "--mixed")[0] == 0
    rc, out, err = cli("score", "--benchmark", phantom_bench, "--predictions", pred, "--out", tmp_path / "s")
    assert rc == 0, err[-3000:]
    m = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert set(m) == {"random", "oracle"}
    import pandas as pd
    s = pd.read_parquet(tmp_path / "s" / "scores.parquet")
    assert (s[s.model == "oracle"]["status"] != "error").all() and (s[s.model == "random"]["status"] != "error").all()
    assert s[s.model == "oracle"]["correct"].astype(bool).all()


# --- issue 23: files other tools can read ----------------------------------------------------------------------------

def test_i23_simpleitk_opens_every_label_map_the_pipeline_writes(tmp_path):
    """NIfTI-1 wherever the data fit it: the label maps of convert (pyradiomics, whose NRRD geometry is float64, and
    TotalSegmentator's example), of the phantom cohort and of the counterfactual copies all open in SimpleITK, with
    the geometry spatialvqa reads within 1e-4 mm."""
    import SimpleITK as sitk
    from spatialvqa.convert.datasets import convert
    from spatialvqa.counterfactual import make_counterfactuals
    from spatialvqa.phantom.cohort import make_cohort
    from spatialvqa.scan import read_labels
    real = ROOT.parent / "shared" / "data" / "real-ct"
    convert("pyradiomics", real / "pyradiomics", tmp_path / "scans" / "pyradiomics", workers=0)
    convert("totalsegmentator", real / "totalsegmentator" / "s0001", tmp_path / "scans" / "ts", workers=0)
    make_cohort(tmp_path / "phantom", n_subjects=2, seed=5, workers=0)
    make_counterfactuals([tmp_path / "scans" / "pyradiomics" / "scans.json"], tmp_path / "copies", phantoms=0, workers=0)
    maps = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.name.startswith("labels") and p.suffix in (".gz", ".nii", ".nrrd"))
    assert {p.parts[len(tmp_path.parts)] for p in maps} == {"scans", "phantom", "copies"}, maps
    for p in maps:
        img = sitk.ReadImage(str(p))                                      # raises on NIfTI-2
        ras = np.diag([-1.0, -1.0, 1.0]) @ np.array(img.GetOrigin())
        assert np.allclose(ras, read_labels(p).affine[:3, 3], atol=1e-4), p


def test_i23_interop_check_fails_loudly_and_is_pinned():
    """make interop: lmms-eval 0.7.3 with filelock 4 logs "No module named 'filelock._api'", evaluates nothing and exits 0;
    the check treats any error line, a missing task and a missing or NaN metric as failures, and the interop venv is
    pinned by interop/constraints.txt (filelock below 4)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("run_lmms_eval", ROOT / "interop" / "run_lmms_eval.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    log = ("2026-11-26 | INFO | lmms_eval.__main__:cli_evaluate_single - Selected Tasks: ['spatialvqa_tracka']\n"
           "2026-11-26 | ERROR | lmms_eval.__main__:cli_evaluate:614 - Error during evaluation: No module named 'filelock._api'.\n")
    assert len(m.errors_in(log)) == 1 and not m.errors_in(log.splitlines()[0])
    want = {"score": 0.25, "mc_accuracy": 0.25, "questions": 8}
    assert m.compare({"score": 0.25, "mc_accuracy": 0.25, "numeric_mra": 0.0}, want, 0.0) == []
    assert len(m.compare({"score": float("nan"), "numeric_mra": 0.0}, want, 0.0)) == 2        # NaN and a missing metric
    pins = dict(l.split("==") for l in (ROOT / "interop" / "constraints.txt").read_text().splitlines() if "==" in l and not l.startswith("#"))
    assert pins["lmms_eval"] == "0.7.3" and int(pins["filelock"].split(".")[0]) < 4 and pins["torchvision"] == "0.29.1"
    assert "-c interop/constraints.txt" in (ROOT / "Makefile").read_text()


def test_i23_ctsvqa_judge_runs_outside_the_repository(tmp_path):
    "Rows that carry question, answer and prediction are judged as they are, from a folder outside the repository."
    from spatialvqa.llm.openai import FakeOpenAIServer
    rows = [{"question": "Which kidney is larger?", "answer": "The left kidney.", "prediction": "Left."},
            {"question": "Is the liver enlarged?", "answer": "No.", "prediction": "Yes, markedly."}]
    preds = write_jsonl(rows, tmp_path / "my_model.jsonl")
    verdict = lambda body: '{"correct": true, "reason": "same"}' if "Left." in body["messages"][-1]["content"] else '{"correct": false, "reason": "no"}'
    with FakeOpenAIServer(reply=verdict) as srv:
        rc, out, err = cli("ctsvqa-judge", "--predictions", preds, "--judge", f"openai:judge@{srv.base_url}", "--out", tmp_path / "j" / "judged.jsonl",
                           cwd=tmp_path, env={"OPENAI_API_KEY": "sk-local-judge-000000"})
    assert rc == 0, err[-3000:]
    assert "2 questions" in out and "jury accuracy 0.5000 over 2 judged questions" in out, out
    judged = read_jsonl(tmp_path / "j" / "judged.jsonl")
    assert [r["jury"] for r in judged] == [True, False] and [r["qid"] for r in judged] == ["0", "1"]
    assert all(p.is_relative_to(tmp_path) for p in tmp_path.rglob("*"))


def test_i23_validate_scans_table_without_affine_names_the_file_and_column(phantom_bench, tmp_path):
    "Clear errors: `validate --scans` on a table without the measure stage's columns says which, not just 'affine'."
    from spatialvqa.measure import measure_manifests
    table, scans, _ = measure_manifests([phantom_bench.parent / "scans" / "cohort.json"], workers=0)
    table.to_parquet(tmp_path / "structures.parquet")
    scans.drop(columns=["affine"]).to_parquet(tmp_path / "scans.parquet")
    before = tree(tmp_path)
    refused(cli("validate", phantom_bench, "--structures", tmp_path / "structures.parquet", "--scans", tmp_path / "scans.parquet",
                "--out", tmp_path / "v"), "validate", "scans.parquet: not a table of the measure stage", "lacks 'affine'")
    assert tree(tmp_path) == before
