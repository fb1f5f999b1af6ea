"""RTSTRUCT reading (spatialvqa.rtstruct) checked against an independent rasteriser, and `spatialvqa convert rtstruct`
end to end: the real NSCLC-Radiomics LUNG1-001 and synthetic patients, faulty RTSTRUCTs refused with status 2.

The reference is dcmrtstruct2nii (a test-only dependency): it reads the series with SimpleITK, matches each contour to
a slice by rounding its own continuous index, fills with scikit-image's polygon2mask and combines the contours of a
slice by XOR. Nothing of it is shared with our reader but pydicom's parsing of the files."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pydicom
import pytest

from spatialvqa import rtstruct
from spatialvqa.core import read_json, shared_data
from spatialvqa.rtstruct import read_rtstruct, write_rtstruct
from spatialvqa.scan import Volume, read_scan, reorient, storage_order, write_dicom_series

EXE = Path(sys.executable).parent / "spatialvqa"
ROIS = ("GTV-1", "Spinal-Cord", "Lung-Left", "Lung-Right")
MAX_REL_VOLUME = 0.01     # the volumes must agree within 1%
MIN_DICE = 0.99           # one slice off gives 0.87-0.97 on LUNG1-001 (see test_the_cross_check_can_fail)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("SPATIALVQA_PROGRESS", "0")


def reference_masks(series: Path, rs: Path, grid: Volume) -> dict[str, np.ndarray]:
    """dcmrtstruct2nii's mask of every ROI, moved onto `grid` (our reader's) after checking that SimpleITK's grid is
    the same one, stored in another order at most."""
    # removed in pydicom 3; dcmrtstruct2nii 5 calls it
    if not hasattr(pydicom, "read_file"): pydicom.read_file = pydicom.dcmread
    import SimpleITK as sitk
    from dcmrtstruct2nii.adapters.convert.rtstructcontour2mask import DcmPatientCoords2Mask
    from dcmrtstruct2nii.adapters.input.contours.rtstructinputadapter import RtStructInputAdapter
    from dcmrtstruct2nii.adapters.input.image.dcminputadapter import DcmInputAdapter
    img = DcmInputAdapter().ingest(str(series))
    aff = np.eye(4)                                              # SimpleITK's LPS index -> world, as RAS+
    aff[:3, :3] = np.diag([-1.0, -1, 1]) @ np.array(img.GetDirection()).reshape(3, 3) @ np.diag(img.GetSpacing())
    aff[:3, 3] = np.array(img.GetOrigin()) * [-1, -1, 1]
    out = {}
    for roi in RtStructInputAdapter().ingest(str(rs)):
        m = sitk.GetArrayFromImage(DcmPatientCoords2Mask().convert(roi["sequence"], img, 0, 1)).transpose(2, 1, 0)
        perm, flip, shift = storage_order(m.shape, aff, grid.shape, grid.affine)
        assert shift < 1e-3, f"SimpleITK places the voxels of {series} up to {shift} mm from our reader"
        out[roi["name"]] = reorient(Volume(m, aff), perm, flip).array.astype(bool)
    return out


def agreement(mine: np.ndarray, ref: np.ndarray, voxel_ml: float) -> dict:
    v_mine, v_ref = int(mine.sum()), int(ref.sum())
    return {"ours_ml": round(v_mine * voxel_ml, 3), "reference_ml": round(v_ref * voxel_ml, 3),
            "relative_difference": (v_mine - v_ref) / v_ref, "dice": 2 * int((mine & ref).sum()) / (v_mine + v_ref),
            "voxels_differing": int((mine ^ ref).sum())}


def agrees(a: dict) -> bool:
    return abs(a["relative_difference"]) <= MAX_REL_VOLUME and a["dice"] >= MIN_DICE


@pytest.fixture(scope="module")
def lung1():
    d = shared_data("real-ct", "nsclc-radiomics", "LUNG1-001")
    s = read_rtstruct(d / "image", d / "mask_rtstruct" / "1-1.dcm")
    return d, s, reference_masks(d / "image", d / "mask_rtstruct" / "1-1.dcm", s.image)


def test_lung1_001_matches_an_independent_rasteriser(lung1):
    _, s, ref = lung1
    assert s.names == list(ROIS) and sorted(ref) == sorted(ROIS)
    ml = s.image.voxel_volume_mm3 / 1000
    table = {n: agreement(s.mask(n), ref[n], ml) for n in ROIS}
    for n, a in table.items():
        print(f"{n:12s} ours {a['ours_ml']:9.3f} mL  dcmrtstruct2nii {a['reference_ml']:9.3f} mL  "
              f"difference {a['relative_difference']:+.4%}  Dice {a['dice']:.5f}  voxels differing {a['voxels_differing']}")
    assert all(agrees(a) for a in table.values()), table
    assert 150 < table["GTV-1"]["ours_ml"] < 165 and 2000 < table["Lung-Left"]["ours_ml"] < 3500   # plausible sizes


def test_the_cross_check_can_fail(lung1, tmp_path, monkeypatch):
    "One slice off fails it on every structure of LUNG1-001; holes filled in fail it on a ring."
    _, s, ref = lung1
    ml = s.image.voxel_volume_mm3 / 1000
    shifted = {n: agreement(np.roll(s.mask(n), 1, axis=2), ref[n], ml) for n in ROIS}
    assert not any(agrees(a) for a in shifted.values()), shifted
    series, rs = _ring_patient(tmp_path)
    ring_ref = reference_masks(series, rs, read_rtstruct(series, rs).image)["ring"]
    assert agrees(agreement(read_rtstruct(series, rs).mask("ring"), ring_ref, 1.0))
    fill = rtstruct.even_odd_fill
    monkeypatch.setattr(rtstruct, "even_odd_fill", lambda ps, shape: np.any([fill([p], shape) for p in ps], axis=0))
    filled = agreement(read_rtstruct(series, rs).mask("ring"), ring_ref, 1.0)
    assert not agrees(filled) and filled["relative_difference"] > 0.2, filled


# ---------------------------------------------------------------- synthetic patients

CT = Volume(np.full((16, 14, 6), -1000, np.int16), np.array([[-1.5, 0, 0, 60], [0, -1.5, 0, 40], [0, 0, 3.0, -10], [0, 0, 0, 1]]))


def square(k, lo, hi, vol=CT):
    "A square in voxel indices on slice `k`, as RAS+ mm."
    return vol.to_world([[lo, lo, k], [hi, lo, k], [hi, hi, k], [lo, hi, k]])


def patient(d: Path, rois: dict, series: Path | None = None) -> Path:
    "An NSCLC-Radiomics-like patient folder: `image/` and `mask_rtstruct/1-1.dcm`."
    write_dicom_series(CT, d / "image")
    return write_rtstruct(series or d / "image", rois, d / "mask_rtstruct" / "1-1.dcm")


def _ring_patient(d: Path) -> tuple[Path, Path]:
    rs = patient(d / "ring", {"ring": [square(2, 1.5, 12.5), square(2, 3.5, 10.5), square(2, 5.5, 8.5)],
                              "square": [square(k, 2.5, 6.5) for k in (1, 2, 3)],
                              "lobes": [square(4, 0.5, 3.5), square(4, 9.5, 12.5)]})
    return d / "ring" / "image", rs


def test_synthetic_holes_islands_and_overlaps_match_the_reference(tmp_path):
    series, rs = _ring_patient(tmp_path)
    s = read_rtstruct(series, rs)
    ref = reference_masks(series, rs, s.image)
    for n in ("ring", "square", "lobes"): assert np.array_equal(s.mask(n), ref[n]), n
    assert [r.voxels for r in s.rois] == [11 * 11 - 7 * 7 + 3 * 3, 3 * 16, 2 * 9]


def test_an_oblique_series_is_read_in_its_own_index_space(tmp_path):
    "A gantry-tilted series: its contours lie in its (tilted) slices, matched and filled like axial ones."
    c, s_ = np.cos(np.radians(15)), np.sin(np.radians(15))
    aff = CT.affine.copy(); aff[:3, :3] = CT.affine[:3, :3] @ np.array([[1, 0, 0], [0, c, -s_], [0, s_, c]])
    tilted = Volume(CT.array, aff)
    write_dicom_series(tilted, tmp_path / "image")
    rs = write_rtstruct(tmp_path / "image", {"box": [square(k, 2.5, 6.5, tilted) for k in (1, 2)]}, tmp_path / "rs.dcm")
    s = read_rtstruct(tmp_path / "image", rs)
    assert s.rois[0].voxels == 32 and np.allclose(s.image.affine, aff, atol=1e-4)
    # not in its slices
    axial = write_rtstruct(tmp_path / "image", {"box": [square(2, 2.5, 6.5)]}, tmp_path / "axial.dcm")
    with pytest.raises(rtstruct.ScanError, match="not parallel to the slices"):
        read_rtstruct(tmp_path / "image", axial)


# ---------------------------------------------------------------- the converter on LUNG1-001, by its command line

def run_convert(src, out, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), "convert", "rtstruct", str(src), "--out", str(out), "--workers", "0", *extra],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "SPATIALVQA_PROGRESS": "0"})


def test_cli_converts_lung1_001(lung1, tmp_path):
    d, s, _ = lung1
    r = run_convert(d, tmp_path / "out")
    assert r.returncode == 0, r.stderr[-2000:]
    [rec] = read_json(tmp_path / "out" / "scans.json")
    assert (rec["scan_id"], rec["dataset"], rec["licence"], rec["image"]) == \
        ("rtstruct_LUNG1-001", "NSCLC-Radiomics", "CC BY-NC 3.0", str(d / "image"))
    assert rec["label_names"] == {"79": "spinal_cord", "138": "lung_left", "139": "lung_right", "230": "lung_tumor"}
    assert rec["rois"] == {"GTV-1": "lung_tumor", "Spinal-Cord": "spinal_cord", "Lung-Left": "lung_left", "Lung-Right": "lung_right"}
    scan = read_scan(rec["labels"], rec["image"])                   # on the CT's grid, voxel for voxel
    counts = np.bincount(scan.labels.array.ravel(), minlength=231)
    # the smaller ones kept every voxel
    assert counts[230] == s.rois[0].voxels and counts[79] == s.rois[1].voxels
    assert counts[138] + counts[139] + rec.get("overlap_voxels", 0) == s.rois[2].voxels + s.rois[3].voxels


# ---------------------------------------------------------------- faults: status 2, one sentence, nothing written

def _other_series(d: Path) -> Path:
    write_dicom_series(CT, d.parent / "elsewhere")      # the same grid, another series (outside the dataset folder)
    return patient(d / "P1", {"GTV-1": [square(2, 2.5, 6.5)]}, series=d.parent / "elsewhere")


FAULTS = {   # name -> (how to make the patient folder, what the message must say)
    "another series": (_other_series, ["1-1.dcm: references series", "drawn on another series"]),
    "plane off the grid": (lambda d: patient(d / "P1", {"GTV-1": [square(6, 2.5, 6.5)]}),
                           ["1-1.dcm: contour 1 of ROI 'GTV-1' is off the grid", "3 mm beyond the last slice"]),
    "point off the grid": (lambda d: patient(d / "P1", {"Lung-Left": [square(1, 2.5, 6.5), square(2, 2.5, 20)]}),
                           ["1-1.dcm: contour 2 of ROI 'Lung-Left' is off the grid", "a point lies 9.75 mm outside the image"]),
    "between slices": (lambda d: patient(d / "P1", {"GTV-1": [square(1.5, 2.5, 6.5)]}), ["lies between slices"]),
    "empty ROI": (lambda d: patient(d / "P1", {"Lung-Left": [square(1, 2.5, 6.5)], "Heart": []}),
                  ["1-1.dcm: ROI 'Heart' is empty: it has no contours"]),
    "nothing rasterised": (lambda d: patient(d / "P1", {"Heart": [square(1, 2.2, 2.8)]}),
                           ["ROI 'Heart' is empty", "enclose no voxel centre"]),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_cli_refuses_a_faulty_rtstruct(fault, tmp_path):
    make, want = FAULTS[fault]
    make(tmp_path / "src")
    patient(tmp_path / "src" / "P0", {"Lung-Left": [square(1, 2.5, 6.5)]})        # a good patient beside it
    before = {p: p.read_bytes() for p in (tmp_path / "src").rglob("*") if p.is_file()}
    (tmp_path / "used").mkdir(); (tmp_path / "used" / "keep.txt").write_text("earlier")
    for out in (tmp_path / "out", tmp_path / "used"):
        r = run_convert(tmp_path / "src", out)
        assert r.returncode == 2, (fault, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, r.stderr
        lines = [l for l in r.stderr.splitlines() if l.startswith("spatialvqa convert: error: ")]
        assert len(lines) == 1, r.stderr
        assert str(tmp_path / "src" / "P1") in lines[0] and "nothing converted (1 of 2 patients'" in lines[0], lines[0]
        for w in want: assert w in lines[0], (w, lines[0])
    assert not (tmp_path / "out").exists()
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["keep.txt"]
    assert {p: p.read_bytes() for p in (tmp_path / "src").rglob("*") if p.is_file()} == before


def test_faulty_reject_converts_the_others(tmp_path):
    from spatialvqa.convert.rtstruct import convert_rtstruct
    _other_series(tmp_path / "src")
    patient(tmp_path / "src" / "P0", {"Lung-Left": [square(1, 2.5, 6.5)], "Heart_PRV": [square(2, 8.5, 10.5)]})
    recs = convert_rtstruct(tmp_path / "src", tmp_path / "out", workers=0, faulty="reject")
    assert [(r["scan_id"], r["label_names"]) for r in recs] == [("rtstruct_P0", {"138": "lung_left", "141": "Heart_PRV"})]
    [rej] = read_json(tmp_path / "out" / "rejected.json")
    assert rej["scan_id"] == "rtstruct_P1" and "drawn on another series" in rej["error"]
    report = read_json(tmp_path / "out" / "convert_report.json")
    assert report["mapping"] == {"GTV-1": "GTV-1 (own name, id 140)", "Heart_PRV": "Heart_PRV (own name, id 141)", "Lung-Left": "lung_left"}
