"""Uncertainty, paired tests, blind baselines, the jury proxy and figures for Track B scoring: cluster-bootstrap
coverage, McNemar against worked examples, cross-fitting that never trains on the evaluated patients, one blind
answer per question, and figures that write their PNG and CSV."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spatialvqa.ctsvqa.jury import category_accuracy
from spatialvqa.ctsvqa.metrics import bleu_corpus, bleu_from_stats, bleu_stats, category_accuracy_ci, ctrate_patient, text_metric_items, text_metrics_ci, text_summary
from spatialvqa.ctsvqa.baselines import AnswerPrior, BLIND_FREE_TEXT_SYSTEM, answer_facet, answer_polarity, answer_side, blind_baselines, facet_correct, facet_table, ctrate_patient_of
from spatialvqa.stats import (bootstrap_ci, bootstrap_cis, bootstrap_means, cross_fit, group_folds, holm, length_stats, mcnemar,
                              paired_bootstrap_diff, pairwise_tests)


# --- the cluster bootstrap --------------------------------------------------------------------------------

def clustered_bernoulli(rng, k=120, size=6, mean_a=2, mean_b=3):
    "k clusters of `size` 0/1 outcomes, each cluster with its own success chance ~ Beta(a, b) (true mean a/(a+b))."
    p = np.repeat(rng.beta(mean_a, mean_b, size=k), size)
    return (rng.random(k * size) < p).astype(float), np.repeat(np.arange(k), size)


def test_cluster_bootstrap_covers_the_truth_and_item_bootstrap_does_not():
    rng = np.random.default_rng(11)
    reps, hits_cluster, hits_items, width_ratio = 150, 0, 0, []
    for r in range(reps):
        y, cl = clustered_bernoulli(rng)
        a, b = bootstrap_ci(y, cl, n_boot=300, seed=r), bootstrap_ci(y, None, n_boot=300, seed=r)
        hits_cluster += a["ci_low"] <= 0.4 <= a["ci_high"]
        hits_items += b["ci_low"] <= 0.4 <= b["ci_high"]
        width_ratio.append((b["ci_high"] - b["ci_low"]) / (a["ci_high"] - a["ci_low"]))
    assert 0.89 <= hits_cluster / reps <= 0.99
    assert hits_items / reps < hits_cluster / reps
    assert np.mean(width_ratio) < 0.85            # ignoring the clusters gives intervals too narrow


def test_bootstrap_is_seeded_paired_and_handles_missing_values():
    y = np.array([1, 1, 0, 0, 1, 0, 1, 1], float)
    cl = list("aabbccdd")
    assert bootstrap_ci(y, cl, 200, seed=3) == bootstrap_ci(y, cl, 200, seed=3)
    est, reps = bootstrap_means(np.c_[y, 1 - y], cl, 200, seed=1)
    np.testing.assert_allclose(est, [0.625, 0.375])
    np.testing.assert_allclose(reps.sum(axis=1), 1.0)          # same resamples for every column
    ci = bootstrap_cis(pd.DataFrame({"x": [1.0, np.nan, 0.0, 1.0]}), ["a", "a", "b", "c"], 100)
    assert ci.loc["x", "n"] == 3 and ci.loc["x", "estimate"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="cluster labels"): bootstrap_ci(y, ["a"], 10)


def test_paired_difference():
    rng = np.random.default_rng(0)
    y, cl = clustered_bernoulli(rng)
    same = paired_bootstrap_diff(y, y, cl, 300)
    assert same["estimate"] == 0 and same["p_value"] == 1.0
    better = np.maximum(y, (rng.random(len(y)) < 0.3).astype(float))
    d = paired_bootstrap_diff(better, y, cl, 500)
    assert d["estimate"] > 0 and d["ci_low"] > 0 and d["p_value"] <= 2 / 501 + 1e-12
    assert d["n_clusters"] == 120


# --- McNemar and Holm ---------------------------------------------------------------------------------------

def test_mcnemar_worked_examples():
    # exact: 1 discordant pair one way, 6 the other: 2 * P(Bin(7, 1/2) <= 1) = 2 * 8/128
    ex = mcnemar([1] + [0] * 6 + [1] * 5, [0] + [1] * 6 + [1] * 5)
    assert (ex["a_only"], ex["b_only"], ex["method"]) == (1, 6, "exact binomial")
    assert ex["p_value"] == pytest.approx(0.125, abs=1e-12)
    # Agresti (2002) table 10.1: 150 vs 86 discordant of 1600; corrected chi2 = 63^2 / 236 = 16.82
    a = [1] * 150 + [0] * 86 + [1] * 794 + [0] * 570
    b = [0] * 150 + [1] * 86 + [1] * 794 + [0] * 570
    cc = mcnemar(a, b)
    assert cc["method"] == "chi2, continuity corrected"
    assert cc["statistic"] == pytest.approx(16.8178, abs=1e-4) and cc["p_value"] == pytest.approx(4.11e-5, abs=1e-6)
    import scipy.stats as stats
    assert cc["p_value"] == pytest.approx(stats.chi2.sf(63 ** 2 / 236, 1), rel=1e-9)
    for n10, n01 in ((0, 5), (3, 9), (12, 12)):
        r = mcnemar([1] * n10 + [0] * n01, [0] * n10 + [1] * n01)
        assert r["p_value"] == pytest.approx(stats.binomtest(min(n10, n01), n10 + n01, 0.5).pvalue, rel=1e-9)
    assert mcnemar([1, 0, 1], [1, 0, 1])["p_value"] == 1.0
    with pytest.raises(ValueError, match="0/1"): mcnemar([1, np.nan], [0, 1])


def test_clustered_mcnemar_and_holm():
    # discordance that cancels inside each cluster is no evidence of a difference
    assert mcnemar([1, 0, 1, 0], [0, 1, 0, 1], clusters=list("ppqq"))["statistic"] == 0.0
    assert mcnemar([1, 1, 1, 1], [0, 0, 0, 0], clusters=list("pqrs"))["statistic"] == pytest.approx(4.0)
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm([0.02, 0.3]), [0.04, 0.3])
    np.testing.assert_allclose(holm([0.5, 0.9]), [1.0, 1.0])
    assert np.isnan(holm([np.nan, 0.1])[0]) and holm([np.nan, 0.1])[1] == pytest.approx(0.1)


def test_pairwise_tests_table():
    rng = np.random.default_rng(5)
    y, cl = clustered_bernoulli(rng)
    idx = [f"v{c}_a_1.nii.gz::{i}" for i, c in enumerate(cl)]
    df = pd.DataFrame({"A": y, "B": np.maximum(y, (rng.random(len(y)) < 0.3)), "C": 1 - y}, index=idx)
    df.iloc[0, 2] = np.nan
    pw = pairwise_tests(df, lambda q: q.split("_")[0], n_boot=300)
    assert pw[["model_a", "model_b"]].values.tolist() == [["A", "B"], ["A", "C"], ["B", "C"]]
    assert pw["n"].tolist() == [720, 719, 719]
    assert (pw["p_mcnemar_holm"] >= pw["p_mcnemar"]).all() and (pw["p_boot_holm"] >= pw["p_boot"]).all()
    assert pw.loc[0, "diff"] < 0 and pw.loc[0, "ci_high"] < 0 and pw.loc[0, "a_only"] == 0
    assert "p_mcnemar_clustered_holm" in pw


def test_category_intervals_match_point_estimates():
    m = pd.DataFrame({"A": [1.0, 0.0, 1.0, 0.0], "B": [0.0, 0.0, 1.0, np.nan]}, index=list("wxyz"))
    cats = {"w": ["left"], "x": ["left", "up"], "y": ["up"], "z": ["up"]}
    ci = category_accuracy_ci(m, cats, list("ppqq"), n_boot=100)
    point = category_accuracy(m, cats, binarize=False).set_index("category")
    got = ci.pivot(index="category", columns="model", values="accuracy")
    pd.testing.assert_frame_equal(got, point[["A", "B"]], check_names=False, check_dtype=False)
    assert (ci["ci_low"] <= ci["accuracy"]).all() and (ci["accuracy"] <= ci["ci_high"]).all()


# --- text metrics with intervals ------------------------------------------------------------------------------

def test_bleu_from_stats_equals_sacrebleu():
    hyp = ["a nodule in the left lower lobe", "no", "bilateral", "in both lungs", "the trachea is in the midline"]
    ref = ["in the left lower lobe", "no", "both lungs", "in both lungs.", "in the midline"]
    st = bleu_stats(hyp, ref)
    assert bleu_from_stats(st.sum(0)) == pytest.approx(bleu_corpus(hyp, ref), abs=1e-9)
    for i in range(len(hyp)): assert bleu_from_stats(st[i]) == pytest.approx(bleu_corpus(hyp[i:i + 1], ref[i:i + 1]), abs=1e-9)


def test_text_metrics_ci_estimates_are_the_summary():
    preds = ["Left lung", "", "No", "upper lobe", "in both lungs", "right"] * 5
    refs = ["In the left lung.", "Right", "no", "Lower lobe", "In both lungs.", "Left"] * 5
    items, missing = text_metric_items(preds, refs, sbert=False, meteor=False)
    summary = text_summary(items, missing)
    ci = text_metrics_ci(items, [f"p{i // 6}" for i in range(len(preds))], n_boot=200, missing=missing).set_index("metric")
    assert set(ci.index) == {"exact_match", "bleu", "rouge1_f", "rouge2_f", "rougeL_f"}
    for k in ci.index: assert ci.loc[k, "estimate"] == pytest.approx(summary[k], abs=1e-12)
    assert (ci["count"] == 25).all() and summary["count"] == 25
    assert (ci["ci_low"] <= ci["estimate"]).all() and (ci["estimate"] <= ci["ci_high"]).all()


def test_length_stats():
    ls = length_stats({"reference": ["In both lungs.", "No enlarged lymph nodes."], "model": ["No", ""]}).set_index("name")
    assert ls.loc["reference", "mean"] == 3.5 and ls.loc["model", "empty"] == 0.5 and ls.loc["model", "share_le3"] == 1.0


# --- blind baselines --------------------------------------------------------------------------------------------

def toy_questions(n_patients=12):
    qs = []
    for p in range(n_patients):
        for scan in "ab":
            for i, (q, a) in enumerate([("Are there enlarged lymph nodes in the prevascular area?", "No enlarged lymph nodes were detected."),
                                        ("Where are the nodules located?", "In both lungs." if p % 3 else "In the right lung."),
                                        (f"What is the size of lesion {p}?", f"{p + 3} mm.")]):
                v = f"valid_{p}_{scan}_1.nii.gz"
                qs.append(dict(qid=f"{v}::{i}", volume=v, question=q, answer=a))
    return qs


def test_cross_fitting_never_trains_on_the_evaluated_volumes_or_patients():
    qs = toy_questions()
    calls = []
    def spy(train, test):
        tv, ev = {r["volume"] for r in train}, {r["volume"] for r in test}
        assert not tv & ev
        assert not {ctrate_patient(v) for v in tv} & {ctrate_patient(v) for v in ev}
        assert len(train) + len(test) == len(qs)
        calls.append(len(test))
        return [r["qid"] for r in test]
    preds, folds = cross_fit(qs, spy, ctrate_patient_of, k=4, seed=1)
    assert preds == [r["qid"] for r in qs] and sum(calls) == len(qs) and len(calls) == 4
    assert sorted(set(folds.values())) == [0, 1, 2, 3] and set(folds) == {f"valid_{p}" for p in range(12)}
    assert group_folds(list(folds), 4, 1) == folds                       # deterministic
    with pytest.raises(ValueError, match="cannot fill"): group_folds(["a", "b"], 3)
    # the prior learns only from other patients: a patient-specific answer is never predicted for its own patient
    prior, _ = cross_fit(qs, lambda tr, te: AnswerPrior().fit(tr).predict(te), ctrate_patient_of, k=4)
    for r, p in zip(qs, prior):
        if r["question"].startswith("What is the size"): assert p != r["answer"]


def test_blind_baselines_give_one_answer_per_question():
    qs = toy_questions()
    bl = blind_baselines(qs, constants=("No", "Normal"), k=3)
    assert set(bl) == {"constant 'No'", "constant 'Normal'", "most frequent answer", "question echo", "answer prior"}
    assert all(len(v) == len(qs) and all(isinstance(a, str) and a for a in v) for v in bl.values())
    assert bl["question echo"] == [r["question"] for r in qs]
    ly = [a for r, a in zip(qs, bl["answer prior"]) if r["question"].startswith("Are there")]
    assert set(ly) == {"No enlarged lymph nodes were detected."}
    assert set(bl["most frequent answer"]) == {"No enlarged lymph nodes were detected."}


def test_text_only_llm_baseline_through_spatialvqa_llm():
    from spatialvqa.llm.openai import FakeOpenAIServer
    from spatialvqa.llm.registry import make_llm
    qs = toy_questions(4)
    with FakeOpenAIServer(lambda body: "No.") as srv:
        llm = make_llm({"backend": "openai", "model": "fake", "base_url": srv.base_url, "api_key_env": None})
        bl = blind_baselines(qs, k=2, llm=llm)
    assert bl["text-only LLM"] == ["No."] * len(qs)
    assert len(srv.requests) == len(qs)
    # the client's worker threads reach the server in any order: find the first question's request
    msgs = [r["body"]["messages"] for r in srv.requests if r["body"]["messages"][-1]["content"] == qs[0]["question"]]
    assert len(msgs) >= 1 and msgs[0][0] == {"role": "system", "content": BLIND_FREE_TEXT_SYSTEM} and len(msgs[0]) == 2


# --- the jury proxy ----------------------------------------------------------------------------------------------

def test_facets():
    assert [answer_polarity(t) for t in ("No.", "Yes, both.", "None were seen", "Heights are normal.", "wasn't seen")] == \
           ["no", "yes", "no", "yes", "no"]
    assert [answer_side(t) for t in ("left lobe", "both lungs", "bilaterally", "right and left", "midline", "liver")] == \
           ["left", "both", "both", "both", "midline", None]
    assert answer_facet("Is there pleural effusion?", "No pleural effusion.") == ("yesno", "no")
    assert answer_facet("Is it in the upper or lower lobe?", "Upper lobe.") is None
    assert answer_facet("Where is the nodule in the right lung?", "In the right upper lobe.") is None
    assert answer_facet("Are the nodules unilateral or bilateral?", "Bilateral.") == ("side", "both")
    assert facet_correct("Where are the nodules?", "In both lungs.", "bilateral") is True
    assert facet_correct("Where are the nodules?", "In both lungs.", "") is False
    assert facet_correct("What size?", "3 mm", "3 mm") is None
    ft = facet_table([dict(question="Is there effusion?", answer="No."), dict(question="Size?", answer="3 mm")], ["no", "x"])
    assert ft["facet"].iloc[0] == "yesno" and pd.isna(ft["facet"].iloc[1])
    assert ft["correct"].iloc[0] == 1.0 and np.isnan(ft["correct"].iloc[1])


# --- figures ---------------------------------------------------------------------------------------------------------

def test_figures_write_png_and_csv(tmp_path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from spatialvqa.core import plot_grouped_ci, plot_length_distributions, save_figure
    from spatialvqa.ctsvqa.figures import plot_metric_panels, plot_overlap
    ci = pd.DataFrame(dict(model=["a", "a", "b", "b"], join=["published join", "key join"] * 2, estimate=[0.3, 0.31, 0.32, 0.32],
                           ci_low=[0.29, 0.3, 0.31, 0.31], ci_high=[0.31, 0.32, 0.33, 0.33]))
    rng = np.random.default_rng(0)
    figs = {"ci": (plot_grouped_ci(ci, "model", "join"), ci),
            "ci_h": (plot_grouped_ci(ci, "join", "model", horizontal=True), ci),
            "lengths": plot_length_distributions({"reference": rng.poisson(8, 50), "a": rng.poisson(2, 50)}),
            "overlap": plot_overlap(pd.DataFrame({"a": rng.random(40) < 0.3, "b": rng.random(40) < 0.5})),
            "panels": (plot_metric_panels(ci.assign(system=ci["model"] + ci["join"], kind="3D model", metric="jury")), None)}
    for name, (fig, data) in figs.items():
        files = save_figure(fig, tmp_path / f"{name}.png", data)
        plt.close(fig)
        assert files[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and files[0].stat().st_size > 5_000
        if data is not None: assert pd.read_csv(files[1]).shape == data.shape
    assert pd.read_csv(tmp_path / "overlap.csv")["count"].sum() == 40
