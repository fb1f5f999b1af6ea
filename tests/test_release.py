"""A release of a benchmark with real counterfactual twins (a phantom, its mirrored and resized copies, the pipeline's
own questions and pairs): nothing released names a scan or copy, the members of a group differ only in their opaque
qid and in the fields that carry the answer, and the exported flip-group metric scores an answerer that reads every
other field at 0, the oracle at 1, and a group of two as Table 2 scores its pair."""
import json
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from spatialvqa import counterfactual as CF
from spatialvqa import export as E
from spatialvqa import release as R
from spatialvqa.core import read_jsonl, write_json
from spatialvqa.measure import measure_manifests
from spatialvqa.phantom.subject import make_subject
from spatialvqa.questions.core import LETTERS
from spatialvqa.questions.generate import generate_questions
from spatialvqa.results.pairs import pair_values
from spatialvqa.scan import write_volume
from spatialvqa.scoring import score_predictions


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    "Originals on a phantom and their twins on its copies, as the counterfactual stage makes them, with one view each."
    d = tmp_path_factory.mktemp("release")
    s = make_subject("rel_test", seed=11, tumours={"liver": 35.0})
    (d / "orig" / "rel_test").mkdir(parents=True)
    write_volume(s.labels, d / "orig/rel_test/labels.nii.gz")
    write_volume(s.image, d / "orig/rel_test/image.nii.gz")
    write_json([{"scan_id": "rel_test", "labels": "rel_test/labels.nii.gz", "image": "rel_test/image.nii.gz",
                 "source": "phantom"}], d / "orig/scans.json")
    entries, rejected = CF.make_counterfactuals([d / "orig/scans.json"], d / "cf", phantoms=1, workers=0)
    assert rejected == [] and len(entries) == 2
    tab, scans, _ = measure_manifests([d / "orig/scans.json"], workers=0)
    ctab, cscans, _ = measure_manifests([d / "cf/scans.json"], workers=0)
    focus = {e["original"]: [e["target"]] for e in entries if e.get("counterfactual") == "resize" and e.get("target")}
    per = {"DIR": 30, "DIST": 20, "EXT": 10, "VOL": 20, "COMP": 20, "VOLEST": 8}
    recs = generate_questions(tab, seed=0, scans=scans, per_scan=per, focus=focus)
    twins, _ = CF.pair_questions(recs, ctab, cscans, originals=tab)
    assert sum(t["flipped"] for t in twins if t["format"] == "mc") >= 5
    allrecs = [*recs, *twins]
    (d / "views").mkdir()
    views = {}
    for i, r in enumerate(allrecs):
        f = d / "views" / f"v{i:04d}.png"
        Image.new("RGB", (8, 8), (i % 256, 0, 0)).save(f)
        views[r["qid"]] = [f]
    return d, allrecs, views


@pytest.fixture(scope="module")
def exported(bench):
    d, recs, views = bench
    paths = E.export_all(recs, d / "export", views, sources={"phantom": "1 scan and 2 copies; Apache-2.0"})
    return paths, read_jsonl(paths["jsonl"]), read_jsonl(paths["key"])


def test_nothing_released_names_a_scan_or_copy(bench, exported):
    d, recs, _ = bench
    paths, pub, key = exported
    assert len(pub) == len(recs) and R.id_leaks(pub, key) == []
    internal = {r["qid"] for r in recs} | {s for r in recs for s in r["scan_ids"]}
    for name in ("jsonl", "tsv", "tsv_numeric", "card"):          # every text file of the release, whole
        text = Path(paths[name]).read_text()
        assert "~" not in text and not [s for s in internal if s in text], name
    parquet = pd.read_parquet(paths["parquet"]).drop(columns="views").to_json()
    assert not [s for s in internal if s in parquet]
    assert all(R.PRIVATE_FIELDS[i] not in r for r in pub for i in range(len(R.PRIVATE_FIELDS)))
    assert {r["patient"] for r in pub} == {R.opaque_id("p-", "rel_test")}       # one patient, copies included
    # no member's qid shares its digits with its group's (the group is named after the original's qid)
    assert not {r["qid"][2:] for r in pub} & {r[k][2:] for r in pub for k in ("group", "patient")}
    # the order of the file says nothing: originals are not always first in their group
    first = {}
    for k in key: first.setdefault(k["group"], k["pair_of"] is None)
    grouped = {k["group"] for k in key if k["pair_of"]}
    assert 0 < sum(first[g] for g in grouped) < len(grouped)


def test_group_members_differ_only_in_qid_and_answer(exported):
    paths, pub, key = exported
    groups = {}
    for r in pub: groups.setdefault(r["group"], []).append(r)
    assert sum(len(g) > 1 for g in groups.values()) >= 10
    allowed = {"qid", *R.ANSWER_FIELDS}
    telling = {k for g in groups.values() for r in g[1:] for k in r if r[k] != g[0][k] and k not in allowed}
    assert telling == set()
    # compendium side, by contrast: the fields that told twins apart
    assert {"pair_of", "counterfactual", "flipped"} <= {f for k in key for f, v in k.items() if v is not None}


def _answers(pub, key, pick):
    "Replies in the compendium's qids: `pick(released record)` per question."
    back = {k["qid"]: k["internal_qid"] for k in key}
    return [dict(qid=back[r["qid"]], raw=pick(r), error=None) for r in pub]


def test_flip_groups_score_readers_of_every_other_field_at_zero(bench, exported, tmp_path, monkeypatch):
    d, recs, _ = bench
    paths, pub, key = exported
    monkeypatch.chdir(tmp_path)
    U = E.load_utils(paths["lmms_utils"])
    seen = [f for f in pub[0] if f not in {"qid", *R.ANSWER_FIELDS}]
    def reader(r):            # any deterministic function of every field but the opaque qid and the answers
        if r["format"] != "mc": return "50 mL"
        text = json.dumps([r.get(f) for f in seen], sort_keys=True, default=str)
        return LETTERS[int(R.opaque_id("", text)[:8], 16) % 4]
    replies = {"reader": _answers(pub, key, reader),
               "oracle": _answers(pub, key, lambda r: r["answer_letter"] if r["format"] == "mc"
                                  else f"{r['answer_value']} mL")}
    ids = {k["internal_qid"]: k["qid"] for k in key}
    scored = pd.concat([score_predictions(recs, replies[m], m) for m in replies], ignore_index=True)
    per, agg = E.harness_scores(pub, scored, U, ids)
    a = agg.set_index("model")["flip groups (every member right)"]
    assert a["reader"] == 0.0 and a["oracle"] == 100.0 and agg["mismatches"].tolist() == [0, 0]
    # the VLMEvalKit scorer reads the same groups from its TSV
    S = E.load_utils(paths["vlmevalkit_scorer"])
    mc = pd.read_csv(paths["tsv"], sep="\t")
    mc.assign(prediction=mc.answer).to_csv("mc.tsv", sep="\t", index=False)
    assert S.score_vlmevalkit("mc.tsv")[1]["flip_groups"] == 1.0
    by = {r["qid"]: r for r in pub}
    mc.assign(prediction=[reader(by[q]) for q in mc.qid]).to_csv("mc_reader.tsv", sep="\t", index=False)
    assert S.score_vlmevalkit("mc_reader.tsv")[1]["flip_groups"] == 0.0


def test_a_group_of_two_scores_as_table2_scores_its_pair(bench, exported, tmp_path, monkeypatch):
    "On groups of two, the exported metric and Table 2's flip-pair accuracy agree for a random answerer."
    import numpy as np
    d, recs, _ = bench
    paths, pub, key = exported
    monkeypatch.chdir(tmp_path)
    U = E.load_utils(paths["lmms_utils"])
    size = pd.Series([k["group"] for k in key]).value_counts()
    two = {k["internal_qid"] for k in key if size[k["group"]] == 2}
    rng = np.random.default_rng(3)
    replies = [dict(qid=r["qid"], raw=str(rng.choice(list(LETTERS))) if r["format"] == "mc" else "1 mL", error=None)
               for r in recs]
    scored = score_predictions(recs, replies, "random")
    sub = [r for r in recs if r["qid"] in two]
    table2 = pair_values(scored[scored["qid"].isin(two)], n_boot=10)
    t2 = table2.set_index("column").loc["Flip pairs"]
    _, agg = E.harness_scores(pub, scored[scored["qid"].isin(two)], U, {k["internal_qid"]: k["qid"] for k in key})
    assert int(t2["n"]) >= 3 and len(sub) >= 6
    assert agg["flip groups (every member right)"].iloc[0] == pytest.approx(round(100 * t2["estimate"], 1))


def test_the_key_never_goes_into_the_release(bench, tmp_path):
    d, recs, views = bench
    with pytest.raises(ValueError, match="would be released"):
        E.export_all(recs, tmp_path / "out", views, key=tmp_path / "out" / "sub" / "key.jsonl")
    assert not (tmp_path / "out").exists()
    leaky = [dict(r, question=r["question"] + f" ({r['scan_id']})") if r.get("pair_of") else r for r in recs]
    with pytest.raises(ValueError, match="still name a compendium id"):
        E.export_all(leaky, tmp_path / "out2", views)
    assert not (tmp_path / "out2").exists()
