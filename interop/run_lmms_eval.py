"""Run the exported lmms-eval task (data/export/lmms_eval/spatialvqa_tracka) in a real lmms-eval installation, from a
working directory outside the repository, and check its numbers against the exported parquet.

Two runs:
1. the command line, `python -m lmms_eval --model dummy --model_args response=A,read_bytes=1 ...`: lmms-eval's own dummy
   model answers "A" to every question; `read_bytes=1` makes it call `doc_to_visual` for every question first (an
   error there fails the run). Expected, counted from the parquet without lmms-eval: `mc_accuracy` = the share of
   multiple-choice questions whose answer is A, `numeric_mra` = 0 ("A" holds no number), `score` = A-answers / all.
2. the Python API (`lmms_eval.evaluator.simple_evaluate`) with `ViewCounter`, a model defined here that takes every
   question's images from `doc_to_visual`, checks that there is at least one and that each is an RGB PIL image, and
   answers with a fixed policy (the letter B; "150 mL" to numeric questions). Expected: the share of B answers.
Prints one JSON summary (numbers and seconds) and exits non-zero if a run fails, reports an error (lmms-eval logs a
task it cannot load and goes on with none), leaves a metric out or gets a number that differs."""
import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

TASK = "spatialvqa_tracka"


def expected(parquet: Path, letter: str) -> dict:
    df = pd.read_parquet(parquet, columns=["qid", "task", "format", "answer_letter", "group_flips"])
    mc = df[df["format"] == "mc"]
    out = {"score": float((mc["answer_letter"] == letter).sum() / len(df)), "mc_accuracy": float((mc["answer_letter"] == letter).mean()),
           "questions": len(df), "mc_questions": len(mc), "numeric_questions": int((df["format"] == "numeric").sum())}
    if mc["group_flips"].astype(bool).any():     # one letter for all cannot be right on every member of a group whose answers differ
        out["flip_groups"] = 0.0
    for t, g in mc.groupby("task"):
        out[f"{t}_score"] = float((g["answer_letter"] == letter).mean())
    return out


def metrics_of(results: dict) -> dict:
    r = results["results"][TASK]
    return {k.split(",")[0]: v for k, v in r.items() if "," in k and "_stderr" not in k}


def _differs(got, want: float) -> bool:
    "A metric lmms-eval did not report, or a number that is not finite, is a mismatch (NaN compares false with anything)."
    try: g = float(got)
    except (TypeError, ValueError): return True
    return not math.isfinite(g) or abs(g - want) > 1e-9


def compare(got: dict, want: dict, numeric_mra: float) -> list[str]:
    bad = [f"{k}: lmms-eval {got.get(k)} != expected {v}" for k, v in want.items()
           if k not in ("questions", "mc_questions", "numeric_questions") and _differs(got.get(k), v)]
    if _differs(got.get("numeric_mra"), numeric_mra):
        bad.append(f"numeric_mra: lmms-eval {got.get('numeric_mra')} != expected {numeric_mra}")
    return bad


def errors_in(text: str) -> list[str]:
    "The lines of lmms-eval's output that report an error: it logs a task it could not load and goes on without it."
    return [l.strip() for l in text.splitlines() if re.search(r"Traceback|No module named|\bError\b|ERROR", l)]


def run_cli(include: Path, cwd: Path) -> tuple[dict, float]:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "lmms_eval", "--model", "dummy", "--model_args", "response=A,read_bytes=1",
           "--tasks", TASK, "--include_path", str(include), "--batch_size", "1", "--output_path", str(cwd / "out")]
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    files = sorted(glob.glob(str(cwd / "out" / "**" / "*results*.json"), recursive=True))
    errors = errors_in(p.stdout + p.stderr)
    results = json.loads(Path(files[-1]).read_text()) if files else {}
    if p.returncode != 0 or not files or errors or TASK not in results.get("results", {}):
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-8000:])
        raise SystemExit(f"lmms-eval (dummy) failed: exit status {p.returncode}, {len(files)} results files in {cwd / 'out'}, "
                         f"task {TASK} {'in' if TASK in results.get('results', {}) else 'NOT in'} the results; "
                         f"{len(errors)} error lines, the first: {errors[0] if errors else '-'}")
    return metrics_of(results), dt


def run_api(include: Path) -> tuple[dict, dict, float]:
    from PIL import Image
    from lmms_eval.api.model import lmms
    from lmms_eval.evaluator import simple_evaluate
    from lmms_eval.tasks import TaskManager

    class ViewCounter(lmms):
        "Checks every question's images and answers B (multiple choice) or 150 mL (numeric)."
        def __init__(self):
            super().__init__()
            self.views = []

        def generate_until(self, requests):
            out = []
            for context, gen_kwargs, doc_to_visual, doc_id, task, split in [r.args for r in requests]:
                doc = self.task_dict[task][split][doc_id]
                ims = doc_to_visual(doc)
                if not ims or not all(isinstance(im, Image.Image) and im.mode == "RGB" and min(im.size) > 0 for im in ims):
                    raise RuntimeError(f"{doc.get('qid')}: doc_to_visual gave {ims!r}")
                self.views.append(len(ims))
                out.append("B" if doc["format"] == "mc" else "150 mL")
            return out

        def loglikelihood(self, requests):
            raise NotImplementedError

        def generate_until_multi_round(self, requests):
            raise NotImplementedError

    t0 = time.perf_counter()
    model = ViewCounter()
    res = simple_evaluate(model=model, tasks=[TASK], task_manager=TaskManager(include_path=str(include)), batch_size=1)
    dt = time.perf_counter() - t0
    if not res or TASK not in (res.get("results") or {}) or not model.views:
        raise SystemExit(f"lmms-eval's simple_evaluate returned no results for {TASK} ({len(model.views)} questions answered)")
    return metrics_of(res), {"questions_with_views": len(model.views), "min_views": min(model.views), "max_views": max(model.views),
                             "views": sum(model.views)}, dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", default="data/export", help="the export folder (the export stage's output)")
    a = ap.parse_args()
    export = Path(a.export).resolve()
    include = export / "lmms_eval"
    parquet = export / "spatialvqa_trackA.parquet"
    if not parquet.is_file(): raise SystemExit(f"{parquet}: missing; run `dvc repro -s export` first")
    import lmms_eval
    from importlib.metadata import version
    t0 = time.perf_counter()
    summary = {"lmms_eval": version("lmms_eval"), "torch": version("torch"), "export": str(export)}
    with tempfile.TemporaryDirectory(prefix="spatialvqa-interop-") as tmp:
        cwd = Path(tmp)                             # a foreign working directory: neither the repository nor the export
        os.chdir(cwd)
        summary["cwd"] = str(cwd)
        want_a = expected(parquet, "A")
        got, dt = run_cli(include, cwd)
        summary["dummy_A"] = {"lmms_eval": got, "expected": want_a, "seconds": round(dt, 1)}
        bad = compare(got, want_a, 0.0)
        want_b = expected(parquet, "B")
        got_b, views, dt_b = run_api(include)
        summary["view_counter_B"] = {"lmms_eval": got_b, "expected": {k: v for k, v in want_b.items()}, "views": views, "seconds": round(dt_b, 1)}
        # numeric answers of 150 mL: MRA is whatever it is; it must be a number in [0, 1]
        if not 0.0 <= float(got_b.get("numeric_mra", -1)) <= 1.0: bad.append(f"numeric_mra {got_b.get('numeric_mra')} not in [0, 1]")
        bad += [b for b in compare(got_b, want_b, float(got_b.get("numeric_mra", -1))) if not b.startswith("score")]
        if views["questions_with_views"] != want_b["questions"] or views["min_views"] < 1:
            bad.append(f"views: {views} for {want_b['questions']} questions")
    summary["seconds_total"] = round(time.perf_counter() - t0, 1)
    summary["mismatches"] = bad
    print(json.dumps(summary, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
