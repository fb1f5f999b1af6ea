"""Build the documentation site from `nbs/` with MkDocs + mkdocs-jupyter, offline (`make docs`).

The site (default `_site/`, open `_site/index.html`) has:
- the index: the README text written from `nbs/index.ipynb` (pyproject's `readme_nb`, `scripts/readme.py`);
- one page per library notebook, named as nbdev names it (`nbs/15_measure.ipynb` -> `measure.html`, a subpackage's
  `nbs/24_validate/01_answerers.ipynb` -> `24_validate/answerers.html`: the address the modules' docstrings give), executed at build time exactly as `nbdev-test` runs it (same working folder,
  `#| slow` and `#| eval: false` cells skipped) so that the page shows its outputs and figures;
- the API reference, one page per module, from the docstrings (mkdocstrings);
- the pipeline: the DVC DAG drawn from `dvc dag --dot` (Graphviz) and the stage list;
- the results: Table 2 and every Track A table and figure, the CT-SpatialVQA tables and figures, read from the
  committed `results/` and `figures/`. The build runs no pipeline stage: a figure that is a DVC output (not in git)
  is shown when it is in the workspace (after `dvc repro` or `dvc pull`), otherwise its committed plot data.

Executed notebooks are cached under `.cache/docs/exec/`, keyed by the notebook, the library and the data the tests
read, so a second build executes only what changed. Nothing is fetched, neither when building nor when reading:
no web fonts, no scripts from a CDN (the notebooks hold no TeX, so the pages carry no MathJax).
Run `python scripts/docs.py --help` for the options.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
REPO_URL = "https://github.com/spatialvqa/spatialvqa"
SITE_URL = "https://spatialvqa.github.io/spatialvqa/"
CACHE = ROOT / ".cache" / "docs" / "exec"


sys.path.insert(0, str(Path(__file__).resolve().parent))
from nb_style import library_notebooks  # noqa: E402  (the one list of library notebooks)


def page_name(nb: Path) -> str:
    """A notebook's page, as nbdev names it: its file name less the number prefix (`15_measure` -> `measure`); a
    subpackage's notebook in its folder (`24_validate/01_answerers` -> `24_validate/answerers`)."""
    name = re.sub(r"^\d+_", "", nb.stem)
    return f"{nb.parent.name}/{name}" if nb.parent.parent == NBS else name


def notebook_key(nb: Path) -> str:
    "A notebook's name for `--execute`: its path under nbs/ without the suffix (`15_measure`, `24_validate/01_answerers`)."
    return str(nb.relative_to(NBS).with_suffix(""))


def module_of(nb: Path) -> str | None:
    "The module a notebook exports (`#| default_exp`), or None."
    for c in json.loads(nb.read_text())["cells"]:
        m = re.match(r"#\|\s*default_exp\s+(\S+)", "".join(c["source"]).strip())
        if c["cell_type"] == "code" and m: return m.group(1)
    return None


def title_of(nb: Path) -> str:
    "A notebook's title: its first `# heading`, else its page name."
    for c in json.loads(nb.read_text())["cells"]:
        if c["cell_type"] == "markdown":
            m = re.match(r"#\s+(.+)", "".join(c["source"]).strip())
            if m: return m.group(1).strip()
    return page_name(nb)


# ---------------------------------------------------------------- execution (as nbdev-test runs a notebook)

def _inputs_hash(nb: Path) -> str:
    "What a notebook's outputs depend on: its text, the library, the test data and the params it may read."
    h = hashlib.sha256(nb.read_bytes())
    for p in sorted((ROOT / "spatialvqa").rglob("*.py")) + [ROOT / "params.yaml", ROOT / "pyproject.toml"]:
        if "__pycache__" in p.parts: continue
        h.update(str(p.relative_to(ROOT)).encode()); h.update(p.read_bytes())
    for p in sorted((ROOT / "tests" / "data").rglob("*")):
        if p.is_file(): h.update(str(p.relative_to(ROOT)).encode()); h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:20]


def execute_one(src: Path, dst: Path) -> int:
    "Run notebook `src` as `nbdev-test` does (in its folder, skip flags from pyproject) and write it with outputs."
    from fastcore.nbio import write_nb
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    from nbdev.config import get_config
    from nbdev.process import NBProcessor
    from nbdev.test import _skip_cell
    os.environ["IN_TEST"] = "1"
    nb = NBProcessor(src, rm_directives=False, process=True).nb
    # `#| slow` cells (the pyproject's tst_flags) are skipped, as nbdev-test skips them by default
    no_eval = _skip_cell(nb, get_config().tst_flags.split(), None)
    shell = CaptureShell(src)
    try:
        with working_directory(src.parent):
            shell.run_all(nb, exc_stop=True, preproc=no_eval, cell_timeout=int(get_config().get("cell_timeout", 600)))
    except Exception:
        sys.stderr.write((shell.prettytb(fname=src) or "") + "\n")
        print(f"docs: {src.name} failed to execute (it fails nbdev-test too)", file=sys.stderr)
        return 1
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_nb(nb, dst)
    return 0


def executed(nb: Path, run: bool) -> Path:
    "The notebook with outputs (executed now or from the cache); with `run` False, the committed notebook."
    if not run: return nb
    out = CACHE / f"{notebook_key(nb).replace('/', '-')}-{_inputs_hash(nb)}.ipynb"
    if out.exists(): return out
    t = time.time()
    tmp = out.with_suffix(".tmp.ipynb")
    r = subprocess.run([sys.executable, __file__, "--execute-one", str(nb), str(tmp)], cwd=ROOT)
    if r.returncode != 0: raise SystemExit(f"docs: executing {nb.relative_to(ROOT)} failed (see above)")
    tmp.replace(out)
    for old in CACHE.glob(f"{notebook_key(nb).replace('/', '-')}-*.ipynb"):
        if old != out and not old.name.endswith(".tmp.ipynb"): old.unlink()
    print(f"docs: executed {nb.name} in {time.time() - t:.1f} s")
    return out


# ---------------------------------------------------------------- pages

def _for_page(nb_path: Path, dst: Path):
    "Write the notebook as a page: `#| hide` cells and the `default_exp` cell dropped, `#|` directive lines removed."
    nb = json.loads(nb_path.read_text())
    cells = []
    for c in nb["cells"]:
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        c.get("metadata", {}).pop("execution", None)      # execnb's timings, which nbformat's schema does not allow
        if c["cell_type"] == "code":
            lines = src.splitlines()
            dirs = [l for l in lines if l.strip().startswith("#|")]
            if any(re.match(r"#\|\s*(hide|default_exp)\b", l.strip()) for l in dirs): continue
            src = "\n".join(l for l in lines if not l.strip().startswith("#|")).strip("\n")
            if not src and not c.get("outputs"): continue
            if any(re.match(r"#\|\s*(slow|eval:\s*false)", l.strip()) for l in dirs):
                src = "# not run when the docs are built (slow or eval: false)\n" + src
        else:
            # links to other notebooks point at their pages
            src = re.sub(r"\]\((?:\.\./nbs/|nbs/)?\d\d_(\w+)\.ipynb", r"](\1.ipynb", src)
        c["source"] = src
        cells.append(c)
    # the title first: the exported imports come before it in the notebook, but a page opens with what it is about
    t = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and re.match(r"#\s", c["source"].lstrip())), 0)
    nb["cells"] = [cells[t]] + cells[:t] + cells[t + 1:] if t else cells
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(nb, indent=1))


def index_page() -> str:
    "The site's entry page: the README text, written from `nbs/index.ipynb` by `scripts/readme.py`."
    sys.path.insert(0, str(ROOT / "scripts"))
    from readme import readme
    text = readme(NBS / "index.ipynb")
    guide = (f"\n\n## This site\n\nBuilt from `nbs/` by `make docs`. The [library notebooks](#what-is-in-the-box) read as a "
             "tutorial in data order (each page is the notebook, executed when the site was built); the "
             "[API reference](api/index.md) lists every exported function from its docstring; the "
             "[pipeline](pipeline.md) draws the DVC DAG; the results pages show "
             "[Track A's tables and figures](results_track_a.md) and [CT-SpatialVQA's](results_ctsvqa.md), read from "
             f"the committed `results/` and `figures/`. The source is at [{REPO_URL}]({REPO_URL}).\n")
    return text.rstrip("\n") + guide


def api_pages(out: Path, nbs: list[Path]) -> list[dict]:
    "One API page per module (mkdocstrings), and the API index."
    (out / "api").mkdir(parents=True, exist_ok=True)
    nav, rows = [], []
    for nb in nbs:
        mod = module_of(nb)
        if not mod: continue
        (out / "api" / f"{mod}.md").write_text(
            f"# `spatialvqa.{mod}`\n\nExported from [`nbs/{nb.relative_to(NBS)}`](../{page_name(nb)}.ipynb), where each definition "
            f"comes with prose and an example.\n\n::: spatialvqa.{mod}\n")
        nav.append({mod: f"api/{mod}.md"})
        rows.append(f"| [`spatialvqa.{mod}`]({mod}.md) | [{notebook_key(nb)}](../{page_name(nb)}.ipynb) |")
    (out / "api" / "index.md").write_text(
        "# API reference\n\nEvery module's exported definitions with their signatures and docstrings. The notebooks are "
        "the long form: each definition there is followed by an example that is also a test.\n\n"
        "| module | notebook |\n|---|---|\n" + "\n".join(rows) + "\n")
    return [{"Overview": "api/index.md"}] + nav


def pipeline_page(out: Path) -> None:
    "The DVC DAG drawn by Graphviz from `dvc dag --dot`, and the stages `dvc stage list` reports."
    dvc = shutil.which("dvc") or str(Path(sys.executable).parent / "dvc")
    dot = subprocess.run([dvc, "dag", "--dot"], cwd=ROOT, capture_output=True, text=True)
    if dot.returncode != 0: raise SystemExit(f"docs: `dvc dag --dot` failed: {dot.stderr.strip()[-500:]}")
    if not shutil.which("dot"):
        raise SystemExit("docs: Graphviz's `dot` is not installed (make setup installs Debian's graphviz as root: "
                         "apt-get install graphviz)")
    # Graphviz's tred keeps each stage's direct dependencies only (fetch feeds nearly every Track A stage)
    tred = subprocess.run(["tred"], input=dot.stdout, capture_output=True, text=True, check=True).stdout
    graph = re.sub(r"\{", '{\nrankdir=LR;\nnode [shape=box, style=rounded, fontname="sans-serif", fontsize=11];', tred, count=1)
    (out / "pipeline_dag.dot").write_text(dot.stdout)
    svg = subprocess.run(["dot", "-Tsvg"], input=graph, capture_output=True, text=True, check=True).stdout
    (out / "pipeline_dag.svg").write_text(svg)
    stages = subprocess.run([dvc, "stage", "list"], cwd=ROOT, capture_output=True, text=True)
    rows = []
    for line in stages.stdout.splitlines():
        name, _, desc = line.partition(" ")
        if name: rows.append(f"| `{name}` | {desc.strip() or '—'} |")
    (out / "pipeline.md").write_text(
        "# The pipeline\n\nEvery result is regenerated by `dvc repro` (`dvc.yaml`, parameters in `params.yaml`). Each "
        "stage runs one notebook of `nbs/stages/` with papermill; the library notebooks hold all the logic. The graph "
        "below is drawn when the site is built, from `dvc dag --dot` by Graphviz, with the edges implied by longer paths left out "
        "(`tred`; the [DOT source](pipeline_dag.dot) keeps them).\n\n"
        "![The DVC pipeline: each box is a stage, each arrow a dependency](pipeline_dag.svg)\n\n"
        "## Stages\n\n| stage | description (from `dvc.yaml`) |\n|---|---|\n" + "\n".join(rows) + "\n")


def _demote(md: str, by: int) -> str:
    "Markdown with its headings `by` levels deeper (outside code fences), to sit under the page's own headings."
    out, fence = [], False
    for line in md.splitlines():
        if line.lstrip().startswith("```"): fence = not fence
        elif not fence and re.match(r"#{1,5}\s", line): line = "#" * by + line
        out.append(line)
    return "\n".join(out)


def _table_section(path: Path, level: str = "##") -> str:
    "A committed Markdown table, under a heading naming its file (its own headings below that one)."
    return f"{level} `{path.relative_to(ROOT)}`\n\n{_demote(path.read_text().strip(), len(level))}\n\n"


def _csv_table(path: Path, max_rows: int = 40) -> str:
    "A committed CSV as a Markdown table (the first `max_rows` rows)."
    import pandas as pd
    df = pd.read_csv(path)
    more = f"\n\n*First {max_rows} of {len(df)} rows.*" if len(df) > max_rows else ""
    return df.head(max_rows).to_markdown(index=False) + more


def _figure(out: Path, png: Path, caption: str) -> str:
    "A figure from `figures/`: the PNG when it is in the workspace, else the committed data it plots."
    rel = png.relative_to(ROOT)
    data = png.with_suffix(".csv")
    if png.exists():
        dst = out / "figures" / png.relative_to(ROOT / "figures")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(png, dst)
        return f"### {caption}\n\n![{caption}]({dst.relative_to(out).as_posix()})\n\n`{rel}`" + (
            f", data in `{data.relative_to(ROOT)}`" if data.exists() else "") + "\n\n"
    if data.exists():
        return (f"### {caption}\n\n`{rel}` is a DVC output, not in git: `dvc repro` (or `dvc pull`) puts it in the "
                f"workspace and the next `make docs` shows it. The committed data it plots, `{data.relative_to(ROOT)}`:"
                f"\n\n{_csv_table(data)}\n\n")
    return (f"### {caption}\n\n`{rel}` is a DVC output, not in git, and has no committed data file: `dvc repro` "
            f"writes it and the next `make docs` shows it.\n\n")


def _declared_figures() -> list[Path]:
    "Every PNG under `figures/` that `dvc.yaml` declares, in declaration order."
    seen = []
    for m in re.finditer(r"(figures/[\w/.-]+\.png)", (ROOT / "dvc.yaml").read_text()):
        p = ROOT / m.group(1)
        if p not in seen: seen.append(p)
    return seen


def _caption(png: Path) -> str:
    return png.stem.replace("_", " ").capitalize()


def results_pages(out: Path) -> None:
    "Track A and CT-SpatialVQA results pages, read from the committed tables and figures."
    tables = ROOT / "results" / "tables"
    figs = _declared_figures()
    a = ["# Results: Track A (mask-grounded questions)\n\n",
         "Read from the committed `results/tables/` and `figures/track_a/` (written by the `tables` and `figures` "
         "stages; the site build runs no stage). Intervals are 95% scan-bootstrap intervals.\n\n",
         "## Table 2: accuracy per task\n\n", _demote((tables / "table2.md").read_text().strip(), 2), "\n\n"]
    for p in sorted(tables.glob("*.md")):
        if p.name != "table2.md": a.append(_table_section(p))
    ir = ROOT / "results" / "interreader"
    a.append("## Keys under a second expert's contours\n\n"
             "The `interreader` stage on Nikolov et al. 2018's two-reader head-and-neck set: keys that flip between a "
             "radiographer's and an oncologist's contours with today's rules and with `generate.margins`, and those margins.\n\n")
    for name in ("flips.md", "margins_params.md", "sensitivity.md", "held_out.md"): a.append(_table_section(ir / name, "###"))
    a.append("## Figures\n\n")
    for p in figs:
        if p.parent.name == "track_a" or p.stem in ("composition", "counterfactual", "interreader"): a.append(_figure(out, p, _caption(p)))
    (out / "results_track_a.md").write_text("".join(a))
    ct = ROOT / "results" / "ctsvqa"
    b = ["# Results: CT-SpatialVQA (report-grounded questions)\n\n",
         "Read from the committed `results/ctsvqa/` and `results/ctsvqa_twin/` (written by the `ctsvqa_*` stages; "
         "the site build runs no stage).\n\n", "## Tables\n\n"]
    for p in sorted(ct.glob("*.md")) + sorted((ROOT / "results" / "ctsvqa_twin").glob("*.md")):
        b.append(_table_section(p, "###"))
    b.append("## Figures\n\n")
    for p in figs:
        if p.stem.startswith("ctsvqa"): b.append(_figure(out, p, _caption(p)))
    (out / "results_ctsvqa.md").write_text("".join(b))


_MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)


def strip_mathjax(html: str) -> str:
    """A notebook page without mkdocs-jupyter's MathJax (a script from a CDN, and its configuration).

    The notebooks hold no TeX, and MathJax would typeset any `$...$` in an output (shell variables, prices) as math;
    it is also the one thing the pages would fetch from outside. Should TeX ever be wanted, serve MathJax from the
    site instead (mkdocs-jupyter's `custom_mathjax_url`)."""
    out, n = _MATHJAX.subn("", html)
    if n != 1: raise SystemExit("docs: mkdocs-jupyter's MathJax block was not found once in a page: its template changed")
    return out


# ---------------------------------------------------------------- build

def build(site: Path, run: str = "all", src_dir: Path | None = None, quiet: bool = False) -> Path:
    "Write the pages into `src_dir` and build the site into `site`; `run`: 'all', 'none' or comma-separated stems."
    import yaml
    t0 = time.time()
    src = Path(src_dir or ROOT / ".cache" / "docs" / "src")
    if src.exists(): shutil.rmtree(src)
    src.mkdir(parents=True)
    nbs = library_notebooks()
    want = {notebook_key(n) for n in nbs} if run == "all" else set() if run == "none" else set(run.split(","))
    unknown = want - {notebook_key(n) for n in nbs}
    if unknown: raise SystemExit(f"docs: --execute names no library notebook: {', '.join(sorted(unknown))}")
    (src / "index.md").write_text(index_page())
    groups = {"0": "Foundations", "1": "Intake", "2": "Track A", "3": "Track B", "4": "Evaluation"}
    nav_nbs: dict[str, list] = {}
    for nb in nbs:
        _for_page(executed(nb, notebook_key(nb) in want), src / f"{page_name(nb)}.ipynb")
        number = ".".join(p[:2] for p in nb.relative_to(NBS).parts)
        nav_nbs.setdefault(groups.get(number[0], "Other"), []).append({f"{number} {title_of(nb)}": f"{page_name(nb)}.ipynb"})
    api_nav = api_pages(src, nbs)
    pipeline_page(src)
    results_pages(src)
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    cfg["docs_dir"] = str(src)
    for plugin in cfg["plugins"]:          # griffe extensions named by path: from the repository, wherever the config
        if not isinstance(plugin, dict): continue
        opts = plugin.get("mkdocstrings", {}).get("handlers", {}).get("python", {}).get("options", {})
        ext = opts.get("extensions")
        if ext: opts["extensions"] = [str(ROOT / e) if str(e).endswith(".py") else e for e in ext]
    cfg["site_dir"] = str(Path(site).resolve())
    cfg["nav"] = ([{"Home": "index.md"}, {"Notebooks": [{k: v} for k, v in nav_nbs.items()]},
                   {"API reference": api_nav}, {"Pipeline": "pipeline.md"},
                   {"Results": [{"Track A": "results_track_a.md"}, {"CT-SpatialVQA": "results_ctsvqa.md"}]}])
    conf = src.parent / "mkdocs.gen.yml"
    conf.write_text(yaml.safe_dump(cfg, sort_keys=False))
    mk = shutil.which("mkdocs") or str(Path(sys.executable).parent / "mkdocs")
    r = subprocess.run([mk, "build", "--clean", "-f", str(conf)] + (["-q"] if quiet else []), cwd=ROOT)
    if r.returncode != 0: raise SystemExit(f"docs: mkdocs build failed (status {r.returncode})")
    for nb in nbs:
        page = Path(site) / f"{page_name(nb)}.html"
        page.write_text(strip_mathjax(fix_toc(page.read_text())))
    print(f"docs: site built in {time.time() - t0:.1f} s: {Path(site) / 'index.html'}")
    return Path(site)


def fix_toc(html: str, depth: int = 3) -> str:
    """Point a notebook page's table of contents at its headings' ids.

    mkdocs-jupyter slugs a heading for the TOC without its inline code (`## Volume: ...` written with `Volume` as code ->
    `#an-array-and-its-affine`) while nbconvert's heading id keeps it (`volume-an-array-and-its-affine`), so such
    TOC links lead nowhere. The TOC lists the headings below the title in order, so the n-th link gets the n-th id."""
    heads = [i for lvl, i in re.findall(r'<h([1-6])[^>]*\bid="([^"]+)"', html) if int(lvl) <= depth][1:]

    def fix(m):
        block = m.group(0)
        hrefs = re.findall(r'href="#([^"]*)"', block)
        if len(hrefs) != len(heads): return block
        it = iter(heads)
        return re.sub(r'href="#[^"]*"', lambda _: f'href="#{next(it)}"', block)
    return re.sub(r'<nav class="md-nav md-nav--secondary".*?</nav>\s*(?=</div>|$)', fix, html, flags=re.S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/docs.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_site", help="the site folder (default _site/)")
    ap.add_argument("--execute", default="all", metavar="WHICH",
                    help="which library notebooks to execute for their outputs: all (default), none, or stems "
                         "such as 00_core,45_figures (the others are shown without outputs)")
    ap.add_argument("--src", type=Path, default=None, help="where the generated pages go (default .cache/docs/src)")
    ap.add_argument("--execute-one", nargs=2, type=Path, metavar=("NOTEBOOK", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.execute_one: return execute_one(a.execute_one[0].resolve(), a.execute_one[1].resolve())
    build(a.out, a.execute, a.src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
