"""Acceptance of the foundation: one physical phantom stored in every orientation measures the same in RAS+,
the liver always lies to the patient's right of the spleen, and our numbers equal SimpleITK's."""
import numpy as np
import pytest
import SimpleITK as sitk

from spatialvqa.measure import direction, measure_file
from spatialvqa.phantom.subject import make_subject, orientations, write_subject

LPS = np.array([-1.0, -1.0, 1.0])  # RAS = LPS * (-1, -1, 1)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    "One coarse phantom (with tumours) written in all 12 orientations, alternating NIfTI and NRRD."
    subj = make_subject("orient", seed=7, tumours=True, spacing=(3.0, 3.0, 5.0))
    root = tmp_path_factory.mktemp("orient")
    out = {}
    for n, name in enumerate(orientations()):
        fmt = ("nii.gz", "nrrd")[n % 2]
        rec = write_subject(subj, root / name, orientation=name, fmt=fmt)
        out[name] = root / name / rec["labels"]
    return subj, out


def by_label(res): return {s["label"]: s for s in res["structures"]}


def test_at_least_eight_orientations(stored):
    _, files = stored
    assert len(files) >= 8
    axcodes = {measure_file(p, components=False)["scan"]["axcodes"].__str__() for p in files.values()}
    assert len(axcodes) >= 8, axcodes


def test_same_measures_in_every_orientation(stored):
    subj, files = stored
    results = {name: by_label(measure_file(p)) for name, p in files.items()}
    ref = results["RAS"] if "RAS" in results else next(iter(results.values()))
    spacing = np.array(subj.labels.spacing)
    for name, res in results.items():
        assert res.keys() == ref.keys(), name
        for lab, s in res.items():
            r = ref[lab]
            assert s["voxels"] == r["voxels"] and s["components"] == r["components"], (name, lab)
            assert s["volume_ml"] == pytest.approx(r["volume_ml"], rel=1e-9)
            # "to within a voxel": here they agree to rounding, far inside one voxel
            assert np.all(np.abs(np.subtract(s["centroid_ras_mm"], r["centroid_ras_mm"])) < 1e-6 * 1000), (name, lab)
            assert np.all(np.abs(np.subtract(s["bbox_ras_mm"], r["bbox_ras_mm"])) <= spacing.max() * 1e-6 + 1e-6)


def test_liver_right_of_spleen_in_every_orientation(stored):
    _, files = stored
    for name, p in files.items():
        res = by_label(measure_file(p, components=False))
        liver, spleen = res[5], res[1]
        assert liver["centroid_ras_mm"][0] > spleen["centroid_ras_mm"][0], name
        assert res[2]["centroid_ras_mm"][0] > res[3]["centroid_ras_mm"][0], name  # kidney_right at larger x


def test_measures_equal_truth(stored):
    subj, files = stored
    truth = subj.truth["structures"]
    res = by_label(measure_file(files["LPS"] if "LPS" in files else next(iter(files.values())), components=False))
    names = {s["name"]: s for s in res.values()}
    for name in ("liver", "spleen", "kidney_right", "heart", "aorta"):
        t = truth[name]
        assert names[name]["voxels"] == t["voxels"]
        # the truth is rounded to 1e-3 mm and 1e-2 mL
        np.testing.assert_allclose(names[name]["centroid_ras_mm"], t["centroid_mm"], atol=1e-3)
        np.testing.assert_allclose(names[name]["bbox_ras_mm"], t["bbox_mm"], atol=1e-3)
        assert names[name]["volume_ml"] == pytest.approx(t["volume_ml"], abs=0.01)


def sitk_stats(path):
    f = sitk.LabelShapeStatisticsImageFilter()
    f.ComputePerimeterOff()
    f.Execute(sitk.ReadImage(str(path)))
    return {int(l): (f.GetNumberOfPixels(l), f.GetPhysicalSize(l) / 1000.0, np.array(f.GetCentroid(l)) * LPS)
            for l in f.GetLabels()}


@pytest.mark.parametrize("name", ["LPS", "RAS", "SRA", "PSR"])
def test_phantom_matches_simpleitk(stored, name):
    "Volumes and centroids equal SimpleITK's LabelShapeStatistics (LPS converted to RAS) to 1e-6 relative."
    _, files = stored
    assert name in files, f"phantom.orientations() no longer has {name}"
    ours = by_label(measure_file(files[name], components=False))
    ref = sitk_stats(files[name])
    assert ours.keys() == ref.keys()
    for lab, (n, vol, cen) in ref.items():
        assert ours[lab]["voxels"] == n
        assert ours[lab]["volume_ml"] == pytest.approx(vol, rel=1e-6)
        np.testing.assert_allclose(ours[lab]["centroid_ras_mm"], cen, rtol=1e-6, atol=1e-6)


def test_directions_agree_across_orientations(stored):
    from spatialvqa.measure import measure_labels
    from spatialvqa.scan import read_labels
    _, files = stored
    dirs = set()
    for p in files.values():
        v = read_labels(p)
        s = {x.name: x for x in measure_labels(v.array, v.affine, components=False)}
        dirs.add((direction(s["liver"], s["spleen"]), direction(s["heart"], s["urinary_bladder"]),
                  direction(s["aorta"], s["vertebrae_L1"])))
    assert len(dirs) == 1 and next(iter(dirs))[:2] == ("right", "superior"), dirs
