"""Start-up of the `spatialvqa` command: wall time of `spatialvqa --help` (and `infer --help`) in a fresh process, and
which heavy packages (torch, transformers, sklearn, sentence_transformers, pandas, matplotlib) each one imports.
Prints one line per command: median seconds over the runs, and the heavy modules loaded."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "transformers", "sklearn", "sentence_transformers", "pandas", "matplotlib", "scipy", "faiss")
PROBE = ("import sys, json, runpy; sys.argv = ['spatialvqa', *json.loads(sys.argv[1])]\n"
         "try: runpy.run_module('spatialvqa.cli', run_name='__not_main__'); from spatialvqa.cli import main; main(sys.argv[1:])\n"
         "except SystemExit: pass\n"
         "print(json.dumps(sorted(m for m in %r if m in sys.modules)), file=sys.stderr)" % (HEAVY,))


def run(args: list[str], repeat: int = 3) -> tuple[float, list[str]]:
    times, mods = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        mods = json.loads(p.stderr.strip().splitlines()[-1])
    return statistics.median(times), mods


if __name__ == "__main__":
    for args in (["--help"], ["infer", "--help"], ["check-params", "--help"]):
        s, mods = run(args)
        print(f"spatialvqa {' '.join(args):<22} {s:6.2f} s   heavy imports: {', '.join(mods) or 'none'}")
