"""The scanned slab of a real OpenKBP patient (spatialvqa.openkbp.scanned_slab): end slices that store only a patch of
CT around a structure are no part of the scan, so a structure lying on them reaches the grid's face and is cut.

pt_218 stores about 70 CT voxels on each of its top 11 slices (around the brainstem) and about 25 on each of its bottom
39 (around the spinal cord), against 1,000-2,400 on a scanned slice; 4 slices of its mandible lie on the sparse top."""
import numpy as np

from spatialvqa.anatomy import NAME_TO_ID
from spatialvqa.convert.openkbp import convert_openkbp
from spatialvqa.core import shared_data, write_json
from spatialvqa.measure import measure_manifests
from spatialvqa.openkbp import read_patient, read_sparse
from spatialvqa.questions.generate import contexts_from_tables

PT_218 = ("real-ct", "openkbp", "provided-data", "validation-pats", "pt_218")


def test_sparse_end_slices_are_beyond_the_scan():
    folder = shared_data(*PT_218)
    per_slice = np.bincount(read_sparse(folder / "ct.csv.gz")[0] % 128, minlength=128)
    assert (np.flatnonzero(per_slice)[[0, -1]] == [29, 127]).all()            # CT stored on slices 29-127 ...
    assert per_slice[29:40].max() < 100 and per_slice[88:].max() < 100 and per_slice[40:88].min() > 1000
    p = read_patient(folder)                                                   # ... but scanned on 40-87 only
    assert p.slab == (40, 87) and p.ct.shape == (128, 128, 48)
    jaw = np.argwhere(p.labels.array == NAME_TO_ID["mandible"])
    assert jaw[:, 2].min() == 0                                                # the mandible reaches the top face
    raw = read_sparse(folder / "Mandible.csv.gz")[0] % 128
    assert (raw < 40).sum() > 0 and p.beyond >= (raw < 40).sum()               # its voxels above the scan dropped
    assert p.voxels["mandible"] == len(raw) == len(jaw) + (raw < 40).sum()


def test_the_mandible_the_scan_cuts_is_counted_cut(tmp_path):
    recs = convert_openkbp(shared_data(*PT_218), tmp_path / "scans", workers=0)
    assert recs[0]["grid_slices"] == "40-87" and recs[0]["label_voxels_beyond_scan"] > 0
    table, scans, rejected = measure_manifests(write_json(recs, tmp_path / "scans.json"), workers=0)
    assert rejected == []
    cut = contexts_from_tables(table, scans)["openkbp_pt_218"].cut
    assert cut.get("mandible") == frozenset({2}), cut                       # cut along superior-inferior only
    assert cut.get("brainstem") == frozenset({2}), cut                      # it too runs past the scan's top
