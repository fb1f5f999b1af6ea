"""The procedural phantom cohort: determinism, anatomy where it belongs (mirrored in situs inversus), variation
between subjects that an atlas cannot guess, variants and pathology recorded and reported, tumours of known size
inside their hosts, reports that agree with the truth, and storage orientations that only correct affine handling
survives."""
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from spatialvqa.anatomy import NAME_TO_ID, TOTALSEG, reference_range
from spatialvqa.core import load_params
from spatialvqa.phantom.body import DEFAULT_RATES, VARIANTS
from spatialvqa.phantom.cohort import cohort_variants, make_cohort, read_cohort, subject_seed
from spatialvqa.phantom.report import VARIANT_PHRASES
from spatialvqa.phantom.subject import FORMATS, make_subject, orient, orientations, write_subject
from spatialvqa.phantom.variation import atlas_agreement, atlas_summary, cohort_variation
from spatialvqa.scan import read_scan

ORGANS = ["liver", "spleen", "kidney_right", "kidney_left", "heart", "aorta", "inferior_vena_cava", "stomach",
          "pancreas", "gallbladder", "urinary_bladder", "esophagus", "trachea", "adrenal_gland_right",
          "adrenal_gland_left", "lung_upper_lobe_left", "lung_lower_lobe_left", "lung_upper_lobe_right",
          "lung_middle_lobe_right", "lung_lower_lobe_right", "duodenum", "colon", "small_bowel", "sacrum",
          *(f"vertebrae_{v}" for v in [*(f"T{i}" for i in range(1, 13)), *(f"L{i}" for i in range(1, 6)), "S1"])]
COARSE = (4.0, 4.0, 6.0)
NORMAL = {k: 0.0 for k in VARIANTS}                  # no variants: the textbook anatomy
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def subj():
    "A default-grid subject without variants, with a lesion in every organ that can host one."
    return make_subject("t0", seed=11, tumours=True, rates=NORMAL)


@pytest.fixture(scope="module")
def coarse_subjects():
    "Subjects from several seeds on a coarse grid at the default rates, for relations that must hold for everyone."
    return [make_subject(f"c{i}", seed=100 + i, spacing=(3.5, 3.5, 5.0)) for i in range(5)]


@pytest.fixture(scope="module")
def variant_subjects():
    "The first 24 subjects of the default cohort (params.yaml: seed, rates) on a coarse grid, variants as a cohort assigns them."
    p = load_params("phantom", ROOT / "params.yaml")
    var = cohort_variants(24, int(p["seed"]), p["rates"])
    return [make_subject(f"v{i}", subject_seed(int(p["seed"]), i), spacing=COARSE, rates=p["rates"], variants=var[i])
            for i in range(24)]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    d = tmp_path_factory.mktemp("cohort")
    return d, make_cohort(d, n_subjects=12, seed=5, spacing=COARSE, workers=2)


def centroids(s):
    return {k: np.array(v["centroid_mm"]) for k, v in s.truth["structures"].items()}


# --- determinism -------------------------------------------------------------------------------------------

def test_same_seed_same_subject():
    a = make_subject("x", seed=3, spacing=COARSE)
    b = make_subject("x", seed=3, spacing=COARSE)
    assert np.array_equal(a.labels.array, b.labels.array) and np.array_equal(a.image.array, b.image.array)
    assert np.array_equal(a.labels.affine, b.labels.affine)
    assert a.truth == b.truth and a.report == b.report and a.orientation == b.orientation and a.fmt == b.fmt


def test_other_seed_other_subject():
    a = make_subject("x", seed=3, spacing=COARSE)
    c = make_subject("x", seed=4, spacing=COARSE)
    assert a.labels.shape != c.labels.shape or not np.array_equal(a.labels.array, c.labels.array)
    assert a.truth["structures"]["liver"] != c.truth["structures"]["liver"]


def test_tumour_choice_leaves_anatomy_alone():
    "Independent random streams: asking for a tumour does not move the organs."
    a = make_subject("x", seed=8, tumours=False, spacing=COARSE)
    b = make_subject("x", seed=8, tumours={"liver": 20}, spacing=COARSE)
    assert a.truth["structures"]["spleen"] == b.truth["structures"]["spleen"]
    assert a.truth["structures"]["kidney_left"] == b.truth["structures"]["kidney_left"]


def test_written_files_are_byte_identical(tmp_path):
    s = make_subject("x", seed=3, spacing=COARSE)
    digests = []
    for run in ("a", "b"):
        for fmt in FORMATS:
            e = write_subject(s, tmp_path / run / fmt, orientation="LPS", fmt=fmt)
            digests.append([hashlib.sha256((tmp_path / run / fmt / e[k]).read_bytes()).hexdigest()
                            for k in ("image", "labels", "truth", "report")])
    assert digests[0] == digests[2] and digests[1] == digests[3]


def test_cohort_is_reproducible(tmp_path):
    a = make_cohort(tmp_path / "a", n_subjects=2, seed=9, spacing=(6.0, 6.0, 8.0), workers=0)
    b = make_cohort(tmp_path / "b", n_subjects=2, seed=9, spacing=(6.0, 6.0, 8.0), workers=2)
    assert a == b
    for e in a:
        for k in ("image", "labels", "truth"):
            assert (tmp_path / "a" / e[k]).read_bytes() == (tmp_path / "b" / e[k]).read_bytes()


# --- anatomy -----------------------------------------------------------------------------------------------

def test_structures_present_and_plausible(subj):
    S = subj.truth["structures"]
    ts = [k for k in S if S[k]["label"] in TOTALSEG]
    assert len(ts) >= 20
    missing = [o for o in ORGANS if o not in S]
    assert not missing, missing
    # adult-like volumes (mL), with the lesions they host
    vol = lambda n: S[n]["volume_ml"] + sum(t["volume_ml"] for t in subj.truth["tumours"] if t["host"] == n)
    for name, (lo, hi) in {"liver": (1000, 2800), "spleen": (80, 500), "kidney_right": (80, 300),
                           "kidney_left": (80, 300), "heart": (350, 1300), "urinary_bladder": (40, 800)}.items():
        assert lo < vol(name) < hi, (name, vol(name))
    lungs = sum(v["volume_ml"] for k, v in S.items() if k.startswith("lung_") and k.endswith(("left", "right")))
    assert 3000 < lungs < 9000


def test_labels_are_unique_and_inside_the_body(subj):
    L = subj.labels.array
    S = subj.truth["structures"]
    assert sum(v["voxels"] for v in S.values()) == int((L > 0).sum())   # one label per voxel, all accounted for
    assert not (L[~subj.body] > 0).any()
    img = subj.image.array
    assert img[~subj.body].mean() < -950                               # air outside


def test_tissue_intensities(subj):
    L, img = subj.labels.array, subj.image.array
    hu = lambda n: float(img[L == NAME_TO_ID[n]].mean())
    assert hu("lung_lower_lobe_right") < -650
    assert 30 < hu("liver") < 140 and 20 < hu("spleen") < 140
    assert hu("vertebrae_L3") > 200
    assert -20 < hu("urinary_bladder") < 30
    assert subj.image.array.dtype == np.int16 and subj.labels.array.dtype == np.uint8


def test_fissures_show_where_lobes_meet(subj):
    "The interlobar fissures are visible: lobe voxels touching another lobe of the same lung are denser than lung."
    from spatialvqa.phantom.draw import _fissures
    from scipy import ndimage
    L, img = subj.labels.array, subj.image.array
    face = _fissures(L)
    lobes = np.isin(L, [NAME_TO_ID[n] for n in ORGANS if n.startswith("lung_")])
    interior = ndimage.binary_erosion(lobes, iterations=2) & ~ndimage.binary_dilation(face, iterations=2)
    assert face.sum() > 1000 and interior.sum() > face.sum()
    assert np.median(img[face]) >= np.median(img[interior]) + 300           # about 500 HU above lung (0 before)
    # the labels are those drawn before fissures
    a = make_subject("x", seed=3, spacing=COARSE)
    assert hashlib.sha256(a.labels.array.tobytes()).hexdigest()[:16] == "134abfe2e23b664b"  # version 4 (perirenal fat)


KIDNEY_IDS = [NAME_TO_ID[n] for n in ("kidney_right", "kidney_left", "kidney_tumor")]


@pytest.mark.parametrize("seed", [2, 6, 1])
def test_kidney_outlines_show_in_perirenal_fat(seed):
    """A blinded reader could not see a non-contrast kidney's outline: 67% of its rim lay within 25 HU of the liver or
    muscle it abutted. In perirenal fat, under 10% of a kidney's boundary voxels is iso-dense with its outside
    6-neighbours (seeds 2 and 6 non-contrast: 23-34% before, 0% now; seed 1 portal-venous: 0.4-0.5% before)."""
    from spatialvqa.phantom.draw import _BONE, _perirenal, rim_isodense
    s = make_subject("k", seed=seed, spacing=(2.5, 2.5, 5.0))                # the cohort's coarsest spacing
    assert s.truth["phase"] == ("portal-venous" if seed == 1 else "non-contrast")
    L, img = s.labels.array, s.image.array
    for k in ("kidney_right", "kidney_left"):
        assert rim_isodense(L, img, NAME_TO_ID[k], inside=[NAME_TO_ID["kidney_tumor"]]) < 0.10, k
    fat = _perirenal(np.isin(L, KIDNEY_IDS), s.labels.spacing)
    assert not ((L[fat] > 0) & ~_BONE[L[fat]]).any()                          # no soft tissue label touches a kidney
    assert np.median(img[fat & (L == 0)]) < -60                                # and the layer is fat


def test_perirenal_fat_leaves_the_kidney_labels_alone():
    "The kidneys' voxels (and their lesions) are those drawn before the fat (version 3); other organs gave way."
    a = make_subject("x", seed=3, spacing=COARSE)
    k = np.isin(a.labels.array, KIDNEY_IDS)
    assert hashlib.sha256(k.tobytes() + a.labels.array[k].tobytes()).hexdigest()[:16] == "f884ed10e7f880d3"


def relations_hold(s):
    """The relations that hold for every adult, as this subject's variants change them: in situs inversus the
    unpaired viscera are mirrored (`R(a, b)`: a lies more to the patient's right than b, in the normal situs);
    relations involving an absent organ or a pelvic kidney are not asked. x is measured from the midline."""
    C = centroids(s)
    var = set(s.truth["variants"])
    mid = s.truth["patient_offset_mm"][0]                          # the body's midsagittal plane, x = mid
    sgn = -1 if "situs_inversus" in var else 1
    R = lambda a, b: sgn * (C[a][0] - C[b][0]) > 0 if isinstance(b, str) else sgn * (C[a][0] - mid) > 0
    L = lambda a: sgn * (C[a][0] - mid) < 0
    x, y, z = 0, 1, 2
    has = lambda *ns: all(n in C for n in ns)
    orthotopic = [k for k in ("kidney_right", "kidney_left") if k in C and not any(v.startswith("pelvic_kidney") and k.endswith(v.split("_")[-1]) for v in var)]
    checks = {
        "right kidney right of left": not has("kidney_right", "kidney_left") or C["kidney_right"][x] > C["kidney_left"][x],
        "heart above liver": C["heart"][z] > C["liver"][z],
        "heart left of midline (right in situs inversus)": L("heart"),
        "IVC right of aorta (mirrored in situs inversus)": R("inferior_vena_cava", "aorta"),
        "liver right of midline (mirrored in situs inversus)": R("liver", None),
        "aorta anterior to L1": C["aorta"][y] > C["vertebrae_L1"][y],
        "stomach on the left (right in situs inversus)": L("stomach"),
        "lungs above liver": min(C[k][z] for k in C if k.startswith("lung_")) > C["liver"][z],
        "right lobes right": all(C[k][x] > mid for k in C if k.startswith("lung_") and k.endswith("right")),
        "left lobes left": all(C[k][x] < mid for k in C if k.startswith("lung_") and k.endswith("left")),
        "upper lobes above lower": C["lung_upper_lobe_right"][z] > C["lung_lower_lobe_right"][z]
                                   and C["lung_upper_lobe_left"][z] > C["lung_lower_lobe_left"][z],
        "sternum in front of heart": C["sternum"][y] > C["heart"][y],
        "esophagus behind trachea": C["esophagus"][y] < C["trachea"][y],
        "bladder in front of sacrum": C["urinary_bladder"][y] > C["sacrum"][y],
        "vertebrae stacked": all(C[f"vertebrae_{a}"][z] > C[f"vertebrae_{b}"][z] for a, b in zip(
            [*(f"T{i}" for i in range(1, 13)), *(f"L{i}" for i in range(1, 6))],
            [*(f"T{i}" for i in range(2, 13)), *(f"L{i}" for i in range(1, 6)), "S1"])),
        "ribs paired": all(C[f"rib_right_{i}"][x] > mid > C[f"rib_left_{i}"][x] for i in range(1, 13)),
        "bladder below the orthotopic kidneys": all(C["urinary_bladder"][z] < C[k][z] for k in orthotopic),
        "kidneys behind pancreas": all(C[k][y] < C["pancreas"][y] for k in orthotopic),
        "adrenals above their orthotopic kidneys": all(C[f"adrenal_gland_{k.split('_')[1]}"][z] > C[k][z] for k in orthotopic),
    }
    if has("spleen"): checks["liver right of spleen (mirrored in situs inversus)"] = R("liver", "spleen")
    if has("spleen", "stomach"): checks["spleen behind stomach"] = C["spleen"][y] < C["stomach"][y]
    if has("gallbladder"):                                         # an enlarged liver reaches far below its gallbladder
        checks["gallbladder below and in front of liver"] = (C["gallbladder"][z] < C["liver"][z] or "hepatomegaly" in var) \
            and C["gallbladder"][y] > C["liver"][y]
    if has("prostate"): checks["prostate below bladder"] = C["prostate"][z] < C["urinary_bladder"][z]
    return [k for k, ok in checks.items() if not ok]


def test_anatomical_relations(subj, coarse_subjects, variant_subjects):
    for s in [subj, *coarse_subjects, *variant_subjects]:
        assert relations_hold(s) == [], (s.subject_id, s.truth["variants"])


def test_subjects_vary(coarse_subjects):
    vols = [s.truth["structures"]["liver"]["volume_ml"] for s in coarse_subjects]
    kid = lambda S: S["kidney_left"] if "kidney_left" in S else S["kidney_right"]       # one may be removed
    pos = [kid(s.truth["structures"])["centroid_mm"][2] - s.truth["patient_offset_mm"][2] for s in coarse_subjects]
    assert np.std(vols) > 50 and np.std(pos) > 3
    assert len({s.truth["sex"] for s in coarse_subjects}) == 2


def test_variation_is_large_and_realistic(variant_subjects):
    "Issue 9: organs move by centimetres and vary in size across their real ranges, in the body's own frame."
    truths = [s.truth for s in variant_subjects]
    v = cohort_variation(truths, frame="body")
    for name, spread, cv in (("liver", 20, 0.25), ("spleen", 25, 0.5), ("kidney_left", 10, 0.2), ("kidney_right", 10, 0.2),
                             ("pancreas", 10, 0.2), ("gallbladder", 15, 0.25), ("heart", 12, 0.1)):
        assert v.loc[name, "spread_mm"] > spread and v.loc[name, "volume_cv"] > cv, (name, v.loc[name].to_dict())
    vols = {n: [t["structures"][n]["volume_ml"] for t in truths if n in t["structures"]] for n in ("liver", "spleen", "kidney_left", "pancreas")}
    # the cohort's median is a normal adult, its spread reaches pathology
    for n, xs in vols.items():
        lo, hi = reference_range(n, "normal")
        assert lo < np.median(xs) < hi, (n, np.median(xs))
        plo, phi = reference_range(n)
        assert plo < min(xs) and max(xs) < phi, (n, min(xs), max(xs))
    assert max(vols["liver"]) > 2200 and max(vols["spleen"]) > 450           # hepatomegaly, splenomegaly
    off = np.array([t["patient_offset_mm"] for t in truths])
    assert off[:, 0].std() > 5 and off[:, 2].std() > 50                      # the patient lies anywhere on the table
    bmi = [t["body"]["bmi"] for t in truths]
    assert min(bmi) < 23 and max(bmi) > 29


def test_atlas_is_often_wrong_where_anatomy_varies(variant_subjects):
    "A leave-one-subject-out atlas of median positions and volumes no longer knows every relation."
    s = atlas_summary(atlas_agreement([x.truth for x in variant_subjects]))
    assert s["all"]["accuracy"] < 0.985 and s["right"]["accuracy"] < 0.97, s
    # pairs of structures whose relation the atlas gets wrong in >= 20 % of subjects
    assert s["all"]["contested"] >= 40, s
    # situs inversus subjects are the ones where left/right relations of the viscera flip
    ag = atlas_agreement([x.truth for x in variant_subjects])
    si = {x.subject_id for x in variant_subjects if "situs_inversus" in x.truth["variants"]}
    assert si
    lr = ag[(ag.relation == "right") & (ag.a == "liver") & (ag.b == "spleen")]
    assert set(lr[~lr.correct].subject) <= si and not lr[lr.subject.isin(si)].correct.any()


def test_variants_follow_the_rates_and_are_recorded_and_reported(variant_subjects):
    p = load_params("phantom", ROOT / "params.yaml")
    assert set(p["rates"]) == set(DEFAULT_RATES) and {k: float(v) for k, v in p["rates"].items()} == DEFAULT_RATES
    seen = set()
    for s in variant_subjects:
        S, var = s.truth["structures"], s.truth["variants"]
        seen |= set(var)
        for v in var:
            key = v if v in VARIANT_PHRASES else None
            assert key and VARIANT_PHRASES[key] in s.report, (s.subject_id, v, s.report)
        assert ("kidney_left" in S) == ("nephrectomy_left" not in var) and ("kidney_right" in S) == ("nephrectomy_right" not in var)
        assert ("spleen" in S) == ("splenectomy" not in var) and ("gallbladder" in S) == ("cholecystectomy" not in var)
        if "situs_inversus" in var: assert "Situs inversus totalis" in s.report and "Dextrocardia" in s.report
        else: assert "Situs solitus." in s.report and "Situs inversus" not in s.report
        for sd in ("left", "right"):
            if f"renal_atrophy_{sd}" in var: assert s.truth["findings"][f"kidney_{sd}"] == "small"
            if f"pelvic_kidney_{sd}" in var:
                k = S[f"kidney_{sd}"]["centroid_mm"][2]
                assert k < S["vertebrae_S1"]["centroid_mm"][2] and f"ectopic, in the {sd} hemipelvis (pelvic kidney)" in s.report
        if "hepatomegaly" in var: assert s.truth["findings"]["liver"] == "enlarged"
        if "splenomegaly" in var: assert s.truth["findings"]["spleen"] == "enlarged"
        # explicit, unambiguous negatives
        if not any(v.startswith(("nephrectomy", "pelvic", "renal_atrophy")) for v in var) and \
                s.truth["findings"]["kidney_left"] == s.truth["findings"]["kidney_right"] == "normal":
            assert "Both kidneys are present" in s.report
        for absent, phrase in (("nephrectomy", "nephrectomy"), ("splenectomy", "splenectomy"), ("cholecystectomy", "cholecystectomy")):
            if not any(v.startswith(absent) for v in var): assert phrase not in s.report
    assert seen >= {"situs_inversus", "cholecystectomy", "hepatomegaly", "splenomegaly"}, seen


def test_situs_inversus_is_a_mirror_image():
    "The same subject with and without situs inversus: viscera mirrored through the midline, paired names correct."
    a = make_subject("n", seed=12, spacing=COARSE, rates=NORMAL, tumours=False)
    b = make_subject("si", seed=12, spacing=COARSE, rates=NORMAL, tumours=False, variants={"situs_inversus": True})
    assert a.truth["variants"] == [] and b.truth["variants"] == ["situs_inversus"]
    mid = a.truth["patient_offset_mm"][0]
    assert b.truth["patient_offset_mm"] == a.truth["patient_offset_mm"]
    A, B = centroids(a), centroids(b)
    for n in ("liver", "spleen", "stomach", "heart", "pancreas", "gallbladder", "inferior_vena_cava", "aorta", "duodenum"):
        assert abs((B[n][0] - mid) + (A[n][0] - mid)) < 6, n                          # x mirrored
        assert np.allclose(B[n][1:], A[n][1:], atol=6), n                             # y, z kept
        # same shape, other voxels
        assert abs(b.truth["structures"][n]["volume_ml"] / a.truth["structures"][n]["volume_ml"] - 1) < 0.12, n
    # paired names follow the patient's sides: the mirrored right kidney (the one under the liver, lower) is now the
    # left one, at the same height; its own size and lateral shift are the anatomical left kidney's
    assert B["kidney_left"][0] < mid < B["kidney_right"][0]
    assert abs(B["kidney_left"][2] - A["kidney_right"][2]) < 6 and abs(B["kidney_right"][2] - A["kidney_left"][2]) < 6
    assert B["adrenal_gland_left"][0] < mid < B["adrenal_gland_right"][0]
    assert np.allclose(B["vertebrae_L1"], A["vertebrae_L1"], atol=1e-6)              # the skeleton is not mirrored


def test_rates_decide_without_moving_anything_else():
    "Turning a variant on changes that variant only: body, organ sizes and the other organs stay as they were."
    a = make_subject("a", seed=31, spacing=COARSE, rates=NORMAL, tumours=False)
    b = make_subject("b", seed=31, spacing=COARSE, rates=NORMAL, tumours=False, variants={"cholecystectomy": True})
    assert "gallbladder" in a.truth["structures"] and "gallbladder" not in b.truth["structures"]
    assert a.truth["body"] == b.truth["body"]
    for n in ("spleen", "kidney_left", "kidney_right", "heart", "pancreas", "stomach"):
        assert a.truth["structures"][n] == b.truth["structures"][n], n
    with pytest.raises(ValueError, match="unknown variant"):
        make_subject("x", seed=1, spacing=COARSE, rates={"heterotaxy": 0.1})
    with pytest.raises(ValueError, match="host"):
        make_subject("x", seed=1, spacing=COARSE, rates=NORMAL, variants={"splenectomy": True}, tumours={"spleen": 20})


def test_default_grid_is_anisotropic(subj):
    sx, sy, sz = subj.labels.spacing
    assert sx == sy and sz > sx and 2 <= sx <= 2.5 and 3 <= sz <= 5
    assert 2e6 < subj.labels.array.size < 1.2e7


# --- tumours and reports -----------------------------------------------------------------------------------

def test_tumours_of_requested_size_inside_their_hosts():
    want = {"kidney": 26, "liver": 34, "lung": 14, "pancreas": 18, "spleen": 16}
    s = make_subject("t", seed=21, tumours=want, spacing=(2.5, 2.5, 3.0))
    L = s.labels.array
    assert {t["kind"] for t in s.truth["tumours"]} == set(want)
    for t in s.truth["tumours"]:
        assert t["diameter_mm"] == want[t["kind"]]
        nominal = np.pi / 6 * t["diameter_mm"] ** 3 / 1000
        assert abs(t["volume_ml"] - nominal) / nominal < 0.25
        m = L == t["label"]
        ring = np.zeros_like(m)                          # the voxels touching the tumour face-on
        for ax in range(3):
            for sh in (1, -1): ring |= np.roll(m, sh, axis=ax)
        ring &= ~m
        assert set(np.unique(L[ring])) == {NAME_TO_ID[t["host"]]}, t      # wrapped by its host, nothing else
        assert np.linalg.norm(np.array(t["centroid_mm"]) - s.labels.to_world(np.argwhere(m).mean(0))) < 1e-2


def test_report_agrees_with_truth():
    seen = set()
    for seed in range(30, 38):
        s = make_subject("r", seed=seed, tumours=True, spacing=COARSE)
        rep = s.report
        assert rep.startswith("TECHNIQUE:") and "FINDINGS:" in rep and "IMPRESSION:" in rep
        for t in s.truth["tumours"]:
            assert t["location"] in rep and f"{t['diameter_mm']:.0f} mm" in rep
            if t["kind"] in ("kidney", "lung"):
                # patient's right is +x in RAS
                side = "right" if t["centroid_mm"][0] > s.truth["patient_offset_mm"][0] else "left"
                assert t["side"] == side and re.search(rf"\b{side}\b", t["location"])
                seen.add((t["kind"], side))
            if t["kind"] == "lung":
                assert t["location"] == " ".join(t["host"].split("_")[i] for i in (3, 1)) + " lobe"
        liver_ml = s.truth["structures"]["liver"]["volume_ml"] + sum(t["volume_ml"] for t in s.truth["tumours"] if t["kind"] == "liver")
        assert ("Hepatomegaly" in rep or "liver is enlarged" in rep or "Enlarged liver" in rep) == (liver_ml > 2000)
        for v in s.truth["variants"]: assert VARIANT_PHRASES[v] in rep, (v, rep)
        assert len(s.truth["tumours"]) >= 4                      # tumours=True: every organ the subject has
    assert {("kidney", "left"), ("kidney", "right")} <= seen


def test_several_lesions_of_random_site_and_size(variant_subjects):
    "At the default rates a cohort has subjects with several lesions, in every kind of host, of many sizes."
    subs = variant_subjects                                          # the default cohort's first 24, its rates
    ts = [t for s in subs for t in s.truth["tumours"]]
    n = [len(s.truth["tumours"]) for s in subs]
    assert max(n) >= 2 and 0 < sum(x > 0 for x in n) < len(subs)
    assert len({t["kind"] for t in ts}) >= 4 and len({t["host"] for t in ts}) >= 5
    assert len({t["diameter_mm"] for t in ts}) >= 0.7 * len(ts)
    for s in subs:                                                   # one lesion per label
        assert len({t["name"] for t in s.truth["tumours"]}) == len(s.truth["tumours"])


def test_no_tumours_when_none_asked():
    s = make_subject("n", seed=2, tumours=False, spacing=COARSE)
    assert s.truth["tumours"] == [] and s.labels.array.max() < 200
    assert not re.search(r"\d (mm|cm) [a-z -]*(lesion|nodule|mass)", s.report)


def test_impossible_tumour_is_refused():
    with pytest.raises(ValueError, match="pancreas"):
        make_subject("x", seed=1, tumours={"pancreas": 80}, spacing=COARSE)
    with pytest.raises(ValueError, match="unknown tumour kind"):
        make_subject("x", seed=1, tumours=["brain"], spacing=COARSE)


# --- storage orientations ----------------------------------------------------------------------------------

def test_orientations_are_what_they_say():
    o = orientations()
    assert len(o) >= 8 and {"RAS", "LPS", "LAS", "RPI"} <= set(o)
    s = make_subject("o", seed=3, spacing=(6.0, 6.0, 8.0))
    ref = s.labels.to_world(np.argwhere(s.labels.array == NAME_TO_ID["liver"]).mean(0))
    for name in o:
        v = orient(s.labels, name)
        assert "".join(v.axcodes) == name
        assert np.allclose(v.to_world(np.argwhere(v.array == NAME_TO_ID["liver"]).mean(0)), ref)


def test_cohort_orientations_vary_and_files_give_back_the_truth(cohort):
    d, entries = cohort
    assert len(entries) == 12
    assert len({e["orientation"] for e in entries}) >= 8
    assert [e["format"] for e in entries] == [FORMATS[i % 2] for i in range(12)]
    assert json.loads((d / "cohort.json").read_text()) == entries
    index_wrong = 0
    for e in read_cohort(d):
        scan = read_scan(e["labels"], e["image"])
        truth = json.loads(open(e["truth"]).read())
        assert open(e["report"]).read() == truth["report"]
        lab = scan.labels
        assert "".join(lab.axcodes) == e["orientation"] == truth["storage"]["orientation"]
        A = lab.affine
        vox_ml = abs(np.linalg.det(A[:3, :3])) / 1000
        for name in ("liver", "spleen", "kidney_left", "kidney_right", "heart", "urinary_bladder"):
            ijk = np.argwhere(lab.array == NAME_TO_ID[name])
            if name not in truth["structures"]:                          # removed (nephrectomy, splenectomy)
                assert not len(ijk) and any(v.startswith(("nephrectomy", "splenectomy")) for v in truth["variants"]); continue
            xyz = ijk @ A[:3, :3].T + A[:3, 3]
            t = truth["structures"][name]
            assert len(ijk) == t["voxels"]
            assert abs(len(ijk) * vox_ml - t["volume_ml"]) < 1e-3
            assert np.allclose(xyz.mean(0), t["centroid_mm"], atol=1e-3)
            assert np.allclose([xyz.min(0), xyz.max(0)], t["bbox_mm"], atol=1e-3)
        # array indices alone would put the liver on the wrong side in many of these files
        li = np.argwhere(lab.array == NAME_TO_ID["liver"]).mean(0)
        sp = np.argwhere(lab.array == NAME_TO_ID["spleen"]).mean(0)
        index_wrong += not (li[0] > sp[0])
        assert scan.image.array.dtype == np.int16
    assert index_wrong >= 3
