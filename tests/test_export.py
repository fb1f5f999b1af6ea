"""Exports of a validated Track A benchmark: JSONL + parquet loadable with `datasets` (directly and through the dataset
card), VLMEvalKit TSVs, and an lmms-eval task folder whose YAML parses and whose functions score exported documents."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from spatialvqa import export as E
from spatialvqa.cli import parser as _cli_parser  # noqa: F401  (the CLI module imports cleanly)
from spatialvqa.core import read_jsonl, write_jsonl
from spatialvqa.measure import measure_manifests
from spatialvqa.phantom import make_cohort
from spatialvqa.prompt import build_prompt
from spatialvqa.questions import LETTERS, generate_questions
from spatialvqa.validate import validate


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    d = tmp_path_factory.mktemp("phantom")
    make_cohort(d, 3, seed=0, tumour_rate=1.0, workers=2)
    table, scans, _ = measure_manifests([d / "cohort.json"], workers=1)
    recs = generate_questions(table, seed=0, scans=scans)
    return validate(recs, table, scans, seed=0, audit=None).kept


@pytest.fixture(scope="module")
def out(kept, tmp_path_factory, request):
    d = tmp_path_factory.mktemp("export")
    import os
    cwd = os.getcwd()
    os.chdir(d)                               # the lmms-eval task's data_files is relative to the working directory
    try: paths = E.export_all(kept, "export", summary={"questions": 99, "removed_by": {"triviality": 3}})
    finally: os.chdir(cwd)
    return d, {k: d / p for k, p in paths.items()}


def _load(*args, **kw):
    import datasets
    datasets.disable_progress_bars()
    return datasets.load_dataset(*args, **kw)


def test_jsonl_and_parquet(kept, out):
    d, p = out
    assert read_jsonl(p["jsonl"]) == kept
    df = pd.read_parquet(p["parquet"])
    assert df.qid.tolist() == [r["qid"] for r in kept]
    assert {"prompt", "blind", "blind_vote", "blind_right"} <= set(df.columns)
    r0 = kept[0]
    assert json.loads(df.blind[0]) == r0["blind"] and json.loads(df.spec[0]) == r0["spec"]
    assert df.prompt.tolist() == [build_prompt(r) for r in kept]
    mc = df[df.format == "mc"]
    assert all(len(o) == 4 for o in mc.options)


def test_datasets_loads_parquet_and_folder(kept, out, tmp_path):
    d, p = out
    ds = _load("parquet", data_files={"test": str(p["parquet"])}, cache_dir=str(tmp_path))["test"]
    assert ds.num_rows == len(kept) and ds[0]["qid"] == kept[0]["qid"]
    num = next(i for i, r in enumerate(kept) if r["format"] == "numeric")
    assert ds[num]["options"] is None and ds[num]["answer_value"] == pytest.approx(kept[num]["answer_value"])
    folder = _load(str(p["parquet"].parent), cache_dir=str(tmp_path / "f"))
    assert list(folder) == ["test"] and folder["test"]["qid"] == [r["qid"] for r in kept]


def test_dataset_card(kept, out):
    d, p = out
    text = p["card"].read_text()
    front = yaml.safe_load(text.split("---")[1])
    assert front["configs"] == [{"config_name": "default", "data_files": [{"split": "test", "path": f"{E.NAME}.parquet"}]}]
    assert "visual-question-answering" in front["task_categories"]
    assert f"{len(kept)} questions" in text and "Filtered from 99" in text
    for col in pd.read_parquet(p["parquet"]).columns: assert f"`{col}`" in text
    # the card states the MRA the exported task and Table 2 compute: VSI-Bench's <= (an error of exactly 1 - θ passes)
    assert "|pred − truth| / truth ≤ 1 − θ" in text and "< 1 − θ" not in text


def test_vlmevalkit(kept, out):
    d, p = out
    mc = pd.read_csv(p["tsv"], sep="\t")
    num = pd.read_csv(p["tsv_numeric"], sep="\t")
    assert list(mc.columns) == ["index", "question", *LETTERS, "answer", "category", "l2-category", "image_path", "qid"]
    assert list(num.columns)[:4] == ["index", "question", "answer", "category"]
    assert mc["index"].tolist() == list(range(len(mc))) and num["index"].tolist() == list(range(len(num)))
    assert len(mc) + len(num) == len(kept)
    by = {r["qid"]: r for r in kept}
    for _, row in mc.iterrows():
        r = by[row.qid]
        assert [row[l] for l in LETTERS] == r["options"] and row.answer == r["answer_letter"]
        assert row.category == r["task"] and row["l2-category"] == r["subtask"] and row.image_path == r["images"][0]
    for row in num.itertuples():
        r = by[row.qid]
        assert "\n" not in row.question and row.question.startswith(r["question"])
        assert float(row.answer) == pytest.approx(r["answer_value"], rel=0.01)
    cross = [r for r in kept if len(r["scan_ids"]) == 2]
    if cross:                                   # two scans: a list, as VLMEvalKit's toliststr reads it
        assert json.loads(num.set_index("qid").loc[cross[0]["qid"], "image_path"]) == cross[0]["images"]


def test_rendered_image_paths(kept, tmp_path):
    from PIL import Image
    png = tmp_path / "view.png"
    Image.new("RGB", (8, 8), "white").save(png)
    ip = {r["qid"]: [str(png)] for r in kept[:3]}
    paths = E.export_all(kept, tmp_path / "x", image_paths=ip, absolute=True)
    mc = pd.read_csv(paths["tsv"], sep="\t")
    assert mc.image_path.iloc[0] == str(png)
    assert (mc.image_path.iloc[3:] == "[]").all()
    df = pd.read_parquet(paths["parquet"])
    assert list(df.image_path.iloc[0]) == [str(png)]
    U = _utils(paths["lmms_utils"])
    assert len(U.doc_to_visual(df.iloc[0].to_dict())) == 1 and U.doc_to_visual(df.iloc[5].to_dict()) == []


def _utils(path):
    spec = importlib.util.spec_from_file_location("spatialvqa_tracka_utils", path)
    U = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(U)
    return U


def _task(paths):
    U = _utils(paths["lmms_utils"])

    class Loader(yaml.SafeLoader): pass
    Loader.add_constructor("!function", lambda ld, node: getattr(U, ld.construct_scalar(node).split(".", 1)[1]))
    return yaml.load(paths["lmms_yaml"].read_text(), Loader=Loader), U


def test_lmms_eval_task(kept, out, tmp_path, monkeypatch):
    d, p = out
    cfg, U = _task(p)
    assert cfg["task"] == E.LMMS_TASK and cfg["dataset_path"] == "parquet" and cfg["test_split"] == "test"
    assert cfg["output_type"] == "generate_until" and callable(cfg["process_results"])
    assert cfg["dataset_kwargs"]["data_files"]["test"] == f"export/{E.NAME}.parquet"          # relative to where it ran
    names = [m["metric"] for m in cfg["metric_list"]]
    assert names[:3] == ["score", "mc_accuracy", "numeric_mra"] and "VOLEST_score" in names
    monkeypatch.chdir(d)
    docs = _load(cfg["dataset_path"], **cfg["dataset_kwargs"], cache_dir=str(tmp_path))[cfg["test_split"]]
    by = {r["qid"]: r for r in kept}
    res = []
    for doc in docs:
        r = by[doc["qid"]]
        assert cfg["doc_to_text"](doc) == build_prompt(r)
        assert cfg["doc_to_text"](doc, {"pre_prompt": "Q: ", "post_prompt": " A:"}) == f"Q: {build_prompt(r)} A:"
        assert cfg["doc_to_text"](doc, {"prompt_style": "radiologist"}) == build_prompt(r, "radiologist")
        target = cfg["doc_to_target"](doc)
        right = cfg["process_results"](doc, [target])
        assert right["score"] == 1.0
        if doc["format"] == "mc":
            wrong = next(l for l in LETTERS if l != doc["answer_letter"])
            out_ = cfg["process_results"](doc, [f"Answer: {wrong}"])
            assert out_["score"] == 0.0 and out_["mc_accuracy"] == 0.0 and out_["numeric_mra"] is None
            assert cfg["process_results"](doc, [f"({doc['answer_letter']}) {doc['answer_text']}"])["score"] == 1.0
            assert cfg["process_results"](doc, [doc["answer_text"]])["score"] == 1.0
        else:
            assert cfg["process_results"](doc, [f"{3 * doc['answer_value']:.1f}"])["score"] == 0.0
            assert cfg["process_results"](doc, ["I cannot tell"])["score"] == 0.0
            assert 0 < cfg["process_results"](doc, [f"{1.2 * doc['answer_value']}"])["score"] < 1
        res.append(cfg["process_results"](doc, [target] if len(res) % 2 else ["no idea"]))
    agg = {m["metric"]: m["aggregation"]([x[m["metric"]] for x in res]) for m in cfg["metric_list"]}
    assert agg["score"] == pytest.approx(sum(x["score"] for x in res) / len(res))
    mcs = [x["mc_accuracy"] for x in res if x["mc_accuracy"] is not None]
    assert agg["mc_accuracy"] == pytest.approx(sum(mcs) / len(mcs))
    assert cfg["doc_to_visual"](docs[0]) == []


def test_utils_is_written_from_the_library(out):
    "utils.py holds the library's own source of the prompt, the parser and MRA, not a second implementation."
    import inspect
    from spatialvqa import parse, prompt, stats
    d, p = out
    text = p["lmms_utils"].read_text()
    assert text == E.lmms_utils_source() == E.LMMS_UTILS
    for f in (parse.parse_choice, parse.parse_number, parse.parse_answer, parse.match_option_text, prompt.build_prompt, stats.mra):
        assert inspect.getsource(f) in text, f.__name__
    U = _utils(p["lmms_utils"])
    assert U.mra(110, 100) == stats.mra(110, 100) == 0.9          # VSI-Bench's <=, as Table 2
    assert U.aggregate_mean([1.0, None, 0.0]) == 0.5


CORPUS = [json.loads(l) for l in (Path(__file__).parent / "data" / "parse_corpus.jsonl").read_text().splitlines() if l.strip()]


def test_exported_task_reads_every_corpus_reply_as_the_project(out, tmp_path, monkeypatch):
    """Loaded from a foreign working directory the way lmms-eval loads it, the exported utils.py parses all 303 replies of
    the parse corpus exactly as spatialvqa.parse does, and process_results gives each the score spatialvqa.scoring gives."""
    from spatialvqa import parse
    from spatialvqa.scoring import outcome, score_predictions
    d, p = out
    monkeypatch.chdir(tmp_path)
    U = _utils(p["lmms_utils"])
    assert len(CORPUS) >= 300
    for i, row in enumerate(CORPUS):
        if row["kind"] == "choice":
            ours, theirs = parse.parse_choice(row["text"], row["options"]), U.parse_choice(row["text"], row["options"])
            truth = row["expected"] or "A"
            doc = dict(qid=f"c{i}", format="mc", task="DIR", question="Which?", options=row["options"], answer_letter=truth,
                       answer=truth, answer_value=None, unit=None, scan_id="s")
        else:
            ours, theirs = parse.parse_number(row["text"], row["unit"]), U.parse_number(row["text"], row["unit"])
            truth = row["expected"] if row["expected"] else 100.0
            doc = dict(qid=f"n{i}", format="numeric", task="VOLEST", question="How much?", options=None, answer_letter=None,
                       answer=None, answer_value=truth, unit=row["unit"], scan_id="s", tolerance=None)
        assert (theirs.value, theirs.status, theirs.span, theirs.note) == (ours.value, ours.status, ours.span, ours.note), (i, row["text"])
        for reply, want in ((row["text"], truth), (row["text"], "B" if row["kind"] == "choice" else truth * 1.3)):
            d2 = dict(doc, answer_letter=want, answer=want) if row["kind"] == "choice" else dict(doc, answer_value=want)
            scored = score_predictions([d2], [dict(qid=d2["qid"], raw=reply, error=None)], "m")
            project = float(outcome(scored, True, "correct" if row["kind"] == "choice" else "mra")[0])
            got = U.process_results(d2, [reply])
            assert got["score"] == project, (i, reply, want, got["score"], project)
            assert got["mc_accuracy" if row["kind"] == "choice" else "numeric_mra"] == project


def test_cli_export(kept, tmp_path):
    import argparse
    write_jsonl(kept, tmp_path / "bench.jsonl")
    p = argparse.ArgumentParser(); sub = p.add_subparsers(dest="command"); E.add_cli(sub)
    a = p.parse_args(["export", str(tmp_path / "bench.jsonl"), "--out", str(tmp_path / "o"), "--absolute"])
    assert a.func(a) == 0
    cfg = yaml.safe_load((tmp_path / "o/lmms_eval" / E.LMMS_TASK / f"{E.LMMS_TASK}.yaml").read_text()
                         .replace("!function ", ""))
    assert cfg["dataset_kwargs"]["data_files"]["test"] == str((tmp_path / "o" / f"{E.NAME}.parquet").resolve())
    (tmp_path / "empty.jsonl").write_text("")
    a = p.parse_args(["export", str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "e")])
    with pytest.raises(ValueError, match="no questions"): a.func(a)


NUMBER_CASES = [("-12 mL", "mL"), ("12,5 mL", "mL"), ("0,5 L", "mL"), ("0,500 L", "mL"), ("1,200 mL", "mL"), ("12,500 mL", "mL"),
                ("options 1,2,3 mL", "mL"), ("150 -170 mL", "mL"), ("The volume is -12 mL", "mL")]


def test_exported_utils_read_signs_and_commas_as_the_project(out, tmp_path, monkeypatch):
    "Issue 11: negative numbers and decimal commas are read by the exported utils.py exactly as by spatialvqa.parse."
    from spatialvqa import parse
    monkeypatch.chdir(tmp_path)
    U = _utils(out[1]["lmms_utils"])
    for text, unit in NUMBER_CASES:
        ours, theirs = parse.parse_number(text, unit), U.parse_number(text, unit)
        assert (theirs.value, theirs.status, theirs.span, theirs.note) == (ours.value, ours.status, ours.span, ours.note), text
    assert U.parse_number("-12 mL", "mL").value == -12.0 and U.parse_number("0,5 L", "mL").value == 500.0
