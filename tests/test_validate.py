"""Track A validation: the acceptance test (blind answerers near chance on the kept questions, clearly above chance on
the removed ones), filter report counts, honest cross-fitting, a planted shortcut being caught, plausibility, dedup,
kappas and the review round trip.

The benchmark is a small one built here: six phantoms of the default cohort with three times the default number of
questions per scan, so that a fresh clone (CI) and a working tree after `dvc repro` test the same thing. Set
SPATIALVQA_TEST_PIPELINE=1 to run them on the pipeline's own (data/benchmark/questions.jsonl with the measure stage's
tables): its real head-and-neck cohort has no liver and other answerer rates, and some of these checks assume the
phantoms' anatomy."""
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spatialvqa.validate import filters as VF, answerers as VA, chance as VC, pipeline as VP
from spatialvqa import review as RV
from spatialvqa.counterfactual import pair_key, scan_family
from spatialvqa.anatomy import reference_range
from spatialvqa.stats import cohen_kappa, fleiss_kappa, group_folds
from spatialvqa.core import load_params, read_jsonl
from spatialvqa.measure import measure_manifests
from spatialvqa.phantom.cohort import make_cohort
from spatialvqa.prompt import build_prompt
from spatialvqa.questions.core import LETTERS
from spatialvqa.questions.generate import DEFAULT_PER_SCAN, generate_questions

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "data/benchmark/questions.jsonl"
TABLES = ROOT / "results/measure/structures.parquet", ROOT / "results/measure/scans.parquet"


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    if all(p.exists() for p in (BENCH, *TABLES)) and os.environ.get("SPATIALVQA_TEST_PIPELINE"):
        return dict(recs=read_jsonl(BENCH), table=pd.read_parquet(TABLES[0]), scans=pd.read_parquet(TABLES[1]), built=False)
    p = load_params("phantom", ROOT / "params.yaml")
    d = tmp_path_factory.mktemp("phantom")
    make_cohort(d, 6, seed=int(p["seed"]), tumour_rate=float(p["tumour_rate"]), workers=2)
    table, scans, rejected = measure_manifests([d / "cohort.json"], workers=2)
    assert rejected == []
    recs = generate_questions(table, seed=0, scans=scans, per_scan={t: 3 * n for t, n in DEFAULT_PER_SCAN.items()})
    return dict(recs=recs, table=table, scans=scans, built=True)


@pytest.fixture(scope="module")
def val(bench):
    return VP.validate(bench["recs"], bench["table"], bench["scans"], seed=0)


def _chance_upper(n, p=0.25, z=1.96):
    return p + z * math.sqrt(p * (1 - p) / n)


def test_blind_near_chance_on_kept_and_above_chance_on_removed(val):
    "The acceptance test of the triviality filter."
    s = val.summary
    kept, removed = s["blind"]["kept"]["mc"], s["blind"]["removed"]["mc"]
    # the answerers that decided: near chance on what they kept, right on what they removed
    assert kept["mean"]["n"] >= 300
    assert kept["mean"]["accuracy"] <= max(0.35, _chance_upper(kept["mean"]["n"])), kept
    assert removed["mean"]["n"] >= 40 and removed["mean"]["accuracy"] >= 0.6, removed
    # the same kinds of answerer, re-trained within each set on a fresh scan split (never used to filter): no
    # learnable shortcut is left in the kept questions, while the removed ones still carry them
    ak, ar = s["audit"]["kept"]["mc"], s["audit"]["removed"]["mc"]
    for name in ("prior", "text"):
        assert ak[name]["accuracy"] <= 0.35, (name, ak[name])
        assert ak[name]["ci95"][0] <= 0.30, (name, ak[name])           # and not clearly above chance
    pooled = np.mean([ar[n]["accuracy"] for n in ("prior", "text")])
    assert pooled > _chance_upper(ar["prior"]["n"]), ar


def test_filter_report_counts_add_up(bench, val):
    recs = bench["recs"]
    rep = val.report.set_index("task")
    assert (rep[[*VP.FILTERS, "kept"]].sum(axis=1) == rep["questions"]).all()
    assert rep.loc["all", "questions"] == len(recs) and rep.loc["all", "kept"] == len(val.kept)
    assert rep.drop("all")["questions"].sum() == len(recs)
    by = Counter((r["task"], r["removed_by"]) for r in val.removed)
    for t in rep.index.drop("all"):
        for f in VP.FILTERS: assert rep.loc[t, f] == by[(t, f)]
    kept, removed = {r["qid"] for r in val.kept}, {r["qid"] for r in val.removed}
    assert kept.isdisjoint(removed) and kept | removed == {r["qid"] for r in recs}
    assert all(r["removed_by"] in VP.FILTERS and r["reason"] for r in val.removed)
    assert all(set(r["blind"]) == {"prior", "text"} for r in val.kept)
    assert all(np.mean(list(r["blind_vote"].values())) < VC.SOFT_MAJORITY for r in val.kept)      # soft majority
    assert all(np.mean(list(r["blind_vote"].values())) >= VC.SOFT_MAJORITY for r in val.removed
               if r["removed_by"] == "triviality" and not r["reason"].startswith("removed with its pair"))
    # a question and its counterfactual twins are kept or removed together
    fate = {}
    for r in val.kept: fate.setdefault(pair_key(r), set()).add(True)
    for r in val.removed: fate.setdefault(pair_key(r), set()).add(False)
    assert all(len(v) == 1 for v in fate.values())
    assert sum(bool(r.get("pair_of")) for r in recs) == 0 or any(r.get("pair_of") for r in val.kept)
    assert all(0 <= r["blind_right"] <= 2 for r in val.kept)
    assert val.summary["removed_by"] == {f: rep.loc["all", f] for f in VP.FILTERS}
    assert [r["qid"] for r in val.kept] == [r["qid"] for r in recs if r["qid"] in kept]      # input order kept
    md = VP.report_markdown(val)
    assert "| all |" in md and "Blind accuracy" in md


def test_deterministic(bench, val):
    again = VP.validate(bench["recs"], bench["table"], bench["scans"], seed=0, audit=None)
    assert [r["qid"] for r in again.kept] == [r["qid"] for r in val.kept]
    assert [r["blind"] for r in again.kept] == [r["blind"] for r in val.kept]
    assert [r["blind_vote"] for r in again.kept] == [r["blind_vote"] for r in val.kept]


class _Spy:
    "A blind answerer that records what it was trained on and checks it never sees the scan it answers about."
    name, needs_fit = "spy", True

    def __init__(self): self.calls = []

    def fit(self, records):
        self.train = {scan_family(r) for r in records}
        return self

    def predict(self, records):
        test = {scan_family(r) for r in records}      # a counterfactual copy counts as its original scan
        assert not test & self.train, "a blind answerer saw the scan (or its counterfactual copy) it answers about"
        self.calls.append((self.train, test))
        return ["A" if r["format"] == "mc" else None for r in records]


def test_cross_fitting_never_trains_on_the_scan_it_answers(bench):
    recs = bench["recs"]
    spy = _Spy()
    preds = VA.cross_fit_answerers(recs, [spy], folds=3, seed=4)
    assert len(spy.calls) == 3
    assert set().union(*(t for _, t in spy.calls)) == {scan_family(r) for r in recs}
    assert all(preds[r["qid"]]["spy"] == {"pred": "A" if r["format"] == "mc" else None, "proba": None} for r in recs)
    folds = group_folds([r["scan_id"] for r in recs], 2, seed=0)
    assert abs(Counter(folds.values())[0] - Counter(folds.values())[1]) <= 1
    assert folds != group_folds([r["scan_id"] for r in recs], 2, seed=1) or len(folds) < 4


def test_a_planted_shortcut_is_caught(bench):
    """When the correct option of some questions is always a little longer, the text classifier learns it and the
    (soft majority) filter drops them, though the prior cannot see it."""
    rng = np.random.default_rng(0)
    recs, planted = [], set()
    for r in bench["recs"]:
        if r["format"] == "mc" and rng.random() < 0.3:
            o = list(r["options"]); i = LETTERS.index(r["answer_letter"])
            o[i] += " (as measured on the segmentation masks)"
            r = {**r, "options": o, "answer_text": o[i]}
            planted.add(r["qid"])
        recs.append(r)
    v = VP.validate(recs, bench["table"], bench["scans"], seed=0, audit=None)
    gone = {r["qid"] for r in v.removed if r["removed_by"] == "triviality"}
    mc = [r["qid"] for r in recs if r["format"] == "mc" and r["qid"] not in {x["qid"] for x in v.removed
                                                                                  if x["removed_by"] != "triviality"}]
    rate_planted = np.mean([q in gone for q in mc if q in planted])
    rate_clean = np.mean([q in gone for q in mc if q not in planted])
    assert rate_planted >= 0.75 and rate_planted > 2 * rate_clean, (rate_planted, rate_clean)
    kept_planted = [r for r in v.kept if r["qid"] in planted]
    assert len(kept_planted) < 0.25 * len(planted)


def test_plausibility(bench):
    recs, table, scans = bench["recs"], bench["table"].copy(), bench["scans"]
    sid = sorted(table.scan_id.unique())[0]
    liver = (table.scan_id == sid) & (table.name == "liver")
    assert liver.any()
    # the plausible range (pathology included): a 3 L liver is enlarged but real, twice the upper bound is not
    lo, hi = reference_range("liver")
    assert lo < 3000 < hi
    table.loc[liver, "volume_ml"] = 2.0 * hi
    kept, removed = VF.plausibility(recs, table, scans)
    about = [r for r in recs if (sid, "liver") in VF.involved(r)]
    assert about and {r["qid"] for r in about} <= {r["qid"] for r in removed}
    why = {r["qid"]: r["reason"] for r in removed}
    assert all(f"liver in {sid}: volume {2.0 * hi:.1f} mL outside the reference range {lo:g}-{hi:g} mL" in why[r["qid"]] for r in about)
    # every removed question involves a flagged structure; switching the range test off keeps the liver questions
    probs = VF.structure_problems(table, scans)
    assert all(any(k in probs for k in VF.involved(r)) for r in removed)
    kept2, _ = VF.plausibility(recs, table, scans, ranges=False)
    assert {r["qid"] for r in about} <= {r["qid"] for r in kept2}
    # a structure touching the scan's border: move the liver's box onto the edge of its scan
    sc = scans.set_index("scan_id").loc[sid]
    from spatialvqa.questions.core import geometry_from_affine
    g = geometry_from_affine(sc["affine"], sc["shape"])
    t2 = bench["table"].copy()
    t2.loc[liver, "bbox_xmin"] = g.lo[0]
    assert VF.structure_problems(t2, scans)[(sid, "liver")] == "touches the border of the scan"
    assert (sid, "liver") not in VF.structure_problems(t2, None)          # no scans table: no border test
    tiny = bench["table"].copy(); tiny.loc[liver, "voxels"] = 10
    assert VF.structure_problems(tiny, scans, min_voxels=50)[(sid, "liver")] == "10 voxels < 50"


def test_dedup():
    base = {"qid": "s-VOL-1", "scan_id": "s", "scan_ids": ["s"], "task": "VOL", "question": "What is the volume of the liver?",
            "options": ["1,234 mL", "1600 mL", "2100 mL", "800 mL"], "answer_text": "1,234 mL"}
    same = {**base, "qid": "s-VOL-2", "question": "WHAT is the volume of the liver ??", "options": base["options"][::-1],
            "answer_text": "1235 mL"}                                        # rounds to the same two digits
    other_answer = {**base, "qid": "s-VOL-0", "answer_text": "1600 mL"}
    other_scan = {**base, "qid": "t-VOL-1", "scan_id": "t", "scan_ids": ["t"]}
    other_organ = {**base, "qid": "s-VOL-3", "question": "What is the volume of the spleen?"}
    kept, removed = VF.dedup([same, base, other_answer, other_scan, other_organ], threshold=0.9)
    assert [r["qid"] for r in kept] == ["s-VOL-1", "s-VOL-0", "t-VOL-1", "s-VOL-3"]
    assert [(r["qid"], r["reason"]) for r in removed] == [("s-VOL-2", "near-identical to s-VOL-1")]
    assert VF.dedup([base, other_organ], threshold=0.5)[1][0]["qid"] == "s-VOL-3"
    # order of words matters through bigrams
    ab = {**base, "question": "Where is the liver relative to the spleen?", "options": None, "answer_text": "right"}
    ba = {**ab, "qid": "s-VOL-9", "question": "Where is the spleen relative to the liver?"}
    assert VF.dedup([ab, ba])[1] == []


def test_cohen_kappa_matches_sklearn():
    from sklearn.metrics import cohen_kappa_score
    rng = np.random.default_rng(1)
    for _ in range(20):
        a = rng.integers(0, 3, 40)
        b = np.where(rng.random(40) < rng.random(), a, rng.integers(0, 3, 40))
        for w in (None, "linear", "quadratic"):
            assert math.isclose(cohen_kappa(a, b, weights=w), cohen_kappa_score(a, b, weights=w), abs_tol=1e-12)
    assert cohen_kappa([1, 1, 1], [1, 1, 1]) != cohen_kappa([1, 1, 1], [1, 1, 1])        # undefined: NaN
    with pytest.raises(ValueError, match="same items"): cohen_kappa([1, 2], [1])


def test_fleiss_kappa():
    # Fleiss (1971) as worked on Wikipedia: 10 subjects, 14 raters, 5 categories, kappa = 0.210
    wiki = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
            [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
    assert math.isclose(fleiss_kappa(wiki), 0.20993, abs_tol=1e-4)
    assert fleiss_kappa([[3, 0, 0], [0, 3, 0], [0, 0, 3]]) == 1.0
    with pytest.raises(ValueError, match="same number"): fleiss_kappa([[2, 1], [1, 1]])
    import statsmodels.stats.inter_rater as sm
    rng = np.random.default_rng(2)
    t = np.stack([rng.multinomial(5, [0.2, 0.3, 0.5]) for _ in range(30)])
    assert math.isclose(fleiss_kappa(t), sm.fleiss_kappa(t), abs_tol=1e-12)


def test_review_round_trip(val, tmp_path):
    recs = val.kept[:8]
    RV.write_review_sheet(recs, tmp_path / "sheet.csv", raters=3)
    s = pd.read_csv(tmp_path / "sheet.csv", dtype=str, keep_default_na=False)
    assert list(s.columns) == ["qid", "scan_id", "task", "question", "A", "B", "C", "D", "answer", "answer_text", "image",
                               "rater_1_score", "rater_1_comment", "rater_2_score", "rater_2_comment",
                               "rater_3_score", "rater_3_comment"]
    assert s.qid.tolist() == [r["qid"] for r in recs] and (s.rater_1_score == "").all()
    mc = [i for i, r in enumerate(recs) if r["format"] == "mc"]
    assert all(s.loc[i, "A"] == recs[i]["options"][0] for i in mc)
    r1 = [2, 2, 1, 0, 2, 1, 2, 0]; r2 = [2, 1, 1, 0, 2, 2, 2, 1]; r3 = [2, 2, 2, 0, 1, 1, 2, 0]
    s["rater_1_score"], s["rater_2_score"] = [str(x) for x in r1], [str(x) for x in r2]
    s.to_csv(tmp_path / "ab.csv", index=False)
    two = RV.read_reviews(tmp_path / "ab.csv")
    assert two.mean.tolist() == [(a + b) / 2 for a, b in zip(r1, r2)]
    assert two.included.tolist() == [(a + b) / 2 > 1.0 for a, b in zip(r1, r2)]
    assert two.agreement["method"] == "cohen" and two.agreement["items"] == 8
    assert math.isclose(two.agreement["kappa"], cohen_kappa(r1, r2, labels=[0, 1, 2]), abs_tol=1e-4)
    c = pd.read_csv(tmp_path / "sheet.csv", dtype=str, keep_default_na=False)
    c["rater_1_score"] = [str(x) for x in r3]
    c.loc[7, "rater_1_score"] = ""                                            # not rated
    c.to_csv(tmp_path / "c.csv", index=False)
    three = RV.read_reviews([tmp_path / "ab.csv", tmp_path / "c.csv"])
    assert three.agreement["method"] == "fleiss" and three.agreement["raters"] == 3 and three.agreement["items"] == 7
    counts = np.stack([[sum(x == k for x in (a, b, c_)) for k in (0, 1, 2)] for a, b, c_ in zip(r1[:7], r2[:7], r3[:7])])
    assert math.isclose(three.agreement["kappa"], fleiss_kappa(counts), abs_tol=1e-4)
    assert math.isclose(three.mean.iloc[7], 0.5)                              # mean of the two raters who rated it
    bad = s.copy(); bad.loc[2, "rater_2_score"] = "yes"; bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match=f"rater_2_score of {recs[2]['qid']} is 'yes'"): RV.read_reviews(tmp_path / "bad.csv")
    dup = pd.concat([s, s.iloc[:1]]); dup.to_csv(tmp_path / "dup.csv", index=False)
    with pytest.raises(ValueError, match="more than once"): RV.read_reviews(tmp_path / "dup.csv")


class _FakeLLM:
    "Answers every multiple-choice question with the option whose text is longest, and every number with 100."
    name = "fake"

    def __init__(self): self.prompts = []

    def generate(self, prompts, max_tokens=512, temperature=0.0, json_mode=False, system=None):
        assert system == VA.BLIND_SYSTEM and temperature == 0.0
        self.prompts += prompts
        out = []
        for p in prompts:
            opts = [l[3:] for l in p.splitlines() if l[:3] in ("A. ", "B. ", "C. ", "D. ")]
            out.append(f"The answer is ({'ABCD'[int(np.argmax([len(o) for o in opts]))]})." if opts else "Roughly 100 mL.")
        return out


def test_llm_specialists_vote(bench):
    scans = list(dict.fromkeys(scan_family(r) for r in bench["recs"]))[:2]  # cross-fitting needs two scans (families)
    recs = [r for s in scans for r in [x for x in bench["recs"] if x["scan_id"] == s][:30]]
    fake = _FakeLLM()
    ans = VA.make_answerers("prior", llm=[fake])
    assert [a.name for a in ans] == ["prior", "llm:fake"]
    v = VP.validate(recs, seed=0, answerers="prior", llm=[fake], rule="all", audit=None)
    assert all(set(r["blind"]) == {"prior", "llm:fake"} for r in v.kept)
    assert len(fake.prompts) == len(recs) - v.summary["removed_by"]["plausibility"] - v.summary["removed_by"]["dedup"]
    assert not any(r["scan_id"] in p for p in fake.prompts for r in recs)        # blind: no scan named
    assert set(fake.prompts) <= {build_prompt(r) for r in recs}
    for r in v.removed:
        if r["removed_by"] == "triviality": assert r["blind_right"] == 2
    assert VA.make_answerers("prior", llm="none") and len(VA.make_answerers("", llm=None)) == 0


def test_blind_replies_are_read_by_the_one_parser(bench):
    "LLM answerers are asked with prompt.build_prompt and read with parse.parse_answer, exactly like the models."
    from spatialvqa.parse import parse_answer
    mc = next(r for r in bench["recs"] if r["format"] == "mc")
    num = next(r for r in bench["recs"] if r["format"] == "numeric" and r["unit"] == "mL")
    assert VA.blind_prompt(mc) == build_prompt(mc)
    for r, texts in ((mc, ["C", "(b)", "Answer: D.", "**A**", "A or B", "", "the answer is c"]),
                     (num, ["1,250 mL", "1.5 L", "2.053e+02 mL", "about 40 cc", "n/a", "between 100 and 200 mL"])):
        for t in texts:
            p = parse_answer(r, t)
            assert VA.blind_answer(r, t) == (p.value if p.ok else None), t
    assert [VA.blind_answer(num, t) for t in ["1.5 L", "2.053e+02 mL", "about 40 cc"]] == [1500.0, 205.3, 40.0]


def test_llm_specialist_through_make_llm(bench):
    "An LLM configured the way params.yaml does it (a spatialvqa.llm config) answers blind, through an OpenAI-compatible server."
    from spatialvqa.llm.openai import FakeOpenAIServer
    recs = [r for r in bench["recs"] if r["format"] == "mc"][:6] + [r for r in bench["recs"] if r["format"] == "numeric"][:2]
    with FakeOpenAIServer(reply=lambda body: "I believe the answer is (B)." if "letter" in body["messages"][-1]["content"]
                          else "Roughly 2.5 L") as srv:
        ans = VA.make_answerers("", llm={"backend": "openai", "model": "blind-test", "base_url": srv.base_url,
                                        "api_key_env": None, "max_attempts": 1})
        preds = VA.cross_fit_answerers(recs, ans, 2, seed=0)
    name = ans[0].name
    assert name.startswith("llm:openai:blind-test")
    # "Roughly 2.5 L" reads as 2500 mL; asked for a ratio it has no number in the unit asked for: unread (None)
    assert [preds[r["qid"]][name]["pred"] for r in recs] == ["B"] * 6 + [2500.0 if recs[6]["unit"] == "mL" else None,
                                                                         2500.0 if recs[7]["unit"] == "mL" else None]
    body = srv.requests[0]["body"]
    assert body["temperature"] == 0.0 and body["messages"][0] == {"role": "system", "content": VA.BLIND_SYSTEM}
    assert {m["content"] for b in srv.requests for m in b["body"]["messages"] if m["role"] == "user"} == \
        {build_prompt(r) for r in recs}
    with pytest.raises(ValueError, match="no LLM configured"): VA.LLMAnswerer({"backend": "none"})


# --- FeatureMatrix: DictVectorizer's matrices, property-tested (the filter's text answerer depends on the equality) ---
from hypothesis import given, settings, strategies as st  # noqa: E402

_NAMES = st.sampled_from([f"{p}:{w}" for p in ("o", "q", "pos", "len", "DIR.relative|o") for w in ("a", "b", "liver", "0", "1", "z")])
_DICTS = st.lists(st.dictionaries(_NAMES, st.sampled_from([0.0, 1.0]), min_size=1, max_size=8), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(fit=_DICTS, apply=_DICTS)
def test_feature_matrix_is_dictvectorizers(fit, apply):
    "Fitted on some dicts, applied to others (unseen names dropped): data, indices, indptr, shape and names all equal."
    from sklearn.feature_extraction import DictVectorizer
    from spatialvqa.validate.answerers import FeatureMatrix, feature_codes
    dv, fm = DictVectorizer(), FeatureMatrix()
    pairs = [(dv.fit_transform(fit), fm.fit_transform([feature_codes(d) for d in fit])),
             (dv.transform(apply), fm.transform([feature_codes(d) for d in apply]))]
    for a, b in pairs:
        assert a.shape == b.shape
        for k in ("data", "indices", "indptr"): assert getattr(a, k).tolist() == getattr(b, k).tolist(), k
    assert fm.feature_names_ == list(dv.feature_names_)


def test_text_answerer_fits_the_same_model_as_with_dictvectorizer(bench):
    "The text answerer's logistic regression, fitted on FeatureMatrix rows, is the one DictVectorizer's rows give, bit for bit."
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression
    from spatialvqa.validate.answerers import TextAnswerer, option_features
    recs = [r for r in bench["recs"] if r["format"] == "mc"]
    ta = TextAnswerer().fit(recs)
    X, y = [], []
    for r in recs:
        ci = LETTERS.index(r["answer_letter"])
        for i, f in enumerate(option_features(r)): X.append(f); y.append(int(i == ci))
    dv = DictVectorizer()
    clf = LogisticRegression(C=1.0, max_iter=2000).fit(dv.fit_transform(X), y)
    assert len(recs) > 100 and np.array_equal(clf.coef_, ta.clf.coef_) and np.array_equal(clf.intercept_, ta.clf.intercept_)
    got = ta.probas(recs[:50])
    want = clf.decision_function(dv.transform([f for r in recs[:50] for f in option_features(r)])).reshape(50, -1)
    assert all(int(np.argmax(g)) == int(np.argmax(w)) for g, w in zip(got, want))
