"""Model inputs (spatialvqa.views): every 3D preset against its upstream recipe, written out here independently with
the operations the upstream code itself calls (torch `F.interpolate`, nibabel, pydicom, scipy; MONAI when it is
installed), on a phantom stored LPS; radiological orientation of the 2D views; the content-hash cache; the slice grid.

Upstream recipes (repository@commit file lines) are cited next to each re-expression; see nbs/40_views/."""

import nibabel as nib
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spatialvqa.anatomy import NAME_TO_ID
from spatialvqa.phantom.body import VARIANTS
from spatialvqa.phantom.subject import make_subject, orient
from spatialvqa.scan import Volume, read_volume, write_dicom_series, write_volume
from spatialvqa.views.transforms import orient_to
from spatialvqa.views.presets import PRESETS, preset
from spatialvqa.views.planes import OKABE_ITO_RGB, VIEWS
from spatialvqa.views.render import render_grid, render_views
from spatialvqa.views.inputs import RENDERS, make_input
from spatialvqa.views.cache import get_or_render, render_records

torch.set_num_threads(1)


def _crop(vol: Volume, lo, hi) -> Volume:
    "A sub-block of a volume with its affine moved along (keeps world positions)."
    sl = tuple(slice(a, b) for a, b in zip(lo, hi))
    aff = vol.affine.copy()
    aff[:3, 3] = vol.to_world(np.array(lo, float))
    return Volume(vol.array[sl].copy(), aff)


@pytest.fixture(scope="module")
def subj():
    # textbook anatomy (no situs inversus, no organ removed): the radiological-orientation checks compare liver and spleen
    return make_subject("views_test", seed=5, tumours=False, spacing=(6.0, 6.0, 8.0), rates={k: 0.0 for k in VARIANTS})


@pytest.fixture(scope="module")
def files(subj, tmp_path_factory):
    "The phantom written LPS-stored, as NIfTI and as NRRD."
    d = tmp_path_factory.mktemp("views")
    img, lab = orient(subj.image, "LPS"), orient(subj.labels, "LPS")
    return dict(dir=d, nii=write_volume(img, d / "image.nii.gz"), nii_labels=write_volume(lab, d / "labels.nii.gz"),
                nrrd=write_volume(img, d / "image.nrrd"), nrrd_labels=write_volume(lab, d / "labels.nrrd"))


def display_stack_lps(a_lps: np.ndarray) -> np.ndarray:
    """How a viewer (and so a Radiopaedia JPEG export) shows an LPS-stored volume: each axial slice k as an image with
    rows along j (toward posterior) and columns along i (toward patient left), i.e. `a[:, :, k].T`; slices from the
    top of the body down (k from high to low)."""
    return np.stack([a_lps[:, :, k].T for k in range(a_lps.shape[2] - 1, -1, -1)])


# ---------------------------------------------------------------- orientation

def test_presets_do_not_depend_on_storage_orientation(subj):
    # every preset reorients from the affine: a block stored PSR (axes permuted and flipped) gives the same array as
    # stored RAS (the tests below also go through LPS-stored files)
    block = _crop(subj.image, (10, 8, 20), (40, 32, 44))
    for name, p in PRESETS.items():
        if name == "ctchat": continue                            # the CT-CLIP recipe (checked below)
        ref = p(block)
        np.testing.assert_array_equal(p(orient(block, "PSR")), ref, err_msg=name)
        assert ref.dtype == np.dtype(p.dtype)
        assert all(s is None or s == n for s, n in zip(p.shape, ref.shape)), (name, ref.shape)


def test_orient_to_round_trip(subj):
    for o in ("LPS", "LPI", "SRA", "PSR"):
        v = orient_to(orient(subj.image, o), "RAS")
        np.testing.assert_array_equal(v.array, subj.image.array)
        np.testing.assert_allclose(v.affine, subj.image.affine)


# ---------------------------------------------------------------- 3D presets vs upstream

def m3d_upstream(a_lps: np.ndarray, size) -> np.ndarray:
    """M3D-Cap / Med3DVLM: BAAI-DCAI/M3D@63e7200 Data/process/m3d_cap_data_prepare.py L103-112 (stack, min-max,
    CropForeground, Resize bilinear); mirthAI/Med3DVLM@cbbd633 src/utils/m3d_cap_data_prepare_128.py L90-99."""
    image = display_stack_lps(a_lps).astype(np.float32)[np.newaxis, ...]
    image = image - image.min()
    image = image / np.clip(image.max(), a_min=1e-8, a_max=None)
    fg = np.argwhere(image[0] > 0)                       # MONAI CropForeground: select_fn x > 0, margin 0
    lo, hi = fg.min(0), fg.max(0) + 1
    image = image[:, lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
    t = torch.from_numpy(np.ascontiguousarray(image)).unsqueeze(0)   # MONAI Resize -> F.interpolate(trilinear)
    return F.interpolate(t, size=tuple(size), mode="trilinear", align_corners=False)[0].numpy()


@pytest.mark.parametrize("name,size", [("m3d", (32, 256, 256)), ("med3dvlm", (128, 256, 256))])
def test_m3d_med3dvlm_match_upstream(subj, name, size):
    lps = orient(subj.image, "LPS")
    got = preset(name)(lps)
    assert got.shape == (1, *size)
    np.testing.assert_allclose(got, m3d_upstream(lps.array, size), atol=2e-6)


def test_m3d_with_monai_if_installed(subj):
    import monai.transforms as mtf
    lps = orient(subj.image, "LPS")
    image = display_stack_lps(lps.array).astype(np.float32)[np.newaxis, ...]
    image = image - image.min()
    image = image / np.clip(image.max(), a_min=1e-8, a_max=None)
    ref = mtf.Compose([mtf.CropForeground(), mtf.Resize(spatial_size=[32, 256, 256], mode="bilinear")])(image)
    np.testing.assert_allclose(preset("m3d")(lps), np.asarray(ref), atol=2e-6)


def radfm_upstream(a_lps: np.ndarray) -> np.ndarray:
    """RadFM (chaoyi-wu/RadFM@9efba84): jpg2nii_data_convert.py L13-32 (each slice cv2.resize INTER_LINEAR to 512x512,
    stacked, transposed to (H, W, D)); nii2npy_for_radiopaedio.py L59-71 (3 channels); radiopaedia.py L153 (min-max);
    multi_dataset.py L69-112 (`stack_images`). cv2 is not installed here: its INTER_LINEAR is half-pixel bilinear
    without anti-aliasing, which is F.interpolate(bilinear, align_corners=False)."""
    slices = display_stack_lps(a_lps).astype(np.float32)
    t = torch.from_numpy(slices).unsqueeze(1)                                  # (D, 1, H, W)
    image_list = F.interpolate(t, size=(512, 512), mode="bilinear", align_corners=False)[:, 0].numpy()
    image_array = np.array(image_list).transpose((1, 2, 0))                    # (512, 512, D)
    image_array = np.concatenate([image_array[np.newaxis]] * 3, axis=0)        # (3, 512, 512, D)
    image = (image_array - image_array.min()) / (image_array.max() - image_array.min())
    image = torch.from_numpy(image).float()
    target_H, target_W, target_D, MAX_D = 512, 512, 4, 4
    D = image.shape[3]
    if D > MAX_D: MAX_D = D
    for temp_D in range(4, 65, 4):
        if abs(temp_D - MAX_D) < abs(target_D - MAX_D): target_D = temp_D
    return F.interpolate(image.unsqueeze(0), size=(target_H, target_W, target_D))[0].numpy()


def test_radfm_matches_upstream(subj):
    lps = orient(subj.image, "LPS")
    got = preset("radfm")(lps)
    ref = radfm_upstream(lps.array)
    assert got.shape == ref.shape == (3, 512, 512, 64)                          # 77 slices -> the closest of 4..64
    np.testing.assert_allclose(got, ref, atol=2e-6)
    short = _crop(subj.image, (0, 0, 30), (62, 45, 48))                        # 18 slices -> 16 (ties go down)
    got = preset("radfm")(orient(short, "LPS"))
    np.testing.assert_allclose(got, radfm_upstream(orient(short, "LPS").array), atol=2e-6)
    assert got.shape[-1] == 16 and preset("radfm").target_depth(18) == 16


def ctclip_upstream(path) -> torch.Tensor:
    """CT-CLIP `nii_img_to_tensor` (ibrahimethemhamamci/CT-CLIP@a2a155c scripts/data_inference_nii.py L96-165,
    resize_array L12-34), slope 1, intercept 0, spacings from the NIfTI header as CT-RATE's metadata gives them."""
    nii_img = nib.load(str(path))
    img_data = nii_img.get_fdata()
    zooms = nii_img.header.get_zooms()
    xy_spacing, z_spacing = float(zooms[0]), float(zooms[2])
    current, target = (z_spacing, xy_spacing, xy_spacing), (1.5, 0.75, 0.75)
    img_data = np.clip(1.0 * img_data + 0.0, -1000, 1000)
    img_data = img_data.transpose(2, 0, 1)
    tensor = torch.tensor(img_data).unsqueeze(0).unsqueeze(0)
    original_shape = tensor.shape[2:]
    new_shape = [int(original_shape[i] * (current[i] / target[i])) for i in range(3)]
    img_data = F.interpolate(tensor, size=new_shape, mode="trilinear", align_corners=False).cpu().numpy()[0][0]
    img_data = np.transpose(img_data, (1, 2, 0))
    tensor = torch.tensor((img_data / 1000).astype(np.float32))
    h, w, d = tensor.shape
    dh, dw, dd = 480, 480, 240
    h_start, w_start, d_start = max((h - dh) // 2, 0), max((w - dw) // 2, 0), max((d - dd) // 2, 0)
    tensor = tensor[h_start:min(h_start + dh, h), w_start:min(w_start + dw, w), d_start:min(d_start + dd, d)]
    ph, pw, pd = dh - tensor.size(0), dw - tensor.size(1), dd - tensor.size(2)
    tensor = F.pad(tensor, (pd // 2, pd - pd // 2, pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=-1)
    return tensor.permute(2, 0, 1).unsqueeze(0)


def test_ctclip_ctchat_match_upstream(subj, tmp_path):
    # a block of the phantom, LPS-stored in NIfTI as CT-RATE's volumes are; 30 x 24 x 24 voxels of 6 x 6 x 8 mm
    # become 240 x 192 x 128 at 0.75 x 0.75 x 1.5 mm, then padded to 480 x 480 x 240
    block = orient(_crop(subj.image, (10, 8, 20), (40, 32, 44)), "LPS")
    path = write_volume(block, tmp_path / "ct.nii.gz")
    got = preset("ctclip")(read_volume(path))
    ref = ctclip_upstream(path).numpy()
    assert got.shape == ref.shape == (1, 240, 480, 480)
    np.testing.assert_allclose(got, ref, atol=1e-6)
    # CT-CHAT encodes the same tensor (CT-CHAT@33c9b97 llava/serve/encode_script.py L33-95 repeats the recipe)
    same = lambda name: {k: v for k, v in preset(name).params().items() if k != "name"}
    assert same("ctchat") == same("ctclip")


def merlin_upstream(vol: Volume) -> np.ndarray:
    """Merlin's MONAI transforms (StanfordMIMI/Merlin@2489a96 merlin/data/monai_transforms.py L13-29) spelled out:
    Orientationd RAS; Spacingd (1.5, 1.5, 3) bilinear - new shape round((n-1)*s/t + 1), grid from the first voxel
    centre, border padding (here scipy map_coordinates, order 1, mode nearest); ScaleIntensityRanged clip;
    SpatialPadd symmetric with 0; CenterSpatialCropd (start n//2 - roi//2)."""
    from scipy import ndimage
    img = nib.as_closest_canonical(nib.Nifti1Image(vol.array, vol.affine))
    a, sp = np.asarray(img.dataobj, dtype=np.float64), img.header.get_zooms()[:3]
    shape = [int(np.round((n - 1) * s / t + 1)) for n, s, t in zip(a.shape, sp, (1.5, 1.5, 3.0))]
    grid = np.meshgrid(*[np.arange(m) * t / s for m, s, t in zip(shape, sp, (1.5, 1.5, 3.0))], indexing="ij")
    a = ndimage.map_coordinates(a, grid, order=1, mode="nearest", prefilter=False)
    a = np.clip((a + 1000.0) / 2000.0, 0.0, 1.0)
    roi = (224, 224, 160)
    a = np.pad(a, [((r - n) // 2, r - n - (r - n) // 2) if r > n else (0, 0) for n, r in zip(a.shape, roi)])
    starts = [max(n // 2 - r // 2, 0) for n, r in zip(a.shape, roi)]
    return a[tuple(slice(s, s + r) for s, r in zip(starts, roi))][None]


def test_merlin_matches_upstream(subj):
    lps = orient(subj.image, "LPS")
    got = preset("merlin")(lps)
    assert got.shape == (1, 224, 224, 160)
    np.testing.assert_allclose(got, merlin_upstream(lps), atol=1e-6)


def test_merlin_with_monai_if_installed(files):
    from monai.transforms import (CenterSpatialCropd, Compose, EnsureChannelFirstd, LoadImaged, Orientationd,
                                  ScaleIntensityRanged, Spacingd, SpatialPadd)
    tf = Compose([LoadImaged(keys=["image"]), EnsureChannelFirstd(keys=["image"]), Orientationd(keys=["image"], axcodes="RAS"),
                  Spacingd(keys=["image"], pixdim=(1.5, 1.5, 3), mode=("bilinear")),
                  ScaleIntensityRanged(keys=["image"], a_min=-1000, a_max=1000, b_min=0.0, b_max=1.0, clip=True),
                  SpatialPadd(keys=["image"], spatial_size=[224, 224, 160]),
                  CenterSpatialCropd(roi_size=[224, 224, 160], keys=["image"])])
    ref = np.asarray(tf({"image": str(files["nii"])})["image"])
    np.testing.assert_allclose(preset("merlin")(read_volume(files["nii"])), ref, atol=1e-5)


def test_medgemma_matches_upstream(tmp_path):
    """MedGemma 1.5 CT notebook (Google-Health/medgemma@d89262c notebooks/high_dimensional_ct_hugging_face.ipynb):
    instances sorted by InstanceNumber, 85 sampled uniformly, pixel data rescaled to HU, three windows as RGB,
    rounded to uint8. The series is written head first (InstanceNumber 1 = most superior slice), as a cranio-caudal
    acquisition numbers it, and read back through spatialvqa's DICOM reader."""
    import pydicom
    subj = make_subject("medgemma_test", seed=6, tumours=False, spacing=(8.0, 8.0, 4.0))   # 154 slices > 85
    folder = write_dicom_series(orient(subj.image, "LPI"), tmp_path / "series")
    dicom_instances = sorted((pydicom.dcmread(f) for f in folder.iterdir()), key=lambda i: int(i.InstanceNumber))
    MAX_SLICE = 85
    assert len(dicom_instances) > MAX_SLICE
    dicom_instances = [dicom_instances[int(round(i / (MAX_SLICE) * (len(dicom_instances) - 1)))] for i in range(1, MAX_SLICE + 1)]
    ct_volume_slices = [pydicom.pixels.apply_rescale(dcm.pixel_array, dcm) for dcm in dicom_instances]

    def norm(ct_vol, min, max):
        ct_vol = np.clip(ct_vol, min, max).astype(np.float32)
        ct_vol -= min
        ct_vol /= (max - min)
        ct_vol *= 255.0
        return ct_vol

    window_clips = [(-1024, 1024), (-135, 215), (0, 80)]
    ref = np.stack([np.round(np.stack([norm(s, lo, hi) for lo, hi in window_clips], axis=-1), 0).astype(np.uint8)
                    for s in ct_volume_slices])
    got = preset("medgemma")(read_volume(folder))
    assert got.shape == ref.shape == (85, subj.image.shape[1], subj.image.shape[0], 3)
    np.testing.assert_array_equal(got, ref)


# ---------------------------------------------------------------- 2D views

def _centre(lab: np.ndarray, name: str) -> np.ndarray:
    "(column, row) of a structure's pixels in a sampled label map."
    rc = np.argwhere(lab == NAME_TO_ID[name]).mean(0)
    return rc[::-1]


@pytest.mark.parametrize("stored", ["nrrd", "nii"])
def test_views_are_radiological(files, stored):
    paths = (files[stored], files[f"{stored}_labels"] if stored == "nii" else files["nrrd_labels"])
    v = render_views(paths, ["liver", "spleen", "heart"], size=192)
    for view in ("axial", "coronal"):                          # patient's right on the image left
        assert _centre(v[view].labels, "liver")[0] < _centre(v[view].labels, "spleen")[0], view
    assert _centre(v["coronal"].labels, "heart")[1] < _centre(v["coronal"].labels, "liver")[1]   # head up
    sag = render_views(paths, ["sternum", "spinal_cord"], size=192)
    assert _centre(sag["axial"].labels, "sternum")[1] < _centre(sag["axial"].labels, "spinal_cord")[1]   # anterior up
    # anterior left
    assert _centre(sag["sagittal"].labels, "sternum")[0] < _centre(sag["sagittal"].labels, "spinal_cord")[0]
    # the outlines drawn on the image agree: orange (liver) pixels left of bluish-green (spleen) ones
    img = v["axial"].image
    cols = {c: np.argwhere((img == np.array(OKABE_ITO_RGB[k], np.uint8)).all(-1))[:, 1].mean() for k, c in [(0, "liver"), (1, "spleen")]}
    assert cols["liver"] < cols["spleen"]
    assert v["axial"].meta["orientation"] == {"left": "R", "right": "L", "top": "A", "bottom": "P"}
    assert v["sagittal"].meta["orientation"] == {"left": "A", "right": "P", "top": "S", "bottom": "I"}


def test_views_identical_for_any_storage(subj, tmp_path):
    ref = None
    for o in ("RAS", "LPS", "PSR"):
        ip = write_volume(orient(subj.image, o), tmp_path / f"i_{o}.nii.gz")
        lp = write_volume(orient(subj.labels, o), tmp_path / f"l_{o}.nii.gz")
        v = render_views((ip, lp), ["kidney_left", "aorta"], size=128)
        if ref is None: ref = v; continue
        for k in VIEWS:
            np.testing.assert_array_equal(v[k].labels, ref[k].labels)
            np.testing.assert_array_equal(v[k].image, ref[k].image)


def test_crop_scale_and_windows(files):
    v = render_views((files["nii"], files["nii_labels"]), ["kidney_right"], size=100, margin_mm=30, label=False)
    fovs = {m.meta["fov_mm"] for m in v.values()}
    assert len(fovs) == 1                                       # one scale for all three views
    fov = fovs.pop()
    assert all(m.meta["pixel_mm"] == pytest.approx(fov / 100) for m in v.values())
    assert v["axial"].meta["window_hu"] == [-150.0, 250.0]
    lung = render_views((files["nii"], files["nii_labels"]), ["kidney_right"], size=100, window="lung", label=False)
    assert lung["axial"].meta["window_hu"] == [-1350.0, 150.0]
    assert not np.array_equal(lung["axial"].image, v["axial"].image)
    grey = v["axial"].image
    assert (grey[..., 0] == grey[..., 1]).all()                 # no marks drawn when label=False
    with pytest.raises(ValueError, match="unknown view"):
        render_views((files["nii"], files["nii_labels"]), ["liver"], views=["oblique"])


def test_grid_layout(files):
    g = render_grid((files["nii"], files["nii_labels"]), ["liver", "heart"], n=6, size=300)
    assert (g.meta["rows"], g.meta["cols"], g.meta["tile"]) == (2, 3, 100)
    assert g.image.shape == (200, 300, 3) and g.labels.shape == (200, 300)
    z = g.meta["slice_mm"]
    assert z == sorted(z, reverse=True) and len(z) == 6         # superior first, row by row
    tiles = [g.labels[r * 100:(r + 1) * 100, c * 100:(c + 1) * 100] for r in range(2) for c in range(3)]
    heart = [t for t in range(6) if (tiles[t] == NAME_TO_ID["heart"]).any()]
    liver = [t for t in range(6) if (tiles[t] == NAME_TO_ID["liver"]).any()]
    assert heart and liver and min(heart) < max(liver)
    vis = {s["name"]: s["visible_in"] for s in g.meta["structures"]}
    assert vis["heart"] == [t + 1 for t in heart]
    k = (np.array(z) - read_volume(files["nii"]).affine[2, 3]) / 8.0          # acquired slices only (8 mm apart)
    np.testing.assert_allclose(k, np.round(k), atol=1e-3)    # meta rounds to 0.001 mm
    small = render_grid((files["nii"], files["nii_labels"]), ["adrenal_gland_left"], n=16, size=160)
    assert small.meta["n_requested"] == 16 and 1 < small.meta["n"] < 16   # no tile repeats a slice
    assert len(set(small.meta["slice_mm"])) == small.meta["n"]
    whole = render_grid((files["nii"], files["nii_labels"]), n=4, size=200, extent="scan")
    assert whole.meta["extent"] == "scan" and whole.image.shape == (200, 200, 3)


# ---------------------------------------------------------------- records and the cache

def _record(files, qid="q1", structures=("liver", "spleen"), scans=1):
    s = list(structures)
    return {"qid": qid, "scan_ids": ["a", "b"][:scans], "images": [str(files["nii"]), str(files["nrrd"])][:scans],
            "label_maps": [str(files["nii_labels"]), str(files["nrrd_labels"])][:scans],
            "structures": s, "label_ids": [NAME_TO_ID[x] for x in s]}


def test_make_input_representations(files):
    rec = _record(files, scans=2)
    assert len(make_input(rec, "three_views", size=64).arrays) == 6
    assert len(make_input(rec, "coronal", size=64).arrays) == 2
    g = make_input(rec, "grid", grid_n=4, grid_size=128)
    assert [a.shape for a in g.arrays] == [(128, 128, 3)] * 2
    m = make_input(rec, "volume:m3d")
    assert m.kind == "volume" and [a.shape for a in m.arrays] == [(1, 32, 256, 256)] * 2
    np.testing.assert_array_equal(m.arrays[0], m.arrays[1])     # the same scan stored two ways
    with pytest.raises(ValueError, match="unknown representation"):
        make_input(rec, "four_views")


def test_cache_hits_and_misses(files, tmp_path):
    cache = tmp_path / "cache"
    RENDERS.clear()
    recs = [_record(files, "q1"), _record(files, "q2", ("heart",)), _record(files, "q3")]
    first = [get_or_render(r, "three_views", cache, size=64) for r in recs]
    assert [c.misses for c in first] == [1, 1, 0]               # q3 names what q1 names: same key
    assert RENDERS["three_views"] == 2
    again = [get_or_render(r, "three_views", cache, size=64) for r in recs]
    assert RENDERS["three_views"] == 2 and all(c.hits == 1 for c in again)
    assert [c.paths for c in again] == [c.paths for c in first]
    # 3D: one rendering per scan, whatever the question
    vols = [get_or_render(r, "volume:medgemma", cache) for r in recs]
    assert RENDERS["volume:medgemma"] == 1 and len({tuple(c.paths) for c in vols}) == 1
    # another parameter, or other file content, is another key
    assert get_or_render(recs[0], "three_views", cache, size=64, window="bone").misses == 1
    changed = tmp_path / "image.nii.gz"
    vol = read_volume(files["nii"])
    write_volume(Volume(vol.array + 1, vol.affine), changed)
    rec = {**recs[0], "images": [str(changed)]}
    assert get_or_render(rec, "three_views", cache, size=64).misses == 1
    assert RENDERS["three_views"] == 4


def test_render_records_reports_errors(files, tmp_path):
    bad = {**_record(files, "bad"), "structures": ["liver_tumor"], "label_ids": [250]}
    rows = render_records({"records": [_record(files), bad], "representation": "axial", "cache": str(tmp_path), "params": {"size": 48}})
    assert "error" not in rows[0] and len(rows[0]["paths"]) == 1
    assert rows[1]["qid"] == "bad" and "none of liver_tumor is in the label map" in rows[1]["error"]
