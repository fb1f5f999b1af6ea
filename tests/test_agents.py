"""Retrieval and SpatialMed's agents (spatialvqa.retrieval, spatialvqa.agents): a fixed small corpus gives the
expected passages; on a local fake OpenAI-compatible server, then on the replay of what it recorded, the annotator's
proposals are re-derived or rejected with a reason and the validator's and specialists' verdicts act exactly as their
rules say; the slow test runs everything live with the local Gemma 3 270M on 10 questions."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from spatialvqa import agents as A
from spatialvqa.core import read_jsonl, shared_data
from spatialvqa.llm.openai import FakeOpenAIServer
from spatialvqa.llm.registry import make_llm
from spatialvqa.measure import Structure
from spatialvqa.questions.check import rederive
from spatialvqa.retrieval import Retriever, report_passages, retrieve

ROOT = Path(__file__).resolve().parents[1]


def _st(name, label, vox, ml, c=(0, 0, 0), half=(30, 30, 30)):
    c, h = np.asarray(c, float), np.asarray(half, float)
    return Structure(label, name, vox, ml, tuple(c), tuple(c - h), tuple(c + h))


VOLUMES = {"s1": {"spleen": _st("spleen", 1, 30000, 240.0, c=(80, 0, 0)),
                  "liver": _st("liver", 5, 190000, 1520.0, c=(-80, 0, 20), half=(90, 80, 80))}}


def _vol_record(qid, a, options, letter, value, question):
    return {"qid": qid, "scan_id": "s1", "scan_ids": ["s1"], "task": "VOL", "subtask": "VOL.value", "format": "mc",
            "question": question, "options": [f"{v:g} mL" for v in options], "answer": letter, "answer_letter": letter,
            "answer_text": f"{value:g} mL", "answer_value": value, "option_values": list(options), "unit": "mL",
            "structures": [a], "label_ids": [1 if a == "spleen" else 5],
            "spec": {"a": a, "options": list(options), "spacing_mm": [[1.0, 1.0, 1.0]]}}


RECORDS = [_vol_record("s1-VOL-spleen", "spleen", [120.0, 240.0, 480.0, 960.0], "B", 240.0, "What is the volume of the spleen?"),
           _vol_record("s1-VOL-liver", "liver", [760.0, 3040.0, 1520.0, 380.0], "C", 1520.0, "What is the volume of the liver?"),
           _vol_record("s1-VOL-spleen2", "spleen", [240.0, 60.0, 120.0, 480.0], "A", 240.0, "How big is the spleen in this scan?")]


def test_records_rederive():
    for r in RECORDS: assert rederive(r, VOLUMES)["answer_letter"] == r["answer_letter"], r["qid"]


def test_retrieval_fixed_corpus(tmp_path):
    reports = tmp_path / "reports.json"
    reports.write_text(json.dumps({
        "valid_7_a_1.nii.gz": {"Findings_EN": "A 6 mm nodule is seen in the upper lobe of the right lung. The heart is normal.",
                               "Impressions_EN": "Right upper lobe nodule."},
        "valid_3_b_2.nii.gz": {"Findings_EN": "The spleen is enlarged, measuring 16 cm craniocaudally.", "Impressions_EN": "Splenomegaly."}}))
    corpus = [p for p in A.anatomy_passages() if p["id"].split(":")[1].split("#")[0] in ("liver", "spleen", "kidney_left", "kidney_right")]
    corpus += report_passages(reports, max_words=12)
    assert [p["id"] for p in corpus if p["source"] == "ct-rate"] == ["valid_3_b_2#f0", "valid_3_b_2#i0", "valid_7_a_1#f0",
                                                                   "valid_7_a_1#f1", "valid_7_a_1#i0"]
    r = Retriever(corpus)
    top = lambda q: r.search(q, k=1)[0][0]["id"]
    assert top("The volume of the spleen") == "anatomy:spleen#volume"
    assert top("The volume of the left kidney") == "anatomy:kidney_left#volume"
    assert top("The size of the liver") == "anatomy:liver#size"
    assert top("a nodule in the right upper lobe of the lung") == "valid_7_a_1#f0"
    assert top("enlarged spleen on CT") in ("valid_3_b_2#f0", "valid_3_b_2#i0")
    r.save(tmp_path / "idx")
    again = Retriever.load(tmp_path / "idx")
    assert again.search(["The volume of the spleen"], k=3) == r.search(["The volume of the spleen"], k=3)
    # every agent record cites what it used: the union of the queries' top k, each once
    got = retrieve(r, A.record_queries(RECORDS[0]), k=2)
    assert got[0]["id"] == "anatomy:spleen#volume" and len({g["id"] for g in got}) == len(got)


def test_report_file_faults(tmp_path):
    p = tmp_path / "r.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable reports JSON file"): report_passages(p)
    with pytest.raises(ValueError, match="not a readable reports JSON file"): report_passages(tmp_path / "missing.json")


def _user(body):
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


def _system(body):
    return next((m["content"] for m in body["messages"] if m["role"] == "system"), "")


def fake_agents(body) -> str:
    "The fake server's replies, per agent (told apart by the system prompt) and question (by its text)."
    sysm, user = _system(body), _user(body)
    if sysm == A.ANNOTATOR_SYSTEM:
        if "volume of the spleen?" in user:      # accepted: names the spleen, plausible distractors far enough apart
            return 'Sure: {"question": "Estimate the spleen volume on this CT.", "distractors": [90, 600, 1200]}'
        if "volume of the liver?" in user:       # rejected: a distractor outside the liver's plausible range
            return '```json\n{"question": "How large is the liver?", "distractors": [300, 700, 9000]}\n```'
        return "I cannot do that."               # rejected: no JSON
    if sysm == A.VALIDATOR_SYSTEM:
        fail = "How big is the spleen" in user
        return json.dumps({c: {"verdict": "fail" if fail and c == "non_triviality" else "pass",
                               "reason": "a textbook value answers it" if fail else "fine"} for c in A.VALIDATOR_CRITERIA})
    role = next(r for r in A.SPECIALIST_ROLES if f"expert {r} " in sysm)
    if "volume of the liver?" in user: return {"anatomist": "C", "radiologist": "The answer is C.", "medical physicist": "A"}[role]
    if "volume of the spleen?" in user: return {"anatomist": "B", "radiologist": "D", "medical physicist": "no idea"}[role]
    return "A"


def _agents(llm, retriever):
    return (A.Annotator(llm, retriever, k=2), A.ClinicalValidator(llm),
            A.make_specialists([llm, llm, llm], retriever, k=2))


def _check_run(run):
    by = {r["qid"]: r for r in run.removed}
    # validator: non_triviality failed on the second spleen question -> removed by the validator (rule: any fail)
    assert by["s1-VOL-spleen2"]["removed_by"] == "clinical_validator"
    assert by["s1-VOL-spleen2"]["reason"] == "non_triviality failed: a textbook value answers it"
    # specialists: two of three right on the liver -> discarded; one of three on the spleen -> kept
    assert by["s1-VOL-liver"]["removed_by"] == "specialists"
    assert by["s1-VOL-liver"]["reason"] == ("2 of 3 specialists answered correctly without the image "
                                           "(specialist_1, specialist_2)")
    assert [r["qid"] for r in run.kept] == ["s1-VOL-spleen"]
    kept = run.kept[0]["agents"]["specialists"]
    assert kept["answers"] == {"specialist_1": "B", "specialist_2": "D", "specialist_3": None} and kept["remove"] is False
    assert all(kept["passages"][s] and kept["passages"][s][0] == "anatomy:spleen#volume" for s in kept["passages"])
    # annotator: one proposal re-derived (its options answered again from the measurements), two rejected with reasons
    props = {p["qid"]: p for p in run.proposals}
    assert props["s1-VOL-spleen"]["accepted"] and props["s1-VOL-spleen"]["options"] == ["90.0 mL", "240 mL", "600 mL", "1200 mL"]
    assert props["s1-VOL-liver"]["reason"] == "a distractor lies outside the plausible range 500-4500 mL"
    assert props["s1-VOL-spleen2"]["reason"].startswith("no JSON: ")
    para = run.paraphrases[0]
    assert para["qid"] == "s1-VOL-spleen~para" and para["question"] == "Estimate the spleen volume on this CT."
    assert rederive(para, VOLUMES)["answer_letter"] == para["answer_letter"] == "B"
    assert para["passages"] and para["passages"][0] == "anatomy:spleen#volume"
    assert run.report.set_index("task").loc["all"].to_dict() == {"questions": 3, "clinical_validator": 1, "specialists": 1, "kept": 1, "kept_share": 0.333}
    assert run.summary["annotator"] == {"proposals": 3, "valid_json": 2, "valid_json_share": 0.6667, "accepted": 1,
                                        "accepted_share": 0.3333,
                                        "rejections": {"a distractor lies outside the plausible range N-N mL": 1, "no JSON": 1}}


def test_agents_on_fake_server_then_replay(tmp_path, monkeypatch):
    secret = "sk-test-" + "x" * 24
    monkeypatch.setenv("FAKE_AGENTS_KEY", secret)
    retriever = Retriever(A.anatomy_passages())
    cache = tmp_path / "agents.jsonl"
    with FakeOpenAIServer(fake_agents) as srv:
        llm = make_llm({"backend": "openai", "model": "fake-agent", "base_url": srv.base_url, "api_key_env": "FAKE_AGENTS_KEY",
                        "cache": str(cache), "cache_mode": "auto"})
        run = A.run_agents(RECORDS, VOLUMES, *_agents(llm, retriever))
        n_requests = len(srv.requests)
    assert srv.requests[0]["headers"].get("Authorization") == f"Bearer {secret}"
    _check_run(run)
    # annotator, validator, three specialists per question; specialists on the rephrasing
    assert n_requests == 3 * 5 + 3
    # paraphrase consistency: specialist_1 answers the template spleen question (B) right, its rephrasing ("A") wrong
    assert run.summary["paraphrase_consistency"]["specialist_1"] == {"pairs": 1, "acc_template": 1.0, "acc_paraphrase": 0.0,
                                                                      "consistency": 0.0}
    text = cache.read_text()
    assert secret not in text and "FAKE_AGENTS_KEY" not in text     # the record holds no secret
    # offline: the same run from the record alone (replay: an unrecorded call would be an error)
    replay = make_llm({"backend": "replay", "cache": str(cache)})
    again = A.run_agents(RECORDS, VOLUMES, *_agents(replay, retriever))
    _check_run(again)
    assert again.summary == run.summary and again.proposals == run.proposals


def test_replay_miss_is_an_error(tmp_path):
    from spatialvqa.llm.protocol import CacheMiss
    cache = tmp_path / "c.jsonl"
    with FakeOpenAIServer(fake_agents) as srv:
        llm = make_llm({"backend": "openai", "model": "fake-agent", "base_url": srv.base_url, "api_key_env": None, "cache": str(cache)})
        A.ClinicalValidator(llm).judge(RECORDS[:1])
    with pytest.raises(CacheMiss):
        A.ClinicalValidator(make_llm({"backend": "replay", "cache": str(cache)})).judge(RECORDS[1:2])


def test_specialists_are_blind_answerers():
    "The fit/predict protocol of spatialvqa.validate's answerers: its cross_fit_answerers takes specialists as they are."
    from spatialvqa.validate.answerers import cross_fit_answerers
    from spatialvqa.validate.chance import trivial

    class Say:
        name = "say"
        def __init__(self, f): self.f = f
        def generate(self, prompts, **kw): return [self.f(p) for p in prompts]

    sps = A.make_specialists([Say(lambda p: "B"), Say(lambda p: "B"), Say(lambda p: "C")])
    preds = cross_fit_answerers(RECORDS[:1], sps, folds=2, seed=0)
    assert {a: e["pred"] for a, e in preds["s1-VOL-spleen"].items()} == {"specialist_1": "B", "specialist_2": "B", "specialist_3": "C"}
    assert trivial(RECORDS[0], preds["s1-VOL-spleen"], "at_least_half")[0]
    assert A.specialist_rule(RECORDS[0], {a: e["pred"] for a, e in preds["s1-VOL-spleen"].items()})[0]


def test_committed_replay_cache_has_no_secret():
    p = ROOT / "data" / "replay" / "agents.jsonl"
    assert p.exists(), f"{p} is missing: the agents stage replays it (record it with agents.cache_mode auto)"
    recs = read_jsonl(p, strict=True)
    assert recs and all(set(r) >= {"key", "backend", "model", "request", "output"} for r in recs)
    text = p.read_text()
    for bad in ("api_key", "Authorization", "Bearer ", "sk-"):
        assert bad not in text, f"{p} contains {bad!r}"


@pytest.mark.slow
def test_agents_live_gemma_10_questions(tmp_path):
    "The whole agent path live with the local Gemma 3 270M (CPU) on 10 questions of the committed stage's sample."
    qpath = ROOT / "data" / "benchmark" / "validated.jsonl"
    for p in (qpath, ROOT / "results" / "measure" / "structures.parquet"):
        assert p.exists(), f"{p} is missing: run `dvc repro -s validate` (or `dvc checkout`) first"
    import pandas as pd
    from spatialvqa.questions.generate import contexts_from_tables
    recs = A.sample_records(read_jsonl(qpath, strict=True), 10, seed=0)
    ctx = contexts_from_tables(pd.read_parquet(ROOT / "results/measure/structures.parquet"),
                               pd.read_parquet(ROOT / "results/measure/scans.parquet"))
    volumes = {s: c.structs for s, c in ctx.items()}
    retriever = Retriever(A.default_corpus(str(shared_data("ct-spatialvqa", "reports", "validation_reports_output.json")), limit=50))
    cache = tmp_path / "live.jsonl"
    llm = make_llm({"backend": "transformers", "model": "gemma-3-270m", "name": "transformers:gemma-3-270m",
                    "cache": str(cache), "cache_mode": "record"})
    t0 = time.time()
    run = A.run_agents(recs, volumes, *_agents(llm, retriever))
    secs = time.time() - t0
    assert llm.calls == 10 * 5 and len(read_jsonl(cache)) == 50
    assert len(run.kept) + len(run.removed) == 10 and len(run.proposals) == 10
    assert all(p["accepted"] or p["reason"] for p in run.proposals)
    for p in run.paraphrases: assert rederive(p, volumes)["answer_letter"] == p["answer_letter"]
    # the record replays to the same run, offline
    again = A.run_agents(recs, volumes, *_agents(make_llm({"backend": "replay", "cache": str(cache)}), retriever))
    assert again.summary == run.summary
    print(f"live Gemma agents on 10 questions: {secs:.0f} s; summary {json.dumps(run.summary)}")


def test_specialist_from_filter_config(tmp_path):
    "A specialist built from the JSON-ready config a filter's params can carry, answering inside validate's cross_fit_answerers."
    from spatialvqa.validate.answerers import cross_fit_answerers
    Retriever(A.anatomy_passages()).save(tmp_path / "idx")
    with FakeOpenAIServer(fake_agents) as srv:
        cfgs = [{"answerer": "specialist", "llm": f"openai:fake-agent@{srv.base_url}", "cache": str(tmp_path / "c.jsonl"),
                 "index": str(tmp_path / "idx"), "role": role, "name": f"specialist_{i + 1}"} for i, role in enumerate(A.SPECIALIST_ROLES)]
        sps = [A.specialist_answerer(c) for c in cfgs]
        preds = cross_fit_answerers(RECORDS[:2], sps, folds=2, seed=0)
    got = {q: {a: e["pred"] for a, e in d.items()} for q, d in preds.items()}
    assert got == {"s1-VOL-spleen": {"specialist_1": "B", "specialist_2": "D", "specialist_3": None},
                   "s1-VOL-liver": {"specialist_1": "C", "specialist_2": "C", "specialist_3": "A"}}
    assert sps[0].cited["s1-VOL-spleen"][0] == "anatomy:spleen#volume"


def test_filter_builds_specialists_from_params_config(tmp_path):
    """validate.llm with {"answerer": "specialist", ...} entries: the filter's `make_answerers` builds the specialists
    through the `spatialvqa.answerers` entry point (validate cannot import agents), and they answer as above; the
    paper's rule (a question is discarded when at least two of the three succeed) is the filter's rule `at_least_two`."""
    from spatialvqa.validate.answerers import LLMAnswerer, cross_fit_answerers, make_answerers
    from spatialvqa.validate.chance import trivial
    Retriever(A.anatomy_passages()).save(tmp_path / "idx")
    with FakeOpenAIServer(fake_agents) as srv:
        cfgs = [{"answerer": "specialist", "llm": f"openai:fake-agent@{srv.base_url}", "cache": str(tmp_path / "c.jsonl"),
                 "index": str(tmp_path / "idx"), "role": role, "name": f"specialist_{i + 1}"} for i, role in enumerate(A.SPECIALIST_ROLES)]
        ans = make_answerers([], llm=cfgs, seed=0)
        assert [type(a).__name__ for a in ans] == ["Specialist"] * 3 and [a.name for a in ans] == ["specialist_1", "specialist_2", "specialist_3"]
        preds = cross_fit_answerers(RECORDS[:2], ans, folds=2, seed=0)
    assert {q: {a: e["pred"] for a, e in d.items()} for q, d in preds.items()} == {
        "s1-VOL-spleen": {"specialist_1": "B", "specialist_2": "D", "specialist_3": None},
        "s1-VOL-liver": {"specialist_1": "C", "specialist_2": "C", "specialist_3": "A"}}
    # the filter's rule at_least_two is the paper's (agents.specialist_rule)
    for r in RECORDS[:2]:
        assert trivial(r, preds[r["qid"]], rule="at_least_two")[0] == A.specialist_rule(r, {a: e["pred"] for a, e in preds[r["qid"]].items()})[0]
    assert [trivial(r, preds[r["qid"]], rule="at_least_two")[0] for r in RECORDS[:2]] == [False, True]
    assert isinstance(make_answerers([], llm={"backend": "replay", "cache": str(tmp_path / "c.jsonl")})[0], LLMAnswerer)
    with pytest.raises(ValueError, match="unknown answerer 'nosuch'"): make_answerers([], llm={"answerer": "nosuch"})
