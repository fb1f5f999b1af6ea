"""Build a small Track A export without DVC, for `make interop` on a clone that has no `data/export`: the README's
"Your own data, without DVC" block (6 phantoms in TotalSegmentator's layout, convert to export) run as it stands in
OUT (default .cache/interop), with the project's `spatialvqa` command. Prints the export folder: OUT/work/export."""
import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_block(title: str = "Your own data, without DVC") -> str:
    "The first ```bash block of the README section `title`."
    section = (ROOT / "README.md").read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "interop", help="working folder (emptied first)")
    a = ap.parse_args()
    out = a.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "SPATIALVQA_PROGRESS": "0"}
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block()], cwd=out, env=env)
    if r.returncode != 0: raise SystemExit(f"the README walk-through failed in {out} (exit status {r.returncode})")
    print(out / "work" / "export")
    return 0


if __name__ == "__main__":
    sys.exit(main())
