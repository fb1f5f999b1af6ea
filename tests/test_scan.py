"""Fault injection and round trips for `spatialvqa.scan`: every bad input gives a `ScanError` naming file and fault."""
from __future__ import annotations

import itertools
import pickle
import shutil
from pathlib import Path

import nibabel as nib
import nrrd
import numpy as np
import pydicom
import pytest

from spatialvqa.core import shared_data
from spatialvqa.scan import (ScanError, Scan, Volume, canonical, read_labels, read_scan, read_volume, reorient,
                             write_dicom_series, write_volume)

LUNG = shared_data("real-ct", "pyradiomics")          # fails with the expected path when ../shared is missing
AFF = np.array([[-0.75, 0.0, 0.0, 40.0], [0.0, 0.75, 0.0, -60.0], [0.0, 0.0, 2.5, 100.0], [0.0, 0.0, 0.0, 1.0]])


def oblique_affine(seed: int = 1) -> np.ndarray:
    "An oblique, anisotropic affine whose entries are not float32-exact."
    rot = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))[0]
    aff = np.eye(4)
    aff[:3, :3] = rot * [0.57, 0.91, 5.0]
    aff[:3, 3] = [146.123456789, 325.1, -777.49999999999977]
    return aff


def ct(shape=(6, 7, 8)) -> np.ndarray:
    return (np.arange(np.prod(shape)).reshape(shape) % 2000 - 1000).astype(np.int16)


def labels(shape=(6, 7, 8), dtype=np.uint8) -> np.ndarray:
    a = np.zeros(shape, dtype)
    a[1:4, 2:5, 3:6] = 1
    a[4, 5, 6] = 3
    return a


def save_nii(path: Path, array, affine=AFF) -> Path:
    nib.save(nib.Nifti1Image(np.asarray(array), affine), str(path))
    return path


def expect(path, fault: str, fn=read_volume, *args, **kw):
    "Assert `fn(path)` raises ScanError whose message starts with the path and contains `fault`."
    with pytest.raises(ScanError) as ei:
        fn(path, *args, **kw)
    err = ei.value
    assert str(err).startswith(f"{path}: "), str(err)
    assert fault in err.fault, str(err)
    assert err.path == str(path)
    return err


# ---------------------------------------------------------------- error object

def test_scanerror_message_and_pickle():
    e = ScanError("/x/ct.nii.gz", "zero or NaN voxel spacing")
    assert str(e) == "/x/ct.nii.gz: zero or NaN voxel spacing" and isinstance(e, ValueError)
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.path, e2.fault, str(e2)) == (e.path, e.fault, str(e))


# ---------------------------------------------------------------- unreadable files

def test_missing_file(tmp_path):
    expect(tmp_path / "absent.nii.gz", "no such file or folder")


def test_truncated_nii_gz(tmp_path):
    good = save_nii(tmp_path / "good.nii.gz", np.random.default_rng(0).integers(-1000, 1000, (40, 40, 40)).astype(np.int16))
    b = good.read_bytes()
    for frac in (0.1, 0.5, 0.9):
        bad = tmp_path / f"cut{int(frac * 100)}.nii.gz"
        bad.write_bytes(b[: int(len(b) * frac)])
        expect(bad, "unreadable or corrupt")


def test_truncated_nii_raw(tmp_path):
    b = save_nii(tmp_path / "good.nii", ct()).read_bytes()
    (tmp_path / "cut.nii").write_bytes(b[:-10])
    expect(tmp_path / "cut.nii", "unreadable or corrupt")


@pytest.mark.parametrize("name", ["garbage.nii", "garbage.nii.gz", "garbage.nrrd"])
def test_garbage_file(tmp_path, name):
    (tmp_path / name).write_bytes(b"this is not a medical image\n" * 20)
    expect(tmp_path / name, "unreadable or corrupt")


def test_empty_file(tmp_path):
    (tmp_path / "empty.nii.gz").write_bytes(b"")
    expect(tmp_path / "empty.nii.gz", "unreadable or corrupt")


def test_nrrd_truncated(tmp_path):
    hdr = {"space": "left-posterior-superior", "space directions": np.eye(3), "space origin": np.zeros(3)}
    nrrd.write(str(tmp_path / "raw.nrrd"), ct(), {**hdr, "encoding": "raw"})
    b = (tmp_path / "raw.nrrd").read_bytes()
    (tmp_path / "cut_raw.nrrd").write_bytes(b[:-7])
    expect(tmp_path / "cut_raw.nrrd", "unreadable or corrupt")
    nrrd.write(str(tmp_path / "gz.nrrd"), np.random.default_rng(0).integers(0, 999, (30, 30, 30)).astype(np.int16),
               {**hdr, "encoding": "gzip"})
    b = (tmp_path / "gz.nrrd").read_bytes()
    (tmp_path / "cut_gz.nrrd").write_bytes(b[: len(b) // 2])
    expect(tmp_path / "cut_gz.nrrd", "unreadable or corrupt")


def test_unsupported_extension_and_single_dicom(tmp_path):
    (tmp_path / "ct.mha").write_bytes(b"x")
    expect(tmp_path / "ct.mha", "unsupported format '.mha'")
    (tmp_path / "one.dcm").write_bytes(b"x")
    expect(tmp_path / "one.dcm", "single DICOM file")


# ---------------------------------------------------------------- dimensionality and geometry

def test_2d_nifti(tmp_path):
    expect(save_nii(tmp_path / "flat.nii.gz", np.zeros((5, 6), np.int16)), "2D volume with shape (5, 6)")


def test_4d_nifti(tmp_path):
    expect(save_nii(tmp_path / "time.nii.gz", np.zeros((5, 6, 7, 3), np.int16)), "4D volume with shape (5, 6, 7, 3)")


def test_trailing_singleton_squeezed(tmp_path):
    v = read_volume(save_nii(tmp_path / "x1.nii.gz", ct()[..., None]))
    assert v.shape == (6, 7, 8) and np.array_equal(v.array, ct())


def test_2d_and_4d_nrrd(tmp_path):
    nrrd.write(str(tmp_path / "2d.nrrd"), np.zeros((5, 6), np.int16), {"space": "left-posterior-superior",
               "space directions": np.array([[1.0, 0, 0], [0, 1.0, 0]]),
               "space origin": np.zeros(3)})
    expect(tmp_path / "2d.nrrd", "2D volume")
    nrrd.write(str(tmp_path / "4d.nrrd"), np.zeros((5, 6, 7, 2), np.int16))
    expect(tmp_path / "4d.nrrd", "4D volume")


def _nii_with_sform(path, sform):
    "A NIfTI whose header sform is exactly `sform` (nibabel's image API would refuse to decompose a bad one)."
    hdr = nib.Nifti1Header()
    hdr.set_data_shape(ct().shape)
    hdr.set_data_dtype(np.int16)
    hdr["srow_x"], hdr["srow_y"], hdr["srow_z"] = sform[0], sform[1], sform[2]
    hdr["sform_code"], hdr["qform_code"] = 1, 0
    nib.save(nib.Nifti1Image(ct(), None, header=hdr), str(path))
    assert nib.load(str(path)).header["sform_code"] == 1
    return path


@pytest.mark.parametrize("bad", [0.0, -0.0, np.nan, np.inf])
def test_zero_nan_spacing_nifti(tmp_path, bad):
    expect(_nii_with_sform(tmp_path / "sp.nii.gz", np.diag([0.75, bad, 2.5, 1.0])), "zero or NaN voxel spacing")


def test_zero_nan_spacing_nrrd(tmp_path):
    for name, d in [("zero", np.diag([1.0, 0.0, 1.0])), ("nan", np.diag([1.0, np.nan, 1.0]))]:
        nrrd.write(str(tmp_path / f"{name}.nrrd"), ct(), {"space": "left-posterior-superior", "space directions": d,
                                                          "space origin": np.zeros(3)})
        expect(tmp_path / f"{name}.nrrd", "zero or NaN voxel spacing")


def test_singular_affine(tmp_path):
    s = AFF.copy()
    s[:3, 1] = [0.75, 0.0, 0.0]  # axis j parallel to axis i
    expect(_nii_with_sform(tmp_path / "sing.nii.gz", s), "singular affine")


def test_nifti_without_orientation(tmp_path):
    img = nib.Nifti1Image(ct(), None)
    img.set_sform(None, code=0)
    img.set_qform(None, code=0)
    nib.save(img, str(tmp_path / "nocode.nii.gz"))
    expect(tmp_path / "nocode.nii.gz", "no orientation")


def test_qform_only_with_zero_pixdim(tmp_path):
    "nibabel repairs pixdim 0 to 1 mm on load; with only a qform that would be the spacing: refused instead."
    import struct
    img = nib.Nifti1Image(ct(), None)
    img.set_sform(None, code=0)
    img.set_qform(np.diag([2.0, 2.0, 2.0, 1.0]), code=1)
    nib.save(img, str(tmp_path / "q.nii"))
    raw = bytearray((tmp_path / "q.nii").read_bytes())
    raw[80:92] = struct.pack("<3f", 2.0, 0.0, 2.0)          # pixdim[2] = 0 (pixdim starts at byte 76)
    (tmp_path / "q.nii").write_bytes(bytes(raw))
    assert nib.load(str(tmp_path / "q.nii")).header.get_zooms() == (2.0, 1.0, 2.0)   # nibabel's quiet 1 mm
    expect(tmp_path / "q.nii", "zero or NaN voxel spacing (2.0, 0.0, 2.0) in pixdim")
    expect(tmp_path / "q.nii", "zero or NaN voxel spacing", read_labels)


def test_nrrd_without_space(tmp_path):
    nrrd.write(str(tmp_path / "nospace.nrrd"), ct(), {"spacings": [1.0, 1.0, 2.0]})
    expect(tmp_path / "nospace.nrrd", "no orientation")


# ---------------------------------------------------------------- labels

@pytest.mark.parametrize("name,value,fault", [
    ("half", 0.5, "non-integer label values (e.g. 0.5)"),
    ("neg", -1, "negative label values (min -1)"),
    ("nan", np.nan, "non-finite"),
])
def test_bad_label_values(tmp_path, name, value, fault):
    a = labels(dtype=np.float32)
    a[0, 0, 0] = value
    expect(save_nii(tmp_path / f"{name}.nii.gz", a), fault, read_labels)


def test_negative_integer_labels(tmp_path):
    a = labels(dtype=np.int16)
    a[0, 0, 0] = -2
    expect(save_nii(tmp_path / "neg.nii.gz", a), "negative label values (min -2)", read_labels)


def test_uint64_label_beyond_int64(tmp_path):
    a = labels(dtype=np.uint64)
    a[0, 0, 0] = 2**63 + 1
    nib.save(nib.Nifti1Image(a, AFF, dtype=np.uint64), str(tmp_path / "big.nii.gz"))
    err = expect(tmp_path / "big.nii.gz", "label value 9223372036854775809 is above the largest supported label", read_labels)
    assert "negative" not in str(err)
    a[0, 0, 0] = 2**63 - 1                                    # the largest that is accepted
    nib.save(nib.Nifti1Image(a, AFF, dtype=np.uint64), str(tmp_path / "ok.nii.gz"))
    assert int(read_labels(tmp_path / "ok.nii.gz").array.max()) == 2**63 - 1


def test_empty_labels(tmp_path):
    expect(save_nii(tmp_path / "empty.nii.gz", np.zeros((4, 4, 4), np.uint8)), "no foreground", read_labels)


def test_float_labels_with_integral_values_are_cast(tmp_path):
    v = read_labels(save_nii(tmp_path / "f.nii.gz", labels(dtype=np.float32)))
    assert v.array.dtype == np.uint8 and np.array_equal(v.array, labels())


def test_scaled_labels_non_integer(tmp_path):
    img = nib.Nifti1Image(labels(dtype=np.int16), AFF)
    img.header.set_slope_inter(0.5, 0)  # stored 3 -> 1.5
    nib.save(img, str(tmp_path / "scaled.nii.gz"))
    expect(tmp_path / "scaled.nii.gz", "the header scales the stored values (scl_slope 0.5, scl_inter 0)", read_labels)


def test_scaled_labels_integer_are_refused_too(tmp_path):
    "Issue 23: slope 2 would turn a stored spleen (1) into kidney_right (2); any scaling of a label map is refused."
    img = nib.Nifti1Image(labels(dtype=np.int16), AFF)
    img.header.set_slope_inter(2, 0)
    nib.save(img, str(tmp_path / "scaled2.nii.gz"))
    expect(tmp_path / "scaled2.nii.gz", "a stored label 1 would read as 2", read_labels)


# ---------------------------------------------------------------- read_scan agreement

def test_shape_mismatch(tmp_path):
    lab = save_nii(tmp_path / "lab.nii.gz", labels())
    img = save_nii(tmp_path / "img.nii.gz", ct((6, 7, 9)))
    err = expect(lab, "shape mismatch", read_scan, img)
    assert "(6, 7, 8)" in str(err) and "(6, 7, 9)" in str(err) and str(img) in str(err)


def test_affine_mismatch(tmp_path):
    lab = save_nii(tmp_path / "lab.nii.gz", labels())
    moved = AFF.copy()
    moved[1, 3] += 0.5
    img = save_nii(tmp_path / "img.nii.gz", ct(), moved)
    err = expect(lab, "affine mismatch", read_scan, img)
    assert "0.5 mm" in str(err) and str(img) in str(err)
    rot = AFF.copy()
    rot[:3, :3] = rot[:3, :3] @ np.array([[1, 0, 0], [0, 1, 1e-3], [0, -1e-3, 1]])  # tiny rotation, ~0.01 mm at corners
    save_nii(tmp_path / "rot.nii.gz", ct(), rot)
    expect(lab, "affine mismatch", read_scan, tmp_path / "rot.nii.gz")
    assert read_scan(lab, tmp_path / "rot.nii.gz", atol_mm=0.1).image is not None


@pytest.mark.parametrize("perm,flip", [((0, 1, 2), (False, True, False)), ((2, 0, 1), (False, False, False)),
                                       ((1, 0, 2), (True, False, True)), ((2, 1, 0), (True, True, True))])
def test_label_map_in_another_storage_order(tmp_path, perm, flip):
    "The same grid stored permuted and/or flipped is accepted and reoriented onto the image, value for value."
    a = labels()
    a[5, 6, 7] = 9
    stored = reorient(Volume(a, oblique_affine()), perm, flip)
    lab = write_volume(stored, tmp_path / "lab.nii.gz")
    img = write_volume(Volume(ct(), oblique_affine()), tmp_path / "img.nii.gz")
    s = read_scan(lab, img)
    assert s.labels.shape == (6, 7, 8) and np.array_equal(s.labels.array, a)
    np.testing.assert_allclose(s.labels.affine, oblique_affine(), atol=1e-9)
    assert s.labels.path == str(lab)


@pytest.mark.parametrize("change", ["shift", "rescale", "shape"])
def test_label_map_on_another_grid_is_refused(tmp_path, change):
    "After matching the axes, a grid that is shifted, rescaled or of another size is still refused."
    stored = reorient(Volume(labels(), AFF), (0, 1, 2), (False, True, False))
    aff, arr = stored.affine.copy(), stored.array
    if change == "shift": aff[2, 3] += 0.5
    elif change == "rescale": aff = aff @ np.diag([1.0, 1.01, 1.0, 1.0])
    else: arr = arr[:, :, :7]
    lab = write_volume(Volume(arr, aff), tmp_path / "lab.nii.gz")
    img = save_nii(tmp_path / "img.nii.gz", ct())
    err = expect(lab, "shape mismatch" if change == "shape" else "affine mismatch", read_scan, img)
    assert str(img) in str(err)
    if change == "shift": assert "0.5 mm apart" in str(err)


def test_read_scan_ok(tmp_path):
    lab = save_nii(tmp_path / "s0001_seg.nii.gz", labels())
    s = read_scan(lab, save_nii(tmp_path / "s0001_ct.nii.gz", ct()))
    assert isinstance(s, Scan) and s.scan_id == "s0001_seg" and s.image.shape == s.labels.shape
    assert read_scan(lab, scan_id="s1").scan_id == "s1" and read_scan(lab).image is None


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("ext", [".nii", ".nii.gz", ".nrrd", ".nhdr"])
@pytest.mark.parametrize("affine", [AFF, oblique_affine()], ids=["axis", "oblique"])
def test_write_read_roundtrip(tmp_path, ext, affine):
    for arr in (ct(), labels(), np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)):
        back = read_volume(write_volume(Volume(arr, affine), tmp_path / f"v{ext}"))
        assert np.array_equal(back.array, arr) and back.array.dtype == arr.dtype
        # NIfTI-1 (what every tool reads, issue 23): a float32 affine, rounded by <= 6e-8 of its size
        if ext.startswith(".nii"):
            assert np.abs(back.affine - affine).max() <= 6e-8 * np.abs(affine).max()
            assert np.array_equal(back.affine, affine) == np.array_equal(affine.astype(np.float32), affine)
        else: assert np.array_equal(back.affine, affine)  # exactly, not approximately


def test_nrrd_lps_to_ras(tmp_path):
    "A hand-written LPS NRRD: the RAS affine flips x and y of directions and origin; rows are axes."
    dirs = np.array([[0.5, 0.1, 0.0], [0.0, 0.6, 0.2], [0.3, 0.0, 2.0]])  # row n = step of index axis n
    nrrd.write(str(tmp_path / "lps.nrrd"), ct(), {"space": "left-posterior-superior", "space directions": dirs,
                                                   "space origin": np.array([1.0, 2.0, 3.0])})
    v = read_volume(tmp_path / "lps.nrrd")
    flip = np.array([-1.0, -1.0, 1.0])
    assert np.allclose(v.affine[:3, 0], flip * dirs[0]) and np.allclose(v.affine[:3, 2], flip * dirs[2])
    assert np.allclose(v.affine[:3, 3], [-1.0, -2.0, 3.0])
    assert np.allclose(v.to_world([1, 0, 0]) - v.to_world([0, 0, 0]), [-0.5, -0.1, 0.0])


def _sitk_ras(path):
    import SimpleITK as sitk
    im = sitk.ReadImage(str(path))
    lps = np.eye(4)
    lps[:3, :3] = np.array(im.GetDirection()).reshape(3, 3) * np.array(im.GetSpacing())
    lps[:3, 3] = im.GetOrigin()
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps, sitk.GetArrayFromImage(im).transpose(2, 1, 0)


def test_real_nrrd_matches_simpleitk():
    f = LUNG / "lung1_image.nrrd"
    v = read_volume(f)
    aff, arr = _sitk_ras(f)
    assert np.allclose(v.affine, aff, atol=1e-9, rtol=0) and np.array_equal(v.array, arr)
    assert v.axcodes == ("L", "P", "S")
    s = read_scan(LUNG / "lung1_label.nrrd", f)
    assert np.issubdtype(s.labels.array.dtype, np.integer) and s.labels.array.max() >= 1


@pytest.mark.parametrize("space", ["left-posterior-superior", "right-anterior-superior"])
def test_oblique_nrrd_matches_simpleitk(tmp_path, space):
    dirs = (oblique_affine()[:3, :3]).T
    nrrd.write(str(tmp_path / "o.nrrd"), ct(), {"space": space, "space directions": dirs,
                                                 "space origin": np.array([12.5, -30.0, 7.0])})
    v = read_volume(tmp_path / "o.nrrd")
    aff, arr = _sitk_ras(tmp_path / "o.nrrd")
    assert np.allclose(v.affine, aff, atol=1e-9, rtol=0) and np.array_equal(v.array, arr)


@pytest.mark.parametrize("space", ["scanner-xyz", None])
def test_nrrd_itk_spaces_read_as_lps(tmp_path, space):
    hdr = {"space directions": np.diag([0.5, 0.6, 2.0]), "space origin": np.array([1.0, 2.0, 3.0])}
    hdr.update({"space": space} if space else {"space dimension": 3})
    nrrd.write(str(tmp_path / "s.nrrd"), ct(), hdr)
    with pytest.warns(UserWarning, match="read as LPS"):
        v = read_volume(tmp_path / "s.nrrd")
    assert np.allclose(v.affine, np.diag([-0.5, -0.6, 2.0, 1.0]) + np.c_[np.zeros((4, 3)), [-1.0, -2.0, 3.0, 0.0]])
    assert np.allclose(v.affine, _sitk_ras(tmp_path / "s.nrrd")[0])


def test_nifti_matches_simpleitk(tmp_path):
    p = write_volume(Volume(ct(), AFF), tmp_path / "a.nii.gz")
    aff, arr = _sitk_ras(p)
    v = read_volume(p)
    assert np.allclose(v.affine, aff, atol=1e-6, rtol=0) and np.array_equal(v.array, arr)


# ---------------------------------------------------------------- DICOM

def _series(tmp_path, name="series", affine=None, intercept=-1024.0):
    vol = Volume(ct(), oblique_affine() if affine is None else affine)
    return vol, write_dicom_series(vol, tmp_path / name, intercept=intercept)


def test_dicom_roundtrip_matches_nifti(tmp_path):
    vol, folder = _series(tmp_path)
    for f in sorted(folder.iterdir()):  # file names no longer follow slice position
        f.rename(folder / f"z{(5 * int(f.stem)) % 8}.dcm")
    d = read_volume(folder)
    n = read_volume(write_volume(vol, tmp_path / "twin.nrrd"))     # NRRD keeps the float64 geometry (NIfTI-1: float32)
    assert np.array_equal(d.array, n.array) and np.allclose(d.affine, n.affine, atol=1e-8, rtol=0)
    ds = pydicom.dcmread(next(folder.iterdir()))
    assert ds.SOPClassUID == pydicom.uid.CTImageStorage and ds.file_meta.TransferSyntaxUID == pydicom.uid.ExplicitVRLittleEndian
    assert float(ds.RescaleIntercept) == -1024.0


def test_dicom_rescale_slope_float(tmp_path):
    vol, folder = _series(tmp_path, affine=AFF, intercept=0.0)
    for f in folder.iterdir():
        ds = pydicom.dcmread(f)
        ds.RescaleSlope, ds.RescaleIntercept = "0.5", "-1024.25"
        ds.save_as(f)
    d = canonical(read_volume(folder))
    assert d.array.dtype == np.float32 and np.array_equal(d.array, canonical(vol).array * 0.5 - 1024.25)


def test_dicom_left_handed_grid(tmp_path):
    "AFF is left-handed (L, A, S): slices sort along the normal (as ITK does), so k comes back reversed,"
    "but it is the same physical object."
    vol, folder = _series(tmp_path, affine=AFF)
    d = read_volume(folder)
    assert d.axcodes == ("L", "A", "I")
    back = reorient(d, (0, 1, 2), (False, False, True))
    assert np.array_equal(back.array, vol.array) and np.allclose(back.affine, AFF, atol=1e-9, rtol=0)


def test_dicom_matches_simpleitk(tmp_path):
    import SimpleITK as sitk
    vol, folder = _series(tmp_path)
    r = sitk.ImageSeriesReader()
    r.SetFileNames(r.GetGDCMSeriesFileNames(str(folder)))
    im = r.Execute()
    lps = np.eye(4)
    lps[:3, :3] = np.array(im.GetDirection()).reshape(3, 3) * np.array(im.GetSpacing())
    lps[:3, 3] = im.GetOrigin()
    d = read_volume(folder)
    assert np.allclose(d.affine, np.diag([-1.0, -1, 1, 1]) @ lps, atol=1e-6, rtol=0)
    assert np.array_equal(d.array, sitk.GetArrayFromImage(im).transpose(2, 1, 0))


def _copy(src: Path, dst: Path) -> list[Path]:
    shutil.copytree(src, dst)
    return sorted(dst.iterdir(), key=lambda f: int(pydicom.dcmread(f).InstanceNumber))


def test_dicom_faults(tmp_path):
    vol, folder = _series(tmp_path)
    mixed = tmp_path / "mixed"
    _copy(folder, mixed)
    _, other = _series(tmp_path, "other")
    shutil.copy(sorted(other.iterdir())[0], mixed / "intruder.dcm")
    expect(mixed, "mixed series")

    gap = tmp_path / "gap"
    _copy(folder, gap)[3].unlink()
    expect(gap, "inconsistent slice spacing")

    dup = tmp_path / "dup"
    files = _copy(folder, dup)
    ds = pydicom.dcmread(files[2])
    ds.ImagePositionPatient = pydicom.dcmread(files[1]).ImagePositionPatient
    ds.save_as(files[2])
    expect(dup, "duplicate slice positions")

    for tag in ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing"):
        miss = tmp_path / f"no{tag}"
        files = _copy(folder, miss)
        ds = pydicom.dcmread(files[2])
        delattr(ds, tag)
        ds.save_as(files[2])
        expect(miss, f"missing DICOM tag {tag}")

    ps = tmp_path / "pixsp"
    files = _copy(folder, ps)
    ds = pydicom.dcmread(files[4])
    ds.PixelSpacing = [0.7, 0.7]
    ds.save_as(files[4])
    expect(ps, "inconsistent pixel spacing")

    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(sorted(folder.iterdir())[0], one)
    expect(one, "2D volume")

    junk = tmp_path / "junk"
    _copy(folder, junk)
    (junk / "notes.txt").write_text("hello")
    expect(junk, "not a DICOM file: notes.txt")

    (tmp_path / "none").mkdir()
    expect(tmp_path / "none", "no DICOM files")


# ---------------------------------------------------------------- reorient

def test_reorient_keeps_world_position_all_48():
    a = np.zeros((3, 4, 5), np.int16)
    a[2, 1, 3] = 7
    v = Volume(a, oblique_affine())
    x0 = v.to_world([2, 1, 3])
    seen = set()
    for perm in itertools.permutations(range(3)):
        for flip in itertools.product([False, True], repeat=3):
            r = reorient(v, perm, flip)
            assert r.shape == tuple(a.shape[p] for p in perm)
            (idx,) = np.argwhere(r.array == 7)
            assert np.allclose(r.to_world(idx), x0, atol=1e-9, rtol=0)
            assert np.isclose(r.voxel_volume_mm3, v.voxel_volume_mm3) and np.allclose(sorted(r.spacing), sorted(v.spacing))
            # every voxel, not just the marked one
            ijk = np.argwhere(np.ones(r.shape, bool))
            old = np.rint(v.to_index(r.to_world(ijk))).astype(int)
            assert np.array_equal(v.array[tuple(old.T)], r.array[tuple(ijk.T)])
            inv = np.argsort(perm)
            back = reorient(r, inv, [flip[i] for i in inv])
            assert np.array_equal(back.array, a) and np.allclose(back.affine, v.affine, atol=1e-12, rtol=0)
            seen.add((perm, flip))
    assert len(seen) == 48


def test_canonical():
    v = Volume(ct(), oblique_affine())
    c = canonical(v)
    assert c.axcodes == ("R", "A", "S")
    assert np.allclose(c.to_world(np.argwhere(c.array == c.array.max())[0]),
                       v.to_world(np.argwhere(v.array == v.array.max())[0]))


def test_volume_properties():
    v = Volume(np.zeros((2, 3, 4)), np.diag([-0.5, 0.5, 2.0, 1.0]))
    assert v.spacing == (0.5, 0.5, 2.0) and v.voxel_volume_mm3 == 0.5 and v.axcodes == ("L", "A", "S")
    assert v.affine.dtype == np.float64 and "Volume(shape=(2, 3, 4)" in repr(v)
