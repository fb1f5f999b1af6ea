"""Track A tables and figures (`spatialvqa.results`) on a toy run: Table 2 layout with a Random row and a Chance
row, LaTeX that compiles-looking (balanced braces, booktabs rules), the oracle at 100%, the random guesser's
interval covering chance, the probe's cohort scope, the parquet round trip, and every figure function writing a
PNG and its CSV."""
import re

import matplotlib
matplotlib.use("Agg")
import numpy as np
import pandas as pd
import pytest

from spatialvqa.results.scores import toy_run, score_models, TABLE2_TASKS, model_scope, write_scores, read_scores
from spatialvqa.results.draws import seed_draws, seed_draws_by_infer
from spatialvqa.results.table2 import table2_values, table2, chance_values, sanity_checks
from spatialvqa.results.writers import latex_table, write_table
from spatialvqa.results.breakdowns import (parse_table, score_metrics, position_table, pairwise_table,
                                           blind_gap_table, group_accuracy, mra_by_volume)
from spatialvqa.results.circular import (split_rotations, circular_values, circular_checks, circular_chance,
                                         circular_table)
from spatialvqa.results.failures import failure_sheets, failure_counts
from spatialvqa import figures as F
from spatialvqa.core import save_figure


@pytest.fixture(scope="module")
def run():
    recs, preds = toy_run(n_scans=16)
    scored = score_models(recs, preds)
    return recs, preds, scored


@pytest.fixture(scope="module")
def values(run):
    return table2_values(run[2], n_boot=400)


def test_table2_layout_random_and_chance_rows(run, values):
    recs, _, scored = run
    t = table2(values, chance=chance_values(scored), n_total=len(recs))
    assert list(t.columns) == ["Model", "Size", "Backbones", "Scope", "Flip pairs", "Pair acc.", "MCA AVG", "DIR", "DIST", "EXT",
                              "VOL", "COMP", "Volume MRA"]           # the headline (pairs whose answer flips) first
    assert (t[["Pair acc.", "Flip pairs"]] == "-").all().all()          # a benchmark without counterfactual pairs
    assert "Random" in t["Model"].tolist() and t["Model"].iloc[-1] == "Chance (expected)"
    cell = re.compile(r"^\d+\.\d \[\d+\.\d, \d+\.\d\]$")
    rnd = t[t["Model"] == "Random"].iloc[0]
    assert all(cell.match(rnd[c]) for c in ["MCA AVG", "DIR", "DIST", "EXT", "VOL", "COMP", "Volume MRA"]), rnd
    assert t.iloc[-1]["MCA AVG"] == "25.0"


def test_oracle_is_100_and_random_covers_chance(run, values):
    _, _, scored = run
    o = values[values.model == "oracle"]
    assert np.allclose(o["estimate"], 1.0)
    r = values[(values.model == "random") & (values.column == "MCA AVG")].iloc[0]
    assert r.ci_low <= 0.25 <= r.ci_high
    checks = sanity_checks(values, chance_values(scored))
    assert checks["oracle_perfect"] and checks["random_at_chance"]


def test_mca_avg_is_macro_mean_of_tasks(values):
    v = values[values.model == "random"].set_index("column")["estimate"]
    assert v["MCA AVG"] == pytest.approx(v[list(TABLE2_TASKS)].mean())


def test_latex_balanced_with_booktabs(run, values):
    recs, _, scored = run
    t = table2(values, chance=chance_values(scored), n_total=len(recs))
    tex = latex_table(t, "Accuracy (%) & 95% CI", "tab:a", rule_before=[len(t) - 1], left=4, wide=True)
    assert tex.count("{") == tex.count("}")
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")
    assert r"\begin{table*}" in tex and r"\end{table*}" in tex and r"\& 95\% CI" in tex
    body = [l for l in tex.splitlines() if l.endswith(r"\\")]
    assert all(l.count(" & ") == t.shape[1] - 1 for l in body)      # every row has every column


def test_scope_keeps_out_of_cohort_records_apart(run):
    recs, preds, _ = run
    cohort = {"config": {"scans": "toy_000,toy_001,toy_002,toy_003"}}
    scope = model_scope(recs, cohort)
    p = [dict(x, model="cohort") if x["qid"] in scope else dict(qid=x["qid"], model="cohort", raw=None, error="not in the cohort")
         for x in preds["oracle"]]
    s = score_models(recs, {"cohort": p, "random": preds["random"]}, {"cohort": scope})
    parse = parse_table(s).set_index("model")
    assert parse.loc["cohort", "n"] == len(scope) and parse.loc["cohort", "error"] == 0
    t = table2(table2_values(s, n_boot=50), n_total=len(recs))
    assert t.loc[0, "Scope"] == f"4 scans (n={len(scope)})" and t.loc[0, "MCA AVG"].startswith("100.0")
    assert score_metrics(s)["cohort"]["n"] == len(scope)


def test_scores_roundtrip(run, tmp_path):
    scored = run[2]
    write_scores(scored, tmp_path / "s.parquet")
    back = read_scores(tmp_path / "s.parquet", ["random", "oracle", "chatty"])
    assert list(back["model"].cat.categories) == ["random", "oracle", "chatty"]
    assert back.set_index(["model", "qid"])["correct"].to_dict() == scored.assign(model=scored.model.astype(str)).set_index(["model", "qid"])["correct"].to_dict()


def test_tables_and_metrics(run, tmp_path):
    recs, _, scored = run
    paths = write_table(parse_table(scored), tmp_path / "parse", "caption")
    assert [p.suffix for p in paths] == [".csv", ".md"] and all(p.exists() for p in paths)
    assert position_table(scored)["model"].nunique() == 3
    assert len(pairwise_table(scored, n_boot=50)) == 3
    assert blind_gap_table(scored, {"oracle": "random"}, n_boot=50).query("group == 'all'")["gap"].iloc[0] > 0.5
    m = score_metrics(scored)
    assert m["oracle"]["mca_avg_strict"] == 1.0 and m["chatty"]["status_refused"] > 0


def test_every_figure_writes_png_and_csv(run, values, tmp_path):
    recs, _, scored = run
    figs = {
        "task_accuracy": F.plot_task_bars(values),
        "organ_heatmap": F.plot_organ_heatmap(group_accuracy(scored, "organ", n_boot=50)),
        "tumour_radar": F.plot_radar(group_accuracy(scored, "tumour_type", n_boot=50, fill="organs only")),
        "volume_mra": F.plot_volume_mra(mra_by_volume(scored, recs, n_boot=50)),
        "correctness_matrix": F.plot_correctness_matrix(scored),
        "answer_lengths": F.plot_answer_lengths(scored),
        "parse_failures": F.plot_parse_failures(parse_table(scored)),
    }
    for name, (fig, data) in figs.items():
        paths = save_figure(fig, tmp_path / f"{name}.png", data)
        assert [p.suffix for p in paths] == [".png", ".csv"]
        assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and len(pd.read_csv(paths[1])) > 0
        matplotlib.pyplot.close(fig)


# --- circular evaluation and the failure sheet ------------------------------------------------------------------

def _with_rotations(recs, preds, seed=1):
    "Toy answers to the rotated copies: the oracle reads each rotation's truth, random draws a letter per rotated qid."
    from spatialvqa.questions.tables import rotations
    rng, out = np.random.default_rng(seed), {m: list(p) for m, p in preds.items()}
    for r in rotations(recs):
        out["oracle"].append(dict(qid=r["qid"], model="oracle", raw=r["answer_letter"], error=None))
        out["random"].append(dict(qid=r["qid"], model="random", raw=str(rng.choice(list("ABCD"))), error=None))
    return out


def test_rotations_leave_table2_unchanged(run, values):
    recs, preds, scored = run
    both = score_models(recs, _with_rotations(recs, preds), circular=["oracle", "random"])
    plain, circ = split_rotations(both)
    assert len(plain) == len(scored) and set(plain["qid"]) == {r["qid"] for r in recs}      # no extra n
    pd.testing.assert_frame_equal(table2_values(plain, n_boot=400), values)
    assert set(circ["model"].astype(str)) == {"oracle", "random"} and (circ["format"] == "mc").all()
    n_mc = sum(r["format"] == "mc" for r in recs)
    assert circ.groupby("model", observed=True).size().tolist() == [4 * n_mc, 4 * n_mc]


def test_oracle_circular_100_and_random_near_chance():
    recs, preds = toy_run(n_scans=48, per_scan=40, seed=3)
    both = score_models(recs, _with_rotations(recs, preds), circular=["oracle", "random"])
    _, circ = split_rotations(both)
    cv = circular_values(circ, n_boot=300)
    checks = circular_checks(cv)
    assert checks["oracle_circular_perfect"]
    r = cv[(cv.model == "random") & (cv.column == "MCA AVG")].iloc[0]
    chance = circular_chance(circ)
    assert chance["circular"] == pytest.approx(0.25 ** 4) and chance["plain"] == pytest.approx(0.25)
    assert r.circular_ci_low <= chance["circular"] <= r.circular_ci_high and r.circular < 0.02   # (1/4)^4 region
    assert r.plain_ci_low <= 0.25 <= r.plain_ci_high
    t = circular_table(cv, chance=chance)
    assert list(t.columns) == ["Model", "Task", "n", "Plain", "Circular", "Drop (points)"] and t["Model"].iloc[-1] == "Chance (expected)"


def test_failure_sheet_and_figures(run, tmp_path):
    from spatialvqa.scoring import ERROR_TYPES, read_failure_sheet, write_failure_sheet
    _, _, scored = run
    sheet = failure_sheets(scored, n=50, seed=0)
    assert "oracle" not in set(sheet["model"]) and (sheet.groupby(["model", "task"]).size() <= 50).all()
    pd.testing.assert_frame_equal(sheet, failure_sheets(scored, n=50, seed=0))
    write_failure_sheet(sheet.assign(error_type=[ERROR_TYPES[i % 4] for i in range(len(sheet))]), tmp_path / "s.csv")
    assert (read_failure_sheet(tmp_path / "s.csv")["error_type"] != "").all()
    fig, data = F.plot_failures(failure_counts(scored))
    assert set(save_figure(fig, tmp_path / "failure_types.png", data)) and (tmp_path / "failure_types.csv").exists()


def test_seed_draws_equal_runs_through_infer(phantom_benchmark, tmp_path):
    """`seed_draws` (one read, answers in memory, each distinct answer scored once) gives, value for value, what every
    seed run through `infer` and a prediction file gives (`seed_draws_by_infer`), for every seeded baseline of the draws
    stage with its params.yaml entry: the coin of the answerers fitted once, the splits of the learned ones."""
    from pathlib import Path
    from spatialvqa.core import load_params, write_jsonl
    root = Path(__file__).resolve().parents[1]
    entries = load_params("infer", root / "params.yaml")["models"]
    names = [m.strip() for m in load_params("draws", root / "params.yaml")["models"].split(",")]
    bench = write_jsonl(phantom_benchmark["recs"], tmp_path / "bench.jsonl")
    picked = {m: entries[m] for m in names}
    for m in picked.values():      # the patient atlases' pool is a DVC output a clean clone lacks: the bench stands in
        if (m.get("config") or {}).get("pool"):
            m["config"] = {**m["config"], "pool": str(bench)}
    assert any((m.get("config") or {}).get("pool") for m in picked.values())
    new = seed_draws(bench, picked, n=3)
    pd.testing.assert_frame_equal(new, seed_draws_by_infer(bench, picked, n=3))
    assert list(new["model"].unique()) == names and sorted(new["draw"].unique()) == [0, 1, 2]
    pd.testing.assert_frame_equal(seed_draws(bench, {m: picked[m] for m in ("random", "prior")}, n=3, workers=2),
                                  # processes change nothing
                                  new[new["model"].isin(["random", "prior"])].reset_index(drop=True))
    assert new.groupby("model")["value"].apply(lambda v: v.nunique() > 1).all()     # real answers, not all one value
