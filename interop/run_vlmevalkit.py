"""Run the exported VLMEvalKit TSVs (data/export/spatialvqa_trackA.tsv and _numeric.tsv) in VLMEvalKit itself, in its
own venv, with a model defined through its Python API, from a working directory outside the repository.

VLMEvalKit is not on PyPI: install it from its source (a git snapshot of open-compass/VLMEvalKit) into a venv of its
own, torch==2.13.0 first (see the README, "Evaluate a model in lmms-eval, VLMEvalKit or `datasets`"). Then
`/path/to/vlmeval-venv/bin/python interop/run_vlmevalkit.py --export data/export`.

What it does: copies both TSVs into a temporary `$LMUData`, lets VLMEvalKit build the datasets as it builds any custom
TSV (`vlmeval.dataset.build_dataset`: a custom multiple-choice dataset for the TSV with A-D columns, a custom VQA
dataset for the numeric one), runs `vlmeval.inference.infer_data_job` with `ViewChecker`, a `vlmeval.vlm.base.BaseModel`
defined here that receives each question's messages as VLMEvalKit builds them (the base64 views decoded to image
files), checks that every question has at least one image and that each opens as an RGB image, and answers B
(multiple choice) or "150 mL" (numeric). The multiple-choice predictions are scored by VLMEvalKit's own evaluator
(exact matching, no judge model); the numeric ones, which VLMEvalKit's custom VQA dataset cannot score, by the
exported `vlmevalkit/spatialvqa_score.py`. Expected, counted from the TSV without VLMEvalKit: the share of questions
whose answer is B, per task and overall. Prints one JSON summary and exits non-zero if anything fails or differs."""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAME = "spatialvqa_trackA"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", default="data/export", help="the export folder (the export stage's or `spatialvqa export`'s output)")
    a = ap.parse_args()
    export = Path(a.export).resolve()
    tsv, num = export / f"{NAME}.tsv", export / f"{NAME}_numeric.tsv"
    for f in (tsv, num):
        if not f.is_file(): raise SystemExit(f"{f}: missing; run `dvc repro -s export` or `spatialvqa export` first")
    import pandas as pd
    from importlib.metadata import version
    t0 = time.perf_counter()
    summary = {"vlmeval": version("vlmeval"), "torch": version("torch"), "export": str(export)}
    bad = []
    with tempfile.TemporaryDirectory(prefix="spatialvqa-vlmevalkit-") as tmp:
        tmp = Path(tmp)
        os.environ["LMUData"] = str(tmp / "LMUData")
        (tmp / "LMUData").mkdir()
        for f in (tsv, num): shutil.copy(f, tmp / "LMUData" / f.name)
        os.chdir(tmp)                               # a foreign working directory: neither the repository nor the export
        summary["cwd"] = str(tmp)
        from PIL import Image
        from vlmeval.dataset import build_dataset
        from vlmeval.inference import infer_data_job
        from vlmeval.smp import load
        from vlmeval.vlm.base import BaseModel

        class ViewChecker(BaseModel):
            "Checks every question's images as VLMEvalKit hands them over; answers B, or 150 mL to a numeric question."
            INTERLEAVE = False

            def __init__(self):
                super().__init__()
                self.views: list[int] = []

            def generate_inner(self, message, dataset=None):
                ims = [m["value"] for m in message if m["type"] == "image"]
                text = "\n".join(m["value"] for m in message if m["type"] == "text")
                if not ims: raise RuntimeError(f"no image in the message of {dataset}: {text[:80]!r}")
                for p in ims:
                    with Image.open(p) as im:
                        if im.mode != "RGB" or min(im.size) < 1: raise RuntimeError(f"{p}: {im.mode} {im.size}")
                self.views.append(len(ims))
                return "150 mL" if dataset == f"{NAME}_numeric" else "B"

        out = {}
        for name, f in ((NAME, tsv), (f"{NAME}_numeric", num)):
            model, t1 = ViewChecker(), time.perf_counter()
            ds = build_dataset(name)
            if ds is None: raise SystemExit(f"VLMEvalKit could not build the dataset {name} from {f.name}")
            work = tmp / "outputs" / name
            work.mkdir(parents=True)
            model.set_dump_image(ds.dump_image)
            pred = infer_data_job(model, str(work), "ViewChecker", ds, api_nproc=1)
            preds = load(pred) if isinstance(pred, str) else pred
            if isinstance(pred, str): pred_file = pred
            else: pred_file = next(str(p) for p in work.rglob("ViewChecker*") if p.suffix in (".xlsx", ".tsv", ".csv"))
            n = len(load(pred_file))
            out[name] = {"dataset_class": type(ds).__name__, "questions": n, "answered": len(model.views),
                         "views": sum(model.views), "min_views": min(model.views or [0]), "max_views": max(model.views or [0]),
                         "seconds": round(time.perf_counter() - t1, 1)}
            if len(model.views) != n or not n: bad.append(f"{name}: {len(model.views)} of {n} questions reached the model")
            if name == NAME:
                acc = ds.evaluate(pred_file, model="exact_matching", nproc=1)
                got = {str(r["split"]) if "split" in acc else "all": {k: float(v) for k, v in r.items() if k != "split"} for _, r in acc.iterrows()}
                out[name]["vlmevalkit_accuracy"] = got
                t = pd.read_csv(tsv, sep="\t", usecols=["answer", "category"])
                want = {"Overall": float((t["answer"] == "B").mean()), **{c: float((g["answer"] == "B").mean()) for c, g in t.groupby("category")}}
                out[name]["expected"] = want
                row = next(iter(got.values()))
                for k, v in want.items():
                    if k not in row or not math.isclose(row[k], v, abs_tol=1e-9):
                        bad.append(f"{name} {k}: VLMEvalKit {row.get(k)} != expected {v}")
            else:
                r = subprocess.run([sys.executable, str(export / "vlmevalkit" / "spatialvqa_score.py"), pred_file],
                                   capture_output=True, text=True)
                if r.returncode != 0: bad.append(f"spatialvqa_score.py failed: {r.stderr[-2000:]}")
                out[name]["spatialvqa_score"] = r.stdout.strip()[-2000:]
        summary["runs"] = out
    summary["seconds_total"] = round(time.perf_counter() - t0, 1)
    summary["mismatches"] = bad
    print(json.dumps(summary, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
