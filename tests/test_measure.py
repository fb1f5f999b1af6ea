"""The spatial tools against SimpleITK, brute force and hand-built answers; invariance to how a file stores its voxels."""
import itertools
import json
import tracemalloc

import numpy as np
import pytest
import SimpleITK as sitk
from hypothesis import given, settings, strategies as st
from scipy import ndimage

import spatialvqa.measure as M
from spatialvqa.measure import (bbox_center_distance, boundary_voxels, centroid_distance, direction,
                                measure_file, measure_labels, measure_scan, offset, pairs_table, structures_table,
                                surface_distance)
from spatialvqa.anatomy import label_name
from spatialvqa.core import shared_data
from spatialvqa.scan import Volume, read_labels, read_scan, reorient, write_volume

REAL = shared_data("real-ct", "pyradiomics")
LPS = np.diag([-1.0, -1.0, 1.0])


def rotation(ax, deg):
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    r = np.eye(3)
    a, b = [n for n in range(3) if n != ax]
    r[a, a], r[a, b], r[b, a], r[b, b] = c, -s, s, c
    return r


def affine(spacing=(0.75, 1.25, 2.5), flip=(True, False, True), rot=None, origin=(-41.5, 17.0, 230.0)):
    "An affine with anisotropic spacing, flipped axes and optionally a rotation; float32-exact like a NIfTI sform."
    a = np.eye(4)
    a[:3, :3] = np.diag([(-s if f else s) for s, f in zip(spacing, flip)])
    if rot is not None: a[:3, :3] = rot @ a[:3, :3]
    a[:3, 3] = origin
    return a.astype(np.float32).astype(np.float64)


def blobs(shape=(40, 36, 30), seed=0, n=6):
    "Several ellipsoid blobs (one of them split in two), plus a label id beyond TotalSegmentator's range."
    rng = np.random.default_rng(seed)
    idx = np.indices(shape).transpose(1, 2, 3, 0).astype(float)
    a = np.zeros(shape, np.uint8)
    for l in range(1, n + 1):
        c, r = rng.uniform(0.25, 0.75, 3) * shape, rng.uniform(3, 8, 3)
        a[(((idx - c) / r) ** 2).sum(-1) <= 1] = l
    a[1:4, 1:4, 1:4] = 3          # a second piece of label 3
    a[-3:, -2:, :2] = 201         # a tumour-range id in a corner
    return a


def brute(a, aff, l):
    "Count, centroid, world box and ndimage components (face, full) of label `l` from all its voxel centres."
    xyz = np.argwhere(a == l) @ aff[:3, :3].T + aff[:3, 3]
    return len(xyz), xyz.mean(0), xyz.min(0), xyz.max(0)


def sitk_stats(path):
    "SimpleITK label shape statistics of a label map file, centroids converted from LPS to RAS."
    img = sitk.ReadImage(str(path))
    f = sitk.LabelShapeStatisticsImageFilter()
    f.Execute(img)
    out = {}
    for l in f.GetLabels():
        bb = np.array(f.GetBoundingBox(l))
        out[l] = dict(n=f.GetNumberOfPixels(l), mm3=f.GetPhysicalSize(l), centroid=LPS @ np.array(f.GetCentroid(l)),
                      index_min=bb[:3], index_max=bb[:3] + bb[3:] - 1)
    return out


def assert_matches_sitk(path, aligned=True):
    vol = read_labels(path)
    ours = {s.label: s for s in measure_labels(vol.array, vol.affine)}
    ref = sitk_stats(path)
    assert sorted(ours) == sorted(ref)
    for l, r in ref.items():
        s = ours[l]
        assert s.voxels == r["n"]
        assert s.volume_ml * 1000 == pytest.approx(r["mm3"], rel=1e-6)
        np.testing.assert_allclose(s.centroid, r["centroid"], rtol=1e-6, atol=1e-6)
        assert s.index_min == tuple(r["index_min"]) and s.index_max == tuple(r["index_max"])
        if aligned:  # the world box is then the image of SimpleITK's index box
            corners = np.array(list(itertools.product(*zip(r["index_min"], r["index_max"]))))
            w = corners @ vol.affine[:3, :3].T + vol.affine[:3, 3]
            np.testing.assert_allclose(s.bbox_min, w.min(0), atol=1e-6)
            np.testing.assert_allclose(s.bbox_max, w.max(0), atol=1e-6)
    return ours


# --- against SimpleITK -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("ext", [".nii.gz", ".nrrd"])
def test_synthetic_matches_simpleitk(tmp_path, ext):
    a, aff = blobs(), affine()
    path = write_volume(Volume(a, aff), tmp_path / f"blobs{ext}")
    ours = assert_matches_sitk(path)
    for l, s in ours.items():  # and the world box equals brute force over voxel centres
        n, c, lo, hi = brute(a, aff, l)
        np.testing.assert_allclose([*s.bbox_min, *s.bbox_max], [*lo, *hi], atol=1e-9)


def test_oblique_matches_simpleitk_and_brute_force(tmp_path):
    a, aff = blobs(seed=1), affine(rot=rotation(2, 20) @ rotation(0, 12))
    path = write_volume(Volume(a, aff), tmp_path / "oblique.nii.gz")
    ours = assert_matches_sitk(path, aligned=False)
    vol = read_labels(path)
    for l, s in ours.items():  # the exact world box, which the image of the index box would overestimate
        n, c, lo, hi = brute(vol.array, vol.affine, l)
        np.testing.assert_allclose([*s.bbox_min, *s.bbox_max], [*lo, *hi], atol=1e-9)
    corners = np.array(list(itertools.product(*zip(ours[1].index_min, ours[1].index_max))))
    assert np.any((corners @ vol.affine[:3, :3].T + vol.affine[:3, 3]).min(0) < np.array(ours[1].bbox_min) - 0.1)


@pytest.mark.parametrize("case", ["lung1", "lung2"])
def test_real_lung_tumours_match_simpleitk(case):
    path = REAL / f"{case}_label.nrrd"
    ours = assert_matches_sitk(path)
    assert list(ours) == [1] and ours[1].components >= 1


# --- the same object stored differently ------------------------------------------------------------------------

ORIENTATIONS = [((0, 1, 2), (False, False, False)), ((0, 1, 2), (True, True, False)), ((2, 1, 0), (False, False, False)),
                ((1, 0, 2), (False, True, True)), ((1, 2, 0), (True, False, False)), ((2, 0, 1), (True, True, True)),
                ((0, 2, 1), (False, True, False)), ((2, 1, 0), (True, False, True)), ((1, 0, 2), (True, True, True))]


def summary(structures):
    return {s.label: (s.voxels, s.volume_ml, s.centroid, s.bbox_min, s.bbox_max, s.components) for s in structures}


def assert_same(x, y):
    assert x.keys() == y.keys()
    for l in x:
        (n0, v0, *geo0, c0), (n1, v1, *geo1, c1) = x[l], y[l]
        assert (n0, c0) == (n1, c1)
        assert v0 == pytest.approx(v1, rel=1e-6)
        np.testing.assert_allclose(np.ravel(geo0), np.ravel(geo1), atol=1e-6)


def directions(structures):
    return {(a.label, b.label): direction(a, b) for a in structures for b in structures if a is not b}


@pytest.mark.parametrize("rot", [None, rotation(1, 15)], ids=["aligned", "oblique"])
def test_orientation_invariance(tmp_path, rot):
    base = Volume(blobs(seed=2), affine(rot=rot))
    ref = measure_labels(base.array, base.affine)
    want, want_dir = summary(ref), directions(ref)
    for n, (perm, flip) in enumerate(ORIENTATIONS):
        v = reorient(base, perm, flip)
        for vv in (v, read_labels(write_volume(v, tmp_path / f"o{n}.nii.gz")), read_labels(write_volume(v, tmp_path / f"o{n}.nrrd"))):
            got = measure_labels(vv.array, vv.affine)
            assert_same(summary(got), want)
            assert directions(got) == want_dir


def test_memory_layout_and_slabs(monkeypatch):
    "C or Fortran order, any slab thickness, one thread or several: the same answers."
    a, aff = blobs(seed=3), affine(rot=rotation(0, 30))
    want = summary(measure_labels(a, aff, threads=1))
    for slab in (1, 36 * 30, 3 * 36 * 30 + 7, 10**9):
        monkeypatch.setattr(M, "_SLAB_VOXELS", slab)
        for arr in (a, np.asfortranarray(a), a[::-1, :, ::-1].copy()[::-1, :, ::-1]):
            assert_same(summary(measure_labels(arr, aff, threads=3)), want)


# --- brute force on random label maps --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_random_maps_against_brute_force(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(rng.integers(3, 14, 3))
    a = ndimage.zoom(rng.integers(0, 5, tuple(max(2, s // 3) for s in shape)), 3, order=0)[: shape[0], : shape[1], : shape[2]]
    a = np.where(rng.random(a.shape) < 0.05, rng.integers(0, 5, a.shape), a).astype(rng.choice([np.uint8, np.int16, np.uint16, np.int32]))
    rot = rotation(int(rng.integers(3)), float(rng.uniform(-40, 40))) if seed % 2 else None
    aff = affine(spacing=rng.uniform(0.5, 3, 3), flip=rng.random(3) < 0.5, rot=rot)
    monkeypatch.setattr(M, "_SLAB_VOXELS", int(rng.integers(1, a[0].size * 3)))
    for conn, struct in ((6, 1), (18, 2), (26, 3)):
        got = {s.label: s for s in measure_labels(a, aff, connectivity=conn, threads=2)}
        assert sorted(got) == sorted(set(np.unique(a).tolist()) - {0})
        for l, s in got.items():
            n, c, lo, hi = brute(a, aff, l)
            assert s.voxels == n
            np.testing.assert_allclose(s.centroid, c, atol=1e-9)
            np.testing.assert_allclose([*s.bbox_min, *s.bbox_max], [*lo, *hi], atol=1e-9)
            assert s.components == ndimage.label(a == l, ndimage.generate_binary_structure(3, struct))[1]


# --- components --------------------------------------------------------------------------------------------------

def test_three_pieces(monkeypatch):
    a = np.zeros((30, 20, 20), np.uint8)
    a[2:6, 2:6, 2:6] = 4
    a[10:14, 10:18, 3:5] = 4
    a[25:28, 1:3, 15:19] = 4
    a[12, 2:5, 10:12] = 7
    for slab in (1, 400, 10**9):
        monkeypatch.setattr(M, "_SLAB_VOXELS", slab)
        got = {s.label: s.components for s in measure_labels(a, np.eye(4))}
        assert got == {4: 3, 7: 1}
    assert {s.label: s.components for s in measure_labels(a, np.eye(4), components=False)} == {4: None, 7: None}
    with pytest.raises(ValueError, match="connectivity"): measure_labels(a, np.eye(4), connectivity=8)


def test_corner_contact_depends_on_connectivity():
    a = np.zeros((4, 4, 4), np.uint8)
    a[0, 0, 0] = a[1, 1, 1] = a[2, 2, 1] = 9   # corner then edge contacts
    assert measure_labels(a, np.eye(4), connectivity=26)[0].components == 1
    assert measure_labels(a, np.eye(4), connectivity=18)[0].components == 2
    assert measure_labels(a, np.eye(4), connectivity=6)[0].components == 3


def ndimage_counts(a, connectivity):
    "Pieces of each label, `scipy.ndimage.label` label by label (the independent reference)."
    s = ndimage.generate_binary_structure(3, {6: 1, 18: 2, 26: 3}[connectivity])
    return {int(l): ndimage.label(a == l, s)[1] for l in np.unique(a) if l != 0}


def random_map(rng, shape, n_labels, block):
    "Labels in blocks of `block` voxels (organ-like patches) with speckle noise (thin, corner-touching bits)."
    coarse = rng.integers(0, n_labels + 1, tuple(max(1, -(-s // block)) for s in shape))
    a = coarse.repeat(block, 0).repeat(block, 1).repeat(block, 2)[: shape[0], : shape[1], : shape[2]]
    return np.where(rng.random(shape) < rng.uniform(0, 0.3), rng.integers(0, n_labels + 1, shape), a)


LAYOUTS = {
    "C": lambda a: np.ascontiguousarray(a),
    "F": lambda a: np.asfortranarray(a),                      # as nibabel returns NIfTI arrays
    "flipped view": lambda a: a[::-1, :, ::-1].copy()[::-1, :, ::-1],   # negative strides, not contiguous
    "transposed": lambda a: np.ascontiguousarray(a.transpose(2, 0, 1)).transpose(1, 2, 0),
    "read-only": lambda a: np.lib.stride_tricks.as_strided(a, writeable=False),   # as a memory-mapped file
}


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shape=st.tuples(*[st.integers(1, 13)] * 3), n_labels=st.integers(1, 6),
       block=st.integers(1, 4), layout=st.sampled_from(sorted(LAYOUTS)),
       dtype=st.sampled_from(["u1", "i2", ">i2", "u2", "i4", "<u4", "i8", "f2", "f4", ">f8", "bool"]),
       oblique=st.booleans(), slab_planes=st.integers(1, 14), threads=st.integers(1, 3))
def test_components_equal_ndimage_label_per_label(seed, shape, n_labels, block, layout, dtype, oblique, slab_planes, threads):
    "All labels counted in one pass, slab by slab, equal `ndimage.label` run on each label alone, for 6, 18 and 26."
    rng = np.random.default_rng(seed)
    a = random_map(rng, shape, 1 if dtype == "bool" else n_labels, block).astype(dtype)
    rot = rotation(int(rng.integers(3)), float(rng.uniform(-40, 40))) @ rotation(0, 17) if oblique else None
    aff = affine(spacing=rng.uniform(0.5, 3, 3), flip=rng.random(3) < 0.5, rot=rot)
    arr = LAYOUTS[layout](a)
    old = M._SLAB_VOXELS
    try:
        M._SLAB_VOXELS = slab_planes * int(np.prod(sorted(shape)[:2]))  # a slab holds about `slab_planes` planes
        for conn in (6, 18, 26):
            got = measure_labels(arr, aff, connectivity=conn, threads=threads)
            assert {s.label: s.components for s in got} == ndimage_counts(a, conn)
            assert {s.label: s.voxels for s in got} == {int(l): int((a == l).sum()) for l in np.unique(a) if l != 0}
    finally:
        M._SLAB_VOXELS = old


def test_components_where_slabs_meet():
    "A U whose arms join only in its last plane; a piece lying only in the plane two slabs share; 1-plane slabs."
    a = np.zeros((9, 5, 5), np.uint8)
    a[0:9, 0, 0] = a[8, 0:5, 0] = a[0:9, 4, 0] = 2
    a[4, 2, 2] = 2
    a[3, 2, 4] = 5            # alone in plane 3: with 3-plane slabs, the plane that slabs 0-2 and 3-5 share
    a[6, 3, 3] = a[5, 2, 2] = 6   # a diagonal pair across a slab boundary (26: one piece, 6: two)
    for planes in (1, 2, 3, 4, 9):
        for conn in (6, 26):
            old = M._SLAB_VOXELS
            try:
                M._SLAB_VOXELS = planes * 25
                assert {s.label: s.components for s in measure_labels(a, np.eye(4), connectivity=conn)} == ndimage_counts(a, conn)
            finally:
                M._SLAB_VOXELS = old
    assert ndimage_counts(a, 26) == {2: 2, 5: 1, 6: 1} and ndimage_counts(a, 6)[6] == 2


def test_label_map_of_big_organ_like_volume_equals_ndimage():
    "An organ-like map with many labels, several slabs and threads: the counts of `ndimage.label` label by label."
    rng = np.random.default_rng(7)
    a = random_map(rng, (60, 70, 50), 40, 6).astype(np.uint8)
    a[rng.random(a.shape) < 0.002] = 41   # scattered single voxels: many pieces of one label
    got = {s.label: s.components for s in measure_labels(np.asfortranarray(a), affine(), threads=2)}
    assert got == ndimage_counts(a, 26) and got[41] > 100


def test_non_numeric_label_map_is_refused():
    with pytest.raises(ValueError, match="non-numeric dtype"): measure_labels(np.zeros((2, 2, 2), complex), np.eye(4))


# --- pairwise ------------------------------------------------------------------------------------------------------

def test_pairwise_known_answers():
    aff = np.diag([2.0, 1.0, 0.5, 1.0])
    a = np.zeros((40, 30, 30), np.uint8)
    a[2:8, 2:8, 2:8] = 1
    a[12:18, 5:11, 2:8] = 2       # 4 empty voxels (8 mm) after cube 1 in i, shifted 3 voxels (3 mm) in j
    s1, s2 = measure_labels(a, aff)
    assert bbox_center_distance(s1, s2) == pytest.approx(np.hypot(10 * 2.0, 3 * 1.0))
    assert centroid_distance(s1, s2) == pytest.approx(np.hypot(10 * 2.0, 3 * 1.0))
    # closest voxel centres: the facing layers, 5 steps of 2 mm apart, overlapping in j and k
    assert surface_distance(a, aff, s1, s2) == pytest.approx(10.0)
    assert surface_distance(a, aff, 1, 2) == pytest.approx(10.0)   # by label id, boxes found on the fly
    np.testing.assert_allclose(offset(s2, s1), [20.0, 3.0, 0.0])
    assert direction(s2, s1) == "right" and direction(s1, s2) == "left"
    b = a.copy(); b[8:12, 2:8, 2:8] = 1          # cube 1 grows until it shares a face with cube 2
    assert surface_distance(b, aff, 1, 2) == 0.0
    c = np.zeros_like(a); c[2:8, 2:8, 2:8] = 1; c[8:14, 8:14, 8:14] = 2   # touching at one corner only
    assert surface_distance(c, aff, 1, 2) == 0.0
    d = np.zeros_like(a); d[2:8, 2:8, 2:8] = 1; d[9:15, 9:15, 9:15] = 2   # one empty voxel diagonally
    assert surface_distance(d, aff, 1, 2) == pytest.approx(np.linalg.norm([2 * 2.0, 2 * 1.0, 2 * 0.5]))
    with pytest.raises(ValueError, match="label 3"): surface_distance(a, aff, 1, 3)
    assert boundary_voxels(a, s1).shape == (6**3 - 4**3, 3)


@pytest.mark.parametrize("ext", [".nii.gz", ".nrrd"])
def test_directions_in_lps_stored_file(tmp_path, ext):
    "Six structures around a centre, stored LPS (i toward the patient's left, j posterior): named from the patient."
    a = np.zeros((30, 30, 30), np.uint8)
    c = slice(13, 17)
    a[c, c, c] = 1                       # centre
    a[2:6, c, c] = 2                     # low i = patient's right in LPS
    a[24:28, c, c] = 3                   # left
    a[c, 2:6, c] = 4                     # low j = anterior
    a[c, 24:28, c] = 5                   # posterior
    a[c, c, 24:28] = 6                   # high k = superior
    a[c, c, 2:6] = 7                     # inferior
    aff = np.diag([-1.5, -1.5, 2.0, 1.0]); aff[:3, 3] = [120, 80, -300]
    vol = read_labels(write_volume(Volume(a, aff), tmp_path / f"lps{ext}"))
    assert "".join(vol.axcodes) == "LPS"
    s = {x.label: x for x in measure_labels(vol.array, vol.affine)}
    want = {2: "right", 3: "left", 4: "anterior", 5: "posterior", 6: "superior", 7: "inferior"}
    assert {l: direction(s[l], s[1], ratio=2.0) for l in want} == want
    assert {l: direction(s[l], s[1], by="bbox_center") for l in want} == want
    # diagonal: a tie
    assert direction(s[2], s[4]) is None and direction(s[2], s[4], ratio=0.5) in ("right", "anterior")


def test_pairs_table():
    a = np.zeros((20, 10, 10), np.uint8)
    a[1:4, 2:5, 2:5], a[10:13, 2:5, 2:5], a[16:19, 6:9, 2:5] = 1, 2, 3
    ss = measure_labels(a, np.eye(4))
    t = pairs_table(ss, a, np.eye(4))
    assert t[["label_a", "label_b"]].values.tolist() == [[1, 2], [1, 3], [2, 3]]
    assert t.surface_distance_mm.tolist() == pytest.approx([7.0, np.hypot(13, 2), np.hypot(4, 2)])
    assert t.direction.tolist() == ["left", "left", "left"]
    assert "surface_distance_mm" not in pairs_table(ss).columns


# --- the measure JSON contract --------------------------------------------------------------------------------------

def test_measure_file_contract(tmp_path):
    a, aff = blobs(seed=4), affine()
    lab = write_volume(Volume(a, aff), tmp_path / "labels.nii.gz")
    img = write_volume(Volume(np.zeros(a.shape, np.int16), aff), tmp_path / "ct.nrrd")
    res = measure_file(lab, img)
    assert json.loads(json.dumps(res)) == res    # plain JSON values throughout
    assert res["scan"]["labels"] == str(lab) and res["scan"]["image"] == str(img) and res["scan"]["axcodes"] == "LAI"
    assert res["scan"]["shape"] == list(a.shape)
    keys = ["label", "name", "voxels", "volume_ml", "centroid_ras_mm", "bbox_ras_mm", "extent_mm", "components",
            "stray_mm", "near_mm"]
    assert all(list(s) == keys for s in res["structures"])
    assert [s["label"] for s in res["structures"]] == sorted(set(np.unique(a).tolist()) - {0})
    s = {x["label"]: x for x in res["structures"]}
    assert s[3]["components"] == ndimage.label(a == 3, np.ones((3, 3, 3)))[1] >= 2
    assert s[1]["name"] == "spleen" and s[201]["name"] == label_name(201)
    n, c, lo, hi = brute(a, aff, 3)
    assert s[3]["voxels"] == n and s[3]["volume_ml"] == pytest.approx(n * 0.75 * 1.25 * 2.5 / 1000)
    assert s[3]["extent_mm"] == pytest.approx(dict(zip(("lr", "ap", "si"), (hi - lo).tolist())))
    assert measure_scan(read_scan(lab), components=False)["structures"][0]["components"] is None
    t = structures_table(measure_labels(a, aff))
    assert t.label.tolist() == [x["label"] for x in res["structures"]] and t.extent_si.tolist() == [x["extent_mm"]["si"] for x in res["structures"]]


# --- memory --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("components", [False, True])
def test_peak_memory_within_three_label_maps(components):
    "NumPy's peak allocations while measuring an organ-like map stay under 3x the label map's own bytes."
    a = blobs(seed=5).repeat(8, 0).repeat(8, 1).repeat(8, 2)   # 320 x 288 x 240, 22 MB
    measure_labels(a[:8], np.eye(4), components=components)     # warm up imports and caches
    tracemalloc.start()
    tracemalloc.reset_peak()
    measure_labels(a, np.eye(4), components=components)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3 * a.nbytes, peak / a.nbytes


# --- specks --------------------------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), speck=st.integers(1, 6), spacing=st.tuples(*[st.floats(0.5, 4.0)] * 3))
def test_stray_mm_equals_a_brute_force_count(seed, speck, spacing):
    "How far the specks of a label (pieces under a tenth of it) stretch its box, recomputed with scipy per label."
    a = blobs(seed=seed % 1000)
    rng = np.random.default_rng(seed)
    a[tuple(rng.integers(0, n, speck) for n in a.shape)] = 2        # up to six one-voxel specks of label 2
    aff = np.diag([*spacing, 1.0])
    got = {s.label: s.stray_mm for s in M.with_strays(a, aff, measure_labels(a, aff))}
    for l, stray in got.items():
        pieces, n = ndimage.label(a == l, np.ones((3, 3, 3)))
        size = np.bincount(pieces.ravel())[1:]
        main = np.isin(pieces, 1 + np.flatnonzero((size >= 0.1 * size.sum()) | (size == size.max())))
        box = lambda m: np.ptp(np.argwhere(m), axis=0)
        assert stray == pytest.approx(float(np.max((box(a == l) - box(main)) * np.asarray(spacing))), abs=1e-3), l
