"""Dataset converters on tiny replicas of each dataset's real folder layout: ids, geometry, manifests, rejects."""
import argparse
import json
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from spatialvqa.anatomy import NAME_TO_ID
from spatialvqa.convert.amos import AMOS_LABELS, convert_amos
from spatialvqa.convert.commands import add_cli
from spatialvqa.convert.datasets import CONVERTERS, check_datasets, convert, convert_datasets
from spatialvqa.convert.kits import convert_kits, split_kidneys
from spatialvqa.convert.labels import label_mapping, match_label_name
from spatialvqa.convert.msd import convert_msd
from spatialvqa.convert.totalsegmentator import convert_totalsegmentator
from spatialvqa.scan import Volume, read_labels, write_volume

SHAPE = (16, 16, 8)
# stored LPS-style (i toward the patient's left), as DICOM-derived NIfTIs usually are
AFF = np.array([[-2.0, 0, 0, 40], [0, -2.0, 0, 30], [0, 0, 3.0, -20], [0, 0, 0, 1]])
# KiTS19's convention: slices first, column axis toward the patient's left (kits19 README)
AFF_KITS = np.array([[0, 0, -2.0, 0], [0, -2.0, 0, 0], [-5.0, 0, 0, 0], [0, 0, 0, 1]])
KEYS = {"scan_id", "image", "labels", "source", "licence", "label_names", "modality", "split", "case", "source_labels"}
ID = NAME_TO_ID


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("SPATIALVQA_PROGRESS", "0")


def blobs(shape, boxes, dtype=np.uint8):
    a = np.zeros(shape, dtype)
    for v, sl in boxes: a[sl] = v
    return a


def ct(path, shape=SHAPE, aff=AFF, value=-1000):
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_volume(Volume(np.full(shape, value, np.int16), aff), path)


def lab(path, boxes, shape=SHAPE, aff=AFF):
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_volume(Volume(blobs(shape, boxes), aff), path)


def load(out):
    out = Path(out)
    return tuple(json.loads((out / f).read_text()) for f in ("scans.json", "rejected.json", "convert_report.json"))


# ---------------------------------------------------------------- names

def test_match_label_name():
    assert match_label_name("right kidney") == "kidney_right"
    assert match_label_name("left adrenal gland") == "adrenal_gland_left"
    assert match_label_name("kidney_left") == "kidney_left"
    assert match_label_name("Gall Bladder") == "gallbladder"
    assert match_label_name("arota") == "aorta"
    assert match_label_name("postcava") == "inferior_vena_cava"
    assert match_label_name("bladder") == "urinary_bladder"
    assert match_label_name("colon cancer primaries") is None   # whole names only: not 'colon'
    assert match_label_name("left right kidney") is None


def test_amos_table_maps_by_name():
    m = label_mapping(AMOS_LABELS)
    assert [ID[m[v]] for v in range(1, 15)] == [1, 2, 3, 4, 15, 5, 6, 52, 63, 7, 8, 9, 19, 21]
    assert m[15] is None


# ---------------------------------------------------------------- TotalSegmentator

@pytest.fixture
def totalseg(tmp_path):
    root = tmp_path / "Totalsegmentator_dataset_v201"
    masks = {"liver": np.s_[2:6, 4:10, 2:6], "spleen": np.s_[10:14, 4:8, 2:5], "kidney_right": np.s_[2:5, 11:14, 1:3],
             "heart": np.s_[0:0], "face": np.s_[0:2, 0:2, 0:2]}
    for sid in ("s0000", "s0001", "s0002", "s0003"):
        ct(root / sid / "ct.nii.gz")
        for name, sl in masks.items():
            if name == "face" and sid != "s0001": continue   # a v1-only class in one subject
            lab(root / sid / "segmentations" / f"{name}.nii.gz", [(1, sl)])
    (root / "s0000" / "segmentations" / "._liver.nii.gz").write_bytes(b"\0\5\26\7")   # macOS junk
    (root / "._s0000").write_bytes(b"\0")
    (root / "s0002" / "segmentations" / "spleen.nii.gz").write_bytes(b"\x1f\x8b\x08 broken")      # corrupt
    # wrong grid
    lab(root / "s0003" / "segmentations" / "spleen.nii.gz", [(1, np.s_[1:3, 1:3, 1:3])], shape=(16, 16, 9))
    (root / "meta.csv").write_text("image_id;age;gender;institute;study_type;split\n"
                                   "s0000;61;m;A;ct thorax;train\ns0001;70;f;B;ct abdomen;val\n"
                                   "s0002;55;m;A;ct;test\ns0003;50;f;A;ct;train\ns0999;40;m;C;ct;train\n")
    return root


def test_totalsegmentator(totalseg, tmp_path):
    recs = convert_totalsegmentator(totalseg, tmp_path / "out", workers=0)
    scans, rejected, report = load(tmp_path / "out")
    assert scans == recs
    assert [r["scan_id"] for r in recs] == ["totalseg_s0000", "totalseg_s0001"]
    r = recs[0]
    assert KEYS <= set(r)
    assert (r["source"], r["licence"], r["modality"], r["split"], r["case"]) == ("TotalSegmentator", "CC BY 4.0", "CT", "train", "s0000")
    assert r["image"] == str(totalseg / "s0000" / "ct.nii.gz")        # referenced, not copied
    assert r["label_names"] == {"1": "spleen", "2": "kidney_right", "5": "liver"}
    assert "unmapped_labels" not in r
    v = read_labels(r["labels"])
    np.testing.assert_array_equal(v.affine, AFF)
    assert v.shape == SHAPE
    assert v.array[3, 5, 3] == ID["liver"] and v.array[11, 5, 3] == ID["spleen"] and v.array[3, 12, 1] == ID["kidney_right"]
    assert sorted(np.unique(v.array).tolist()) == [0, 1, 2, 5]
    # a mask name outside TotalSegmentator v2's classes is reported, not dropped silently
    assert recs[1]["unmapped_labels"] == {"face": "face"}
    assert report["unmapped_labels_in_scans"] == {"face face": 1}
    # the corrupt and the misaligned subject are rejected with the file and the fault; the rest carried on
    errs = {x["scan_id"]: x["error"] for x in rejected}
    assert set(errs) == {"totalseg_s0002", "totalseg_s0003"}
    assert "spleen.nii.gz: unreadable or corrupt" in errs["totalseg_s0002"]
    assert "shape mismatch" in errs["totalseg_s0003"]
    assert report["ignored_files"] == [str(totalseg / "._s0000")]
    assert any("1 subjects listed in meta.csv" in n for n in report["notes"])


def test_totalsegmentator_overlap_lower_id_wins(tmp_path):
    root = tmp_path / "ts"
    ct(root / "s0000" / "ct.nii.gz")
    lab(root / "s0000" / "segmentations" / "liver.nii.gz", [(1, np.s_[2:8, 2:8, 2:6])])
    lab(root / "s0000" / "segmentations" / "spleen.nii.gz", [(1, np.s_[6:10, 2:8, 2:6])])  # 2*6*4 voxels overlap
    (r,) = convert_totalsegmentator(root, tmp_path / "out", workers=0)
    assert r["overlap_voxels"] == 2 * 6 * 4
    a = read_labels(r["labels"]).array
    assert a[7, 4, 3] == ID["spleen"]   # spleen (1) keeps the shared voxels over liver (5)


def test_totalsegmentator_worker_processes_and_image_modes(totalseg, tmp_path):
    recs = convert_totalsegmentator(totalseg, tmp_path / "sym", workers=2, images="symlink")
    assert len(recs) == 2
    img = Path(recs[0]["image"])
    assert img == tmp_path / "sym" / "totalseg_s0000" / "image.nii.gz" and img.is_symlink()
    assert os.path.samefile(img, totalseg / "s0000" / "ct.nii.gz")
    recs = convert_totalsegmentator(totalseg, tmp_path / "copy", workers=0, images="copy")
    img = Path(recs[0]["image"])
    assert img.is_file() and not img.is_symlink()
    np.testing.assert_array_equal(nib.load(img).affine, AFF)
    with pytest.raises(ValueError, match="images must be one of"):
        convert_totalsegmentator(totalseg, tmp_path / "x", workers=0, images="hardlink")


# ---------------------------------------------------------------- AMOS

def amos_case(root, split, name, img_shape=SHAPE, boxes=None):
    ct(root / f"images{split}" / f"{name}.nii.gz", img_shape)
    boxes = boxes or [(1, np.s_[10:14, 4:8, 2:5]), (2, np.s_[2:5, 11:14, 1:3]), (9, np.s_[7:9, 7:9, :]),
                      (15, np.s_[7:9, 12:14, 0:2])]
    lab(root / f"labels{split}" / f"{name}.nii.gz", boxes)


@pytest.fixture
def amos(tmp_path):
    root = tmp_path / "AMOS2022" / "amos22"
    amos_case(root, "Tr", "amos_0001")                      # male CT
    amos_case(root, "Va", "amos_0008")                      # female CT
    amos_case(root, "Tr", "amos_0540")                      # MRI
    amos_case(root, "Tr", "amos_0010", img_shape=(16, 16, 9))   # image and labels disagree
    ct(root / "imagesTr" / "amos_0011.nii.gz")              # an image with no label file
    ct(root / "imagesTs" / "amos_0002.nii.gz")              # test split: no public labels
    (root / "labelsTr" / "._amos_0001.nii.gz").write_bytes(b"\0")
    labels = {"0": "background", **{str(k): v for k, v in AMOS_LABELS.items()}}
    (root / "dataset.json").write_text(json.dumps({"name": "AMOS", "licence": "CC BY 4.0", "labels": labels,
                                                   "training": [], "validation": [], "test": []}))
    (root.parent / "labeled_data_meta_0000_0599.csv").write_text(
        "amos_id,Patient's Birth Date,Patient's Sex,Patient's Age\n1,19700101,M,052Y\n8,19600101,F,061Y\n540,19800101,M,040Y\n")
    return root


def test_amos(amos, tmp_path):
    recs = convert("amos", amos.parent, tmp_path / "out", workers=0)   # the folder above amos22/ works too
    scans, rejected, report = load(tmp_path / "out")
    assert [(r["scan_id"], r["split"], r["modality"]) for r in recs] == [("amos_0001", "train", "CT"), ("amos_0008", "val", "CT")]
    male, female = recs
    assert male["label_names"] == {"1": "spleen", "2": "kidney_right", "22": "prostate", "63": "inferior_vena_cava"}
    assert "unmapped_labels" not in male
    assert female["label_names"] == {"1": "spleen", "2": "kidney_right", "63": "inferior_vena_cava"}
    assert female["unmapped_labels"] == {"15": "prostate/uterus"}     # the uterus has no TotalSegmentator class
    v = read_labels(male["labels"])
    np.testing.assert_array_equal(v.affine, AFF)
    assert v.array[8, 8, 4] == ID["inferior_vena_cava"] and v.array[8, 13, 1] == ID["prostate"]
    assert v.array[3, 12, 2] == ID["kidney_right"]
    assert read_labels(female["labels"]).array[8, 13, 1] == 0
    errs = {x["scan_id"]: x["error"] for x in rejected}
    assert set(errs) == {"amos_0010", "amos_0011"}
    assert "shape mismatch" in errs["amos_0010"] and "missing label file amos_0011.nii.gz" in errs["amos_0011"]
    assert {s["case"]: s["reason"].split()[0] for s in report["skipped"]} == {"amos_0540": "MRI", "amos_0002": "test"}
    assert report["ignored_files"] == [str(amos / "labelsTr" / "._amos_0001.nii.gz")]
    assert report["mapping"]["9"] == "inferior_vena_cava" and report["mapping"]["8"] == "aorta"


def test_amos_mri_on_request_and_no_meta(amos, tmp_path):
    (amos.parent / "labeled_data_meta_0000_0599.csv").unlink()
    recs = convert_amos(amos, tmp_path / "out", workers=0, modalities=("CT", "MRI"))
    by = {r["scan_id"]: r for r in recs}
    assert by["amos_0540"]["modality"] == "MRI"
    assert all(r["unmapped_labels"] == {"15": "prostate/uterus"} for r in recs)   # sex unknown: never guessed
    assert any("was not found" in n for n in load(tmp_path / "out")[2]["notes"])


# ---------------------------------------------------------------- MSD

def msd_task(root, name, labels, cases, modality=None, channels=1):
    (root / "imagesTs").mkdir(parents=True, exist_ok=True)
    (root / "dataset.json").write_text(json.dumps({
        "name": name, "licence": "CC-BY-SA 4.0", "release": "1.0 04/05/2018", "tensorImageSize": "3D" if channels == 1 else "4D",
        "modality": modality or {"0": "CT"}, "labels": {"0": "background", **labels}, "training": [], "test": []}))
    for case, boxes in cases.items():
        img_shape = SHAPE if channels == 1 else (*SHAPE, channels)
        ct(root / "imagesTr" / f"{case}.nii.gz", img_shape)
        lab(root / "labelsTr" / f"{case}.nii.gz", boxes)
        (root / "imagesTr" / f"._{case}.nii.gz").write_bytes(b"\0\5\26\7")
        (root / "labelsTr" / f"._{case}.nii.gz").write_bytes(b"\0\5\26\7")
    ct(root / "imagesTs" / "x_999.nii.gz")
    return root


def test_msd_liver(tmp_path):
    boxes = [(1, np.s_[2:10, 2:10, 1:7]), (2, np.s_[4:6, 4:6, 3:5])]
    root = msd_task(tmp_path / "Task03_Liver", "Liver", {"1": "liver", "2": "cancer"},
                    {"liver_0": boxes, "liver_1": [*boxes, (4, np.s_[12:13, 12:13, 0:1])], "liver_2": boxes})
    (root / "labelsTr" / "liver_2.nii.gz").write_bytes(b"garbage")
    recs = convert_msd(root, tmp_path / "out", workers=0)
    scans, rejected, report = load(tmp_path / "out")
    assert [r["scan_id"] for r in recs] == ["msd_liver_0", "msd_liver_1"]
    r = recs[0]
    assert (r["source"], r["licence"], r["split"]) == ("MSD Task03_Liver", "CC-BY-SA 4.0", "train")
    assert r["label_names"] == {"5": "liver", "210": "liver_tumor"}
    v = read_labels(r["labels"])
    np.testing.assert_array_equal(v.affine, AFF)
    assert v.array[5, 5, 4] == ID["liver_tumor"] and v.array[3, 3, 2] == ID["liver"]
    # a value missing from dataset.json is reported and zeroed, never read as one of our ids
    assert recs[1]["unmapped_labels"] == {"4": "(not in the dataset's label table)"}
    assert read_labels(recs[1]["labels"]).array[12, 12, 0] == 0
    assert [x["scan_id"] for x in rejected] == ["msd_liver_2"] and "unreadable or corrupt" in rejected[0]["error"]
    assert len(report["ignored_files"]) == 6 and all(Path(p).name.startswith("._") for p in report["ignored_files"])
    assert [s["case"] for s in report["skipped"]] == ["x_999"]


def test_msd_pancreas_lung_spleen(tmp_path):
    b = [(1, np.s_[2:10, 2:10, 1:7]), (2, np.s_[4:6, 4:6, 3:5])]
    (r,) = convert_msd(msd_task(tmp_path / "Task07_Pancreas", "Pancreas", {"1": "pancreas", "2": "cancer"}, {"pancreas_001": b}), tmp_path / "p", workers=0)
    assert r["label_names"] == {"7": "pancreas", "220": "pancreas_tumor"}
    (r,) = convert_msd(msd_task(tmp_path / "Task06_Lung", "Lung", {"1": "cancer"}, {"lung_001": b[:1]}), tmp_path / "l", workers=0)
    assert r["label_names"] == {"230": "lung_tumor"}
    (r,) = convert_msd(msd_task(tmp_path / "Task09_Spleen", "Spleen", {"1": "spleen"}, {"spleen_2": b[:1]}), tmp_path / "s", workers=0)
    assert r["label_names"] == {"1": "spleen"}


def test_msd_unmappable_task_and_mapping(tmp_path):
    b = [(1, np.s_[2:10, 2:10, 1:7]), (2, np.s_[4:6, 4:6, 3:5])]
    colon = msd_task(tmp_path / "Task10_Colon", "Colon", {"1": "colon cancer primaries"}, {"colon_001": b[:1]})
    with pytest.raises(ValueError, match="none of its labels .*colon cancer primaries"):
        convert_msd(colon, tmp_path / "c", workers=0)
    hv = msd_task(tmp_path / "Task08_HepaticVessel", "HepaticVessel", {"1": "Vessel", "2": "Tumour"}, {"hepaticvessel_001": b})
    (r,) = convert_msd(hv, tmp_path / "h", workers=0, mapping={"Tumour": "liver_tumor"})
    assert r["label_names"] == {"210": "liver_tumor"} and r["unmapped_labels"] == {"1": "Vessel"}
    with pytest.raises(KeyError, match="not a TotalSegmentator class"):
        convert_msd(hv, tmp_path / "h2", workers=0, mapping={"Tumour": "hepatic_tumour"})


def test_msd_mri_task(tmp_path):
    root = msd_task(tmp_path / "Task05_Prostate", "Prostate", {"1": "PZ", "2": "TZ"},
                    {"prostate_00": [(1, np.s_[4:8, 4:8, 2:4]), (2, np.s_[5:7, 5:7, 4:6])]},
                    modality={"0": "T2", "1": "ADC"}, channels=2)
    with pytest.raises(ValueError, match="is MRI"):
        convert_msd(root, tmp_path / "x", workers=0)
    (r,) = convert_msd(root, tmp_path / "out", workers=0, modalities=("MRI",))
    assert r["modality"] == "MRI" and r["label_names"] == {"22": "prostate"}
    assert r["image"] is None and r["multichannel_image"].endswith("prostate_00.nii.gz") and r["channels"] == ["T2", "ADC"]


# ---------------------------------------------------------------- KiTS

KSHAPE = (6, 20, 40)   # (slice, row, column) as KiTS stores them


@pytest.fixture
def kits23(tmp_path):
    root = tmp_path / "kits23"
    data = root / "dataset"
    data.mkdir(parents=True)
    (data / "kits23.json").write_text("[]")
    body = np.full(KSHAPE, -1000, np.int16)
    body[:, 2:18, 4:36] = 40
    cases = {
        # kidney at low column index (larger RAS x: the patient's right) with a tumour; the other with a cyst
        "case_00000": [(1, np.s_[1:5, 8:12, 2:8]), (1, np.s_[1:5, 8:12, 30:36]), (2, np.s_[2:4, 9:11, 3:5]), (3, np.s_[2:3, 9:10, 32:33])],
        # a solitary kidney at the patient's left of the body's midline
        "case_00001": [(1, np.s_[1:5, 8:12, 26:32])],
        "case_00002": None,                                         # no segmentation
        "case_00003": [(1, np.s_[1:5, 8:12, 2:8])],                   # corrupt image
    }
    for c, boxes in cases.items():
        (data / c / "instances").mkdir(parents=True)
        write_volume(Volume(body, AFF_KITS), data / c / "imaging.nii.gz")
        if boxes: lab(data / c / "segmentation.nii.gz", boxes, KSHAPE, AFF_KITS)
    (data / "case_00003" / "imaging.nii.gz").write_bytes(b"\x1f\x8b\x08\x00 truncated")
    (data / "._case_00000").write_bytes(b"\0")
    return root


def test_kits23(kits23, tmp_path):
    recs = convert_kits(kits23, tmp_path / "out", workers=0)
    scans, rejected, report = load(tmp_path / "out")
    assert [r["scan_id"] for r in recs] == ["kits23_case_00000", "kits23_case_00001"]
    r = recs[0]
    assert (r["source"], r["licence"], r["modality"]) == ("KiTS23", "CC BY-NC-SA 4.0", "CT")
    assert r["label_names"] == {"2": "kidney_right", "3": "kidney_left", "200": "kidney_tumor", "201": "kidney_cyst"}
    assert r["kidney_split"]["components"] == 2
    v = read_labels(r["labels"])
    np.testing.assert_array_equal(v.affine, AFF_KITS)
    a = v.array
    assert a[1, 8, 6] == ID["kidney_right"] and a[1, 8, 31] == ID["kidney_left"]
    assert a[2, 9, 3] == ID["kidney_tumor"] and a[2, 9, 32] == ID["kidney_cyst"]
    # the right kidney lies at larger RAS x, whatever the array order
    x = lambda label: (np.argwhere(a == label) @ AFF_KITS[0, :3] + AFF_KITS[0, 3]).mean()
    assert x(ID["kidney_right"]) > x(ID["kidney_left"])
    solo = recs[1]
    assert solo["label_names"] == {"3": "kidney_left"} and solo["kidney_split"]["midline"] == "body midline"
    errs = {x["case"]: x["error"] for x in rejected}
    assert set(errs) == {"case_00002", "case_00003"}
    assert "missing label file" in errs["case_00002"] and "imaging.nii.gz" in errs["case_00003"]
    assert report["ignored_files"] == [str(kits23 / "dataset" / "._case_00000")]


def test_kits_measure_reads_the_manifest(kits23, tmp_path):
    from spatialvqa.measure import measure_manifests
    convert_kits(kits23 / "dataset", tmp_path / "out", workers=0)
    table, scans, rejected = measure_manifests(tmp_path / "out" / "scans.json", workers=0)
    assert rejected == []
    t = table.set_index(["scan_id", "name"])
    assert t.loc[("kits23_case_00000", "kidney_right"), "centroid_x"] > t.loc[("kits23_case_00000", "kidney_left"), "centroid_x"]
    assert set(scans["source"]) == {"KiTS23"}


def test_kits19_and_kits21_layouts(tmp_path):
    k19 = tmp_path / "kits19" / "data"
    lab(k19 / "case_00000" / "segmentation.nii.gz", [(1, np.s_[1:5, 8:12, 2:8]), (1, np.s_[1:5, 8:12, 30:36]), (3, np.s_[0:1, 0:1, 0:1])], KSHAPE, AFF_KITS)
    ct(k19 / "case_00000" / "imaging.nii.gz", KSHAPE, AFF_KITS)
    (k19 / "kits.json").write_text("[]")
    (r,) = convert_kits(tmp_path / "kits19", tmp_path / "o19", workers=0)
    assert r["source"] == "KiTS19" and r["scan_id"] == "kits19_case_00000"
    assert r["unmapped_labels"] == {"3": "(not in the dataset's label table)"}   # KiTS19 has no cyst label
    k21 = tmp_path / "kits21" / "data"
    lab(k21 / "case_00000" / "aggregated_MAJ_seg.nii.gz", [(1, np.s_[1:5, 8:12, 2:8]), (3, np.s_[2:3, 9:10, 3:4])], KSHAPE, AFF_KITS)
    ct(k21 / "case_00000" / "imaging.nii.gz", KSHAPE, AFF_KITS)
    (r,) = convert_kits(tmp_path / "kits21", tmp_path / "o21", workers=0)
    assert r["source"] == "KiTS21" and r["label_names"] == {"2": "kidney_right", "201": "kidney_cyst"}


def test_split_kidneys_ras_not_index():
    m = np.zeros((10, 4, 4), bool)
    m[0:3], m[7:10] = True, True
    ras = np.diag([5.0, 1, 1, 1])         # index i grows toward the patient's right
    las = np.diag([-5.0, 1, 1, 1])        # ... toward the patient's left
    assert split_kidneys(m, ras)[0][1, 0, 0] == ID["kidney_left"]
    assert split_kidneys(m, las)[0][1, 0, 0] == ID["kidney_right"]
    s, info = split_kidneys(np.zeros((3, 3, 3), bool), ras)
    assert not s.any() and info == {"components": 0}


# ---------------------------------------------------------------- registry and command line

def test_registry_and_cli(kits23, tmp_path):
    assert set(CONVERTERS) == {"totalsegmentator", "amos", "msd", "kits", "pyradiomics", "openkbp", "phantom", "rtstruct"}
    with pytest.raises(KeyError, match="unknown dataset"):
        convert("brats", kits23, tmp_path / "x")
    p = argparse.ArgumentParser()
    add_cli(p.add_subparsers(dest="command"))
    a = p.parse_args(["convert", "KiTS", str(kits23), "--out", str(tmp_path / "cli"), "--workers", "0", "--version", "KiTS21"])
    assert a.func(a) == 0
    assert {r["source"] for r in json.loads((tmp_path / "cli" / "scans.json").read_text())} == {"KiTS21"}
    empty = tmp_path / "empty" / "case_00000"
    empty.mkdir(parents=True)
    a = p.parse_args(["convert", "kits", str(empty.parent), "--out", str(tmp_path / "cli2"), "--workers", "0"])
    assert a.func(a) == 1      # nothing converted
    with pytest.raises(ValueError, match="SOURCE=NAME"):
        a = p.parse_args(["convert", "kits", str(kits23), "--out", str(tmp_path / "cli3"), "--map", "oops"])
        a.func(a)


def test_missing_folders_name_the_fault(tmp_path):
    from spatialvqa.scan import ScanError
    with pytest.raises(ScanError, match="no TotalSegmentator subject folders"):
        convert_totalsegmentator(tmp_path, tmp_path / "o", workers=0)
    with pytest.raises(ScanError, match="not an AMOS folder"):
        convert_amos(tmp_path, tmp_path / "o", workers=0)
    with pytest.raises(ScanError, match="dataset.json"):
        convert_msd(tmp_path, tmp_path / "o", workers=0)
    with pytest.raises(ScanError, match="not a KiTS folder"):
        convert_kits(tmp_path, tmp_path / "o", workers=0)


# ---------------------------------------------------------------- a used --out (issue 11)

def cli(*args):
    p = argparse.ArgumentParser()
    add_cli(p.add_subparsers(dest="command"))
    a = p.parse_args(["convert", *map(str, args)])
    return a.func(a)


def test_convert_into_used_out_merges(totalseg, kits23, tmp_path):
    "A second dataset into the same --out is listed beside the first; rerunning the first changes nothing."
    out = tmp_path / "out"
    first = convert_totalsegmentator(totalseg, out, workers=0)
    convert_kits(kits23, out, workers=0)
    scans, rejected, report = load(out)
    assert [r["scan_id"] for r in scans] == [r["scan_id"] for r in first] + ["kits23_case_00000", "kits23_case_00001"]
    assert all(Path(r["labels"]).exists() for r in scans)
    assert {r["scan_id"] for r in rejected} == {"totalseg_s0002", "totalseg_s0003", "kits23_case_00002", "kits23_case_00003"}
    assert report["dataset"] == "KiTS23" and report["earlier_runs"][0]["dataset"] == "TotalSegmentator"
    assert convert_totalsegmentator(totalseg, out, workers=0) == first
    assert load(out)[0] == scans
    assert not [p for p in out.iterdir() if p.name.startswith(".")]      # no staging folder left


def test_convert_into_used_out_refuses_other_content(totalseg, tmp_path):
    "The same scan ids with other content: status 2, the scans named, nothing in --out changed."
    from spatialvqa.cli import main
    out = tmp_path / "out"
    convert_totalsegmentator(totalseg, out, workers=0)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for extra in (["--map", "liver=spleen"], ["--name", "other_name"]):
        code = main(["convert", "totalsegmentator", str(totalseg), "--out", str(out), "--workers", "0", *extra])
        assert code == 2
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # a scan folder left unlisted by an earlier tool, holding other labels, is protected the same way
    (out / "scans.json").write_text("[]")
    with pytest.raises(ValueError, match=r"totalseg_s0000 \(labels differ"):
        convert_totalsegmentator(totalseg, out, workers=0, mapping={"liver": "spleen"})


def test_convert_into_used_out_cli_message(totalseg, tmp_path):
    import subprocess, sys
    exe = str(Path(sys.executable).parent / "spatialvqa")
    env = {**os.environ, "SPATIALVQA_PROGRESS": "0"}
    out = tmp_path / "out"
    r = subprocess.run([exe, "convert", "totalsegmentator", str(totalseg), "--out", str(out), "--workers", "0"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([exe, "convert", "totalsegmentator", str(totalseg), "--out", str(out), "--workers", "0", "--map", "liver=spleen"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{out / 'scans.json'}: 2 scan id(s) already converted here with different content" in r.stderr
    assert "totalseg_s0000 (record differs in label_names)" in r.stderr


# ---------------------------------------------------------------- the real examples and the datasets list

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real-ct"


def need(path):
    assert Path(path).exists(), f"shared data missing: {path} (see ../shared/README.md)"
    return Path(path)


def test_totalsegmentator_real_examples(tmp_path):
    """s0001 in the dataset layout (117 masks, 40 non-empty) and the DICOM example (LAS map on an LPS series)."""
    from spatialvqa.measure import measure_manifests
    ts = need(SHARED / "totalsegmentator")
    recs = convert_totalsegmentator(ts, tmp_path / "ts", workers=0, licence="Apache-2.0", name="ts")
    by = {r["scan_id"]: r for r in recs}
    assert sorted(by) == ["totalseg_dicom_example", "totalseg_s0001"]
    s1, dc = by["totalseg_s0001"], by["totalseg_dicom_example"]
    assert len(s1["label_names"]) == 40 and "unmapped_labels" not in s1 and "reoriented" not in s1
    assert s1["source_labels"].endswith("s0001/segmentations") and s1["image"].endswith("s0001/ct.nii.gz")
    assert len(dc["label_names"]) == 31 and dc["image"].endswith("dicom_example/ct")
    assert dc["reoriented"].startswith("LAS -> LPS")
    # the multilabel map and the masks of s0001 come from different models; the masks are what the layout means
    table, scans, rejected = measure_manifests(tmp_path / "ts" / "scans.json", workers=0)
    assert rejected == [] and set(scans.source) == {"ts"}
    t = table.set_index(["scan_id", "name"])
    for sid in ("totalseg_s0001", "totalseg_dicom_example"):
        # liver at the patient's right
        assert t.loc[(sid, "liver"), "centroid_x"] > t.loc[(sid, "spleen"), "centroid_x"]
    assert 800 < t.loc[("totalseg_s0001", "liver"), "volume_ml"] < 3000
    assert 50 < t.loc[("totalseg_s0001", "spleen"), "volume_ml"] < 600
    for k in ("kidney_left", "kidney_right"): assert 80 < t.loc[("totalseg_s0001", k), "volume_ml"] < 300
    # the multilabel map on request
    (ml,) = convert_totalsegmentator(ts / "s0001", tmp_path / "ml", workers=0, seg="seg_multilabel.nii.gz")
    assert ml["source_labels"].endswith("seg_multilabel.nii.gz") and len(ml["label_names"]) == 41


def test_default_datasets_list(tmp_path):
    """The pipeline's default list, pointed at the shared mirror (OpenKBP: two of its patients): every record carries
    its dataset's name as source, and the full CT of s0001's patient joins s0001's scan family."""
    import shutil
    import yaml
    from spatialvqa.core import write_json
    from spatialvqa.counterfactual import scan_family
    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    entries = check_datasets(params["datasets"])
    assert [(e["name"], e["kind"]) for e in entries] == [
        ("totalseg_s0001", "totalsegmentator"), ("totalseg_dicom", "totalsegmentator"), ("totalseg_full", "totalsegmentator"),
        ("pyradiomics", "pyradiomics"), ("nsclc_radiomics", "rtstruct"), ("openkbp", "openkbp"), ("phantom", "phantom")]
    mirror = need(SHARED).parent
    cohort = tmp_path / "phantom"
    cohort.mkdir()
    write_json([], cohort / "cohort.json")
    kbp = tmp_path / "openkbp" / "test-pats"
    for pt in ("pt_242", "pt_243"):
        shutil.copytree(mirror / "real-ct" / "openkbp" / "provided-data" / "test-pats" / pt, kbp / pt)
    for e in entries:   # data/raw is the fetched copy of the mirror; data/phantom the phantom stage's output
        e["path"] = (str(cohort) if e["kind"] == "phantom" else str(kbp.parent) if e["kind"] == "openkbp"
                     else e["path"].replace("data/raw", str(mirror)))
    recs = convert_datasets(entries, tmp_path / "scans", workers=0)
    assert [(r["scan_id"], r["source"]) for r in recs] == [
        ("totalseg_s0001", "totalseg_s0001"), ("totalseg_dicom_example", "totalseg_dicom"),
        ("totalseg_s0001~full", "totalseg_full"), ("pyradiomics_lung1", "pyradiomics"), ("pyradiomics_lung2", "pyradiomics"),
        ("rtstruct_LUNG1-001", "nsclc_radiomics"), ("openkbp_pt_242", "openkbp"), ("openkbp_pt_243", "openkbp")]
    assert scan_family(recs[2]["scan_id"]) == scan_family(recs[0]["scan_id"]) == "totalseg_s0001"   # one patient, once
    assert {r["licence"] for r in recs[:3]} == {"Apache-2.0"} and recs[3]["licence"] == "BSD-3-Clause"
