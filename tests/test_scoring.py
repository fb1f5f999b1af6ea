"""Track A scoring (`spatialvqa.scoring`): MRA agrees with VSI-Bench's own definition bit for bit, strict and
lenient accuracy, scan-clustered bootstrap, McNemar, circular evaluation, and the end-to-end sanity checks: an
oracle scores 100% and a random guesser ~25% within its interval."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from spatialvqa import scoring as S
from spatialvqa import stats
from spatialvqa.questions.tables import rotate_options, rotations
from spatialvqa.figures import plot_failure_types
from spatialvqa.stats import bootstrap_ci, mcnemar


# VSI-Bench (thinking-in-space, lmms-eval tasks/vsibench/utils.py), written out as they define it, element-wise:
def vsibench_abs_dist_norm(pred, target):
    return abs(pred - target) / target


def vsibench_mra(pred, target, start=0.5, end=0.95, interval=0.05):
    num_pts = (end - start) / interval + 2
    conf_intervs = np.linspace(start, end, int(num_pts))
    accuracy = vsibench_abs_dist_norm(pred, target) <= 1 - conf_intervs
    return accuracy.mean()


def test_mra_thresholds_are_vsibench():
    assert len(stats.MRA_THRESHOLDS) == 10
    assert np.array_equal(stats.MRA_THRESHOLDS, np.linspace(0.5, 0.95, int((0.95 - 0.5) / 0.05 + 2)))


def test_mra_random_inputs_match_vsibench():
    rng = np.random.default_rng(0)
    gt = rng.uniform(0.01, 5000, 20000)
    pred = gt * rng.uniform(0, 2.2, gt.size)
    ours = stats.mra(pred, gt)
    theirs = np.array([vsibench_mra(p, g) for p, g in zip(pred, gt)])
    assert np.array_equal(ours, theirs)
    assert [stats.mra(p, g) for p, g in zip(pred[:50], gt[:50])] == theirs[:50].tolist()


def test_mra_exactly_at_thresholds():
    gts = np.array([1.0, 3.0, 7.0, 10.0, 100.0, 123.456, 1520.0, 0.3])
    thr = np.linspace(0.5, 0.95, 10)
    for g in gts:
        for t in thr:
            for p in (g * (1 + (1 - t)), g * (1 - (1 - t)), g + g * (1 - t), g - g * (1 - t), np.nextafter(g * (2 - t), 0)):
                assert stats.mra(p, g) == vsibench_mra(p, g), (p, g)
    # integer percentages on round truths: every relative error a multiple of 5%
    g = np.full(41, 100.0)
    p = np.arange(0, 205, 5, dtype=float)
    assert np.array_equal(stats.mra(p, g), [vsibench_mra(a, b) for a, b in zip(p, g)])


@settings(max_examples=500, deadline=None)
@given(st.floats(0, 1e6, allow_nan=False), st.floats(1e-6, 1e6, allow_nan=False))
def test_mra_property(pred, gt):
    assert stats.mra(pred, gt) == vsibench_mra(pred, gt)


def test_mra_rejects_zero_truth():
    with pytest.raises(ValueError, match="ground truth 0"):
        stats.mra(5.0, 0.0)
    with pytest.raises(ValueError, match="ground truth 0"):
        stats.mra([1.0, 2.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="finite and positive"):
        stats.mra(1.0, np.nan)


@pytest.fixture(scope="module")
def recs():
    return S.toy_records(n_scans=20, per_scan=8, numeric_per_scan=2, seed=0)


def _oracle(r):
    return f"The answer is {r['answer_letter']}." if r["format"] == "mc" else f"About {r['answer_value']} mL."


def test_oracle_scores_perfectly(recs):
    s = S.score_predictions(recs, [dict(qid=r["qid"], model="o", raw=_oracle(r)) for r in recs], "o")
    t = S.accuracy_table(s, n_boot=200)
    assert (t["accuracy"] == 1.0).all() and (t["ok"] == t["n"]).all()
    assert t.loc["VOLEST", "mra"] == 1.0
    assert np.allclose(t.loc[["DIR", "DIST", "VOL", "COMP"], "chance_adjusted"], 1.0)


def test_random_guesser_near_chance(recs):
    rng = np.random.default_rng(3)
    big = S.toy_records(n_scans=60, per_scan=8, numeric_per_scan=0)
    preds = [dict(qid=r["qid"], raw=f"({rng.choice(list('abcd'))})") for r in big]
    t = S.accuracy_table(S.score_predictions(big, preds, "random"), by=None, n_boot=1000)
    assert t.loc["all", "ci_low"] <= 0.25 <= t.loc["all", "ci_high"]
    assert abs(t.loc["all", "chance_adjusted"]) < 0.15


def test_strict_vs_lenient_and_failure_kinds(recs):
    mc = [r for r in recs if r["format"] == "mc"][:8]
    raws = ["A", "B", "I think it's either A or C.", "", "As an AI I cannot interpret the scan.", None, "C", "D"]
    preds = [dict(qid=r["qid"], raw=x, error=("HTTP 500" if i == 5 else None)) for i, (r, x) in enumerate(zip(mc, raws))][:-1]
    s = S.score_predictions(mc, preds, "m")
    assert s["status"].tolist() == ["ok", "ok", "ambiguous", "no_answer", "refused", "error", "ok", "missing"]
    n_right = sum(s["correct"].map(lambda c: c is True))
    strict = S.accuracy_table(s, by=None, strict=True, n_boot=100).loc["all"]
    lenient = S.accuracy_table(s, by=None, strict=False, n_boot=100).loc["all"]
    assert strict["accuracy"] == pytest.approx(n_right / 8)
    assert lenient["accuracy"] == pytest.approx(n_right / 3)
    assert [strict[k] for k in ("ok", "ambiguous", "no_answer", "refused", "error", "missing")] == [3, 1, 1, 1, 1, 1]


def test_predictions_of_other_models_ignored(recs):
    r = recs[0]
    s = S.score_predictions([r], [dict(qid=r["qid"], model="x", raw=r["answer_letter"]), dict(qid=r["qid"], model="y", raw="nonsense")], "x")
    assert s.loc[0, "correct"] is True


def test_cluster_bootstrap_wider_on_clustered_data():
    # 30 scans of 20 questions; a scan is either all right or all wrong: the questions are not independent
    rng = np.random.default_rng(0)
    scan_right = rng.random(30) < 0.5
    values = np.repeat(scan_right, 20).astype(float)
    clusters = np.repeat([f"s{i}" for i in range(30)], 20)
    naive = bootstrap_ci(values, None, 2000, 0)
    clustered = bootstrap_ci(values, clusters, 2000, 0)
    assert clustered["estimate"] == naive["estimate"]
    w_naive, w_cl = naive["ci_high"] - naive["ci_low"], clustered["ci_high"] - clustered["ci_low"]
    assert w_cl > 3 * w_naive
    assert clustered["n_clusters"] == 30


def test_mcnemar_worked_example():
    # a alone right on 15, b alone on 5, both right 40, both wrong 40
    a = np.r_[np.ones(15), np.zeros(5), np.ones(40), np.zeros(40)]
    b = np.r_[np.zeros(15), np.ones(5), np.ones(40), np.zeros(40)]
    chi = mcnemar(a, b, exact=False)
    assert (chi["a_only"], chi["b_only"]) == (15, 5)
    assert chi["statistic"] == pytest.approx(81 / 20)
    assert chi["p_value"] == pytest.approx(0.04417, abs=1e-4)
    assert mcnemar(a, b, exact=True)["p_value"] == pytest.approx(2 * sum(__import__("math").comb(20, k) for k in range(6)) / 2 ** 20)


def test_compare_models(recs):
    o = S.score_predictions(recs, [dict(qid=r["qid"], raw=_oracle(r)) for r in recs], "oracle")
    bad = S.score_predictions(recs, [dict(qid=r["qid"], raw="A") for r in recs], "always-A")
    t = S.compare_models({"oracle": o, "always-A": bad}, n_boot=200)
    assert len(t) == 1 and t.loc[0, "p_mcnemar"] < 1e-10 and "p_mcnemar_clustered" in t


def test_rotation_roundtrip(recs):
    r = next(x for x in recs if x["format"] == "mc")
    for k in range(4):
        rr = rotate_options(r, k)
        assert rr["options"][ord(rr["answer_letter"]) - 65] == r["answer_text"]
        assert rr["base_qid"] == r["qid"] and (rr["qid"] == r["qid"]) == (k == 0)
        assert rotate_options(rr, 4 - k)["options"] == r["options"]
    with pytest.raises(ValueError, match="only multiple-choice"):
        rotate_options(next(x for x in recs if x["format"] == "numeric"), 1)


def test_circular_eval(recs):
    allr = recs + rotations(recs)
    mc = [r for r in allr if r["format"] == "mc"]
    # right on the original order only: vanilla 100%, circular 0%
    first = S.score_predictions(allr, [dict(qid=r["qid"], raw=(r["answer_letter"] if r.get("rotation", 0) == 0 else "wrong text")) for r in mc])
    c = S.circular_eval(first)
    assert c["complete"].all() and c["vanilla"].mean() == 1.0 and c["circular"].sum() == 0
    # right on every order: circular 100%
    allright = S.score_predictions(allr, [dict(qid=r["qid"], raw=r["answer_letter"]) for r in mc])
    assert S.circular_accuracy(S.circular_eval(allright), n_boot=100).loc["all", "circular"] == 1.0
    # a rotation left unanswered: incomplete, not scored
    part = S.score_predictions([r for r in allr if r.get("rotation", 0) != 2], [dict(qid=r["qid"], raw=r["answer_letter"]) for r in mc])
    c = S.circular_eval(part)
    assert not c["complete"].any() and c["circular"].isna().all()


def test_position_bias_balanced_truth(recs):
    s = S.score_predictions(recs, [dict(qid=r["qid"], raw="B") for r in recs if r["format"] == "mc"])
    pb = S.position_bias(s).set_index("letter")
    assert pb["truth_share"].tolist() == [0.25] * 4 and pb.loc["B", "pred_share"] == 1.0
    assert pb["p_value"].iloc[0] < 1e-10


def test_blind_gap(recs):
    img = S.score_predictions(recs, [dict(qid=r["qid"], raw=_oracle(r)) for r in recs])
    blind = S.score_predictions(recs, [dict(qid=r["qid"], raw="I cannot answer without the image.") for r in recs])
    g = S.blind_gap(img, blind, by=None, n_boot=200)
    assert g.loc["all", "gap"] == 1.0 and g.loc["all", "n"] == len(recs)
    assert S.blind_gap(img, img, by=None, n_boot=100).loc["all", "gap"] == 0.0


def test_faithfulness_categories(recs):
    mc = [r for r in recs if r["format"] == "mc"][:4]
    s = S.score_predictions(mc, [dict(qid=r["qid"], raw=(r["answer_letter"] if i < 2 else "wrong")) for i, r in enumerate(mc)])
    s.loc[2:3, "correct"] = False
    f = S.faithfulness(s, [dict(qid=mc[i]["qid"], reasoning_correct=v) for i, v in enumerate([True, False, True, False])])
    assert f["faithfulness"].tolist() == ["faithful", "lucky guess", "decision error", "hallucinated"]


def test_failure_sheet_roundtrip(tmp_path, recs):
    s = S.score_predictions(recs, [dict(qid=r["qid"], raw="A" if r["format"] == "mc" else "1 mL") for r in recs])
    sheet = S.failure_sheet(s, n=50, seed=1)
    assert set(sheet["task"]) == {"DIR", "DIST", "VOL", "COMP", "VOLEST"}
    assert (sheet.groupby("task").size() <= 50).all() and sheet["error_type"].eq("").all()
    sheet["error_type"] = "numeric"
    S.write_failure_sheet(sheet, tmp_path / "s.csv")
    back = S.read_failure_sheet(tmp_path / "s.csv")
    assert S.failure_type_table(back)["numeric"].sum() == len(sheet)
    fig = plot_failure_types(back, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 1000
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_outcome_reads_nullable_columns_from_parquet(tmp_path):
    """Scores read back from parquet carry pandas' nullable types (pd.NA for an unread answer): `outcome` takes them
    as it takes None (the export stage's rescoring met one after the counterfactual pairs added nullable columns)."""
    import numpy as np
    from spatialvqa.scoring import outcome
    df = pd.DataFrame({"correct": pd.array([True, None, False], dtype="boolean"), "mra": pd.array([0.5, None, 1.0], dtype="Float64")})
    df.to_parquet(tmp_path / "s.parquet")
    back = pd.read_parquet(tmp_path / "s.parquet")
    assert outcome(back).tolist() == [1.0, 0.0, 0.0]
    assert np.isnan(outcome(back, strict=False)[1]) and outcome(back, column="mra").tolist() == [0.5, 0.0, 1.0]
