"""README.md is written from nbs/index.ipynb (scripts/readme.py), and its module table lists every library notebook."""
from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def _writer():
    return load_script("scripts/readme.py")


def test_readme_is_written_from_index(tmp_path):
    w = _writer()
    assert (ROOT / "README.md").read_text() == w.readme(ROOT / "nbs" / "index.ipynb"), \
        "README.md differs from nbs/index.ipynb: edit the notebook and run `make readme`"
    assert w.main(["--out", str(tmp_path / "R.md")]) == 0 and (tmp_path / "R.md").read_text() == (ROOT / "README.md").read_text()
    assert w.main(["--check"]) == 0 and w.main(["--check", "--out", str(tmp_path / "absent.md")]) == 1
    assert not (ROOT / "--check").exists()


def test_writer_shows_code_but_not_hidden_cells(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["# T\n", "text"]},
                    {"cell_type": "code", "source": ["#| hide\n", "import x"]},
                    {"cell_type": "code", "source": ["print(1)"]}]}
    (tmp_path / "i.ipynb").write_text(json.dumps(nb))
    assert _writer().readme(tmp_path / "i.ipynb") == "# T\ntext\n\n```python\nprint(1)\n```\n"


def notebooks() -> dict[str, str]:
    "Library notebook stem -> the module it exports (`#| default_exp`)."
    out = {}
    nbs = ROOT / "nbs"
    for p in load_script("scripts/nb_style.py").library_notebooks(nbs):
        for c in json.loads(p.read_text())["cells"]:
            m = re.match(r"#\|\s*default_exp\s+(\S+)", "".join(c["source"]).strip())
            if c["cell_type"] == "code" and m: out[str(p.relative_to(nbs).with_suffix(""))] = m.group(1); break
    return out


def test_module_table_lists_every_notebook():
    rows = dict(re.findall(r"^\| `(\d\d_\w+(?:/\d\d_\w+)?)` \| `([\w.]+)` \|", (ROOT / "README.md").read_text(), re.M))
    assert rows == notebooks(), "the README's module table must list every library notebook with its module"


def _cell(marker: str) -> str:
    nb = json.loads((ROOT / "nbs" / "index.ipynb").read_text())
    return next("".join(c["source"]) for c in nb["cells"] if marker in "".join(c["source"]))


def test_pipeline_diagram_is_todays_dvc_dag_and_the_table_names_every_stage():
    w = _writer()
    nodes, edges = w.dag_edges(ROOT)
    assert len(nodes) >= 30 and ("validate", "infer") in edges
    assert _cell(w.DAG_MARK) == w.dag_cell(ROOT, (nodes, edges)), "the pipeline diagram is not today's `dvc dag`: run `make readme`"
    table = _cell("| stage | writes |")
    named = set(re.findall(r"`(\w+)(?:@<model>)?`", table.split("| stage | writes |")[1].split("\n\n")[0]))
    assert set(nodes) - {"data.dvc"} <= named, sorted(set(nodes) - {"data.dvc"} - named)


def test_reduce_edges_keeps_only_arrows_no_longer_path_implies():
    w = _writer()
    e = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("a", "d"), ("x", "d")]
    assert w.reduce_edges(e) == [("a", "b"), ("b", "c"), ("c", "d"), ("x", "d")]
    assert w.topological(["d", "c", "b", "a", "x"], e) == ["a", "b", "c", "x", "d"]


def test_a_new_stage_appears_in_the_diagram(tmp_path):
    "In a scratch DVC project: every stage of its dvc.yaml is a node of the cell, linked by the files it reads."
    import subprocess
    import yaml
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    stages = {"make": {"cmd": "echo 1 > a.txt", "outs": ["a.txt"]}, "use": {"cmd": "cat a.txt > b.txt", "deps": ["a.txt"], "outs": ["b.txt"]},
              "ctsvqa_more": {"cmd": "cat b.txt > c.txt", "deps": ["b.txt"], "outs": ["c.txt"]}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    cell = _writer().dag_cell(tmp_path)
    assert '    make["make"]' in cell and '    use["use"]' in cell and "  make --> use" in cell and "  use --> ctsvqa_more" in cell
    # implied by make -> use -> ctsvqa_more
    assert "make --> ctsvqa_more" not in cell
    # Track B's box
    assert cell.index('ctsvqa_more["ctsvqa_more"]') > cell.index('subgraph B') > cell.index('use["use"]')


def test_readme_tables_are_the_committed_results():
    "Every table the README shows from a result file (`<!-- table: PATH ... -->`) is that committed file's, as written."
    w = _writer()
    src = "".join("".join(c["source"]) for c in json.loads((ROOT / "nbs" / "index.ipynb").read_text())["cells"])
    marked = [m.group(1) for l in src.splitlines() if (m := w.TABLE_MARK.match(l))]
    assert {"results/tables/table2.md", "results/tables/detectable_differences.md",
            "results/attacks/leave_one_out.md"} <= set(marked), marked
    assert w.stale_tables() == [], "README tables differ from their result files: run `make readme`"


def test_a_changed_result_makes_its_table_stale_and_the_writer_mends_it(tmp_path):
    w = _writer()
    (tmp_path / "r.md").write_text("caption\n\n| a | b | c |\n|:---|:---|---:|\n| 1 | 2 | 3 |\n\nafter\n")
    (tmp_path / "s.md").write_text("| x |\n|---|\n| 9 |\n")                # a second table, never changed
    cell = ("text\n<!-- table: r.md without b -->\n| a | c |\n| :--- | ---: |\n| 1 | 3 |\nmore\n"
            "<!-- table: s.md -->\n| x |\n| --- |\n| 9 |")
    nb = tmp_path / "i.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": cell.splitlines(True)}]}))
    assert w.stale_tables(nb, tmp_path) == []
    (tmp_path / "r.md").write_text("| a | b | c |\n|:---|:---|---:|\n| 1 | 2 | 4 |\n| 5 | 6 | 7 |\n")
    assert w.stale_tables(nb, tmp_path) == ["r.md"]
    assert w.write_tables(nb, tmp_path) == ["r.md"] and w.stale_tables(nb, tmp_path) == []
    assert w.readme(nb).splitlines()[2:6] == ["| a | c |", "| :--- | ---: |", "| 1 | 4 |", "| 5 | 7 |"]
    assert w.readme(nb).rstrip().endswith("| 9 |") and "more" in w.readme(nb)
    (tmp_path / "r.md").write_text("| a | c |\n|---|---|\n| 1 | 4 |\n")
    try: w.write_tables(nb, tmp_path)
    except KeyError as e: assert "no column" in str(e)
    else: raise AssertionError("a column the marker drops but the file lacks must fail")
