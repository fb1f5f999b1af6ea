"""Benchmark: every structure of a 512 x 512 x 400 label map with 117 labels, measured three ways.

    .venv/bin/python benchmarks/bench_measure.py [--shape 512 512 400] [--repeats 5] [--loop-repeats 3]

1. a per-label loop, `np.nonzero(labels == k)` for each label (count, centroid, bounding box), as per-organ
   scripts do;
2. SimpleITK's `LabelShapeStatisticsImageFilter`, with its defaults (which include the perimeter) and with the
   perimeter off (then it computes what we compute: the reference of the ratio column);
3. `spatialvqa.measure.measure_labels`, without and with connected components.

All methods run on the same label map in the same process and are timed side by side (median of `--repeats`,
interleaved so that machine noise hits all alike). Peak memory is measured for each method in a fresh
subprocess that only loads the label map (NumPy from `.npy`, SimpleITK from `.mha`): the rise of the resident
set's high-water mark (reset through `/proc/self/clear_refs`) while the method runs, which sees SimpleITK's C++
allocations too; NumPy's own peak from `tracemalloc` is printed alongside for the NumPy methods. Values are
checked against `spatialvqa.measure`: voxel counts exactly, volumes and centroids to 1e-6 relative, boxes to
1e-6 mm; components against `scipy.ndimage.label` on each structure's crop.

The label map is stored like nibabel returns a NIfTI (Fortran order: the first index fastest) with a typical
CT affine (0.8 x 0.8 x 1.5 mm, LPS storage); SimpleITK gets the same bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

AFFINE = np.array([[-0.8, 0, 0, 204.4], [0, -0.8, 0, 210.0], [0, 0, 1.5, -720.0], [0, 0, 0, 1.0]])
METHODS = {
    "loop": "per-label loop: `np.nonzero(labels == k)`",
    "sitk_default": "SimpleITK LabelShapeStatistics (defaults, with perimeter)",
    "sitk": "SimpleITK LabelShapeStatistics (perimeter off)",
    "ours": "spatialvqa `measure_labels(components=False)`",
    "ours_cc": "spatialvqa `measure_labels()` (+ components, 26-conn.)",
}


# --- the label map -------------------------------------------------------------------------------------------------

def make_labels(shape=(512, 512, 400), n_labels=117, seed=0, f=4) -> np.ndarray:
    """A deterministic organ-like partition: Voronoi cells of seeds inside an ellipsoidal body, each label its own
    cell (six labels own a second, separate cell: paired organs), warped smoothly at full resolution so boundaries
    cut rows at arbitrary voxels; background outside the body. uint8, Fortran order."""
    from scipy.spatial import cKDTree
    rng = np.random.default_rng(seed)
    cs = tuple(-(-s // f) for s in shape)
    n_cells = n_labels + 6
    d = rng.normal(size=(n_cells, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    c = (np.array(cs) - 1) / 2
    seeds = c + d * rng.uniform(0, 1, (n_cells, 1)) ** (1 / 3) * 0.85 * c
    cell_label = np.r_[np.arange(1, n_labels + 1), rng.choice(np.arange(1, n_labels + 1), 6, replace=False)]
    g = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float32) for n in cs], indexing="ij"), -1).reshape(-1, 3)
    _, idx = cKDTree(seeds).query(g, workers=-1)
    coarse = cell_label[idx].astype(np.uint8)
    coarse[(((g - c) / (c * 0.97)) ** 2).sum(1) > 1] = 0
    coarse = coarse.reshape(cs)
    I, J, K = shape
    out = np.empty(shape, np.uint8, order="F")
    jj, kk = np.arange(J, dtype=np.float32)[:, None], np.arange(K, dtype=np.float32)[None, :]
    for i in range(I):
        ci = np.clip(((i + 3 * np.sin(jj / 23 + kk / 31)) / f).astype(np.int32), 0, cs[0] - 1)
        cj = np.clip(((jj + 3 * np.sin(kk / 19 + i / 29)) / f).astype(np.int32), 0, cs[1] - 1)
        ck = np.clip(((kk + 3 * np.sin(i / 17 + jj / 27)) / f).astype(np.int32), 0, cs[2] - 1)
        out[i] = coarse[ci, cj, ck]
    present = np.unique(coarse)
    assert len(present) == n_labels + 1, f"only {len(present) - 1} labels present"
    return out


def sitk_image(labels: np.ndarray):
    "The same bytes as a SimpleITK image (ITK index x = array axis 0) with the affine's geometry in LPS."
    import SimpleITK as sitk
    img = sitk.GetImageFromArray(labels.T)  # labels.T: C-contiguous view, axes (z, y, x) as SimpleITK expects
    lps = np.diag([-1.0, -1.0, 1.0]) @ AFFINE[:3, :3]
    sp = np.linalg.norm(lps, axis=0)
    img.SetSpacing(sp.tolist())
    img.SetDirection((lps / sp).ravel().tolist())
    img.SetOrigin((np.diag([-1.0, -1.0, 1.0]) @ AFFINE[:3, 3]).tolist())
    return img


# --- the methods: each returns {label: (voxels, volume_ml, centroid RAS, box min RAS, box max RAS)} -----------------

def _world(ijk):
    return np.asarray(ijk, float) @ AFFINE[:3, :3].T + AFFINE[:3, 3]


def _box(lo, hi):
    corners = _world([[a, b, c] for a in (lo[0], hi[0]) for b in (lo[1], hi[1]) for c in (lo[2], hi[2])])
    return corners.min(0), corners.max(0)


def run_loop(labels, n_labels=117):
    vox_ml = abs(np.linalg.det(AFFINE[:3, :3])) / 1000
    c = labels.T  # C-contiguous, so `nonzero` takes its fast path; indices come back as (k, j, i)
    out = {}
    for k in range(1, n_labels + 1):
        idx = np.nonzero(c == k)[::-1]
        if not len(idx[0]): continue
        lo, hi = [int(a.min()) for a in idx], [int(a.max()) for a in idx]
        out[k] = (len(idx[0]), len(idx[0]) * vox_ml, _world([a.mean() for a in idx]), *_box(lo, hi))
    return out


def run_sitk(img, perimeter=True):
    import SimpleITK as sitk
    f = sitk.LabelShapeStatisticsImageFilter()
    f.SetComputePerimeter(perimeter)
    f.Execute(img)
    out = {}
    for l in f.GetLabels():
        bb = f.GetBoundingBox(l)
        lo, hi = bb[:3], [bb[n] + bb[n + 3] - 1 for n in range(3)]
        out[l] = (f.GetNumberOfPixels(l), f.GetPhysicalSize(l) / 1000,
                  np.array(f.GetCentroid(l)) * [-1, -1, 1], *_box(lo, hi))
    return out


def run_ours(labels, components=False):
    from spatialvqa.measure import measure_labels
    ss = measure_labels(labels, AFFINE, components=components)
    return {s.label: (s.voxels, s.volume_ml, np.array(s.centroid), np.array(s.bbox_min), np.array(s.bbox_max), s.components)
            for s in ss}


def run(method, labels=None, img=None):
    if method == "loop": return run_loop(labels)
    if method == "sitk_default": return run_sitk(img, True)
    if method == "sitk": return run_sitk(img, False)
    return run_ours(labels, components=method == "ours_cc")


def same(got: dict, ref: dict) -> tuple[bool, str]:
    "Counts exact, volumes and centroids to 1e-6 relative, boxes to 1e-6 mm."
    if sorted(got) != sorted(ref): return False, f"labels differ: {sorted(set(got) ^ set(ref))[:5]}"
    for l, (n, ml, c, lo, hi, *_) in got.items():
        rn, rml, rc, rlo, rhi, *_ = ref[l]
        if n != rn: return False, f"label {l}: {n} voxels vs {rn}"
        if abs(ml - rml) > 1e-6 * rml: return False, f"label {l}: volume {ml} vs {rml}"
        if np.any(np.abs(c - rc) > 1e-6 * np.maximum(1, np.abs(rc))): return False, f"label {l}: centroid {c} vs {rc}"
        if np.any(np.abs(np.r_[lo, hi] - np.r_[rlo, rhi]) > 1e-6): return False, f"label {l}: box differs"
    return True, ""


def components_ok(labels, ours) -> tuple[bool, str]:
    "Components of each structure against `scipy.ndimage.label` (26-connectivity) on its crop."
    from scipy import ndimage
    from spatialvqa.measure import measure_labels
    for s in measure_labels(labels, AFFINE, components=False):
        crop = labels[tuple(slice(a, b + 1) for a, b in zip(s.index_min, s.index_max))] == s.label
        n = ndimage.label(crop, np.ones((3, 3, 3)))[1]
        if n != ours[s.label][5]: return False, f"label {s.label}: {ours[s.label][5]} components vs {n}"
    return True, ""


# --- peak memory in a fresh process -----------------------------------------------------------------------------

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field): return int(line.split()[1])
    return -1


def child(method: str, work: Path) -> None:
    "Load the label map, warm up, then report the rise of peak RSS (and NumPy's traced peak) while `method` runs."
    labels = img = None
    if method.startswith("sitk"):
        import SimpleITK as sitk
        img = sitk.ReadImage(str(work / "labels.mha"))
        run_sitk(sitk.Image(8, 8, 8, sitk.sitkUInt8) + 1, method == "sitk_default")  # load the filter's code
    else:
        labels = np.load(work / "labels.npy")
        if method.startswith("ours"): run_ours(labels[:8], method == "ours_cc")   # imports, thread pool
    base = _status_kb("VmRSS:")
    try:
        with open("/proc/self/clear_refs", "w") as f: f.write("5")  # reset the high-water mark to now
        hwm = "VmHWM:"
    except OSError:
        hwm = None
    run(method, labels, img)
    peak = _status_kb(hwm) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"rss_extra": (peak - base) * 1024, "rss_reset": hwm is not None}
    if labels is not None:
        tracemalloc.start()
        run(method, labels, img)
        out["traced_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    print(json.dumps(out))


def memory(method: str, work: Path) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", method, "--work", str(work)], capture_output=True, text=True)
    if r.returncode: raise RuntimeError(f"memory child for {method} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# --- main --------------------------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", type=int, nargs=3, default=(512, 512, 400))
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each method (median reported)")
    p.add_argument("--loop-repeats", type=int, default=3, help="timed runs of the (slow) per-label loop")
    p.add_argument("--child")
    p.add_argument("--work")
    a = p.parse_args(argv)
    if a.child: return child(a.child, Path(a.work))
    import SimpleITK as sitk
    import spatialvqa

    load0 = f"{os.getloadavg()[0]:.2f}"
    t = time.perf_counter()
    labels = make_labels(tuple(a.shape))
    img = sitk_image(labels)
    print(f"label map {labels.shape} {labels.dtype} ({labels.nbytes / 2**20:.0f} MiB, Fortran order), "
          f"{len(np.unique(labels[::4, ::4, ::4])) - 1} labels, {np.mean(labels == 0):.0%} background; "
          f"built in {time.perf_counter() - t:.1f} s", flush=True)

    results, times = {}, {m: [] for m in METHODS}
    for m in METHODS:
        if m != "loop": run(m, labels, img)  # warm up (the loop is too slow to run twice more)
    for r in range(a.repeats):
        todo = [m for m in METHODS if m != "loop" or r < a.loop_repeats]
        for m in todo:
            t = time.perf_counter()
            results[m] = run(m, labels, img)
            times[m].append(time.perf_counter() - t)
        print(f"repeat {r + 1}: " + ", ".join(f"{m} {times[m][-1]:.3f} s" for m in todo), flush=True)
    med = {m: statistics.median(v) for m, v in times.items()}

    ok = {m: same(results[m], results["ours"]) for m in METHODS}
    ok["ours_cc"] = components_ok(labels, results["ours_cc"]) if ok["ours_cc"][0] else ok["ours_cc"]

    with tempfile.TemporaryDirectory(prefix="bench_measure_") as work:
        work = Path(work)
        np.save(work / "labels.npy", labels)
        sitk.WriteImage(img, str(work / "labels.mha"), useCompression=False)
        mem = {m: memory(m, work) for m in METHODS}

    nb = labels.nbytes
    print()
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"SimpleITK {sitk.Version.VersionString()} using {sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()} threads; "
          f"spatialvqa {spatialvqa.__version__} using {min(os.cpu_count() or 1, 8)} threads; numpy {np.__version__}.")
    print(f"Label map {'x'.join(map(str, labels.shape))} uint8, 117 labels ({nb / 2**20:.0f} MiB); seconds: median of "
          f"{a.repeats} interleaved runs ({min(a.repeats, a.loop_repeats)} for the loop); load average before: {load0}, after: {os.getloadavg()[0]:.2f}.")
    print()
    print("| method | seconds | × vs SimpleITK (perimeter off) | × vs SimpleITK (defaults) | peak extra memory / label-map bytes | values identical |")
    print("|---|---:|---:|---:|---:|---|")
    for m, name in METHODS.items():
        good, why = ok[m]
        extra = mem[m]["rss_extra"] / nb
        print(f"| {name} | {med[m]:.3f} | {med[m] / med['sitk']:.2f} | {med[m] / med['sitk_default']:.2f} | "
              f"{extra:.2f} | {'yes' if good else 'NO: ' + why}{' (+ components = ndimage.label)' if m == 'ours_cc' and good else ''} |")
    print()
    traced = ", ".join(f"{m} {mem[m]['traced_peak'] / nb:.2f}" for m in METHODS if "traced_peak" in mem[m])
    print(f"NumPy peak allocations (tracemalloc) / label-map bytes: {traced}. "
          f"Peak memory is the rise of the resident high-water mark in a fresh process"
          f"{'' if all(v['rss_reset'] for v in mem.values()) else ' (ru_maxrss: /proc/self/clear_refs not writable)'}.")


if __name__ == "__main__":
    main()
