"""The procedural phantom cohort: determinism, anatomy where it belongs, tumours of known size inside their
hosts, reports that agree with the truth, and storage orientations that only correct affine handling survives."""
import hashlib
import json
import re

import numpy as np
import pytest

from spatialvqa.anatomy import NAME_TO_ID, TOTALSEG
from spatialvqa.phantom import (FORMATS, make_cohort, make_subject, orient, orientations, read_cohort, write_subject)
from spatialvqa.scan import read_scan

ORGANS = ["liver", "spleen", "kidney_right", "kidney_left", "heart", "aorta", "inferior_vena_cava", "stomach",
          "pancreas", "gallbladder", "urinary_bladder", "esophagus", "trachea", "adrenal_gland_right",
          "adrenal_gland_left", "lung_upper_lobe_left", "lung_lower_lobe_left", "lung_upper_lobe_right",
          "lung_middle_lobe_right", "lung_lower_lobe_right", "duodenum", "colon", "small_bowel", "sacrum",
          *(f"vertebrae_{v}" for v in [*(f"T{i}" for i in range(1, 13)), *(f"L{i}" for i in range(1, 6)), "S1"])]
COARSE = (4.0, 4.0, 6.0)


@pytest.fixture(scope="module")
def subj():
    "A default-grid subject with all four tumour kinds."
    return make_subject("t0", seed=11, tumours=True)


@pytest.fixture(scope="module")
def coarse_subjects():
    "Subjects from several seeds on a coarse grid, for relations that must hold for everyone."
    return [make_subject(f"c{i}", seed=100 + i, spacing=(3.5, 3.5, 5.0)) for i in range(5)]


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
    # adult-like volumes (mL)
    for name, (lo, hi) in {"liver": (1000, 2800), "spleen": (80, 500), "kidney_right": (80, 300),
                           "kidney_left": (80, 300), "heart": (350, 1300), "urinary_bladder": (40, 800)}.items():
        assert lo < S[name]["volume_ml"] < hi, (name, S[name]["volume_ml"])
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


def relations_hold(s):
    C = centroids(s)
    x, y, z = 0, 1, 2
    checks = {
        "liver right of spleen": C["liver"][x] > C["spleen"][x],
        "right kidney right of left": C["kidney_right"][x] > C["kidney_left"][x],
        "right kidney lower than left": C["kidney_right"][z] < C["kidney_left"][z],
        "heart above liver": C["heart"][z] > C["liver"][z],
        "heart left of midline": C["heart"][x] < 0,
        "bladder below kidneys": C["urinary_bladder"][z] < min(C["kidney_right"][z], C["kidney_left"][z]),
        "IVC right of aorta": C["inferior_vena_cava"][x] > C["aorta"][x],
        "aorta anterior to L1": C["aorta"][y] > C["vertebrae_L1"][y],
        "gallbladder below and in front of liver": C["gallbladder"][z] < C["liver"][z] and C["gallbladder"][y] > C["liver"][y],
        "stomach on the left": C["stomach"][x] < 0,
        "spleen behind stomach": C["spleen"][y] < C["stomach"][y],
        "adrenals above kidneys": C["adrenal_gland_right"][z] > C["kidney_right"][z] and C["adrenal_gland_left"][z] > C["kidney_left"][z],
        "kidneys behind pancreas": max(C["kidney_right"][y], C["kidney_left"][y]) < C["pancreas"][y],
        "lungs above liver": min(C[k][z] for k in C if k.startswith("lung_")) > C["liver"][z],
        "right lobes right": all(C[k][x] > 0 for k in C if k.startswith("lung_") and k.endswith("right")),
        "left lobes left": all(C[k][x] < 0 for k in C if k.startswith("lung_") and k.endswith("left")),
        "upper lobes above lower": C["lung_upper_lobe_right"][z] > C["lung_lower_lobe_right"][z]
                                   and C["lung_upper_lobe_left"][z] > C["lung_lower_lobe_left"][z],
        "sternum in front of heart": C["sternum"][y] > C["heart"][y],
        "esophagus behind trachea": C["esophagus"][y] < C["trachea"][y],
        "bladder in front of sacrum": C["urinary_bladder"][y] > C["sacrum"][y],
        "vertebrae stacked": all(C[f"vertebrae_{a}"][z] > C[f"vertebrae_{b}"][z] for a, b in zip(
            [*(f"T{i}" for i in range(1, 13)), *(f"L{i}" for i in range(1, 6))],
            [*(f"T{i}" for i in range(2, 13)), *(f"L{i}" for i in range(1, 6)), "S1"])),
        "ribs paired": all(C[f"rib_right_{i}"][x] > 0 > C[f"rib_left_{i}"][x] for i in range(1, 13)),
    }
    if "prostate" in C: checks["prostate below bladder"] = C["prostate"][z] < C["urinary_bladder"][z]
    return [k for k, ok in checks.items() if not ok]


def test_anatomical_relations(subj, coarse_subjects):
    for s in [subj, *coarse_subjects]:
        assert relations_hold(s) == [], s.subject_id


def test_subjects_vary(coarse_subjects):
    vols = [s.truth["structures"]["liver"]["volume_ml"] for s in coarse_subjects]
    pos = [s.truth["structures"]["kidney_left"]["centroid_mm"][2] for s in coarse_subjects]
    assert np.std(vols) > 50 and np.std(pos) > 3
    assert len({s.truth["sex"] for s in coarse_subjects}) == 2


def test_default_grid_is_anisotropic(subj):
    sx, sy, sz = subj.labels.spacing
    assert sx == sy and sz > sx and 2 <= sx <= 2.5 and 3 <= sz <= 5
    assert 2e6 < subj.labels.array.size < 8e6


# --- tumours and reports -----------------------------------------------------------------------------------

def test_tumours_of_requested_size_inside_their_hosts():
    want = {"kidney": 26, "liver": 34, "lung": 14, "pancreas": 18}
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
                side = "right" if t["centroid_mm"][0] > 0 else "left"     # patient's right is +x in RAS
                assert t["side"] == side and re.search(rf"\b{side}\b", t["location"])
                seen.add((t["kind"], side))
            if t["kind"] == "lung":
                assert t["location"] == " ".join(t["host"].split("_")[i] for i in (3, 1)) + " lobe"
        liver_ml = s.truth["structures"]["liver"]["volume_ml"] + sum(t["volume_ml"] for t in s.truth["tumours"] if t["kind"] == "liver")
        assert ("Hepatomegaly" in rep or "liver is enlarged" in rep or "Enlarged liver" in rep) == (liver_ml > 2000)
    assert {("kidney", "left"), ("kidney", "right")} <= seen


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
