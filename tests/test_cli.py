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
KEYS = ["label", "name", "voxels", "volume_ml", "centroid_ras_mm", "bbox_ras_mm", "extent_mm", "components", "stray_mm",
        "near_mm"]


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
    assert liver["components"] == 1 and liver["stray_mm"] == 0.0
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


TS_DICOM = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real-ct" / "totalsegmentator" / "dicom_example"


def test_measure_dicom_example_matches_simpleitk(tmp_path):
    """TotalSegmentator's DICOM example: the label map is stored LAS, the DICOM series LPS (same grid, axis j reversed).
    With `--image` every label's volume and RAS+ centroid equal SimpleITK's LabelShapeStatistics on the label map alone."""
    import SimpleITK as sitk
    assert (TS_DICOM / "seg.nii.gz").exists() and (TS_DICOM / "ct").is_dir(), \
        f"shared data missing: {TS_DICOM} (TotalSegmentator's dicom_example, see ../shared/README.md)"
    out = tmp_path / "m.json"
    r = run("measure", TS_DICOM / "seg.nii.gz", "--image", TS_DICOM / "ct", "--out", out)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["scan"]["axcodes"] == "LPS"            # on the DICOM's grid
    ours = {s["label"]: s for s in res["structures"]}
    f = sitk.LabelShapeStatisticsImageFilter()
    f.Execute(sitk.ReadImage(str(TS_DICOM / "seg.nii.gz")))
    assert sorted(ours) == sorted(f.GetLabels()) and len(ours) == 31
    for l in f.GetLabels():
        assert ours[l]["voxels"] == f.GetNumberOfPixels(l)
        assert ours[l]["volume_ml"] * 1000 == pytest.approx(f.GetPhysicalSize(l), rel=1e-6)
        lps = np.array(f.GetCentroid(l))
        np.testing.assert_allclose(ours[l]["centroid_ras_mm"], lps * [-1, -1, 1], rtol=0, atol=1e-4)
    # the liver lies at the patient's right of the spleen
    assert ours[5]["centroid_ras_mm"][0] > ours[1]["centroid_ras_mm"][0]


def test_measure_uint64_label_beyond_int64(tmp_path, lps_labels):
    import nibabel as nib
    path, a, aff = lps_labels
    big = a.astype(np.uint64)
    big[0, 0, 0] = 2**64 - 1
    nib.save(nib.Nifti1Image(big, aff, dtype=np.uint64), str(tmp_path / "u64.nii.gz"))
    r = run("measure", tmp_path / "u64.nii.gz", "--out", tmp_path / "o.json")
    assert r.returncode == 2 and "u64.nii.gz" in r.stderr and "above the largest supported label" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "negative" not in r.stderr


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


def test_fetch_totalsegmentator_from_mirror(tmp_path):
    "TotalSegmentator's 141 pinned files come verified from the mirror; one changed byte is refused."
    mirror = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    assert (mirror / "real-ct/totalsegmentator/LICENSE").exists(), f"shared data missing: {mirror}/real-ct/totalsegmentator"
    r = run("fetch", "totalsegmentator", "--out", tmp_path / "out", "--mirror", mirror, "--offline")
    assert r.returncode == 0, r.stderr
    recs = json.loads((tmp_path / "out/fetch_manifest.json").read_text())
    assert len(recs) == 141 and all(x["origin"].startswith("mirror:") for x in recs)
    segs = list((tmp_path / "out/real-ct/totalsegmentator/s0001/segmentations").iterdir())
    assert len(segs) == 117 and len(list((tmp_path / "out/real-ct/totalsegmentator/dicom_example/ct").iterdir())) == 20
    bad = tmp_path / "bad/real-ct/totalsegmentator"
    (bad / "s0001").mkdir(parents=True)
    raw = bytearray((mirror / "real-ct/totalsegmentator/s0001/ct.nii.gz").read_bytes()); raw[-1] ^= 1
    (bad / "s0001/ct.nii.gz").write_bytes(bytes(raw))
    r = run("fetch", "totalsegmentator", "--out", tmp_path / "out2", "--mirror", tmp_path / "bad", "--offline")
    assert r.returncode == 2 and "s0001/ct.nii.gz: checksum mismatch" in r.stderr and "Traceback" not in r.stderr
# --- start-up: each subcommand imports what it runs ----------------------------------------------------------------

HEAVY = ("pandas", "scipy.ndimage", "scipy.sparse", "scipy.spatial", "matplotlib", "torch", "sklearn",
         "sentence_transformers", "pyarrow", "transformers")


def modules_after(*args):
    "The modules loaded by a process that runs `spatialvqa *args` (through `cli.main`) and its exit status."
    code = ("import json, sys\nfrom spatialvqa.cli import main\ntry: rc = main(sys.argv[1:])\n"
            "except SystemExit as e: rc = e.code\nprint(json.dumps([rc, sorted(sys.modules)]))")
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "SPATIALVQA_PROGRESS": "0"})
    rc, mods = json.loads(r.stdout.splitlines()[-1])
    return rc, set(mods)


def test_help_imports_no_library(tmp_path):
    rc, mods = modules_after("--help")
    assert rc == 0
    assert not {m for m in mods if m.split(".")[0] in ("numpy", "nibabel", "yaml") or m.startswith(HEAVY)}, \
        sorted(m for m in mods if m.startswith(("numpy", "nibabel", *HEAVY)))[:10]


@pytest.mark.parametrize("command", ["infer", "ctsvqa-jury", "ctsvqa-text", "ctsvqa-judge", "validate", "reviews", "export",
                                     "convert", "views", "report-qa", "ctrate-download", "check-params", "fetch", "phantom"])
def test_subcommand_help_imports_no_model_stack(command):
    "A subcommand's --help loads its own module, never torch, transformers, scikit-learn, sentence-transformers or faiss."
    rc, mods = modules_after(command, "--help")
    assert rc == 0
    heavy = ("torch", "transformers", "sklearn", "sentence_transformers", "faiss", "llama_cpp", "gguf")
    assert not {m for m in mods if m.split(".")[0] in heavy}, sorted(m for m in mods if m.split(".")[0] in heavy)[:10]


def test_measure_imports_only_what_it_needs(tmp_path, lps_labels):
    path, a, aff = lps_labels
    rc, mods = modules_after("measure", path, "--out", tmp_path / "m.json")
    assert rc == 0 and (tmp_path / "m.json").exists()
    assert {"numpy", "cc3d", "spatialvqa.measure"} <= mods
    # a plain .nii.gz is read without nibabel; the neighbours' gaps (measure.with_near) need scipy.ndimage and .spatial
    # (which loads scipy.sparse)
    unneeded = (*(h for h in HEAVY if not h.startswith("scipy.")), "pydicom", "nibabel")
    assert not {m for m in mods if f"{m}.".startswith(unneeded)}, sorted(m for m in mods if f"{m}.".startswith(unneeded))
    rc, mods = modules_after("measure", path, "--no-components", "--out", tmp_path / "m2.json")
    assert rc == 0 and "cc3d" not in mods


def test_measure_dicom_series_labels(tmp_path, lps_labels):
    "nibabel is loaded without pydicom, which still reads a label map stored as a DICOM series: same structures."
    from spatialvqa.scan import write_dicom_series
    path, a, aff = lps_labels
    folder = write_dicom_series(Volume(a, aff), tmp_path / "series")
    r = run("measure", folder, "--out", tmp_path / "d.json")
    assert r.returncode == 0, r.stderr
    r = run("measure", path, "--out", tmp_path / "n.json")
    assert r.returncode == 0, r.stderr
    d, n = (json.loads((tmp_path / f).read_text())["structures"] for f in ("d.json", "n.json"))
    assert [(s["label"], s["voxels"], s["components"]) for s in d] == [(s["label"], s["voxels"], s["components"]) for s in n]
    np.testing.assert_allclose([s["centroid_ras_mm"] for s in d], [s["centroid_ras_mm"] for s in n], atol=1e-4)


def test_help_lists_every_subcommand_without_importing_them():
    "The listing built from `_PLUGINS` is the full parser's, and a plugin's own help has its arguments."
    from spatialvqa.cli import parser
    r = run("--help")
    assert r.returncode == 0 and r.stdout == parser().format_help()
    r = run("validate", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: spatialvqa validate") and "--out" in r.stdout
    r = run("no-such-command")
    assert r.returncode == 2 and "invalid choice: 'no-such-command'" in r.stderr and "views" in r.stderr


def test_generate_with_nothing_to_ask_fails_and_writes_nothing(tmp_path, lps_labels):
    "Two measured boxes give no question: status 2 with why, not status 0 and nine empty files."
    path, _, _ = lps_labels
    assert run("measure", path, "--out", tmp_path / "m.json").returncode == 0
    r = run("generate", "--structures", tmp_path / "m.json", "--out", tmp_path / "g")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "m.json: no question could be asked of these structures" in r.stderr and "nothing written" in r.stderr
    assert not (tmp_path / "g").exists()


def test_phantoms_in_totalsegmentator_layout_are_never_recorded_as_its_patients(tmp_path):
    "The phantom command marks the cases it writes; convert then records them as phantoms, under the phantoms' licence."
    r = run("phantom", "-n", 1, "--layout", "totalsegmentator", "--workers", 0, "--out", tmp_path / "ts")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "ts" / "spatialvqa-phantoms.json").read_text())["cases"] == ["s0001"]
    before = (tmp_path / "ts" / "s0001" / "ct.nii.gz").read_bytes()
    r = run("phantom", "-n", 1, "--layout", "totalsegmentator", "--workers", 0, "--seed", 5, "--out", tmp_path / "ts")
    assert r.returncode == 2 and "already holds" in r.stderr, r.stderr[-2000:]
    assert (tmp_path / "ts" / "s0001" / "ct.nii.gz").read_bytes() == before
    r = run("convert", "totalsegmentator", tmp_path / "ts", "--workers", 0, "--out", tmp_path / "c")
    assert r.returncode == 0, r.stderr[-2000:]
    recs = json.loads((tmp_path / "c" / "scans.json").read_text())
    assert [(x["source"], x["licence"]) for x in recs] == [("phantom", "Apache-2.0 (generated by spatialvqa)")]
    r = run("convert", "totalsegmentator", tmp_path / "ts", "--workers", 0, "--name", "my_ts", "--out", tmp_path / "c2")
    assert r.returncode == 2 and "spatialvqa's phantoms" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "c2" / "scans.json").exists()
