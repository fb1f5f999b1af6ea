"""Counterfactual copies on a phantom, on the real TotalSegmentator CT (s0001) and on the real DICOM example:
mirrored copies reflect every structure exactly (voxel counts equal, centroids mirrored, liver left of the spleen),
resized copies scale one structure by factor³ and change nothing else but what they overwrite, files written
and read back measure the same, and the answers of the paired questions agree with an independent
recomputation from the written label maps with SimpleITK."""
import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
import SimpleITK as sitk

from spatialvqa import counterfactual as CF
from spatialvqa.results.pairs import pair_accuracy, pair_frame
from spatialvqa.anatomy import NAME_TO_ID, counterpart
from spatialvqa.core import read_json, write_json
from spatialvqa.measure import measure_labels, measure_manifests, scan_info, structures_table
from spatialvqa.phantom.cohort import make_cohort
from spatialvqa.phantom.subject import make_subject
from spatialvqa.questions.core import LETTERS, tol_volume
from spatialvqa.questions.registry import evaluate
from spatialvqa.questions.generate import generate_questions
from spatialvqa.scan import Scan, Volume, read_labels, read_scan, read_volume, reorient, write_volume

TS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real-ct" / "totalsegmentator"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"shared data missing: {path} (the real CTs of ../shared/data/real-ct/totalsegmentator)")
    return path


def ts_labels() -> Volume:
    "s0001's per-structure masks as one label map with TotalSegmentator's ids (from the totalsegmentator package)."
    from totalsegmentator.map_to_binary import class_map
    ids = {n: i for i, n in class_map["total"].items()}
    ct = read_volume(_need(TS / "s0001" / "ct.nii.gz"))
    seg = sorted(_need(TS / "s0001" / "segmentations").glob("*.nii.gz"))
    assert len(seg) == 117, len(seg)
    L = np.zeros(ct.shape, np.uint8)
    for f in seg:
        name = f.name[: -len(".nii.gz")]
        assert ids[name] == NAME_TO_ID[name]                   # the package's ids are the project's
        img = nib.load(f)
        assert np.allclose(img.affine, ct.affine)
        m = np.asarray(img.dataobj) > 0
        assert not (m & (L > 0)).any()                         # the masks do not overlap
        L[m] = ids[name]
    return Volume(L, ct.affine, None)


@pytest.fixture(scope="module")
def ts_scan() -> Scan:
    return Scan("s0001", ts_labels(), read_volume(TS / "s0001" / "ct.nii.gz"))


def _aligned(labels: Volume, image: Volume) -> Volume:
    "`labels` reoriented onto `image`'s grid (the DICOM example's map is stored LAS, the series LPS)."
    for perm in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]:
        for flip in np.ndindex(2, 2, 2):
            r = reorient(labels, perm, tuple(bool(f) for f in flip))
            if r.shape == image.shape and np.allclose(r.affine, image.affine, atol=1e-3): return r
    raise AssertionError("the label map and the image do not sample the same grid")


@pytest.fixture(scope="module")
def dicom_scan() -> Scan:
    img = read_volume(_need(TS / "dicom_example" / "ct"))
    lab = _aligned(read_labels(_need(TS / "dicom_example" / "seg.nii.gz")), img)
    scan = read_scan(TS / "dicom_example" / "seg.nii.gz", TS / "dicom_example" / "ct", "dicom_example")
    assert np.array_equal(scan.labels.array, lab.array) and np.allclose(scan.labels.affine, img.affine, atol=1e-3)
    return scan


@pytest.fixture(scope="module")
def phantom_scan() -> Scan:
    s = make_subject("cf_test", seed=11, tumours={"liver": 35.0})
    return Scan("cf_test", s.labels, s.image)


def _structs(vol: Volume) -> dict:
    return {s.name: s for s in measure_labels(vol.array, vol.affine, components=False)}


@pytest.fixture(scope="module", params=["phantom", "s0001", "dicom"])
def any_scan(request, phantom_scan, ts_scan, dicom_scan) -> Scan:
    return {"phantom": phantom_scan, "s0001": ts_scan, "dicom": dicom_scan}[request.param]


# ---------------------------------------------------------------- SimpleITK: the independent measurement
def sitk_structures(path: Path, names: dict) -> dict:
    "Voxels, volume, RAS centroid and RAS voxel-centre box of every label of a label map file, with SimpleITK."
    img = sitk.ReadImage(str(path))
    f = sitk.LabelShapeStatisticsImageFilter()
    f.Execute(sitk.Cast(img, sitk.sitkUInt32))
    vox_ml = float(np.prod(img.GetSpacing())) / 1000
    out = {}
    for l in f.GetLabels():
        name = names.get(str(l)) or names.get(l)
        c = np.array(f.GetCentroid(l)) * (-1, -1, 1)                       # LPS -> RAS
        x, y, z, sx, sy, sz = f.GetBoundingBox(l)
        corners = [img.TransformIndexToPhysicalPoint((int(a), int(b), int(c_))) for a in (x, x + sx - 1)
                   for b in (y, y + sy - 1) for c_ in (z, z + sz - 1)]
        w = np.array(corners) * (-1, -1, 1)
        n = int(f.GetNumberOfPixels(l))
        from spatialvqa.measure import Structure
        out[name] = Structure(int(l), name, n, n * vox_ml, tuple(c), tuple(w.min(0)), tuple(w.max(0)))
    return out


def sitk_gaps(path: Path, names: dict, structs: dict, among) -> dict:
    """`structs` with `near` for the structures `among`, with SimpleITK alone: 0 where a dilation of one by a voxel
    meets the other (26 neighbours), else the least of the other's Maurer distance map over the first's voxels."""
    from dataclasses import replace
    from spatialvqa.measure import NEAR_MM
    img = sitk.ReadImage(str(path))
    arr = sitk.GetArrayFromImage(img)
    ids = {n: structs[n].label for n in among if n in structs}
    out = dict(structs)
    near = {n: {} for n in ids}
    for b, lb in ids.items():
        mask = sitk.Cast(img == lb, sitk.sitkUInt8)
        dm = sitk.GetArrayFromImage(sitk.SignedMaurerDistanceMap(mask, insideIsPositive=False, squaredDistance=False,
                                                                useImageSpacing=True))
        grown = sitk.GetArrayFromImage(sitk.BinaryDilate(mask, [1, 1, 1], sitk.sitkBox)).astype(bool)
        for a, la in ids.items():
            if a == b: continue
            va = arr == la
            d = 0.0 if (grown & va).any() else float(dm[va].min())
            if d < NEAR_MM: near[a][structs[b].name] = d
    for n in ids: out[n] = replace(structs[n], near=near[n])
    return out


# ---------------------------------------------------------------- mirror
def test_mirror_reflects_every_structure(any_scan):
    scan = any_scan
    mir, info = CF.mirror_scan(scan)
    before, after = _structs(scan.labels), _structs(mir.labels)
    x0 = info["plane_x_mm"]
    assert before["liver"].centroid[0] > before["spleen"].centroid[0]
    assert after["liver"].centroid[0] < after["spleen"].centroid[0]       # situs inversus
    assert len(after) == len(before)
    half = min(scan.labels.spacing) / 2
    for n, s in before.items():
        t = after[counterpart(n) or n]
        assert t.voxels == s.voxels, n                                     # volumes unchanged, voxel for voxel
        assert abs(t.centroid[0] - (2 * x0 - s.centroid[0])) < half and np.allclose(t.centroid[1:], s.centroid[1:], atol=half)
    # sided names agree with position again: every left structure is left of its right twin
    for n, s in after.items():
        if n.endswith("_left") or "_left_" in n:
            if counterpart(n) in after: assert s.centroid[0] < after[counterpart(n)].centroid[0], n
    assert mir.image.array.dtype == scan.image.array.dtype and mir.labels.array.dtype == scan.labels.array.dtype
    assert np.sign(np.linalg.det(mir.labels.affine)) == np.sign(np.linalg.det(scan.labels.affine))
    # the CT moves with the labels: each mirrored voxel holds the original voxel at the reflected position
    idx = np.argwhere(mir.labels.array == NAME_TO_ID["liver"])[::97]
    src = np.rint(scan.image.to_index(mir.image.to_world(idx) * (-1, 1, 1) + (2 * x0, 0, 0))).astype(int)
    assert np.array_equal(mir.image.array[tuple(idx.T)], scan.image.array[tuple(src.T)])
    print(f"{scan.scan_id}: plane x = {x0:.2f} mm, {len(before)} structures, swapped {len(info['swapped'])}, "
          f"unpaired sided {info['unpaired_sided']}; liver x {before['liver'].centroid[0]:.1f} -> {after['liver'].centroid[0]:.1f}")


def test_mirror_about_midline_and_labels_only(ts_scan):
    mir, info = CF.mirror_scan(ts_scan, about="midline")
    spine = [n for n in _structs(ts_scan.labels) if n.startswith("vertebrae_") or n == "spinal_cord"]
    assert spine and info["about"] == "midline"
    before, after = _structs(ts_scan.labels), _structs(mir.labels)
    for n in spine:                                  # the spine stays where it was (up to its own asymmetry)
        assert abs(after[n].centroid[0] - before[n].centroid[0]) < 2 * abs(before[n].centroid[0] - info["plane_x_mm"]) + 1e-6
    assert after["liver"].centroid[0] < info["plane_x_mm"] < after["spleen"].centroid[0]
    bare, _ = CF.mirror_scan(Scan("bare", ts_scan.labels, None))         # a label map without its CT
    assert bare.image is None and np.array_equal(bare.labels.array, _mirror_labels(ts_scan))


def _mirror_labels(scan):
    return CF.mirror_scan(scan)[0].labels.array


def test_mirror_written_files_measure_the_same(tmp_path, ts_scan):
    mir, info = CF.mirror_scan(ts_scan)
    write_volume(mir.labels, tmp_path / "labels.nii.gz")
    write_volume(mir.image, tmp_path / "image.nii.gz")
    back = read_scan(tmp_path / "labels.nii.gz", tmp_path / "image.nii.gz")
    assert back.labels.array.dtype == ts_scan.labels.array.dtype and back.image.array.dtype == ts_scan.image.array.dtype
    assert np.array_equal(back.image.array, mir.image.array) and np.array_equal(back.labels.array, mir.labels.array)
    mem = _structs(mir.labels)
    disk = _structs(back.labels)
    assert {n: s.voxels for n, s in mem.items()} == {n: s.voxels for n, s in disk.items()}
    for n in mem: assert np.allclose(mem[n].centroid, disk[n].centroid, atol=1e-6)
    # SimpleITK on the written file: voxel counts and mirrored centroids of the original
    sk = sitk_structures(tmp_path / "labels.nii.gz", info["label_names"])
    orig = _structs(ts_scan.labels)
    x0 = info["plane_x_mm"]
    for n, s in orig.items():
        t = sk[counterpart(n) or n]
        assert t.voxels == s.voxels
        assert np.allclose(t.centroid, (2 * x0 - s.centroid[0], *s.centroid[1:]), atol=1e-3), n


# ---------------------------------------------------------------- resize
@pytest.mark.parametrize("which", ["phantom", "s0001"])
def test_resize_scales_one_structure(which, phantom_scan, ts_scan):
    scan = {"phantom": phantom_scan, "s0001": ts_scan}[which]
    before = _structs(scan.labels)
    out, info = CF.resize_auto(scan)
    after = _structs(out.labels)
    t, f = info["target"], info["factor"]
    # the target's volume is factor³ times the original, to within a few voxels (the iso-level is chosen for it);
    # the benchmark's own volume tolerance (tol_volume) is the bound that matters: within it, answers are as intended
    want = before[t].volume_ml * f ** 3
    assert abs(after[t].volume_ml - want) <= 0.01 * want + 3 * scan.labels.voxel_volume_mm3 / 1000
    assert abs(after[t].volume_ml - want) <= tol_volume(want, round(before[t].voxels * f ** 3))
    assert np.allclose(after[t].centroid, before[t].centroid, atol=max(scan.labels.spacing))
    lost = 0
    for n, s in before.items():                     # everything else only loses what the target overwrote
        if n == t: continue
        gain = info["vacated_voxels"] if info["fill_label"] == n else 0
        assert (after[n].voxels if n in after else 0) == s.voxels - info["overwritten"].get(n, 0) + gain, n
        lost = max(lost, info["overwritten"].get(n, 0) / s.voxels)
    assert lost <= 0.2
    # CT: unchanged outside the old and new masks; inside the vacated rim it continues the surrounding tissue
    old, new = scan.labels.array == info["label"], out.labels.array == info["label"]
    assert np.array_equal(out.image.array[~(old | new)], scan.image.array[~(old | new)])
    if info["vacated_voxels"]:
        assert abs(info["fill_mean"] - info["ring_mean"]) < info["ring_sd"]
    print(f"{scan.scan_id}: {t} x{f:g} ({info['why']}): volume ratio {info['volume_ratio']:.4f} vs factor³ {f ** 3:.4f}, "
          f"overwritten {info['overwritten']} (largest share {lost:.1%}), vacated {info['vacated_voxels']} "
          f"-> {info['fill_label'] or 'background'}")


def test_resize_exact_factor_one_and_border(ts_scan):
    same, info = CF.resize_structure(ts_scan, "gallbladder", 1.0)
    assert np.array_equal(same.labels.array, ts_scan.labels.array) and np.array_equal(same.image.array, ts_scan.image.array)
    with pytest.raises(CF.CounterfactualError, match="border"):
        CF.resize_structure(ts_scan, "liver", 1.25)              # the liver is cut by the 30-slice field of view
    with pytest.raises(CF.CounterfactualError, match="no structure"):
        CF.resize_structure(ts_scan, "brain", 1.25)


# ---------------------------------------------------------------- pairs
def _tables(scan: Scan, **extra):
    t = structures_table(measure_labels(scan.labels.array, scan.labels.affine, components=False)).assign(scan_id=scan.scan_id)
    return t, {**scan_info(scan), **extra}


@pytest.fixture(scope="module")
def written(tmp_path_factory, phantom_scan, ts_scan):
    "Originals and their copies written to disk and measured by the measure stage's function; questions and pairs."
    d = tmp_path_factory.mktemp("cf")
    man = []
    for sc, src in ((phantom_scan, "phantom"), (ts_scan, "totalsegmentator")):
        (d / "orig" / sc.scan_id).mkdir(parents=True)
        write_volume(sc.labels, d / "orig" / sc.scan_id / "labels.nii.gz")
        write_volume(sc.image, d / "orig" / sc.scan_id / "image.nii.gz")
        man.append({"scan_id": sc.scan_id, "labels": f"{sc.scan_id}/labels.nii.gz", "image": f"{sc.scan_id}/image.nii.gz",
                    "source": src})
    write_json(man, d / "orig" / "scans.json")
    entries, rejected = CF.make_counterfactuals([d / "orig" / "scans.json"], d / "cf", phantoms=1, workers=0)
    assert rejected == [] and len(entries) == 4
    tab, scans, bad = measure_manifests([d / "orig" / "scans.json"], workers=0)
    ctab, cscans, cbad = measure_manifests([d / "cf" / "scans.json"], workers=0)
    assert bad == [] and cbad == []
    per = {"DIR": 40, "DIST": 40, "EXT": 20, "VOL": 30, "COMP": 30, "VOLEST": 15}
    # half of each original's questions involve its copy's resized structure (`focus`), so that resize pairs can flip
    focus = {e["original"]: [e["target"]] for e in entries if e.get("counterfactual") == "resize" and e.get("target")}
    recs = generate_questions(tab, seed=0, scans=scans, per_scan=per, focus=focus)
    pairs, dropped = CF.pair_questions(recs, ctab, cscans, originals=tab)
    return dict(dir=d, entries=entries, recs=recs, pairs=pairs, dropped=dropped, cscans=cscans)


def test_manifest_of_copies(written):
    d, entries = written["dir"], written["entries"]
    assert {e["scan_id"] for e in entries} == {"cf_test~mirror", "cf_test~resize", "s0001~mirror", "s0001~resize"}
    assert {e["source"] for e in entries} == {"phantom+mirror", "phantom+resize", "totalsegmentator+mirror",
                                              "totalsegmentator+resize"}
    assert read_json(d / "cf" / "scans.json") == entries
    for e in entries:
        lab = nib.load(d / "cf" / e["labels"])
        img = nib.load(d / "cf" / e["image"])
        orig = nib.load(d / "orig" / e["original"] / "labels.nii.gz")
        assert lab.get_data_dtype() == orig.get_data_dtype() and img.get_data_dtype() == np.int16
        assert np.allclose(lab.affine, img.affine)
        assert set(e["label_names"].values()) >= {"liver", "spleen"}
    cs = written["cscans"].set_index("scan_id")
    assert cs.loc["s0001~resize", "original"] == "s0001" and cs.loc["s0001~mirror", "counterfactual"] == "mirror"


def test_pairs_rederived_and_checked_with_simpleitk(written):
    pairs, recs = written["pairs"], {r["qid"]: r for r in written["recs"]}
    assert len(pairs) >= 150        # 163 with evenly spaced ladders (generator version 3; 200+ before)
    flips = [p for p in pairs if p["flipped"]]
    assert len(flips) >= 10, len(flips)
    # mirrored twins flip here; a resize targets only a structure large enough to ask about before and after
    # (counterfactual.askable_size: s0001's gallbladder, not its 4.7 mL adrenal gland), and whether its twins flip
    # depends on what the originals ask; every resized twin still re-derives below, and
    # test_resize_flips_in_the_pipeline finds the pipeline's resize flips
    assert "mirror" in {p["counterfactual"] for p in flips} and "resize" in {p["counterfactual"] for p in pairs}
    ent = {e["scan_id"]: e for e in written["entries"]}
    sk = {sid: sitk_structures(written["dir"] / "cf" / e["labels"], e["label_names"]) for sid, e in ent.items()}
    gaps_checked = 0
    for p in pairs:
        r = recs[p["pair_of"]]
        assert p["qid"] == p["pair_id"] == f"{r['qid']}~{p['counterfactual']}"
        assert (p["question"], p["options"], p["spec"]) == (r["question"], r["options"], r["spec"])
        assert p["source"] == ent[p["scan_id"]]["source"]
        # the answer again, from SimpleITK's measurements of the written copy
        st = sk[p["scan_id"]]
        if p["spec"].get("by") == "surface":          # edge-to-edge: SimpleITK's distance maps give the gaps
            e = ent[p["scan_id"]]
            st = sitk_gaps(written["dir"] / "cf" / e["labels"], e["label_names"], st, p["structures"])
            gaps_checked += 1
        ev = evaluate(p, [st])
        if p["format"] == "mc":
            assert ev["answer_letter"] == p["answer_letter"], p["qid"]
            assert p["flipped"] == (p["answer_letter"] != r["answer_letter"])
        else:
            assert math.isclose(ev["answer_value"], p["answer_value"], rel_tol=1e-9)
    assert gaps_checked >= 1, "no edge-to-edge twin: the SimpleITK gaps were never compared"
    # and for a sample, the answer derived directly from SimpleITK numbers, without the project's evaluate
    checked = 0
    for p in pairs:
        s = sk[p["scan_id"]]
        spec = p["spec"]
        if p["subtask"] == "VOLEST.absolute":
            assert math.isclose(s[spec["a"]].volume_ml, p["answer_value"], rel_tol=1e-9); checked += 1
        elif p["subtask"] == "VOLEST.ratio":
            assert math.isclose(s[spec["a"]].volume_ml / s[spec["b"]].volume_ml, p["answer_value"], rel_tol=1e-9); checked += 1
        elif p["subtask"] == "COMP.extreme":
            v = [s[k].volume_ml for k in spec["options"]]
            assert LETTERS[int(np.argmax(v) if spec["sense"] > 0 else np.argmin(v))] == p["answer_letter"]; checked += 1
        elif p["subtask"] == "DIR.extreme":
            ax, sg = {"right": (0, 1), "left": (0, -1), "anterior": (1, 1), "posterior": (1, -1), "superior": (2, 1),
                      "inferior": (2, -1)}[spec["direction"]]
            v = [sg * s[k].centroid[ax] for k in spec["options"]]
            assert LETTERS[int(np.argmax(v))] == p["answer_letter"]; checked += 1
        elif p["subtask"] == "DIST.value":
            v = (np.add(s[spec["a"]].bbox_min, s[spec["a"]].bbox_max) - np.add(s[spec["b"]].bbox_min, s[spec["b"]].bbox_max)) / 2
            d = np.linalg.norm(v[spec["axes"]] if "axes" in spec else v)      # in-plane when the scan cuts a structure
            assert math.isclose(d, p["answer_value"], rel_tol=1e-6); checked += 1
    assert checked >= 20, checked
    print(f"{len(pairs)} pairs from {len(recs)} questions, {len(flips)} flip "
          f"({sum(p['counterfactual'] == 'mirror' for p in flips)} mirror, {sum(p['counterfactual'] == 'resize' for p in flips)} resize); "
          f"{checked} answers derived directly from SimpleITK")


def test_mirror_drops_questions_whose_text_no_longer_fits(tmp_path):
    s = make_subject("cf_kid", seed=5, tumours={"kidney": 30.0})
    scan = Scan("cf_kid", s.labels, s.image)
    mir, info = CF.mirror_scan(scan)
    tab, sc = _tables(scan)
    ctab, csc = _tables(mir, original="cf_kid", counterfactual="mirror", source="phantom+mirror",
                        unpaired_sided=",".join(info["unpaired_sided"]))
    recs = generate_questions(tab, seed=0, scans=pd.DataFrame([sc]))
    pairs, dropped = CF.pair_questions(recs, ctab, pd.DataFrame([csc]))
    host = [r for r in recs if r.get("hosts", {}).get("kidney_tumor")]
    assert host and all(r["qid"] in set(dropped.qid) for r in host)     # "the tumour in the left kidney" moved
    assert dropped.reason.str.contains("no longer in").any()
    assert len(pairs) + len(dropped) == len(recs)


def test_pair_accuracy_oracle_and_prior(written):
    pairs = [p for p in written["pairs"] if p["format"] == "mc"]
    frame = pair_frame(pairs)
    assert len(frame) == 2 * len(pairs) and frame.groupby("pair_id").size().eq(2).all()
    truth = {**{r["qid"]: r for r in written["recs"]}, **{p["qid"]: p for p in pairs}}
    key = lambda q: truth[q]["answer_letter"]
    oracle = frame.assign(correct=True)
    # the strongest prior-only answerer: it knows the original's answer and gives it to the same question text
    prior = frame.assign(correct=[key(q) == key(truth[q].get("pair_of") or q) for q in frame.qid])
    res = pair_accuracy(pd.concat([oracle.assign(model="oracle"), prior.assign(model="prior")]), by="model")
    assert res.loc["oracle", "pair_accuracy"] == 1.0 and res.loc["oracle", "flip_pair_accuracy"] == 1.0
    assert res.loc["prior", "flip_pair_accuracy"] == 0.0
    assert res.loc["prior", "pair_accuracy"] == 1 - res.loc["prior", "flip_pairs"] / res.loc["prior", "pairs"]
    print(res)


def test_entry_point_selection_and_faults(tmp_path):
    make_cohort(tmp_path / "ph", n_subjects=3, seed=0, workers=0)
    recs = CF.read_manifests(tmp_path / "ph" / "cohort.json")
    assert all(CF.source_of(r) == "phantom" for r in recs)
    a = [r["scan_id"] for r in CF.select_scans(recs, 2, seed=0)]
    assert a == [r["scan_id"] for r in CF.select_scans(recs, 2, seed=0)] and len(a) == 2
    entries, rejected = CF.make_counterfactuals(tmp_path / "ph" / "cohort.json", tmp_path / "cf", kinds=["mirror"],
                                                phantoms=1, workers=0)
    assert len(entries) == 1 and entries[0]["original"] in a[:2] + [r["scan_id"] for r in recs]
    with pytest.raises(ValueError, match="unknown counterfactual kind"):
        CF.make_counterfactuals(tmp_path / "ph" / "cohort.json", tmp_path / "cf2", kinds=["rotate"])
    # a scan that cannot be read is rejected with the reason; the others carry on
    bad = [*read_json(tmp_path / "ph" / "cohort.json")[:1], {"scan_id": "broken", "labels": "nope.nii.gz", "source": "x"}]
    write_json(bad, tmp_path / "ph" / "bad.json")
    entries, rejected = CF.make_counterfactuals(tmp_path / "ph" / "bad.json", tmp_path / "cf3", kinds=["mirror"],
                                                phantoms=1, workers=0)
    assert len(entries) == 1 and rejected[0]["scan_id"] == "broken~mirror" and "no such file" in rejected[0]["error"]
    assert read_json(tmp_path / "cf3" / "rejected.json") == rejected


def test_stage_writes_what_dvc_declares(tmp_path, ts_scan):
    "The stage notebook, run as DVC runs it (papermill, the params of params.yaml), writes every declared output."
    import subprocess, sys, yaml
    root = Path(__file__).resolve().parents[1]
    stage = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["counterfactual"]
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert set(stage["params"]) == {"counterfactual", "generate.min_voxels", "executor"}
    (tmp_path / "raw" / "s0001").mkdir(parents=True)
    write_volume(ts_scan.labels, tmp_path / "raw" / "s0001" / "labels.nii.gz")
    write_json([{"scan_id": "s0001", "labels": "s0001/labels.nii.gz", "image": str(TS / "s0001" / "ct.nii.gz"),
                 "source": "totalsegmentator"}], tmp_path / "raw" / "scans.json")
    make_cohort(tmp_path / "phantom", n_subjects=2, seed=0, workers=0)
    p = params["counterfactual"]
    dirs = {"data/counterfactual": tmp_path / "data/counterfactual", "results/counterfactual": tmp_path / "results/counterfactual",
            "figures": tmp_path / "figures"}
    args = ["-p", "manifests", f"{tmp_path}/raw/scans.json,{tmp_path}/phantom/cohort.json", "-p", "kinds", p["kinds"],
            "-p", "factors", p["factors"], "-p", "phantoms", "1", "-p", "seed", str(p["seed"]), "-p", "about", str(p["about"]),
            "-p", "prefer", p["prefer"], "-p", "max_loss", str(p["max_loss"]),
            "-p", "min_voxels", str(params["generate"]["min_voxels"]), "-p", "workers", "0",
            "-p", "out", str(dirs["data/counterfactual"]), "-p", "results", str(dirs["results/counterfactual"]),
            "-p", "figures", str(dirs["figures"])]
    r = subprocess.run([sys.executable, "-m", "papermill", "--kernel", "spatialvqa", "--cwd", str(root), "--log-level",
                        "WARNING", "--no-progress-bar", str(root / stage["deps"][0]), str(tmp_path / "executed.ipynb"), *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    declared = [next(iter(o)) if isinstance(o, dict) else o for o in stage["outs"] + stage["metrics"]]
    for o in declared:
        if o.startswith("reports/"): continue
        top = next(k for k in dirs if o.startswith(k))
        assert (dirs[top] / o[len(top):].lstrip("/")).exists(), o
    man = read_json(dirs["data/counterfactual"] / "scans.json")
    assert {e["original"] for e in man} >= {"s0001"} and len({e["original"] for e in man}) == 2   # s0001 + 1 phantom
    summary = read_json(dirs["results/counterfactual"] / "summary.json")
    assert summary["copies"] == len(man) == 4 and summary["rejected"] == 0
    assert summary["resize_max_volume_error"] <= 0.1
    t, s, bad = measure_manifests([dirs["data/counterfactual"] / "scans.json"], workers=0)
    assert bad == [] and set(s.scan_id) == {e["scan_id"] for e in man}


def test_generate_stage_pairs(tmp_path, written):
    """The generate stage, run as DVC runs it on originals and copies measured together: questions about the originals
    only, each followed by its twins; far more twins flip than without `focus_share`/`flip_share`; every answer of
    twins and originals re-derived from the label maps (verify)."""
    import subprocess, sys, yaml
    from spatialvqa.core import read_jsonl
    root = Path(__file__).resolve().parents[1]
    stage = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["generate"]
    assert {"spatialvqa/counterfactual.py", "spatialvqa"} & set(stage["deps"]) and "results/benchmark/pairs.csv" in stage["outs"]
    d = written["dir"]
    tab, sc, _ = measure_manifests([d / "orig" / "scans.json", d / "cf" / "scans.json"], workers=0)
    tab.to_parquet(tmp_path / "structures.parquet"); sc.to_parquet(tmp_path / "scans.parquet")
    out = {k: tmp_path / k for k in ("bench", "results", "figures")}
    # without generate.margins: both copies resize an adrenal gland by 1.25 (a 'gland', whose inter-reader margin is a
    # factor 1.8 in volume), and no question robust to a second reader's contours flips under that (0 of ~30 resize
    # twins, also at 1.5); this test is about the pairing, tests/test_interreader.py about the margins
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["generate"].pop("margins", None)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["-p", "structures", str(tmp_path / "structures.parquet"), "-p", "scans", str(tmp_path / "scans.parquet"),
            "-p", "params_file", str(tmp_path / "params.yaml"),
            "-p", "per_scan", "DIR:8,DIST:8,EXT:6,VOL:6,COMP:6,VOLEST:3", "-p", "per_source", "",
            "-p", "out", str(out["bench"]), "-p", "results", str(out["results"]), "-p", "figures", str(out["figures"])]
    r = subprocess.run([sys.executable, "-m", "papermill", "--kernel", "spatialvqa", "--cwd", str(root), "--log-level",
                        "WARNING", "--no-progress-bar", str(root / stage["deps"][0]), str(tmp_path / "executed.ipynb"), *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = read_jsonl(out["bench"] / "questions.jsonl")
    copies = {e["scan_id"]: e for e in written["entries"]}
    originals = [x for x in recs if x["pair_of"] is None]
    assert {x["scan_id"] for x in originals} == {"cf_test", "s0001"}          # nothing is asked about a copy directly
    last = None
    for x in recs:                                                             # twins right after their original
        if x["pair_of"] is None: last = x["qid"]; continue
        assert x["pair_of"] == last and x["qid"] == f"{last}~{x['counterfactual']}" and x["scan_id"] in copies
        assert x["source"] == copies[x["scan_id"]]["source"] and CF.scan_family(x) == copies[x["scan_id"]]["original"]
    twins = [x for x in recs if x["pair_of"]]
    share = np.mean([x["flipped"] for x in twins])
    # the same copies, focus on the target only
    before = np.mean([p["flipped"] for p in written["pairs"]])
    s = read_json(out["results"] / "summary.json")
    pairs = pd.read_csv(out["results"] / "pairs.csv")
    print(f"{len(originals)} originals, {len(twins)} twins, {share:.0%} flip (without flip_share: {before:.0%})")
    assert s["verified"] and s["twins"] == len(twins) and s["flipped_twins"] == int(pairs.flipped.sum()) == sum(x["flipped"] for x in twins)
    # 53% against 27% (1.94x; 2x or more before DIR.host and the edge gaps, which flip on mirrored copies unasked)
    assert share >= max(0.25, 1.75 * before)
    # resize: see test_resize_flips_in_the_pipeline
    assert "mirror" in {x["counterfactual"] for x in twins if x["flipped"]}


def test_resize_flips_in_the_pipeline():
    """The committed pipeline run (results/tables/pair_accuracy.csv, the tables stage's): resized copies (of askable
    structures: parotids, kidneys, brainstem...) flip kept multiple-choice pairs too, and the oracle gets them right."""
    t = pd.read_csv(Path(__file__).resolve().parents[1] / "results" / "tables" / "pair_accuracy.csv")
    o = t[t.Model.str.startswith("Oracle")].set_index("Group")
    print(o[["Pairs", "Flip pairs"]].to_dict())
    # resizes flip volume answers (VOL, COMP, EXT), and with evenly spaced options (generator version 3) a blind answerer
    # picks most real volume options from the median patient, so the filter keeps few of them: 3 resize flip pairs on
    # main (143 mirror), 10 or more before
    assert o.loc["resize", "Flip pairs"] >= 3 and o.loc["mirror", "Flip pairs"] >= 10
    kinds = o.loc[["resize", "mirror", "ladder"], "Flip pairs"]
    assert kinds.sum() == o.loc["all", "Flip pairs"]
    # the ladder rungs flip volume keys (93 at 5dc9119; 27 at 509abad, where the parotid's 6.5 mL floor keeps the rungs
    # of small glands out and 12 parotids are cut by the sparse-slice crop; 10 at 62fafb9, whose draw keeps VOL 32)
    assert o.loc["ladder", "Flip pairs"] >= 8
    assert o.loc["resize", "Flip-pair acc."].startswith("100.0")


def test_ladder_rungs_move_the_volume_key_one_option(tmp_path, phantom_scan):
    """`ladders`: a real scan's structure grown and shrunk by the factors (one copy per rung), the generator told the
    rungs' ratio (`ladder_steps`): a VOL.closest question about it has options that ratio apart, and its twins on the
    rungs have their keys on the options just above and below, the text unchanged."""
    d = tmp_path
    (d / "orig").mkdir()
    write_volume(phantom_scan.labels, d / "orig" / "labels.nii.gz")
    write_json([{"scan_id": "lad", "labels": "labels.nii.gz", "source": "realish"}], d / "orig" / "scans.json")
    entries, rejected = CF.make_counterfactuals([d / "orig" / "scans.json"], d / "cf", kinds=[], ladders=1, workers=0)
    assert rejected == [] and len(entries) == 2 and {e["factor"] for e in entries} == set(CF.LADDER_FACTORS)
    target = entries[0]["target"]
    assert {e["scan_id"] for e in entries} == {f"lad~ladder-{target}-x{f:g}" for f in CF.LADDER_FACTORS}
    tab, scans, _ = measure_manifests([d / "orig" / "scans.json"], workers=0)
    ctab, cscans, _ = measure_manifests([d / "cf" / "scans.json"], workers=0)
    steps = CF.ladder_steps(cscans)
    assert set(steps) == {"lad"} and set(steps["lad"]) == {target} and 2.1 < steps["lad"][target] < 2.5
    recs = generate_questions(tab, seed=0, scans=scans, per_scan={"VOL": 40}, tasks=("VOL",), focus={"lad": [target]},
                              focus_share=1.0, steps=steps)
    asked = [r for r in recs if r["subtask"] == "VOL.closest" and r["spec"]["a"] == target]
    assert asked, "no VOL.closest question about the ladder's structure"
    pairs, _ = CF.pair_questions(asked, ctab, cscans, originals=tab)
    moved = 0
    for r in asked:
        vals = r["spec"]["options"]
        ratios = [max(a, b) / min(a, b) for a, b in zip(vals, vals[1:])]
        assert all(abs(x / steps["lad"][target] - 1) < 0.05 for x in ratios), (ratios, steps)   # shown: rounded
        k = LETTERS.index(r["answer_letter"])
        for p in (p for p in pairs if p["pair_of"] == r["qid"]):
            assert p["question"] == r["question"] and p["options"] == r["options"]
            grown = p["qid"].endswith(f"x{CF.LADDER_FACTORS[0]:g}")
            want = k + (1 if (vals[-1] > vals[0]) == grown else -1)
            assert LETTERS.index(p["answer_letter"]) == want and p["flipped"]
            moved += 1
    assert moved >= len(asked)
