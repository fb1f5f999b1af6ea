"""Benchmark: the whole `spatialvqa measure` process against a SimpleITK process, on the same NIfTI file.

    .venv/bin/python benchmarks/bench_measure_process.py [--shape 512 512 400] [--repeats 15]

`bench_measure.py` times the library call inside one process; a user runs a command. This script times whole
processes, as `time` would, from start to exit: the interpreter, the imports, reading the gzipped NIfTI, the
measuring and writing the JSON:

1. `spatialvqa measure labels.nii.gz --out x.json` (the console script; connected components included), and
   the same with `--no-components`;
2. a Python process that reads the same file with SimpleITK, runs `LabelShapeStatisticsImageFilter` with the
   perimeter off (then it computes what `measure` computes, less the components: the reference of the ratio)
   and with its defaults, and writes comparable JSON (voxels, volume, centroid and bounding box in RAS mm);
3. for scale, `spatialvqa --help` and a bare `python -c pass`.

The spatialvqa package is byte-compiled first (`compileall`), as `pip install` leaves an installed package and as
SimpleITK's Python files are: an editable install is not, and with PYTHONDONTWRITEBYTECODE set every process would
compile the package's modules again. The label map is `bench_measure.make_labels` (512 x 512 x 400, all 117 labels, a CT affine with LPS storage),
written once with nibabel. Every process runs once untimed (imports compiled, file in the page cache), then
`--repeats` times, interleaved: each repeat runs every command once, in an order rotated from repeat to repeat,
so that noise from other jobs on the machine hits all commands alike. Reported: the median (and min-max) of the
wall-clock seconds and the ratio of the medians. Values are checked: the spatialvqa JSON against the SimpleITK
JSON (voxel counts exactly, volumes and centroids to 1e-6 relative, boxes to 1e-6 mm) and its component counts
against `scipy.ndimage.label` (26-connectivity) run here on each label's crop. Exit status 1 when a value differs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import AFFINE, make_labels  # noqa: E402

# The SimpleITK process: what a user of SimpleITK would write to get the same JSON.
SITK_SCRIPT = r'''
import json, sys
import SimpleITK as sitk
path, out, perimeter = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
img = sitk.ReadImage(path)
f = sitk.LabelShapeStatisticsImageFilter()
f.SetComputePerimeter(perimeter)
f.Execute(img)
ras = (-1.0, -1.0, 1.0)  # ITK's physical space is LPS
recs = []
for l in f.GetLabels():
    bb = f.GetBoundingBox(l)
    lo, hi = bb[:3], [bb[n] + bb[n + 3] - 1 for n in range(3)]
    pts = [[c * s for c, s in zip(img.TransformIndexToPhysicalPoint((a, b, c)), ras)]
           for a in (lo[0], hi[0]) for b in (lo[1], hi[1]) for c in (lo[2], hi[2])]
    recs.append({"label": int(l), "voxels": int(f.GetNumberOfPixels(l)), "volume_ml": f.GetPhysicalSize(l) / 1000,
                 "centroid_ras_mm": [c * s for c, s in zip(f.GetCentroid(l), ras)],
                 "bbox_ras_mm": [[min(p[n] for p in pts) for n in range(3)], [max(p[n] for p in pts) for n in range(3)]]})
with open(out, "w") as fh: json.dump({"structures": recs}, fh)
'''


def commands(work: Path) -> dict[str, tuple[str, list[str]]]:
    "name -> (description, argv) of every process timed."
    exe = str(Path(sys.executable).parent / "spatialvqa")
    nii = str(work / "labels.nii.gz")
    sitk_py = str(work / "sitk_measure.py")
    return {
        "ours": ("`spatialvqa measure labels.nii.gz --out x.json` (+ components, 26-conn.)",
                 [exe, "measure", nii, "--out", str(work / "ours.json")]),
        "ours_nocc": ("`spatialvqa measure --no-components`", [exe, "measure", nii, "--no-components", "--out", str(work / "ours_nocc.json")]),
        "sitk": ("SimpleITK process: read + `LabelShapeStatistics` (perimeter off) + JSON",
                 [sys.executable, sitk_py, nii, str(work / "sitk.json"), "0"]),
        "sitk_default": ("SimpleITK process: read + `LabelShapeStatistics` (defaults, with perimeter) + JSON",
                         [sys.executable, sitk_py, nii, str(work / "sitk_default.json"), "1"]),
        "help": ("`spatialvqa --help`", [exe, "--help"]),
        "python": ("`python -c pass` (interpreter start-up)", [sys.executable, "-c", "pass"]),
    }


def run(argv: list[str], env: dict) -> tuple[float, float]:
    "Wall-clock seconds of the process `argv` from start to exit, and the CPU seconds (user + system) it used."
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode:
            err.seek(0)
            raise RuntimeError(f"{' '.join(argv)} exited with {p.returncode}:\n{err.read().decode()}")
    return dt, usage.ru_utime + usage.ru_stime


def same(ours: dict, ref: dict) -> tuple[bool, str]:
    "Voxel counts exactly, volumes and centroids to 1e-6 relative, boxes to 1e-6 mm."
    a = {s["label"]: s for s in ours["structures"]}
    b = {s["label"]: s for s in ref["structures"]}
    if sorted(a) != sorted(b): return False, f"labels differ: {sorted(set(a) ^ set(b))[:5]}"
    for l in a:
        x, y = a[l], b[l]
        if x["voxels"] != y["voxels"]: return False, f"label {l}: {x['voxels']} voxels vs {y['voxels']}"
        if abs(x["volume_ml"] - y["volume_ml"]) > 1e-6 * y["volume_ml"]: return False, f"label {l}: volume {x['volume_ml']} vs {y['volume_ml']}"
        c, rc = np.array(x["centroid_ras_mm"]), np.array(y["centroid_ras_mm"])
        if np.any(np.abs(c - rc) > 1e-6 * np.maximum(1, np.abs(rc))): return False, f"label {l}: centroid {c} vs {rc}"
        if np.any(np.abs(np.array(x["bbox_ras_mm"]) - np.array(y["bbox_ras_mm"])) > 1e-6): return False, f"label {l}: box differs"
    return True, ""


def components_ok(labels: np.ndarray, ours: dict) -> tuple[bool, str]:
    "Each label's component count against `scipy.ndimage.label` (26-connectivity) on its own crop."
    from scipy import ndimage
    got = {s["label"]: s["components"] for s in ours["structures"]}
    boxes = ndimage.find_objects(labels)
    for l, box in enumerate(boxes, start=1):
        if box is None: continue
        n = ndimage.label(labels[box] == l, np.ones((3, 3, 3), bool))[1]
        if got.get(l) != n: return False, f"label {l}: {got.get(l)} components vs {n} (ndimage.label)"
    return True, ""


def import_time(argv: list[str], env: dict) -> tuple[float, list[tuple[float, str]]]:
    """Seconds of all imports of the process `argv` (a Python script and its arguments) under `python -X importtime`,
    and its five heaviest packages (cumulative seconds; spatialvqa's modules each on their own)."""
    r = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, env=env)
    total, heavy = 0.0, {}
    for line in r.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit(): continue
        t, name = int(parts[1]) / 1e6, parts[2][1:]
        if not name.startswith(" "): total += t
        name = name.strip()
        root = ".".join(name.split(".")[:2 if name.startswith("spatialvqa.") else 1])
        heavy[root] = max(heavy.get(root, 0.0), t)
    return total, sorted(((t, n) for n, t in heavy.items() if n != "spatialvqa.cli"), reverse=True)[:5]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", type=int, nargs=3, default=(512, 512, 400))
    p.add_argument("--repeats", type=int, default=15, help="timed runs of each process (median reported)")
    a = p.parse_args(argv)
    import nibabel as nib
    import SimpleITK as sitk
    import spatialvqa

    env = {**os.environ, "SPATIALVQA_PROGRESS": "0"}
    labels = make_labels(tuple(a.shape))
    with tempfile.TemporaryDirectory(prefix="bench_measure_process_") as work:
        work = Path(work)
        nib.save(nib.Nifti1Image(labels, AFFINE), work / "labels.nii.gz")
        (work / "sitk_measure.py").write_text(SITK_SCRIPT)
        cmds = commands(work)
        print(f"label map {labels.shape} {labels.dtype} ({labels.nbytes / 2**20:.0f} MiB), "
              f"{(work / 'labels.nii.gz').stat().st_size / 2**20:.1f} MiB as .nii.gz", flush=True)
        # the package byte-compiled as `pip install` leaves an installed package (an editable install is not, and with
        # PYTHONDONTWRITEBYTECODE set, as on this project's machines, every process would compile it again: ~0.06 s)
        import compileall
        compileall.compile_dir(str(Path(spatialvqa.__file__).parent), quiet=1)
        for name, (_, cmd) in cmds.items(): run(cmd, env)  # warm up: byte-compiled imports, file in page cache
        load0 = os.getloadavg()
        times, cpu = {m: [] for m in cmds}, {m: [] for m in cmds}
        names = list(cmds)
        for r in range(a.repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for m in order:
                w, c = run(cmds[m][1], env)
                times[m].append(w)
                cpu[m].append(c)
            print(f"repeat {r + 1}: " + ", ".join(f"{m} {times[m][-1]:.3f} s" for m in names), flush=True)
        load1 = os.getloadavg()
        out = {m: json.loads((work / f"{m}.json").read_text()) for m in ("ours", "ours_nocc", "sitk", "sitk_default")}
        # what each command imports: the console script run under `python -X importtime`
        imports = {f"spatialvqa {what}": import_time([cmds[m][1][0], *cmds[m][1][1:]], env)
                   for what, m in (("--help", "help"), ("measure", "ours"))}

    ok = {"ours": same(out["ours"], out["sitk"]), "ours_nocc": same(out["ours_nocc"], out["sitk"]),
          "sitk_default": same(out["sitk_default"], out["sitk"])}
    cc = components_ok(labels, out["ours"]) if ok["ours"][0] else (False, "not checked")
    med = {m: statistics.median(v) for m, v in times.items()}
    cpu_med = {m: statistics.median(v) for m, v in cpu.items()}

    print()
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}; "
          f"SimpleITK {sitk.Version.VersionString()} ({sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()} threads); "
          f"spatialvqa {spatialvqa.__version__}; numpy {np.__version__}; nibabel {nib.__version__}.")
    print(f"Label map {'x'.join(map(str, labels.shape))} uint8, 117 labels, as .nii.gz; wall-clock seconds of whole processes: "
          f"median (min-max) of {a.repeats} interleaved runs; load average (1, 5, 15 min) before: "
          f"{', '.join(f'{x:.2f}' for x in load0)}; after: {', '.join(f'{x:.2f}' for x in load1)}.")
    print()
    print("| process | wall seconds, median (min-max) | × SimpleITK process (perimeter off) | × SimpleITK process (defaults) "
          "| CPU seconds (user + system), median | CPU × SimpleITK (perimeter off) | values identical |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for m, (desc, _) in cmds.items():
        good, why = ok.get(m, (None, ""))
        if m == "ours" and good: good, why = cc
        mark = "" if good is None else ("yes" if good else "NO: " + why)
        if m == "ours" and good: mark += " (components = `ndimage.label` per label)"
        if m == "sitk": mark = "reference"
        print(f"| {desc} | {med[m]:.3f} ({min(times[m]):.3f}-{max(times[m]):.3f}) | {med[m] / med['sitk']:.2f} | "
              f"{med[m] / med['sitk_default']:.2f} | {cpu_med[m]:.3f} | {cpu_med[m] / cpu_med['sitk']:.2f} | {mark} |")
    print()
    for what, (total, top) in imports.items():
        print(f"imports of `{what}` (`python -X importtime`, one run): {total:.3f} s in all; heaviest: "
              + ", ".join(f"{n} {t:.3f} s" for t, n in top))
    ratio = med["ours"] / med["sitk"]
    print()
    print(f"Whole `spatialvqa measure` process (components included) / SimpleITK process (perimeter off), median wall "
          f"clock: {ratio:.2f} (goal <= 1.00: {'met' if ratio <= 1.0 else 'NOT met'}); CPU time: {cpu_med['ours'] / cpu_med['sitk']:.2f}.")
    if not (all(g for g, _ in ok.values()) and cc[0]): sys.exit(1)


if __name__ == "__main__":
    main()
