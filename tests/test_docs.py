"""The documentation site (`make docs`, scripts/docs.py): every notebook has a page, internal links and images resolve,
and pages render in a real headless browser (Debian's chromium driven by Playwright) without console errors."""
from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
# the library page the browser opens: it draws figures, so the page carries executed outputs (images)
BROWSER_NB = "30_ctsvqa/07_figures"
SITE_PATH = "/spatialvqa/"   # the path of mkdocs.yml's site_url


def _docs():
    return load_script("scripts/docs.py")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    "The site built into a temporary folder, executing one library notebook (the others show their code and prose)."
    tmp = tmp_path_factory.mktemp("docs")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs.py"), "--out", str(tmp / "site"),
                        "--src", str(tmp / "src"), "--execute", BROWSER_NB], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"scripts/docs.py failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return tmp / "site"


class _Refs(HTMLParser):
    "Every href/src of a page, and every id/name it defines."
    def __init__(self):
        super().__init__(); self.refs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("id", "name"):
            if a.get(k): self.ids.add(a[k])
        if tag in ("a", "link") and a.get("href"): self.refs.append((tag, a["href"]))
        if tag in ("img", "script", "source") and a.get("src"): self.refs.append((tag, a["src"]))


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> _Refs:
    p = _Refs(); p.feed(path.read_text(errors="replace")); return p


def broken_links(site: Path) -> list[str]:
    "Internal links, images and scripts of every page that do not resolve (missing file or missing #anchor)."
    bad = []
    for page in sorted(site.rglob("*.html")):
        for tag, ref in _parse(page).refs:
            u = urlsplit(ref)
            if u.scheme or ref.startswith("//"):
                # an external script or image would be fetched: the site must work offline (links to the repository
                # and the canonical address are not fetched)
                if u.scheme in ("http", "https") and tag in ("img", "script", "source"):
                    bad.append(f"{page.relative_to(site)}: external {tag} {ref}")
                continue
            if u.path.startswith("/"):
                # absolute paths (the 404 page's) start with the site's path, /spatialvqa/
                target = (site / unquote(u.path).removeprefix(SITE_PATH)).resolve()
            else:
                target = page if not u.path else (page.parent / unquote(u.path)).resolve()
            if target.is_dir(): target = target / "index.html"
            if not target.exists():
                bad.append(f"{page.relative_to(site)}: {tag} {ref} -> missing {target}"); continue
            if u.fragment and target.suffix == ".html" and tag == "a" and unquote(u.fragment) not in _parse(target).ids:
                bad.append(f"{page.relative_to(site)}: {ref} -> no #{u.fragment} in {target.name}")
    return bad


def test_every_notebook_has_a_page_and_links_resolve(site):
    d = _docs()
    nbs = d.library_notebooks()
    assert len(nbs) >= 20
    for nb in nbs:
        page = site / f"{d.page_name(nb)}.html"
        assert page.exists(), f"{nb.name} has no page ({page.name})"
        assert d.title_of(nb) in page.read_text(), f"{page.name} does not show {nb.name}'s title"
        mod = d.module_of(nb)
        api = site / "api" / f"{mod}.html"
        assert api.exists() and f"spatialvqa.{mod}" in api.read_text(), f"no API page for spatialvqa.{mod}"
    # methods added to a class with fastcore's @patch in later cells are on the class's API entry (griffe_patch.py)
    local = (site / "api" / "llm.local.html").read_text()
    for method in ("load", "render", "tokenizer"):
        assert f'id="spatialvqa.llm.local.Transformers.{method}"' in local, f"Transformers.{method} not on its page"
    index = (site / "index.html").read_text()
    assert "Two commands" in index and "pipeline.html" in index, "the index is the README's text with the site's links"
    # the pipeline page draws the DAG: an SVG with one node per stage of `dvc stage list`
    svg = (site / "pipeline_dag.svg").read_text()
    assert "<svg" in svg and 'src="pipeline_dag.svg"' in (site / "pipeline.html").read_text()
    for stage in ("fetch", "measure", "generate", "score", "tables", "figures", "ctsvqa_score"):
        assert f">{stage}</text>" in svg, f"stage {stage} missing from the DAG"
    # results pages: Table 2, the CT-SpatialVQA tables, and every committed figure as an image
    res_a = (site / "results_track_a.html").read_text()
    assert "Table 2" in res_a and "<table" in res_a
    # the tables' own headings sit under the page's: one h1 per page, and the figures section is a section
    assert res_a.count("<h1") == 1 and 'id="figures"' in res_a
    res_b = (site / "results_ctsvqa.html").read_text()
    assert "results/ctsvqa/jury_ci.md" in res_b and res_b.count("<table") >= 10
    for png in sorted((ROOT / "figures").rglob("*.png")):
        if subprocess.run(["git", "ls-files", "--error-unmatch", str(png)], cwd=ROOT, capture_output=True).returncode: continue
        rel = png.relative_to(ROOT).as_posix()
        assert f'src="{rel}"' in res_a + res_b and (site / rel).exists(), f"{rel} is not shown on a results page"
    # the executed notebook carries its outputs: figures as embedded PNGs
    assert "data:image/png;base64," in (site / f"{d.page_name(ROOT / 'nbs' / (BROWSER_NB + '.ipynb'))}.html").read_text()
    bad = broken_links(site)
    assert not bad, f"{len(bad)} broken internal links or images:\n" + "\n".join(bad[:30])


def test_link_checker_finds_broken_links(tmp_path):
    "The checker itself: a missing page, a missing anchor and a missing image are reported; good links are not."
    (tmp_path / "a.html").write_text('<h1 id="top">A</h1><a href="b.html#x">b</a><a href="#top">t</a><a href="c.html">c</a>'
                                     '<img src="img/p.png"><a href="https://example.org/">ext</a>'
                                     '<script src="https://cdn.example/x.js"></script>')
    (tmp_path / "b.html").write_text('<p id="y">b</p>')
    bad = broken_links(tmp_path)
    assert len(bad) == 4 and any("no #x" in b for b in bad) and any("c.html" in b for b in bad)
    assert any("img/p.png" in b for b in bad) and any("external script" in b for b in bad)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass


def test_pages_render_in_headless_chromium(site):
    "The index and a library page load in Debian's chromium with no console error, failed request or page error."
    from playwright.sync_api import sync_playwright
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: `make setup` installs Debian's chromium (scripts/setup_docs.sh)"
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    d = _docs()
    lib = d.page_name(ROOT / "nbs" / f"{BROWSER_NB}.ipynb")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"])
            try:
                for path, must in [("index.html", "spatialvqa"), (f"{lib}.html", d.title_of(ROOT / "nbs" / f"{BROWSER_NB}.ipynb"))]:
                    page = browser.new_page()
                    errors = []
                    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
                    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
                    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url} {r.failure}"))
                    resp = page.goto(f"{base}/{path}", wait_until="networkidle")
                    assert resp is not None and resp.ok, f"{path}: HTTP {resp and resp.status}"
                    assert must in page.title() or must in page.inner_text("h1"), f"{path}: title {page.title()!r}"
                    # the page is laid out: the theme's navigation and the content are visible
                    assert page.locator("nav.md-nav").first.is_visible() and page.locator("article").first.is_visible()
                    if path != "index.html":
                        imgs = page.locator("article img")
                        assert imgs.count() > 0, f"{path}: no figure rendered"
                        # every figure decoded (naturalWidth > 0), i.e. the embedded PNG is an image
                        assert page.evaluate("[...document.querySelectorAll('article img')].every(i => i.complete && i.naturalWidth > 0)")
                    assert not errors, f"{path}: " + "; ".join(errors[:10])
                    page.close()
            finally:
                browser.close()
    finally:
        srv.shutdown()
