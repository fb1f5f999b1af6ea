"""Independent blind-answerability attack on the SpatialVQA benchmark (MC questions).

Written from scratch; imports nothing from `spatialvqa`.  No answerer sees the image,
nor the measurements / derived values / answer_value / option_values / blind* fields
of the question's own scan.  Fields used from each test record: task, subtask,
template_id, question, options, structures, and from `spec` only the fields that
restate the question text (a, b, ref, options->structure ids, direction, sense,
threshold, axis).  spec.spacing_mm / voxel_box_mm / region (own-scan info) are NOT used.

Cross-fitting: scan families (prefix before '~') are shuffled and dealt round-robin
into 5 folds; 10 different shuffles; per-question correctness is averaged over the
10 repeats; 95% CIs from a bootstrap over families (2000 reps).

Written by a reviewer who had not seen the filter's answerers, to attack the released set from outside:

    .venv/bin/python benchmarks/independent_attack.py [--benchmark data/benchmark/validated.jsonl] [--out DIR]

It prints the answerer x task table (* above chance, v below), the subtasks whose interval misses chance and the
flipped counterfactual pairs; with --out it also writes results_by_task.csv, results_by_subtask.csv,
flipped_pairs.json and summary.txt there.
"""
import json, re, sys, collections, math
import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.feature_extraction.text import HashingVectorizer

import argparse, os
_ap = argparse.ArgumentParser(description="Blind answerers written independently of spatialvqa, against the validated Track A set.")
_ap.add_argument("--benchmark", default="data/benchmark/validated.jsonl")
_ap.add_argument("--out", default=None, help="folder for the tables (default: print only)")
_args = _ap.parse_args()
DATA, OUT = _args.benchmark, _args.out
if not os.path.isfile(DATA): sys.exit(f"error: {DATA} not found (run dvc repro first, or pass --benchmark)")
LET = "ABCD"
R = [json.loads(l) for l in open(DATA)]
MC = [r for r in R if r.get("format") == "mc"]
fam = lambda sid: sid.split("~")[0]
for r in MC:
    r["_fam"] = fam(r["scan_id"])
    r["_y"] = LET.index(r["answer_letter"])
FAMS = sorted(set(r["_fam"] for r in MC))

# ---------------------------------------------------------------- measurement DB
# per scan -> structure -> measurement; collected from every record (numeric too).
DB = collections.defaultdict(dict)
for r in R:
    for s in (r.get("measurements") or {}).get("structures", []) or []:
        DB[s["scan_id"]][s["name"]] = s

# ---------------------------------------------------------------- option parsing
NUM = re.compile(r"-?\d+(?:\.\d+)?")

def parse_opt(o):
    """returns ('range',lo,hi) | ('num',v) | ('vec',[..]) | ('name',None)"""
    t = o.replace(",", "")
    if re.match(r"\s*(less|fewer|under|below)", t, re.I):
        return ("range", -np.inf, float(NUM.findall(t)[0]))
    if re.match(r"\s*(more|greater|over|above)", t, re.I):
        return ("range", float(NUM.findall(t)[0]), np.inf)
    m = re.match(r"\s*(-?\d+(?:\.\d+)?)\s*[–-]\s*(\d+(?:\.\d+)?)\s*(mm|mL|ml|cm)?\s*$", t)
    if m:
        return ("range", float(m.group(1)), float(m.group(2)))
    if "×" in t:
        return ("vec", [float(x) for x in NUM.findall(t)])
    m = re.match(r"\s*(-?\d+(?:\.\d+)?)\s*(mm|mL|ml|cm|%|voxels)?\s*$", t)
    if m:
        return ("num", float(m.group(1)))
    return ("name", None)

def opt_kind(r):
    ks = [parse_opt(o)[0] for o in r["options"]]
    return ks[0] if len(set(ks)) == 1 else "mixed"

def opt_scalar(r):
    """a scalar per option for numeric/range/vec options (for rank features)"""
    vals = []
    for o in r["options"]:
        p = parse_opt(o)
        if p[0] == "num": vals.append(p[1])
        elif p[0] == "range":
            lo, hi = p[1], p[2]
            vals.append(lo * 1.5 if hi == np.inf else (hi / 2 if lo == -np.inf else (lo + hi) / 2))
        elif p[0] == "vec": vals.append(float(np.prod(p[1])) ** (1 / 3))
        else: vals.append(np.nan)
    return np.array(vals, float)

for r in MC:
    r["_kind"] = opt_kind(r)
    r["_vals"] = opt_scalar(r)

# ---------------------------------------------------------------- fold assignment
def folds_for(seed, k=5):
    rng = np.random.RandomState(seed)
    f = list(FAMS); rng.shuffle(f)
    return {x: i % k for i, x in enumerate(f)}

# ================================================================ answerer 1: priors
def prior_pred(train, test, key):
    cnt = collections.defaultdict(lambda: np.zeros(4))
    glob = np.zeros(4)
    for r in train:
        cnt[r[key]][r["_y"]] += 1; glob[r["_y"]] += 1
    out = []
    for r in test:
        c = cnt[r[key]] + 1e-3 * glob + 1e-6 * np.arange(4)[::-1]   # tie-break: global, then A
        out.append(int(np.argmax(c)))
    return out

# ================================================================ answerer 2: text classifier
HV = HashingVectorizer(n_features=2 ** 15, alternate_sign=False, ngram_range=(1, 1),
                       token_pattern=r"[A-Za-z]+|\d+", norm=None, binary=True)

def n_sig(o):
    m = NUM.findall(o.replace(",", ""))
    if not m: return 0, 0
    s = m[0].lstrip("-").replace(".", "").lstrip("0")
    dec = len(m[0].split(".")[1]) if "." in m[0] else 0
    return len(s), dec

def option_rows(r):
    """list of (token-string, dense-vector) for the 4 options"""
    q = r["question"].lower()
    qtok = set(re.findall(r"[a-z]+", q))
    vals = r["_vals"]
    numeric = not np.isnan(vals).any()
    ranks = np.argsort(np.argsort(vals)) if numeric else np.full(4, -1)
    lg = np.log(np.abs(vals) + 1e-3) if numeric else np.zeros(4)
    rows = []
    for i, o in enumerate(r["options"]):
        ol = o.lower()
        otok = re.findall(r"[a-z]+|\d+", ol)
        toks = [f"pos{i}", f"pos{i}_{r['subtask']}", f"kind_{r['_kind']}_pos{i}"]
        toks += [f"o_{t}" for t in otok] + [f"o_{t}_{r['subtask']}" for t in otok]
        # option word present in question?
        ov = len([t for t in set(otok) if t in qtok]) / max(1, len(set(otok)))
        dense = [ov, len(ol) / 40.0]
        # length rank among options
        lens = [len(x) for x in r["options"]]
        lrank = sorted(lens).index(len(o))
        toks.append(f"lrank{lrank}_{r['subtask']}")
        if numeric:
            rk = int(ranks[i])
            toks += [f"rank{rk}", f"rank{rk}_{r['subtask']}", f"rank{rk}_pos{i}"]
            # out-of-place: removing this option makes the rest sorted
            rest = np.delete(vals, i)
            oop = float(all(np.diff(rest) >= 0) and not all(np.diff(vals) >= 0))
            sig, dec = n_sig(o)
            others = np.delete(lg, i)
            dense += [oop, lg[i] - others.mean(), np.min(np.abs(others - lg[i])), sig / 4, dec / 2,
                      float(vals[i] == np.round(vals[i], -1))]
            toks += [f"sig{sig}", f"dec{dec}", f"oop{int(oop)}_{r['subtask']}"]
            # question words crossed with rank (lets it learn e.g. 'sum'->rank)
            toks += [f"q_{w}_rank{rk}" for w in qtok]
        else:
            dense += [0, 0, 0, 0, 0, 0]
            toks += [f"q_{w}_pos{i}" for w in qtok]
        rows.append((" ".join(toks), dense))
    return rows

ROWCACHE = {}
def design(recs):
    T, D = [], []
    for r in recs:
        if r["qid"] not in ROWCACHE: ROWCACHE[r["qid"]] = option_rows(r)
        for t, d in ROWCACHE[r["qid"]]:
            T.append(t); D.append(d)
    X = sparse.hstack([HV.transform(T), sparse.csr_matrix(np.array(D, float))]).tocsr()
    return X

def text_pred(train, test, C=0.3):
    X = design(train)
    y = np.concatenate([[1 if i == r["_y"] else 0 for i in range(4)] for r in train])
    clf = LogisticRegression(C=C, max_iter=2000, solver="liblinear")
    clf.fit(X, y)
    s = clf.decision_function(design(test)).reshape(-1, 4)
    return list(np.argmax(s, 1))

SUBS = sorted(set(r["subtask"] for r in MC))
def hgb_pred(train, test):
    from sklearn.ensemble import HistGradientBoostingClassifier
    def D(recs):
        X = []
        for r in recs:
            if r["qid"] not in ROWCACHE: ROWCACHE[r["qid"]] = option_rows(r)
            v = r["_vals"]
            for i, (t, d) in enumerate(ROWCACHE[r["qid"]]):
                rk = np.argsort(np.argsort(v))[i] if not np.isnan(v).any() else -1
                X.append(d + [i, rk, SUBS.index(r["subtask"]), len(r["options"][i])])
        return np.array(X, float)
    y = np.concatenate([[1 if i == r["_y"] else 0 for i in range(4)] for r in train])
    m = HistGradientBoostingClassifier(max_iter=150, learning_rate=0.05, max_leaf_nodes=8,
                                       categorical_features=[10], random_state=0).fit(D(train), y)
    return list(np.argmax(m.predict_proba(D(test))[:, 1].reshape(-1, 4), 1))

# ================================================================ answerer 3: option-content heuristic
def heur_pred(train, test):
    rankc = collections.defaultdict(lambda: np.zeros(4))
    name_ok = collections.Counter(); name_n = collections.Counter()
    txt_ok = collections.Counter()
    letter = collections.defaultdict(lambda: np.zeros(4))
    for r in train:
        letter[r["subtask"]][r["_y"]] += 1
        v = r["_vals"]
        if not np.isnan(v).any():
            rk = np.argsort(np.argsort(v))
            rankc[r["subtask"]][rk[r["_y"]]] += 1
        ids = opt_ids(r)
        if ids and all(isinstance(x, str) for x in ids):
            for i, x in enumerate(ids):
                name_n[x] += 1; name_ok[x] += (i == r["_y"])
        txt_ok[r["options"][r["_y"]]] += 1
    out = []
    for r in test:
        v = r["_vals"]; ids = opt_ids(r)
        lp = letter[r["subtask"]] + 1e-6 * np.arange(4)[::-1]
        if not np.isnan(v).any() and rankc[r["subtask"]].sum() > 0:
            want = int(np.argmax(rankc[r["subtask"]] + 1e-6 * np.array([0, 2, 1, 0])))  # ties -> 2nd smallest
            rk = np.argsort(np.argsort(v)); out.append(int(np.where(rk == want)[0][0]))
        elif ids and all(isinstance(x, str) for x in ids):
            sc = [(name_ok[x] + 0.25) / (name_n[x] + 1) for x in ids]
            out.append(int(np.argmax(np.array(sc) + 1e-6 * lp)))
        else:
            sc = [txt_ok[o] for o in r["options"]]
            out.append(int(np.argmax(np.array(sc) + 1e-3 * lp)))
    return out

def fixed_second_largest(test):
    out = []
    for r in test:
        v = r["_vals"]
        if np.isnan(v).any(): out.append(None); continue
        out.append(int(np.argsort(v)[-2]))
    return out

# ================================================================ answerer 4: nearest-patient anatomy
def opt_ids(r):
    sp = r.get("spec") or {}
    return sp.get("options")

DIRV = {"right": (0, 1), "left": (0, -1), "anterior": (1, 1), "posterior": (1, -1),
        "superior": (2, 1), "inferior": (2, -1)}   # measurements are RAS+ (liver x>0, stomach y>kidney y)

def atlas_scans(train_fams):
    # only un-manipulated scans (no '~') of training families
    return [sid for sid in DB if "~" not in sid and fam(sid) in train_fams]

def med(xs):
    return float(np.median(xs)) if xs else None

def pick_closest_value(r, est):
    """choose option for a numeric/range/vec estimate"""
    ps = [parse_opt(o) for o in r["options"]]
    if ps[0][0] == "range":
        for i, p in enumerate(ps):
            if p[1] <= est < p[2]: return i
        return int(np.argmin([min(abs(est - p[1]), abs(est - p[2])) for p in ps]))
    if ps[0][0] == "num":
        return int(np.argmin([abs(math.log(max(est, 1e-3)) - math.log(max(p[1], 1e-3))) for p in ps]))
    if ps[0][0] == "vec":
        e = np.log(np.maximum(np.array(est), 1e-3))
        return int(np.argmin([np.abs(np.log(np.maximum(np.array(p[1]), 1e-3)) - e).sum() for p in ps]))
    return None

def dist(m1, m2):
    return float(np.linalg.norm(np.array(m1["bbox_center_mm"]) - np.array(m2["bbox_center_mm"])))

AX = {"left-right": 0, "anterior-posterior": 1, "superior-inferior": 2}

def atlas_one(r, scans):
    st, sp, q = r["subtask"], r.get("spec") or {}, r["question"]
    def vols(name):
        return [DB[s][name]["volume_ml"] for s in scans if name in DB[s]]
    if st in ("VOL.range", "VOL.value", "VOL.closest"):
        e = med(vols(sp["a"]));  return None if e is None else pick_closest_value(r, e)
    if st in ("VOL.sum", "VOL.difference"):
        a, b = med(vols(sp["a"])), med(vols(sp["b"]))
        if a is None or b is None: return None
        return pick_closest_value(r, a + b if st == "VOL.sum" else a - b)
    if st in ("DIST.range", "DIST.value"):
        d = [dist(DB[s][sp["a"]], DB[s][sp["b"]]) for s in scans if sp["a"] in DB[s] and sp["b"] in DB[s]]
        e = med(d); return None if e is None else pick_closest_value(r, e)
    if st in ("EXT.value", "EXT.bbox"):
        ex = [DB[s][sp["a"]]["extent_mm"] for s in scans if sp["a"] in DB[s]]
        if not ex: return None
        e = np.median(np.array(ex), 0)
        return pick_closest_value(r, float(e[sp["axis"]]) if st == "EXT.value" else list(e))
    ids = opt_ids(r)
    if st in ("DIST.closest", "DIST.farthest", "DIST.within"):
        ref = sp["ref"]
        ds = [med([dist(DB[s][ref], DB[s][x]) for s in scans if ref in DB[s] and x in DB[s]]) for x in ids]
        if any(d is None for d in ds): return None
        return int(np.argmax(ds) if st == "DIST.farthest" else np.argmin(ds))
    if st in ("VOL.threshold", "COMP.extreme", "COMP.than"):
        v = [med(vols(x)) for x in ids]
        if any(x is None for x in v): return None
        sense = sp.get("sense", 1)
        return int(np.argmax(v) if sense > 0 else np.argmin(v))
    if st == "COMP.rank":
        allnames = sorted(set(x for o in ids for x in o))
        v = {x: med(vols(x)) for x in allnames}
        if any(x is None for x in v.values()): return None
        asc = "smallest to largest" in q
        order = sorted(allnames, key=lambda x: v[x], reverse=not asc)
        for i, o in enumerate(ids):
            if list(o) == order: return i
        return None
    if st == "EXT.max_extent":
        e = [med([DB[s][x]["extent_mm"][sp["axis"]] for s in scans if x in DB[s]]) for x in ids]
        if any(x is None for x in e): return None
        return int(np.argmax(e))
    if st == "DIR.extreme":
        ax, sg = DIRV[sp["direction"]]
        votes = np.zeros(len(ids))
        for s in scans:   # pairwise votes within each atlas scan (coordinates are scan-relative)
            for i in range(len(ids)):
                for j in range(len(ids)):
                    if i != j and ids[i] in DB[s] and ids[j] in DB[s]:
                        votes[i] += sg * (DB[s][ids[i]]["centroid_mm"][ax] - DB[s][ids[j]]["centroid_mm"][ax]) > 0
        return None if votes.sum() == 0 else int(np.argmax(votes))
    if st == "DIR.relative_to":
        ax, sg = DIRV[sp["direction"]]; ref = sp["ref"]
        sc = []
        for x in ids:
            o = [sg * (DB[s][x]["centroid_mm"][ax] - DB[s][ref]["centroid_mm"][ax]) for s in scans if x in DB[s] and ref in DB[s]]
            sc.append(med(o))
        if all(x is None for x in sc): return None
        return int(np.nanargmax([(-1e9 if x is None else x) for x in sc]))
    return None

def atlas_pred(train, test):
    trf = set(r["_fam"] for r in train)
    scans = atlas_scans(trf)
    fb = prior_pred(train, test, "subtask")
    out, cov = [], []
    for r, f in zip(test, fb):
        p = atlas_one(r, scans)
        cov.append(p is not None); out.append(f if p is None else p)
    return out, cov

# ================================================================ run cross-fitting
NREP = 10
ANS = ["prior_subtask", "prior_task", "text_LR", "text_HGB", "heuristic", "atlas"]
correct = {a: np.zeros((NREP, len(MC))) for a in ANS}
pred = {a: np.zeros((NREP, len(MC)), int) for a in ANS}
covered = np.zeros((NREP, len(MC)))
idx = {r["qid"]: i for i, r in enumerate(MC)}
for rep in range(NREP):
    fa = folds_for(1000 + rep)
    for k in range(5):
        te = [r for r in MC if fa[r["_fam"]] == k]
        tr = [r for r in MC if fa[r["_fam"]] != k]
        if not te: continue
        ii = [idx[r["qid"]] for r in te]
        res = {"prior_subtask": prior_pred(tr, te, "subtask"),
               "prior_task": prior_pred(tr, te, "task"),
               "text_LR": text_pred(tr, te),
               "text_HGB": hgb_pred(tr, te),
               "heuristic": heur_pred(tr, te)}
        ap, cv = atlas_pred(tr, te); res["atlas"] = ap; covered[rep, ii] = cv
        for a in ANS:
            p = np.array(res[a]); pred[a][rep, ii] = p
            correct[a][rep, ii] = (p == np.array([r["_y"] for r in te]))
    print("rep", rep, {a: round(float(correct[a][rep].mean()), 3) for a in ANS}, file=sys.stderr)

# fixed (untrained) rule: second-largest numeric value
fs = fixed_second_largest(MC)
fs_ok = np.array([np.nan if p is None else float(p == r["_y"]) for p, r in zip(fs, MC)])

# ================================================================ bootstrap over families
rng = np.random.RandomState(7)
famarr = np.array([r["_fam"] for r in MC]); taskarr = np.array([r["task"] for r in MC])
fam_idx = {f: np.where(famarr == f)[0] for f in FAMS}
BOOT = [rng.randint(0, len(FAMS), len(FAMS)) for _ in range(2000)]

def boot_ci(acc_q, mask):
    mask = mask & ~np.isnan(acc_q)
    if not mask.any(): return np.nan, np.nan, np.nan, 0
    est = acc_q[mask].mean()
    vals = []
    for b in BOOT:
        ii = np.concatenate([fam_idx[FAMS[j]] for j in b])
        ii = ii[mask[ii]]
        if len(ii): vals.append(acc_q[ii].mean())
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return est, lo, hi, int(mask.sum())

TASKS = ["DIR", "DIST", "EXT", "VOL", "COMP", "ALL"]
rows = []
table = {a: correct[a].mean(0) for a in ANS}
table["fixed_2nd_largest"] = fs_ok
cov_q = covered.mean(0) > 0.5
atl_cov = np.where(cov_q, table["atlas"], np.nan)
table["atlas_covered_only"] = atl_cov
for a, acc_q in table.items():
    for t in TASKS:
        m = np.ones(len(MC), bool) if t == "ALL" else taskarr == t
        est, lo, hi, n = boot_ci(acc_q, m)
        flag = "ABOVE" if lo > 0.25 else ("BELOW" if hi < 0.25 else "")
        if n == 0: continue
        rows.append(dict(answerer=a, task=t, n=n, acc=est, lo=lo, hi=hi, flag=flag))

# per subtask (point estimates only)
subrows = []
for a, acc_q in table.items():
    for st in sorted(set(r["subtask"] for r in MC)):
        m = np.array([r["subtask"] == st for r in MC]) & ~np.isnan(acc_q)
        if m.any():
            est, lo, hi, n = boot_ci(acc_q, m)
            subrows.append(dict(answerer=a, subtask=st, n=n, acc=est, lo=lo, hi=hi,
                                flag="ABOVE" if lo > 0.25 else ("BELOW" if hi < 0.25 else "")))

# ================================================================ flipped counterfactual pairs
byqid = {r["qid"]: r for r in MC}
pairs = [(r["pair_of"], r["qid"]) for r in MC if r.get("pair_of") and r.get("flipped") and r["pair_of"] in byqid]
pair_res = {}
for a in ANS:
    both = [np.mean(correct[a][:, idx[o]] * correct[a][:, idx[t]]) for o, t in pairs]
    either = [np.mean(np.maximum(correct[a][:, idx[o]], correct[a][:, idx[t]])) for o, t in pairs]
    pair_res[a] = dict(n_pairs=len(pairs), both_right=float(np.mean(both)), at_least_one=float(np.mean(either)))

# ================================================================ output
import pandas as pd
df = pd.DataFrame(rows); sdf = pd.DataFrame(subrows)
if OUT:
    os.makedirs(OUT, exist_ok=True)
    df.to_csv(f"{OUT}/results_by_task.csv", index=False); sdf.to_csv(f"{OUT}/results_by_subtask.csv", index=False)
    json.dump(pair_res, open(f"{OUT}/flipped_pairs.json", "w"), indent=1)
pd.set_option("display.width", 200); pd.set_option("display.max_rows", 500)
piv = df.assign(cell=df.apply(lambda x: f"{x.acc*100:.1f} [{x.lo*100:.0f},{x.hi*100:.0f}]{'*' if x.flag=='ABOVE' else ('v' if x.flag=='BELOW' else '')}", axis=1)
                ).pivot(index="answerer", columns="task", values="cell")[[t for t in TASKS if t in set(df.task)]]   # a task with no question: no column
ns = df[df.answerer == "prior_task"].set_index("task")["n"]
print("n per task:", dict(ns))
print(piv.to_string())
print("\n* = 95% CI above 25%, v = below 25%")
print("\nper-subtask flags:")
print(sdf[sdf.flag != ""].to_string(index=False))
print("\natlas coverage (decoded, not fallback):", round(cov_q.mean(), 3),
      {t: round(cov_q[taskarr == t].mean(), 2) for t in TASKS[:-1] if (taskarr == t).any()})
print("\nflipped pairs:", json.dumps(pair_res, indent=1))
if OUT:
  with open(f"{OUT}/summary.txt", "w") as f:
    f.write(piv.to_string() + "\n\n" + sdf.to_string(index=False) + "\n\n" + json.dumps(pair_res, indent=1) + "\n")
