"""Track A question generation on a phantom cohort: every task, answers re-derived from the masks, balanced letters,
exactly one defensible option, determinism and stable ids.

The cohort is the first subjects of the default phantom cohort (params.yaml `phantom`: seed, tumour rate), so what
holds here holds for those subjects of the benchmark."""
import itertools
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spatialvqa.anatomy import ANATOMY, TUMOURS, counterpart
from spatialvqa.questions.core import (DIRECTIONS, DIR_RATIO, Geometry, LETTERS, MC_TASKS, MIN_RATIO, TASKS,
                                       direction_margin, fmt_number)
from spatialvqa.questions.readings import POINTS
from spatialvqa.questions.volest import patient_of
from spatialvqa.questions.registry import CLINICAL, SUBTASKS, TEMPLATES
from spatialvqa.questions.policy import CLINICAL_LENGTHS, SIZE_TASKS, AskPolicy, UNSEEN
from spatialvqa.questions.check import check_record, rederive, structures_of
from spatialvqa.questions.generate import RECORD_FIELDS, generate_questions
from spatialvqa.questions.tables import composition, letter_balance, markdown_table, to_frame
from spatialvqa.figures import plot_composition
from spatialvqa.core import load_params, read_jsonl
from spatialvqa.measure import measure_manifests
from spatialvqa.scan import read_scan

ROOT = Path(__file__).resolve().parents[1]
N_SUBJECTS = 8


@pytest.fixture(scope="module")
def cohort(cohorts):
    p = load_params("phantom", ROOT / "params.yaml")
    # the cohort test_validity.py builds on too: made once per session (tests/conftest.py, shared_cohort)
    d = cohorts(min(N_SUBJECTS, int(p["n_subjects"])), seed=int(p["seed"]), tumour_rate=float(p["tumour_rate"]))
    table, scans, rejected = measure_manifests([d / "cohort.json"], workers=2)
    assert rejected == []
    recs = generate_questions(table, seed=0, scans=scans)
    labels = {s.scan_id: read_scan(s.labels, None, s.scan_id).labels for s in scans.itertuples()}
    return dict(table=table, scans=scans, recs=recs, labels=labels, volumes={k: (v.array, v.affine) for k, v in labels.items()})


def test_every_task_and_tumours(cohort):
    recs = cohort["recs"]
    tasks = Counter(r["task"] for r in recs)
    assert set(tasks) == set(TASKS), tasks
    assert all(tasks[t] >= 24 for t in TASKS), tasks
    # every subtask occurs but COMP.asymmetry, which needs a left/right volume ratio clear of equal: this cohort's kidneys
    # are too alike (8 of 9,876 questions in the pipeline), so it is shown on them with one kidney enlarged; and
    # VOLEST.cross_case, which pairs two scans of one patient (a follow-up) and this cohort has one scan per patient
    assert {r["subtask"] for r in recs} >= set(SUBTASKS) - {"COMP.asymmetry", "VOLEST.cross_case"}
    assert all(len({patient_of(s) for s in r["scan_ids"]}) == 1 for r in recs)    # never two patients in a question
    t = cohort["table"].copy()
    big = t.name == "kidney_left"
    t.loc[big, "volume_ml"] *= 1.8
    asym = [r for r in generate_questions(t, seed=0, scans=cohort["scans"], per_scan={"COMP": 12}, tasks=["COMP"])
            if r["subtask"] == "COMP.asymmetry"]
    assert asym and all({"kidney_left", "kidney_right"} <= set(r["structures"]) for r in asym)
    tum = [r for r in recs if r["tumour_type"]]
    assert len(tum) >= 10
    for r in tum:                                                    # tumour questions name the tumour labels
        assert r["tumour_type"] in r["structures"] and r["tumour_type"] in TUMOURS
        assert TUMOURS[r["tumour_type"]].id in r["label_ids"]
        assert "tumour" in (r["question"] + " ".join(r["options"] or [])).lower()
    for r in recs:
        assert set(RECORD_FIELDS) <= set(r)
        assert r["scan_id"] == r["scan_ids"][0] and all(p for p in r["label_maps"])
        if r["format"] == "mc":
            assert len(r["options"]) == 4 and r["answer"] == r["answer_letter"] in LETTERS
            assert r["options"]["ABCD".index(r["answer_letter"])] == r["answer_text"]
        else:
            assert r["task"] == "VOLEST" and r["options"] is None and r["answer_value"] > 0
            assert r["unit"] in ("mL", "ratio") and r["answer"] == fmt_number(r["answer_value"], r["unit"])


def test_every_answer_rederived_from_masks(cohort):
    "Each question answered again from its label maps (measured afresh) gives the recorded answer, with one defensible option."
    recs, volumes = cohort["recs"], cohort["volumes"]
    measured = {sid: structures_of(*v, near=True) for sid, v in volumes.items()}
    problems = [p for r in recs for p in check_record(r, measured)]
    assert problems == []
    # the label maps themselves work too (measured inside rederive)
    r0 = recs[0]
    assert rederive(r0, {s: volumes[s] for s in r0["scan_ids"]})["answer_letter"] == r0["answer_letter"]


class _Mask:
    "Independent of spatialvqa.measure: world coordinates of one label's voxel centres, straight from the array and affine."
    def __init__(self, vol): self.vol, self.cache = vol, {}

    def pts(self, label):
        if label not in self.cache:
            idx = np.argwhere(np.asarray(self.vol.array) == label).astype(float)
            A = np.asarray(self.vol.affine, float)
            self.cache[label] = idx @ A[:3, :3].T + A[:3, 3]
        return self.cache[label]

    def volume_ml(self, label): return len(self.pts(label)) * abs(np.linalg.det(np.asarray(self.vol.affine)[:3, :3])) / 1000
    def centre(self, label): p = self.pts(label); return (p.min(0) + p.max(0)) / 2
    def extent(self, label):
        "Physical extent: the world box over every corner of every voxel (not only the voxel centres)."
        p, m = self.pts(label), np.asarray(self.vol.affine, float)[:3, :3]
        corners = np.array(list(itertools.product((-0.5, 0.5), repeat=3))) @ m.T
        return (p.max(0)[None] + corners).max(0) - (p.min(0)[None] + corners).min(0)
    def centroid(self, label): return self.pts(label).mean(0)


def test_numeric_answers_from_raw_voxels(cohort):
    "The measured quantity behind each numeric answer, recomputed from the raw voxels with numpy alone."
    recs = cohort["recs"]
    masks = {sid: _Mask(v) for sid, v in cohort["labels"].items()}
    lab = lambda r, name: r["label_ids"][r["structures"].index(name)]
    n = 0
    for r in recs:
        sp, m = r["spec"], masks[r["scan_ids"][0]]
        sub = r["subtask"]
        if sub in ("VOL.value", "VOL.range", "VOLEST.absolute"): want = m.volume_ml(lab(r, sp["a"]))
        elif sub == "VOL.sum": want = m.volume_ml(lab(r, sp["a"])) + m.volume_ml(lab(r, sp["b"]))
        elif sub == "VOL.difference": want = m.volume_ml(lab(r, sp["a"])) - m.volume_ml(lab(r, sp["b"]))
        elif sub == "VOL.closest":                                   # the key: the option nearest the volume
            v = m.volume_ml(lab(r, sp["a"]))
            nearest = int(np.argmin([abs(math.log(o / v)) for o in sp["options"]]))
            assert nearest == "ABCD".index(r["answer_letter"]), r["qid"]
            n += 1
            continue
        elif sub == "VOLEST.ratio": want = m.volume_ml(lab(r, sp["a"])) / m.volume_ml(lab(r, sp["b"]))
        elif sub == "VOLEST.cross_case":
            l = lab(r, sp["a"])
            want = m.volume_ml(l) / masks[r["scan_ids"][1]].volume_ml(l)
        elif sub in ("DIST.value", "DIST.range"):
            d = m.centre(lab(r, sp["a"])) - m.centre(lab(r, sp["b"]))
            want = float(np.linalg.norm(d if "axes" not in sp else d[sp["axes"]]))
        elif sub == "EXT.value": want = float(m.extent(lab(r, sp["a"]))[sp["axis"]])
        # the correct option is the farthest along the axis
        elif sub == "DIR.extreme":
            ax, sg = DIRECTIONS[sp["direction"]]
            pos = [sg * m.centroid(lab(r, o))[ax] for o in sp["options"]]
            assert int(np.argmax(pos)) == "ABCD".index(r["answer_letter"]), r["qid"]
            continue
        else: continue
        assert math.isclose(r["answer_value"], want, rel_tol=1e-6, abs_tol=1e-6), (r["qid"], r["answer_value"], want)
        if r["option_values"]:                                        # the correct option shows that value
            shown = r["option_values"]["ABCD".index(r["answer_letter"])]
            assert abs(shown - want) <= r["tolerance"], r["qid"]
        n += 1
    assert n >= 60


def test_clinical_pairings(cohort):
    """`AskPolicy(clinical=True)` asks only what `questions.registry.CLINICAL` allows: no trivia subtask, every pairing by its
    rule, no bone, brainstem or larynx; every pairing (the default) asks the trivia too."""
    recs = generate_questions(cohort["table"], seed=0, scans=cohort["scans"], policy=AskPolicy(clinical=True))
    assert len(recs) >= 100 and {r["task"] for r in recs} >= {"DIR", "DIST", "EXT", "VOL", "VOLEST"}
    assert all(CLINICAL[r["subtask"]] is not None for r in recs)
    lesion = lambda n: n in ANATOMY and ANATOMY[n].category == "lesion"
    for r in recs:
        rule, names = CLINICAL[r["subtask"]], set(r["structures"])
        assert not any(ANATOMY[n].category == "bone" or n in UNSEEN for n in names), r["qid"]
        if rule == "lesion": assert any(lesion(n) for n in names), r["qid"]
        if rule == "ref_lesion": assert lesion(r["spec"]["ref"]), r["qid"]
        if rule == "kidney": assert names == {"kidney_left", "kidney_right"}, r["qid"]
    trivia = [s for s, rule in CLINICAL.items() if rule is None]
    assert {"DIR.extreme", "COMP.than", "VOL.difference"} <= set(trivia)
    # every pairing asks them; the clinical rules never
    assert any(r["subtask"] in trivia for r in cohort["recs"])


def test_meaningful_sizes(cohort):
    """The pipeline's policy (`meaningful_sizes`): extents and volume estimates keep to `CLINICAL` (related ratios, a
    lesion's extents or an organ's height, no "which is widest"); the other tasks keep every pairing."""
    recs = generate_questions(cohort["table"], seed=0, scans=cohort["scans"], policy=AskPolicy(meaningful_sizes=True))
    sizes = [r for r in recs if r["task"] in SIZE_TASKS]
    assert sizes and all(CLINICAL[r["subtask"]] is not None for r in sizes)
    lesion = lambda n: n in ANATOMY and ANATOMY[n].category == "lesion"
    for r in sizes:
        names = [*r["structures"], *(o for o in r["spec"].get("options", []) if isinstance(o, str))]
        lobes = lambda a, b: "_lobe_" in a and "_lobe_" in b and a.rsplit("_", 1)[-1] == b.rsplit("_", 1)[-1]
        hosts = r["hosts"]
        tied = lambda a, b: counterpart(a) == b or hosts.get(a) == b or hosts.get(b) == a or {a, b} <= set(hosts)
        pairs = list(itertools.combinations(names, 2))
        if CLINICAL[r["subtask"]] == "related": assert all(tied(a, b) or lobes(a, b) for a, b in pairs), r["qid"]
        if CLINICAL[r["subtask"]] == "comparable":   # all lung lobes, or every two related
            assert all("_lobe_" in n for n in names) or all(tied(a, b) or lobes(a, b) for a, b in pairs), r["qid"]
        if r["task"] == "EXT":
            a = r["spec"]["a"]
            assert lesion(a) or (a in CLINICAL_LENGTHS and r["spec"]["axis"] == 2), r["qid"]
    every = [r for r in cohort["recs"] if r["task"] in SIZE_TASKS]
    assert any(r["subtask"] == "EXT.max_extent" for r in every)   # the library's default asks it; the policy never
    assert any(r["task"] == "EXT" and r["spec"].get("a") and not lesion(r["spec"]["a"]) and r["spec"].get("axis") != 2
               for r in every)
    assert {r["subtask"] for r in recs if r["task"] == "DIR"} >= {"DIR.extreme"}       # direction: every pairing


def test_letter_balance(cohort):
    bal = letter_balance(cohort["recs"])
    assert list(bal.index) == list(MC_TASKS)
    for task, row in bal.iterrows():
        for l in LETTERS: assert abs(row[l] - 0.25) <= 0.03, (task, l, row[l])
        counts = [round(row[l] * row["n"]) for l in LETTERS]
        assert max(counts) - min(counts) <= 1, (task, counts)


def test_numeric_keys_balanced_near_the_plausible_maximum():
    """Extents of a mandible-like structure (plausible up to 128.8 mm, the bone's extent margin 3 mm), from a fifth of
    that maximum to nearly all of it, as EXT.value draws them: the letters the generator assigns stay within 3 % of
    25 %. Before the ladder's play shrank to the room the range leaves (`distractors._room`), keys near the maximum lost
    every position but the ends to the play (A 19.7 %, B 30.3 %, C 30.9 %, D 19.1 % here; on the measured scans at
    b6a5956, EXT's A and D 31.8 % each)."""
    from spatialvqa.questions.core import _num_truth
    from spatialvqa.questions.distractors import _numeric_variants
    from spatialvqa.questions.generate import _assign_letters
    hi, w = 128.8, 3.0
    own = lambda x: max(3.0, 0.1 * x)
    tol = lambda x: own(x) + w
    rng, items = np.random.default_rng(0), []
    for i, t in enumerate(np.geomspace(0.2 * hi, 0.95 * hi, 200)):
        far = lambda v, t=t: _num_truth(v, t, tol, (t - w, t + w), own) is False      # as `_clear` with EXT's judge
        v = _numeric_variants(float(t), tol, "mm", rng, (0.0, hi), far)
        if any(v): items.append({"subtask": "EXT.value", "qid": f"q{i:03d}", "variants": v})
    assert len(items) > 150
    _assign_letters(items, 0)
    n = Counter(it["correct"] for it in items)
    assert all(abs(n[k] / len(items) - 0.25) <= 0.03 for k in range(4)), n
    for it in items:                                   # still evenly spaced ladders within the plausible range
        v = [o["key"] for o in it["final_options"]]
        assert max(v) <= hi and (v == sorted(v) or v == sorted(v)[::-1]), v


def test_no_two_defensible_options(cohort):
    "Options are apart by more than the tolerance; for directions, the offsets make every other option false."
    recs, volumes = cohort["recs"], cohort["volumes"]
    measured = {sid: structures_of(*v, near=True) for sid, v in volumes.items()}
    for r in (r for r in recs if r["format"] == "mc"):
        ev = rederive(r, measured)
        k = "ABCD".index(r["answer_letter"])
        assert ev["truth"] == [i == k for i in range(4)], r["qid"]
        assert len(set(r["options"])) == 4
        vals = r["option_values"]
        if vals:                                   # numbers: a factor MIN_RATIO apart; none but one within tolerance
            for x, y in itertools.combinations(sorted(vals), 2): assert y / x >= MIN_RATIO - 1e-9, (r["qid"], vals)
            near = [i for i, v in enumerate(vals) if abs(v - r["answer_value"]) <= r["tolerance"]]
            assert near == [k], (r["qid"], vals, r["answer_value"], r["tolerance"])
        if r["subtask"] == "DIR.relative":
            sp = r["spec"]
            g = Geometry(tuple(sp["spacing_mm"][0]))
            for by in POINTS:
                d = ev["derived"][by]["offset_mm"]
                correct = sp["options"][k]
                ax, sg = DIRECTIONS[correct]
                others = sorted(abs(d[i]) for i in range(3) if i != ax)
                assert sg * d[ax] >= direction_margin(g) and abs(d[ax]) > DIR_RATIO * others[-1], r["qid"]
                for i, o in enumerate(sp["options"]):
                    if i == k: continue
                    ax, sg = DIRECTIONS[o]
                    assert sg * d[ax] <= g.spacing[ax] / 2, (r["qid"], o, d)     # that direction does not hold
        if r["subtask"] == "DIR.relative_to":
            g = Geometry(tuple(r["spec"]["spacing_mm"][0]))
            ax = DIRECTIONS[r["spec"]["direction"]][0]
            for by in POINTS:
                off = ev["derived"]["offset_mm"][by]
                for i, o in enumerate(r["spec"]["options"]):
                    assert (off[o] >= direction_margin(g)) if i == k else (off[o] <= g.spacing[ax] / 2), (r["qid"], o)


def test_deterministic_and_stable_ids(cohort):
    table, scans, recs = cohort["table"], cohort["scans"], cohort["recs"]
    assert generate_questions(table, seed=0, scans=scans) == recs
    qids = [r["qid"] for r in recs]
    assert len(set(qids)) == len(qids)
    other = generate_questions(table, seed=1, scans=scans)
    assert [r["qid"] for r in other] != qids
    # a smaller cohort asks the same questions of the scans it keeps (before the cross-case ones, which need partners)
    keep = sorted(scans.scan_id)[:3]
    sub = generate_questions(table[table.scan_id.isin(keep)], seed=0, scans=scans[scans.scan_id.isin(keep)])
    mc = lambda rs: {r["qid"] for r in rs if r["task"] in MC_TASKS and r["scan_id"] in keep}
    assert mc(sub) == mc(recs)


def test_phrasings(cohort):
    per_task = Counter(s.split(".")[0] for s, ts in TEMPLATES.items() for _ in ts)
    assert all(per_task[t] >= 5 for t in TASKS), per_task
    used = Counter()     # over two seeds: one draws only 4 of VOLEST's 7 phrasings on these 8 phantoms
    again = generate_questions(cohort["table"], seed=1, scans=cohort["scans"])
    for t in {r["template_id"] for r in [*cohort["recs"], *again]}: used[t.split(".")[0]] += 1
    assert all(used[t] >= 5 for t in TASKS), used
    for r in cohort["recs"]:
        assert "{" not in r["question"] and r["question"].endswith(("?", "."))


def test_tables_and_plot(cohort, tmp_path):
    recs = cohort["recs"]
    df = to_frame(recs)
    df.to_parquet(tmp_path / "q.parquet")
    back = pd.read_parquet(tmp_path / "q.parquet")
    assert back["qid"].tolist() == [r["qid"] for r in recs]
    comp = composition(recs)
    assert comp.iloc[-1]["organ"] == "all" and int(comp.iloc[-1]["total"]) == len(recs)
    assert (comp.iloc[:-1][list(TASKS)].sum() == pd.Series(Counter(r["task"] for r in recs))[list(TASKS)]).all()
    md = markdown_table(comp)
    assert md.count("\n") == len(comp) + 2
    plot_composition(recs, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_bad_input():
    with pytest.raises(ValueError, match="unknown task"): generate_questions(pd.DataFrame(), tasks=["DIR", "SIZE"])
    with pytest.raises(ValueError, match="lacks column"): generate_questions(pd.DataFrame({"scan_id": ["a"]}))


SUMMARY = ROOT / "results" / "benchmark" / "summary.json"
BENCH = ROOT / "data" / "benchmark" / "questions.jsonl"


def test_pipeline_benchmark_summary():
    "The committed summary of the benchmark the pipeline wrote: every task, balanced letters, every answer re-derived."
    s = json.loads(SUMMARY.read_text())
    assert set(s["per_task"]) == set(TASKS) and sum(s["per_task"].values()) == s["questions"] > 0
    # the generated pool, before the filter (0.3% at 509abad: the ladders fit the plausible range, and no organ's box or
    # width is asked; 6.9% at 5dc9119); the benchmark that ships is balanced exactly per task
    # (test_validity.py::test_exact_letter_balance, the export's `letters_balanced`). Since the letters are chosen with
    # the twins in view (spatialvqa.letters, 8c44809) the originals give up some balance for their groups': 5.0% on the
    # originals, 5.7% with the twins (EXT's ladders keep A and D at 30.5%: few of them can take another letter)
    assert s["letter_share_max_deviation"] <= 0.06
    assert s["letter_share_max_deviation_with_twins"] <= 0.06
    # the generate stage re-derived every answer from the label maps (verify: true)
    assert s["verified"] is True


@pytest.mark.slow
def test_pipeline_benchmark():
    """The benchmark the pipeline wrote (needs `dvc repro generate`): every task, balanced letters on the originals (a
    flipped twin has its own letter), every answer re-derived, twins included (on the copies' label maps)."""
    recs = read_jsonl(BENCH, strict=True)
    assert {r["task"] for r in recs} == set(TASKS)
    originals = [r for r in recs if r["pair_of"] is None]
    # the twins on the counterfactual copies follow their originals
    assert 0 < len(originals) < len(recs)
    bal = letter_balance(originals)
    assert ((bal[list(LETTERS)] - 0.25).abs() <= 0.03).all().all()
    cache = {}
    for r in recs:
        for sid, path in zip(r["scan_ids"], r["label_maps"]):
            if sid not in cache:
                v = read_scan(ROOT / path if not Path(path).is_absolute() else path, None, sid).labels
                cache[sid] = structures_of(v.array, v.affine, near=True)
        assert check_record(r, cache) == [], r["qid"]


# The questions of the shared 4-phantom benchmark, hashed (their file paths aside: they name the session's temporary
# folder). A refactor of spatialvqa.questions or spatialvqa.phantom must leave this unchanged; a change meant to alter
# the questions updates it, and says so in its commit (the pipeline's results then change too).
# edge-to-edge DIST (DIST.gap, DIST.nearest), DIR.host (two lobes a side) join the default subtasks; gaps >= 30 mm: None
# one seeded stream per task (seed, scan, task): every task redrawn once
# DIST's convention says what is measured (the centres of the closest edge voxels): every DIST text and id changes
GOLDEN_QUESTIONS = ("609e44bbc9921221ed6ceebc98a012782dd16384ef32ed5b9419626181141d3b", 116)


def test_generated_questions_are_byte_for_byte_todays(phantom_benchmark):
    import hashlib
    recs = [{k: v for k, v in r.items() if k not in ("images", "label_maps")} for r in phantom_benchmark["recs"]]
    text = json.dumps(recs, sort_keys=True, default=str)
    assert str(phantom_benchmark["dir"]) not in text                          # no temporary path left in what is hashed
    assert (hashlib.sha256(text.encode()).hexdigest(), len(recs)) == GOLDEN_QUESTIONS
