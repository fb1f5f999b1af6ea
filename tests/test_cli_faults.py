"""Every subcommand of `spatialvqa`, run as a user runs it (the console script, in its own process) on broken inputs:
status 2, a message that names the file and the fault, and no traceback. The subcommands are read from
`spatialvqa --help`, so a new subcommand without broken-input cases here fails `test_every_subcommand_has_cases`."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXE = Path(sys.executable).parent / "spatialvqa"

# subcommand -> [(arguments, substrings the message must hold)]; {d} is a folder of broken inputs (see `broken`)
CASES = {
    "measure": [("{d}/broken.nii.gz --out {d}/o.json", ["broken.nii.gz", "corrupt"]),
                ("{d}/broken.nii.gz --out {d}/broken.nii.gz", ["broken.nii.gz", "is the input"]),
                ("{d}/broken.nii.gz --out {d}/emptydir", ["emptydir", "is a folder"])],
    "fetch": [("nosuch --out {d}/f --offline --mirror ''", ["unknown source 'nosuch'"]),
              ("pyradiomics --out {d}/afile --offline --mirror ''", ["afile", "must be a folder"])],
    "phantom": [("--out {d}/afile -n 1", ["afile", "must be a folder"]),
                # a real TotalSegmentator case has the phantoms' names: never replaced (more: tests/test_cli.py)
                ("--out {d}/tsdir -n 2 --layout totalsegmentator", ["tsdir: already holds s0001", "Nothing written"])],
    "convert": [("msd {d}/emptydir --out {d}/c", ["emptydir/dataset.json", "no such file"]),
                ("msd {d}/emptydir --out {d}/emptydir", ["emptydir", "is the input"]),
                # more: tests/test_rtstruct.py
                ("rtstruct {d}/emptydir --out {d}/c", ["emptydir", "no RTSTRUCT beside a CT series"])],
    "ctsvqa-jury": [("--predictions {d}/list.jsonl --judgments {d}/bad.json --out {d}/o.json", ["list.jsonl:1", "no field 'question'"]),
                    ("--predictions {d}/preds.jsonl --judgments {d}/bad.json --out {d}/o.json", ["bad.json", "not valid JSON"]),
                    ("--predictions {d}/preds.jsonl --judgments {d}/strverdict.json --out {d}/o.json", ["strverdict.json: row 0", "'true'"]),
                    ("--predictions {d}/preds.jsonl --judgments {d}/bad.json --threshold nan --out {d}/o.json", ["--threshold nan"]),
                    ("--predictions {d}/preds.jsonl --judgments {d}/bad.json --out {d}/preds.jsonl", ["preds.jsonl", "is the input"])],
    "ctsvqa-judge": [("--predictions {d}/absent.jsonl --judge replay:x.jsonl --out {d}/j.jsonl", ["absent.jsonl", "No such file"]),
                     ("--predictions {d}/list.jsonl --judge replay:x.jsonl --out {d}/j.jsonl", ["list.jsonl:2", "not list"]),
                     ("--predictions {d}/preds.jsonl --judge replay:x.jsonl --out {d}/preds.jsonl", ["preds.jsonl", "is the input"])],
    "ctsvqa-text": [("--predictions {d}/list.jsonl --no-sbert --no-meteor --out {d}/o.json", ["list.jsonl:1", "no field 'answer'"]),
                    ("--predictions {d}/empty.jsonl --no-sbert --no-meteor --out {d}/o.json", ["empty.jsonl", "no predictions"]),
                    ("--predictions {d}/preds.jsonl --out /dev/null", ["/dev/null", "device"]),
                    ("--predictions {d}/preds.jsonl --no-meteor --sbert-model {d}/emptydir --out {d}/o.json",
                     ["--sbert-model", "not a sentence-transformers model folder"])],
    "validate": [("{d}/list.jsonl --out {d}/v", ["list.jsonl:2", "not list"]),
                 ("{d}/dup.jsonl --out {d}/v", ["dup.jsonl", "'q1'"]),
                 ("{d}/ok.jsonl --folds -1 --out {d}/v", ["--folds: -1 is out of range"]),
                 ("{d}/ok.jsonl --out {d}/v", ["ok.jsonl: the questions are about 0 scans", "at least 2 scans"])],
    "reviews": [("{d}/sheet.csv", ["sheet.csv", "no qid column"]),
                ("{d}/missing.csv", ["missing.csv", "No such file"]),
                ("{d}/blank.csv", ["blank.csv: no question is rated yet"]),
                ("{d}/badscore.csv", ["badscore.csv", "rater_1_score of q1 is 'abc'", "0, 1 or 2"]),
                ("{d}/empty.jsonl", ["empty.jsonl: not a review sheet", "No columns"])],
    "export": [("{d}/list.jsonl --out {d}/e", ["list.jsonl:2", "not list"]),
               ("{d}/list.jsonl --out {d}/list.jsonl", ["list.jsonl", "is the input"])],
    "infer": [("--model random --benchmark {d}/list.jsonl --out {d}/p.jsonl", ["list.jsonl:2", "not list"]),
              ("--model random --benchmark {d}/noqid.jsonl --out {d}/p.jsonl", ["noqid.jsonl:1", "no field 'qid'"]),
              ("--model random --benchmark {d}/dup.jsonl --out {d}/p.jsonl", ["dup.jsonl", "repeats the qid 'q1' (record 2)"]),
              ("--model random --benchmark {d}/dup.jsonl --out {d}/p.jsonl --limit 0", ["--limit 0"]),
              ("--model random --benchmark {d}/dup.jsonl --out {d}/dup.jsonl", ["dup.jsonl", "is the input"]),
              ("--model random --benchmark {d}/dup.jsonl --out {d}/link.jsonl", ["link.jsonl", "symbolic link"]),
              ("--model random --benchmark {d}/dup.jsonl --out {d}/afile/p.jsonl", ["afile", "is a file"]),
              ("--model nosuch --benchmark {d}/ok.jsonl --out {d}/p.jsonl", ["unknown model adapter 'nosuch'"]),
              ("--model random --benchmark {d}/empty.jsonl --out {d}/p.jsonl", ["empty.jsonl: no questions"]),
              ("--model random --benchmark {d}/ok.jsonl --out {d}/p.jsonl --config {oops", ["an option's text: not valid YAML or JSON", "column 6"]),
              ("--model random --benchmark {d}/ok.jsonl --out {d}/p.jsonl --params {d}/badp.yaml", ["badp.yaml: not valid YAML or JSON"]),
              ("--model random --benchmark {d}/ok.jsonl --out {d}/p.jsonl --config api_key=sk-abcdefgh12345678",
               ["--config.api_key", "api_key_env"]),
              ("--model random --benchmark {d}/ok.jsonl --out {d}/p.jsonl --config seed=abc",
               ["model random: adapter 'random' cannot take its config", "(the value of seed)"])],
    "ctrate-download": [("--questions {d}/list.jsonl --out {d}/d", ["list.jsonl:2", "not list"])],
    "report-qa": [("--reports {d}/bad.json --out {d}/r.jsonl", ["bad.json", "not valid JSON"]),
                  ("--reports {d}/empty.jsonl --out {d}/r.jsonl", ["empty.jsonl: no reports"]),
                  ("--reports {d}/bad.json --out {d}/bad.json", ["bad.json", "is the input"])],
    "check-params": [("{d}/secret.yaml", ["secret.yaml: validate.llm.api_key", "api_key_env"]),
                     ("{d}/bad.json", ["bad.json", "not valid YAML"]),
                     ("{d}/missing.yaml", ["missing.yaml", "No such file"])],
    "views": [("{d}/broken.nii.gz {d}/broken.nii.gz --structures liver --out {d}/vw", ["broken.nii.gz", "corrupt"]),
              ("{d}/broken.nii.gz {d}/broken.nii.gz --structures liver --size 0 --out {d}/vw", ["--size: 0 is out of range"])],
    # issue 23: the pipeline's steps as commands
    "generate": [("--structures {d}/absent.parquet --scans {d}/absent.parquet --out {d}/g", ["absent.parquet: no such file", "--structures"]),
                 ("--structures {d}/preds.jsonl --scans {d}/preds.jsonl --out {d}/g", ["preds.jsonl", "not the output of `spatialvqa measure`"]),
                 ("--structures {d}/bad.json --out {d}/g", ["bad.json", "not valid JSON"]),
                 ("--structures {d}/bad.json --out {d}/afile", ["afile", "must be a folder"]),
                 ("--structures {d}/bad.json --structures {d}/ok.jsonl --out {d}/g", ["argument --structures", "given twice"]),
                 ("--structures {d}/bad.json --scans {d}/absent.parquet --out {d}/g",
                  ["--scans", "absent.parquet: a measure stage table", "leave --scans out"]),
                 # a budget's fault is the option's, found before any file is read
                 ("--structures {d}/bad.json --per-scan DIR:x --out {d}/g",
                  ["argument --per-scan", "'DIR:x' is not TASK:n"]),
                 ("--structures {d}/bad.json --per-source openkbp=DIRE:2 --out {d}/g",
                  ["argument --per-source", "'DIRE' is not a task"])],
    "render": [("{d}/list.jsonl --out {d}/r", ["list.jsonl:2", "not list"]),
               ("{d}/ok.jsonl --size 0 --out {d}/r", ["--size: 0 is out of range"]),
               ("{d}/ok.jsonl --out {d}/r", ["none of the 1 questions could be rendered as three_views", "the first"])],
    "score": [("--benchmark {d}/ok.jsonl --predictions {d}/empty.jsonl --out {d}/s", ["empty.jsonl", "no predictions"]),
              ("--benchmark {d}/ok.jsonl --predictions {d}/p.jsonl.times.jsonl --out {d}/s",
               ["only the timings `infer` writes"]),
              ("--benchmark {d}/ok.jsonl --predictions {d}/noqid.jsonl --out {d}/s", ["noqid.jsonl", "no field 'qid'"]),
              ("--benchmark {d}/ok.jsonl --predictions {d}/ok.jsonl --out {d}/s",
               ["ok.jsonl: no predictions", "`raw`"]),
              ("--benchmark {d}/ok.jsonl --predictions {d}/list.jsonl --out {d}/s", ["list.jsonl:2", "not list"]),
              ("--benchmark {d}/ok.jsonl --predictions {d}/ok.jsonl --out {d}/ok.jsonl", ["ok.jsonl", "is the input"]),
              ("--benchmark {d}/ok.jsonl --predictions {d}/foreign.jsonl --out {d}/s",
               ["foreign.jsonl: none of the 1 predictions answers a question of the benchmark", "'zz'"])],
    "tables": [("--scores {d}/absent.parquet --out {d}/t", ["absent.parquet: no such file", "--scores"]),
               ("--scores {d}/absent.parquet --n-boot 0 --out {d}/t", ["--n-boot: 0 is out of range"]),
               ("--scores {d}/preds.jsonl --out {d}/t", ["preds.jsonl"]),
               ("--scores {d}/absent.parquet --filter-report {d}/absent.json --out {d}/t",
                ["absent.json: no such file", "--filter-report"]),
               ("--scores {d}/absent.parquet --filter-report {d}/bad.json --out {d}/t", ["bad.json", "not valid JSON"]),
               ("--scores {d}/absent.parquet --filter-report {d}/ok.jsonl --out {d}/t",
                ["ok.jsonl", "not the validate command's filter_report.json"]),
               ("--scores {d}/absent.parquet --info {bad --out {d}/t", ["argument --info", "not valid JSON"])],
}


def _subcommands() -> list[str]:
    h = subprocess.run([str(EXE), "--help"], capture_output=True, text=True, check=True).stdout
    block = re.search(r"\{([a-z0-9,-]+)\}", h)
    return block.group(1).split(",")


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    d = tmp_path_factory.mktemp("broken")
    (d / "broken.nii.gz").write_bytes(b"not a nifti file")
    (d / "list.jsonl").write_text('{"qid": "a"}\n[1, 2]\n')
    (d / "noqid.jsonl").write_text('{"question": "Q?"}\n')
    (d / "dup.jsonl").write_text('{"qid": "q1", "question": "Q?"}\n{"qid": "q1", "question": "Q?"}\n')
    (d / "preds.jsonl").write_text('{"question": "Q", "answer": "A", "prediction": "P"}\n')
    (d / "empty.jsonl").write_text("")
    (d / "ok.jsonl").write_text('{"qid": "q1", "format": "mc", "question": "Q?", "options": ["a", "b"]}\n')
    (d / "bad.json").write_text('[{"question": "Q", ')
    (d / "strverdict.json").write_text('[{"question": "Q", "answer": "A", "prediction": "P", "is_correct": "true"}]')
    (d / "sheet.csv").write_text("a,b\n1,2\n")
    (d / "badscore.csv").write_text("qid,rater_1_score,rater_2_score\nq1,abc,2\nq2,1,1\n")
    (d / "secret.yaml").write_text("""validate:\n  llm: '{"backend": "openai", "model": "m", "api_key": "sk-0123456789abcdef"}'\n""")
    (d / "afile").write_text("x")
    (d / "emptydir").mkdir()
    (d / "link.jsonl").symlink_to(d / "preds.jsonl")
    (d / "badp.yaml").write_text("infer: [\n")
    (d / "blank.csv").write_text("qid,rater_1_score,rater_2_score\nq1,,\n")
    (d / "foreign.jsonl").write_text('{"qid": "zz", "model": "m", "answer": "A"}\n')
    (d / "p.jsonl.times.jsonl").write_text('{"qid": "q1", "key": "q1@0", "attempts": 1, "latency_s": 0.0}\n')
    (d / "tsdir" / "s0001").mkdir(parents=True)
    (d / "tsdir" / "s0001" / "ct.nii.gz").write_text("a real patient's CT")
    return d


def test_every_subcommand_has_cases():
    subs = _subcommands()
    assert len(subs) >= 13
    assert not set(subs) - set(CASES), f"subcommands without broken-input cases in {__file__}: {sorted(set(subs) - set(CASES))}"
    assert not set(CASES) - set(subs), f"cases for subcommands that no longer exist: {sorted(set(CASES) - set(subs))}"


@pytest.mark.parametrize("cmd", sorted(CASES))
def test_subcommand_on_broken_input_is_status_2_with_a_sentence(cmd, broken):
    if cmd not in _subcommands(): pytest.fail(f"{cmd} is not a subcommand of `spatialvqa --help`")
    keep = {p.name: p.read_bytes() for p in broken.iterdir() if p.is_file() and not p.is_symlink()}
    for args, want in CASES[cmd]:
        argv = [a.replace("{d}", str(broken)) if a != "''" else "" for a in args.split()]
        r = subprocess.run([str(EXE), cmd, *argv], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "SPATIALVQA_PROGRESS": "0"})
        assert r.returncode == 2, (args, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        line = [l for l in r.stderr.splitlines() if l.startswith(f"spatialvqa {cmd}: error: ")]
        assert len(line) == 1, (args, r.stderr[-2000:])
        for w in want: assert w in line[0], (args, w, line[0])
        assert "sk-abcdefgh12345678" not in r.stderr + r.stdout
    # no broken input was changed by any of the commands
    assert {p.name: p.read_bytes() for p in broken.iterdir() if p.is_file() and not p.is_symlink() and p.name in keep} == keep
    assert (broken / "tsdir" / "s0001" / "ct.nii.gz").read_text() == "a real patient's CT"
