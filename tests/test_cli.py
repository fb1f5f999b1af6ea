"""The `spatialvqa` command end to end: the measure JSON contract, bad input, and batches that carry on."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spatialvqa.core import shared_data
from spatialvqa.scan import Volume, write_volume

EXE = [str(Path(sys.executable).parent / "spatialvqa")]  # the installed console script
KEYS = ["label", "name", "voxels", "volume_ml", "centroid_ras_mm", "bbox_ras_mm", "extent_mm", "components"]


def run(*args, cwd=None):
    env = {**os.environ, "SPATIALVQA_PROGRESS": "0"}
    return subprocess.run([*EXE, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.fixture
def lps_labels(tmp_path):
    "Two boxes in a 2x2x3 mm LPS-stored grid: liver (5) at patient's right, spleen (1) at left, and label 150."
    a = np.zeros((20, 12, 10), np.uint8)
    a[2:6, 3:9, 2:8] = 5        # low i = patient's right in LPS storage (x_RAS = -x_LPS)
    a[14:18, 3:7, 4:6] = 1
    a[10, 10, 9] = 150           # an id outside TotalSegmentator's 117 classes
    aff = np.diag([-2.0, -2.0, 3.0, 1.0]); aff[:3, 3] = [100, 50, -40]   # LPS storage seen in RAS
    return write_volume(Volume(a, aff), tmp_path / "labels.nii.gz"), a, aff


def test_measure_contract(tmp_path, lps_labels):
    path, a, aff = lps_labels
    out = tmp_path / "m.json"
    r = run("measure", path, "--out", out)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert set(res) >= {"scan", "structures"}
    s = {x["label"]: x for x in res["structures"]}
    assert [x["label"] for x in res["structures"]] == [1, 5, 150]
    for x in res["structures"]: assert list(x) == KEYS
    assert (s[1]["name"], s[5]["name"], s[150]["name"]) == ("spleen", "liver", "label_150")
    liver = s[5]
    assert liver["voxels"] == 4 * 6 * 6
    assert liver["volume_ml"] == pytest.approx(4 * 6 * 6 * 12 / 1000)
    # centroid: mean of voxel-centre world coordinates, computed here by brute force
    ijk = np.argwhere(a == 5)
    xyz = ijk @ aff[:3, :3].T + aff[:3, 3]
    assert liver["centroid_ras_mm"] == pytest.approx(xyz.mean(0).tolist())
    np.testing.assert_allclose(liver["bbox_ras_mm"], [xyz.min(0), xyz.max(0)], rtol=1e-12)
    assert liver["extent_mm"] == pytest.approx(dict(zip(("lr", "ap", "si"), (xyz.max(0) - xyz.min(0)).tolist())))
    assert liver["components"] == 1
    # the liver lies at the patient's right of the spleen: larger x in RAS
    assert liver["centroid_ras_mm"][0] > s[1]["centroid_ras_mm"][0]


def test_measure_with_image(tmp_path, lps_labels):
    path, a, aff = lps_labels
    img = write_volume(Volume(np.full(a.shape, -1000, np.int16), aff), tmp_path / "ct.nrrd")
    r = run("measure", path, "--image", img, "--out", tmp_path / "m.json")
    assert r.returncode == 0, r.stderr
    bad = write_volume(Volume(np.zeros((20, 12, 9), np.int16), aff), tmp_path / "small.nii.gz")
    r = run("measure", path, "--image", bad, "--out", tmp_path / "m2.json")
    assert r.returncode != 0 and "shape" in r.stderr and "small.nii.gz" in r.stderr
    assert not (tmp_path / "m2.json").exists()


@pytest.mark.parametrize("case", ["garbage", "truncated", "empty_labels", "float_labels", "twod"])
def test_measure_bad_input(tmp_path, lps_labels, case):
    path, a, aff = lps_labels
    f = tmp_path / f"{case}.nii.gz"
    if case == "garbage": f.write_bytes(b"\x00garbage" * 10)
    elif case == "truncated":
        raw = Path(path).read_bytes()
        f.write_bytes(raw[: len(raw) // 2])
    elif case == "empty_labels": write_volume(Volume(np.zeros_like(a), aff), f)
    elif case == "float_labels": write_volume(Volume(a.astype(np.float32) + 0.5, aff), f)
    elif case == "twod":
        import nibabel as nib
        nib.save(nib.Nifti1Image(a[:, :, 0], np.eye(4)), f)
    r = run("measure", f, "--out", tmp_path / "o.json")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f.name in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o.json").exists()


def test_measure_missing_file(tmp_path):
    r = run("measure", tmp_path / "nope.nii.gz", "--out", tmp_path / "o.json")
    assert r.returncode == 2 and "nope.nii.gz" in r.stderr


def test_batch_carries_on_past_bad_scans(tmp_path, lps_labels):
    "A manifest with broken scans: they are rejected with their reason, the good ones are measured."
    from spatialvqa.core import write_json
    from spatialvqa.measure import measure_manifests
    path, a, aff = lps_labels
    (tmp_path / "broken.nii.gz").write_bytes(b"broken")
    write_volume(Volume(np.zeros_like(a), aff), tmp_path / "empty.nii.gz")
    manifest = write_json([
        dict(scan_id="good", labels=str(path)),
        dict(scan_id="broken", labels=str(tmp_path / "broken.nii.gz")),
        dict(scan_id="empty", labels=str(tmp_path / "empty.nii.gz")),
        dict(scan_id="missing", labels=str(tmp_path / "missing.nii.gz")),
        dict(scan_id="good_too", labels=str(path), image=None)], tmp_path / "scans.json")
    table, scans, rejected = measure_manifests([manifest], workers=2)
    assert sorted(scans.scan_id) == ["good", "good_too"]
    assert sorted(table.scan_id.unique()) == ["good", "good_too"]
    rej = {r["scan_id"]: r["error"] for r in rejected}
    assert sorted(rej) == ["broken", "empty", "missing"]
    assert "broken.nii.gz" in rej["broken"] and "foreground" in rej["empty"]


def test_fetch_cli_from_mirror(tmp_path):
    "`spatialvqa fetch` copies verified files from a mirror; a tampered mirror is refused."
    mirror = shared_data()
    # a partial mirror holding only the small files: the rest must then be downloaded, which we forbid
    part = tmp_path / "mirror/real-ct/pyradiomics"; part.mkdir(parents=True)
    for f in ("lung1_label.nrrd", "lung2_label.nrrd", "LICENSE.txt"): (part / f).write_bytes((mirror / "real-ct/pyradiomics" / f).read_bytes())
    r = run("fetch", "pyradiomics", "--out", tmp_path / "out", "--mirror", tmp_path / "mirror", "--offline")
    assert r.returncode == 2 and "lung1_image.nrrd" in r.stderr and "online fetching disabled" in r.stderr
    assert (tmp_path / "out/real-ct/pyradiomics/lung1_label.nrrd").exists()
    (part / "lung2_label.nrrd").write_bytes(b"tampered")
    r = run("fetch", "pyradiomics", "--out", tmp_path / "out2", "--mirror", tmp_path / "mirror", "--offline")
    assert r.returncode == 2 and "checksum mismatch" in r.stderr
