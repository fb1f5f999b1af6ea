"""The pipeline declares every result: each committed file under results/ and figures/ belongs to exactly one DVC
stage, no two declarations overlap, and every declaration is recorded in dvc.lock (and, for the committed
`cache: false` ones, present in the working tree with the content the lock records)."""
from __future__ import annotations

import copy
import hashlib
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("outs", "metrics", "plots")
_VAR = re.compile(r"\$\{\s*([^}]+?)\s*\}")


def lookup(ctx: dict, dotted: str):
    "The value at `a.b.c` in the nested dict `ctx`; KeyError naming the path when absent."
    v = ctx
    for k in dotted.split("."):
        if not isinstance(v, dict) or k not in v: raise KeyError(f"${{{dotted}}} is not defined (params.yaml / dvc.yaml vars)")
        v = v[k]
    return v


def interpolate(obj, ctx: dict):
    "`obj` with every `${a.b}` replaced from `ctx`, as DVC does: a string that is one reference becomes that value."
    if isinstance(obj, str):
        m = _VAR.fullmatch(obj.strip())
        if m: return copy.deepcopy(lookup(ctx, m.group(1)))
        return _VAR.sub(lambda m: str(lookup(ctx, m.group(1))), obj)
    if isinstance(obj, list): return [interpolate(v, ctx) for v in obj]
    if isinstance(obj, dict): return {interpolate(k, ctx): interpolate(v, ctx) for k, v in obj.items()}
    return obj


def context(root: Path = ROOT, params: dict | None = None) -> dict:
    "params.yaml plus the `vars` of dvc.yaml (dicts, or files to load), as `${...}` sees them."
    ctx = dict(params if params is not None else yaml.safe_load((root / "params.yaml").read_text()))
    for v in yaml.safe_load((root / "dvc.yaml").read_text()).get("vars") or []:
        ctx.update(v if isinstance(v, dict) else yaml.safe_load((root / v).read_text()))
    return ctx


def stages(root: Path = ROOT, params: dict | None = None, dvc: dict | None = None) -> dict[str, dict]:
    "Every stage of dvc.yaml, `foreach` expanded to `name@key` as DVC names them, `${...}` resolved."
    ctx = context(root, params)
    dvc = dvc if dvc is not None else yaml.safe_load((root / "dvc.yaml").read_text())
    out = {}
    for name, st in (dvc.get("stages") or {}).items():
        if "foreach" in st:
            items = interpolate(st["foreach"], ctx)
            pairs = items.items() if isinstance(items, dict) else ((v, v) for v in items)
            for key, item in pairs:
                out[f"{name}@{key}"] = interpolate(st["do"], {**ctx, "key": key, "item": item})
        else:
            out[name] = interpolate(st, ctx)
    return out


def declared(stage: dict) -> list[tuple[str, dict, str]]:
    "(path, options, kind) of every output a stage declares (outs, metrics, plots)."
    res = []
    for kind in KINDS:
        for e in stage.get(kind) or []:
            if isinstance(e, str): res.append((e, {}, kind))
            else:
                (p, opts), = e.items()
                res.append((p, opts or {}, kind))
    return res


def _norm(p: str) -> str: return Path(p).as_posix().rstrip("/")


def owns(out: str, path: str) -> bool:
    "A declaration owns the path itself and, when it is a folder, everything inside it."
    out, path = _norm(out), _norm(path)
    return path == out or path.startswith(out + "/")


def tracked(*folders: str) -> list[str]:
    r = subprocess.run(["git", "ls-files", "-z", "--", *folders], cwd=ROOT, capture_output=True, check=True)
    return [p for p in r.stdout.decode().split("\0") if p]


def results_files() -> list[str]:
    "Committed files under results/ and figures/ (the .gitignore files DVC writes for cached outputs aside)."
    return [p for p in tracked("results", "figures") if Path(p).name != ".gitignore"]


@pytest.fixture(scope="module")
def pipeline():
    st = stages()
    return st, [(s, p, o, k) for s, d in st.items() for p, o, k in declared(d)]


def test_expansion_sees_every_model():
    "The parser expands `foreach` over infer.models: one infer stage per configured model."
    models = yaml.safe_load((ROOT / "params.yaml").read_text())["infer"]["models"]
    assert {s for s in stages() if s.startswith("infer@")} == {f"infer@{m}" for m in models}


def test_no_placeholder_comments():
    "Every declaration is written out: no `# ... unchanged` shorthand for outputs that still exist."
    text = (ROOT / "dvc.yaml").read_text()
    bad = [l for l in text.splitlines() if re.search(r"#\s*\.\.\.|\bunchanged\b", l)]
    assert not bad, f"placeholder comments in dvc.yaml: {bad}"


def test_every_committed_result_owned_once(pipeline):
    _, decl = pipeline
    files = results_files()
    assert len(files) > 50, f"only {len(files)} committed results: is this a checkout of the compendium?"
    problems = {}
    for f in files:
        owners = sorted({s for s, p, _, _ in decl if owns(p, f)})
        if len(owners) != 1: problems[f] = owners
    assert not problems, f"committed files owned by no stage or by several (file: owners): {problems}"


def test_no_overlapping_declarations(pipeline):
    _, decl = pipeline
    clashes = [(a[0], a[1], b[0], b[1]) for i, a in enumerate(decl) for b in decl[i + 1:] if owns(a[1], b[1]) or owns(b[1], a[1])]
    assert not clashes, f"overlapping declarations (stage, path, stage, path): {clashes}"


def _lock() -> dict:
    return yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]


def test_every_declaration_is_in_the_lock(pipeline):
    "dvc.lock records exactly what dvc.yaml declares: the pipeline has run since the declarations last changed."
    st, decl = pipeline
    lock = _lock()
    assert set(lock) == set(st), f"stages never run: {sorted(set(st) - set(lock))}; stale in dvc.lock: {sorted(set(lock) - set(st))}"
    for s in st:
        want = {_norm(p) for s2, p, _, _ in decl if s2 == s}
        have = {_norm(o["path"]) for o in lock[s].get("outs") or []}
        assert want == have, f"{s}: declared but not in dvc.lock {sorted(want - have)}; in dvc.lock but not declared {sorted(have - want)}"


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_uncached_outputs_committed_as_locked(pipeline):
    """`cache: false` outputs live in git: each is committed, present, and holds what the pipeline wrote (the md5 in
    dvc.lock); cached outputs are DVC's and never committed."""
    _, decl = pipeline
    lock = {(s, _norm(o["path"])): o for s, d in _lock().items() for o in d.get("outs") or []}
    git = set(tracked("."))
    missing, differ, committed_cached = [], [], []
    for s, p, opts, _ in decl:
        if opts.get("cache", True):
            if any(owns(p, f) for f in git): committed_cached.append(p)
            continue
        f = ROOT / p
        if p not in git or not f.is_file(): missing.append(p); continue
        if _md5(f) != lock.get((s, _norm(p)), {}).get("md5"): differ.append(p)
    assert not missing, f"cache: false outputs not committed: {missing}"
    assert not committed_cached, f"cached outputs committed to git: {committed_cached}"
    assert not differ, f"committed outputs differ from what dvc.lock records (rerun the pipeline and commit): {differ}"


def test_ownership_check_can_fail(tmp_path):
    "The checks catch what they are for: an unowned file, two owners, an overlap."
    dvc = {"stages": {"a": {"cmd": "x", "outs": ["results/a", {"results/t.csv": {"cache": False}}]},
                      "b": {"foreach": "${m}", "do": {"cmd": "y", "plots": [{"results/a/${key}.csv": {"cache": False}}]}}}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(dvc)); (tmp_path / "params.yaml").write_text("m: {p: 1}\n")
    decl = [(s, p, o, k) for s, d in stages(tmp_path).items() for p, o, k in declared(d)]
    assert [(s, p) for s, p, _, _ in decl] == [("a", "results/a"), ("a", "results/t.csv"), ("b@p", "results/a/p.csv")]
    assert [s for s, p, _, _ in decl if owns(p, "results/a/p.csv")] == ["a", "b@p"]      # two owners
    assert not [s for s, p, _, _ in decl if owns(p, "results/other.csv")]                 # none
    assert not owns("results/a", "results/ab.csv")                                         # a prefix is not a folder
