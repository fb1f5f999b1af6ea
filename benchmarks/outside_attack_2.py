"""Independent blind-shortcut attack on the MC part of the benchmark (a second outside reviewer, 2026-11-26, who had not
seen the filter's answerers or the generator; like benchmarks/independent_attack.py it imports nothing from spatialvqa).

    python benchmarks/outside_attack_2.py [data/benchmark/validated.jsonl] [OUT]

Eight attackers (answer-position prior, option heuristics, a hashed text classifier, gradient boosting on hand-made
features with and without the copy tag, fixed anatomy rules, a fixed distractor-structure rule, a stacker), cross-fitted
on 5 folds of scan families repeated 3 times; 95% intervals from 2,000 bootstrap resamples of families. Prints the
table the README quotes. NREP (environment) sets the repeats.

Only uses: question, options, task, subtask, source (dataset), qid/pair_of/scan_id
(for grouping + pairing), and answer_letter/answer_text as training labels/evaluation.
"""
import json, re, sys, time, math, os
import numpy as np, pandas as pd
from collections import defaultdict
from sklearn.linear_model import LogisticRegression
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.feature_extraction import FeatureHasher

T0 = time.time()
RNG = np.random.default_rng(0)
N_REPEATS = int(os.environ.get("NREP", 3))
NFOLD = 5
L = "ABCD"

SRC = sys.argv[1] if len(sys.argv) > 1 else "data/benchmark/validated.jsonl"
OUT = sys.argv[2] if len(sys.argv) > 2 else "/tmp/outside_attack_2"
os.makedirs(OUT, exist_ok=True)
rows = [json.loads(l) for l in open(SRC)]
KEEP = ["qid", "scan_id", "source", "task", "subtask", "format", "question", "options",
        "answer_letter", "answer_text", "pair_of"]
d = pd.DataFrame([{k: r[k] for k in KEEP} for r in rows])
d = d[(d.format == "mc") & (d.task != "VOLEST")].reset_index(drop=True)
d["fam"] = d.scan_id.str.split("~").str[0]
d["src"] = d.source.str.split("+").str[0]
d["cf"] = d.source.str.split("+").str[1].fillna("orig")
d["y"] = d.answer_letter.map(L.index)
d["stem"] = d.question.str.split(r"\? ").str[0]  # drop boilerplate sentence
NQ = len(d)
print("MC questions", NQ, "families", d.fam.nunique(), file=sys.stderr)

# ---------------------------------------------------------------- parsing helpers
NUM = re.compile(r"\d+(?:\.\d+)?")


def opt_value(o):
    """monotone scalar for an option (numbers, ranges); None if no number."""
    nums = [float(x) for x in NUM.findall(o)]
    if not nums:
        return None
    lo = o.lower()
    if "less than" in lo:
        return nums[0] * 0.5
    if "more than" in lo and not lo.startswith("the "):
        return nums[0] * 1.5
    if len(nums) == 2 and ("–" in o or "-" in o):
        return (nums[0] + nums[1]) / 2
    if len(nums) == 3:
        return float(np.prod(nums)) ** (1 / 3)
    return nums[0]


def triple(o):
    nums = [float(x) for x in NUM.findall(o)]
    return nums if len(nums) == 3 and "×" in o else None


# structure phrases -> key (my own vocabulary)
PHR = [
    ("tumour in the right kidney", "ktum_R"), ("tumour in the left kidney", "ktum_L"),
    ("tumour in the right upper lobe of the lung", "ltum_RUL"), ("tumour in the left upper lobe of the lung", "ltum_LUL"),
    ("tumour in the right lower lobe of the lung", "ltum_RLL"), ("tumour in the left lower lobe of the lung", "ltum_LLL"),
    ("tumour in the right middle lobe of the lung", "ltum_RML"),
    ("pancreatic tumour", "ptum"), ("liver tumour", "livtum"), ("lung tumour", "lungtum"), ("spleen tumour", "stum"),
    ("kidney tumour", "ktum"),
    ("right upper lobe of the lung", "RUL"), ("left upper lobe of the lung", "LUL"),
    ("right lower lobe of the lung", "RLL"), ("left lower lobe of the lung", "LLL"),
    ("right middle lobe of the lung", "RML"), ("right lung", "lungR"), ("left lung", "lungL"),
    ("right kidney", "kidR"), ("left kidney", "kidL"), ("right adrenal gland", "adrR"), ("left adrenal gland", "adrL"),
    ("right parotid gland", "parR"), ("left parotid gland", "parL"),
    ("gallbladder", "gb"), ("liver", "liver"), ("spleen", "spleen"), ("stomach", "stomach"), ("pancreas", "pancreas"),
    ("heart", "heart"), ("urinary bladder", "bladder"), ("prostate", "prostate"), ("mandible", "mandible"),
    ("larynx", "larynx"), ("brainstem", "brainstem"),
]


def find_structs(text):
    t = text.lower()
    out, used = [], np.zeros(len(t) + 1, bool)
    for ph, k in sorted(PHR, key=lambda p: -len(p[0])):
        for mm in re.finditer(re.escape(ph), t):
            if not used[mm.start():mm.end()].any():
                used[mm.start():mm.end()] = True
                out.append((mm.start(), k))
    return [k for _, k in sorted(out)]


# ---------------------------------------------------------------- anatomy "textbook" (my own priors)
# patient frame: x + = patient's left, y + = anterior, z + = superior (mm), origin ~ L1 body
POS = {
    "liver": (-75, 15, 65), "gb": (-55, 45, 15), "stomach": (55, 35, 55), "spleen": (100, -35, 55),
    "pancreas": (15, 10, 25), "kidL": (75, -45, 5), "kidR": (-70, -45, -15),
    "adrL": (40, -20, 40), "adrR": (-40, -25, 55), "heart": (20, 40, 210),
    "RUL": (-85, 5, 290), "LUL": (85, 15, 280), "RML": (-85, 45, 215), "RLL": (-90, -45, 200),
    "LLL": (90, -45, 195), "lungR": (-90, -5, 240), "lungL": (90, -5, 235),
    "bladder": (0, 35, -260), "prostate": (0, 15, -300),
    "mandible": (0, 65, 450), "larynx": (0, 40, 390), "parL": (55, 5, 470), "parR": (-55, 5, 470),
    "brainstem": (0, -15, 530),
}
VOLT = {  # mL
    "liver": 1550, "gb": 35, "stomach": 400, "spleen": 200, "pancreas": 80, "kidL": 170, "kidR": 160,
    "adrL": 5, "adrR": 4.5, "heart": 650, "RUL": 950, "LUL": 1100, "RML": 400, "RLL": 1100, "LLL": 1000,
    "lungR": 2700, "lungL": 2300, "bladder": 200, "prostate": 30, "mandible": 75, "larynx": 30,
    "parL": 25, "parR": 25, "brainstem": 25,
}
EXTT = {  # LR, AP, SI mm
    "liver": (200, 170, 170), "gb": (40, 40, 80), "stomach": (140, 100, 160), "spleen": (100, 110, 120),
    "pancreas": (150, 60, 60), "kidL": (60, 60, 110), "kidR": (60, 60, 110), "adrL": (30, 30, 45),
    "adrR": (30, 30, 45), "heart": (140, 110, 120), "RUL": (130, 130, 150), "LUL": (130, 150, 180),
    "RML": (100, 90, 80), "RLL": (130, 150, 180), "LLL": (130, 150, 170), "lungR": (130, 180, 250),
    "lungL": (120, 180, 250), "bladder": (80, 60, 60), "prostate": (45, 35, 40), "mandible": (105, 90, 90),
    "larynx": (45, 45, 60), "parL": (35, 45, 65), "parR": (35, 45, 65), "brainstem": (30, 35, 80),
}
TUMHOST = {"ktum_R": "kidR", "ktum_L": "kidL", "ltum_RUL": "RUL", "ltum_LUL": "LUL", "ltum_RLL": "RLL",
           "ltum_LLL": "LLL", "ltum_RML": "RML", "ptum": "pancreas", "livtum": "liver", "lungtum": "lungR",
           "stum": "spleen", "ktum": "kidL"}
TUMVOL, TUMEXT = 30.0, (35, 35, 35)


def pos(k):
    k = TUMHOST.get(k, k)
    return np.array(POS.get(k, (0, 0, 0)), float)


def vol(k):
    return TUMVOL if k in TUMHOST else VOLT.get(k, 100.0)


def ext(k):
    return np.array(TUMEXT if k in TUMHOST else EXTT.get(k, (60, 60, 60)), float)


DIRV = {"left": np.array([1, 0, 0]), "right": np.array([-1, 0, 0]), "anterior": np.array([0, 1, 0]),
        "posterior": np.array([0, -1, 0]), "superior": np.array([0, 0, 1]), "inferior": np.array([0, 0, -1])}


def dir_of(text):
    t = text.lower()
    for w, key in [("patient's left", "left"), ("patient's right", "right"), ("anterior", "anterior"),
                   ("forward", "anterior"), ("posterior", "posterior"), ("superior", "superior"),
                   ("higher", "superior"), ("inferior", "inferior"), ("lower", "inferior")]:
        if w in t:
            return DIRV[key]
    return None


def axis_of(stem):
    t = stem.lower()
    if "left-right" in t or "width" in t:
        return 0
    if "anterior-posterior" in t:
        return 1
    return 2


def near_scores(opts, target, log=True):
    vals = [opt_value(o) for o in opts]
    return np.array([-abs(math.log(v / target)) if v and v > 0 else -9 for v in vals])


def range_scores(opts, target):
    sc = []
    for o in opts:
        nums = [float(x) for x in NUM.findall(o)]
        lo_ = o.lower()
        if "less than" in lo_:
            a, b = 0, nums[0]
        elif "more than" in lo_:
            a, b = nums[0], 1e9
        else:
            a, b = nums[0], nums[1]
        sc.append(0.0 if a <= target < b else -min(abs(math.log(max(target, 1e-3) / max(a, 1e-3))),
                                                   abs(math.log(max(target, 1e-3) / b))))
    return np.array(sc)


def atlas_scores(r):
    """score per option from my own anatomy rules (higher = pick)."""
    st, stem, opts = r.subtask, r.stem, r.options
    S = find_structs(stem)
    OS = [find_structs(o) for o in opts]
    z = np.zeros(4)
    try:
        if st == "DIR.level":  # left vs right paired organ
            kl = [k for k in S if k.endswith("L") or k in ("LUL", "LLL", "lungL")]
            kr = [k for k in S if k.endswith("R") or k in ("RUL", "RLL", "lungR")]
            dv = dir_of(stem)
            diff = float((pos(kl[0]) - pos(kr[0])) @ dv)  # >0 : left more in that dir
            side = "left" if diff > 0 else "right"
            big = abs(diff) > 10
            for i, o in enumerate(opts):
                ol = o.lower()
                z[i] = (side in ol) * 2 + (("more than" in ol) == big)
        elif st == "DIR.extreme":
            dv = dir_of(stem)
            z = np.array([pos(k[0]) @ dv if k else -1e9 for k in OS])
        elif st == "DIR.relative":
            # "Relative to A, ... does B lie" / "from A is B" / "Where is B located relative to A"/ "position of B with respect to A"
            t = stem.lower()
            if t.startswith("relative to") or "direction from" in t:
                a, b = S[0], S[1]
            else:
                b, a = S[0], S[1]
            v = pos(b) - pos(a)
            z = np.array([v @ dir_of(o) if dir_of(o) is not None else -1e9 for o in opts])
        elif st == "DIR.relative_to":
            dv = dir_of(stem)
            a = S[-1]
            z = np.array([(pos(k[0]) - pos(a)) @ dv if k else -1e9 for k in OS])
        elif st in ("DIST.closest", "DIST.farthest", "DIST.within"):
            a = S[-1]
            dd = np.array([np.linalg.norm(pos(k[0]) - pos(a)) if k else 1e9 for k in OS])
            z = dd if st == "DIST.farthest" else -dd
        elif st in ("DIST.value", "DIST.range"):
            dist = max(np.linalg.norm(pos(S[0]) - pos(S[1])), 10.0)
            z = near_scores(opts, dist) if st == "DIST.value" else range_scores(opts, dist)
        elif st == "EXT.value":
            z = near_scores(opts, ext(S[0])[axis_of(stem)])
        elif st == "EXT.bbox":
            e = ext(S[0])
            z = np.array([-np.abs(np.log(np.array(triple(o)) / e)).sum() if triple(o) else -9 for o in opts])
        elif st == "EXT.max_extent":
            z = np.array([ext(k[0])[2] if k else -1 for k in OS])
        elif st in ("VOL.value", "VOL.range"):
            z = near_scores(opts, vol(S[0])) if st == "VOL.value" else range_scores(opts, vol(S[0]))
        elif st == "VOL.sum":
            z = near_scores(opts, vol(S[0]) + vol(S[1]))
        elif st == "VOL.difference":
            z = near_scores(opts, max(vol(S[0]) - vol(S[1]), 1.0))
        elif st == "VOL.threshold":
            thr = float(NUM.findall(stem)[0])
            z = np.array([vol(k[0]) - thr if k else -1e9 for k in OS])
        elif st == "COMP.extreme":
            v = np.array([vol(k[0]) if k else 1 for k in OS])
            z = v if "largest" in stem.lower() else -v
        elif st == "COMP.rank":
            asc = "smallest to largest" in stem.lower()
            for i, k in enumerate(OS):
                v = [vol(x) for x in k]
                ok = all((v[j] <= v[j + 1]) if asc else (v[j] >= v[j + 1]) for j in range(len(v) - 1))
                z[i] = ok
        elif st == "COMP.asymmetry":
            vl, vr = vol(S[0]), vol(S[1])  # left first in all templates seen
            side = "left" if vl > vr else "right"
            big = max(vl, vr) / min(vl, vr) > 1.25
            z = np.array([(side in o.lower()) * 2 + (("more than" in o.lower()) == big) for o in opts], float)
    except Exception as e:  # unparsable -> uniform
        z = np.zeros(4)
    return np.asarray(z, float)


# ---------------------------------------------------------------- per-option hand features
def opt_feats(r):
    opts = r.options
    vals = [opt_value(o) for o in opts]
    F = []
    isnum = all(v is not None and v > 0 for v in vals)
    lv = np.log(np.array(vals, float)) if isnum else np.zeros(4)
    order = np.argsort(np.argsort(lv)) if isnum else np.zeros(4)
    trs = [triple(o) for o in opts]
    lens = np.array([len(o) for o in opts], float)
    for i, o in enumerate(opts):
        f = {}
        f["pos"] = i
        f["isnum"] = float(isnum)
        if isnum:
            others = np.delete(lv, i)
            f["rank"] = order[i]
            f["is_min"] = float(order[i] == 0)
            f["is_max"] = float(order[i] == 3)
            f["z_log"] = (lv[i] - lv.mean()) / (lv.std() + 1e-9)
            f["d_gm_others"] = lv[i] - others.mean()
            f["gap_min"] = np.min(np.abs(others - lv[i]))
            f["logv"] = lv[i]
            gm_all = np.array([np.min(np.abs(np.delete(lv, j) - lv[j])) for j in range(4)])
            f["gap_rank"] = float(np.argsort(np.argsort(-gm_all))[i])  # 0 = most isolated
            srt = np.sort(lv)
            f["gap_below"] = lv[i] - srt[order[i] - 1] if order[i] > 0 else -1
            f["gap_above"] = srt[order[i] + 1] - lv[i] if order[i] < 3 else -1
            f["spread"] = srt[-1] - srt[0]
            # ratio-pattern features: how many others are at "nice" ratios 1.5, 2, 0.67, 0.5
            f["n_ratio_hits"] = sum(any(abs(abs(x - lv[i]) - math.log(q)) < 0.05 for q in (1.25, 1.33, 1.5, 2.0, 3.0))
                                    for x in others)
        if trs[i] is not None and all(t is not None for t in trs):
            me = trs[i]
            f["perm_of_other"] = sum(sorted(me) == sorted(t) for j, t in enumerate(trs) if j != i)
            f["shared_comp"] = sum(len(set(me) & set(t)) for j, t in enumerate(trs) if j != i)
            f["same_pos_comp"] = sum(sum(a == b for a, b in zip(me, t)) for j, t in enumerate(trs) if j != i)
            f["tri_sorted_desc"] = float(me[0] >= me[1] >= me[2])
            f["tri_si_max"] = float(me[2] == max(me))
            f["tri_lr_max"] = float(me[0] == max(me))
        f["len"] = lens[i]
        f["len_rank"] = float(np.argsort(np.argsort(lens))[i])
        f["len_z"] = (lens[i] - lens.mean()) / (lens.std() + 1e-9)
        ol = o.lower()
        f["has_left"] = float("left" in ol)
        f["has_right"] = float("right" in ol)
        f["more_than"] = float("more than" in ol)
        f["less"] = float("less" in ol)
        f["tumour"] = float("tumour" in ol)
        # textual overlap between option and question
        qs = set(find_structs(r.stem))
        os_ = find_structs(o)
        f["opt_in_q"] = float(any(k in qs for k in os_))
        F.append(f)
    return F


CAT_SUBTASKS = sorted(d.subtask.unique())
CAT_SRC = sorted(d.src.unique())
COMMON_OPTS = pd.Series([o for os in d.options for o in os]).value_counts()
COMMON_OPTS = [o for o, c in COMMON_OPTS.items() if c >= 8 and not NUM.search(o)]
QKEYS = sorted({k for s in d.stem for k in find_structs(s)})
print("common opt texts", len(COMMON_OPTS), "struct keys", len(QKEYS), file=sys.stderr)


def build_dense(df, use_src=False, use_cf=False):
    recs = []
    for r in df.itertuples():
        fs = opt_feats(r)
        qk = set(find_structs(r.stem))
        dv = dir_of(r.stem)
        for i, f in enumerate(fs):
            f = dict(f)
            f["st"] = CAT_SUBTASKS.index(r.subtask)
            f["task"] = ["COMP", "DIR", "DIST", "EXT", "VOL"].index(r.task)
            f["qdir"] = -1 if dv is None else int(np.argmax(np.abs(dv)) * 2 + (dv.sum() > 0))
            f["opt_txt"] = COMMON_OPTS.index(r.options[i]) if r.options[i] in COMMON_OPTS else -1
            ok = find_structs(r.options[i])
            f["opt_key"] = QKEYS.index(ok[0]) if ok and ok[0] in QKEYS else -1
            for k in QKEYS:
                f["q_" + k] = float(k in qk)
            f["asc"] = float("smallest to largest" in r.stem.lower())
            if use_src:
                f["src"] = CAT_SRC.index(r.src)
            if use_cf:
                f["cf"] = ["orig", "mirror", "resize"].index(r.cf)
            recs.append(f)
    X = pd.DataFrame(recs).fillna(-2.0)
    return X


# text tokens for the linear text classifier
STOP = set("the of a an and or is are in to which what by how these from that its this with as be one".split())


def words(s):
    return [w for w in re.findall(r"[a-z]+|\d+(?:\.\d+)?", s.lower()) if w not in STOP]


def numtok(w):
    try:
        v = float(w)
        return "n~%d" % round(math.log2(max(v, 0.01)) * 2)
    except ValueError:
        return w


def text_tokens(r, i):
    o = r.options[i]
    ow = [numtok(w) for w in words(o)]
    qw = words(r.stem)
    st = r.subtask
    toks = ["st=" + st, "pos=%d" % i, st + "|pos=%d" % i]
    toks += ["o:" + w for w in ow] + [st + "|o:" + w for w in ow]
    toks += ["o2:" + a + "_" + b for a, b in zip(ow, ow[1:])]
    toks += ["q:%s|o:%s" % (q, w) for q in set(qw) for w in set(ow)]
    return toks


# ---------------------------------------------------------------- attackers (fit on train idx, score test idx)
def att_prior(tr, te):
    cnt = defaultdict(lambda: np.ones(4))
    glob = np.ones(4)
    for r in d.loc[tr].itertuples():
        cnt[r.subtask][r.y] += 1
        glob[r.y] += 1
    out = []
    for r in d.loc[te].itertuples():
        c = cnt[r.subtask] if r.subtask in cnt else glob
        p = c / c.sum() + 1e-6 * glob / glob.sum()
        out.append(p)
    return np.array(out)


HEUR = {
    **{"pos" + L[i]: (lambda r, i=i: np.eye(4)[i]) for i in range(4)},
    "num_min": lambda r, F: -np.array([f.get("rank", 0) for f in F]),
    "num_max": lambda r, F: np.array([f.get("rank", 0) for f in F], float),
    "num_2nd": lambda r, F: -np.abs(np.array([f.get("rank", 0) for f in F]) - 1.0),
    "num_3rd": lambda r, F: -np.abs(np.array([f.get("rank", 0) for f in F]) - 2.0),
    "longest": lambda r, F: np.array([f["len"] for f in F]),
    "shortest": lambda r, F: -np.array([f["len"] for f in F]),
    "most_shared": lambda r, F: np.array([f.get("shared_comp", 0) + f.get("same_pos_comp", 0) * 0.1 for f in F]),
    "least_isolated": lambda r, F: -np.array([f.get("gap_min", 0) for f in F]),
    "most_isolated": lambda r, F: np.array([f.get("gap_min", 0) for f in F]),
    "opt_in_q": lambda r, F: np.array([f["opt_in_q"] for f in F]),
    "not_in_q": lambda r, F: -np.array([f["opt_in_q"] for f in F]),
}


def heur_score(name, r, F):
    h = HEUR[name]
    s = h(r) if name.startswith("pos") else h(r, F)
    return np.asarray(s, float) + 1e-3 * RNG.random(4) * 0  # deterministic; ties -> first


FEATS_CACHE = {}


def feats(i):
    if i not in FEATS_CACHE:
        FEATS_CACHE[i] = opt_feats(d.loc[i])
    return FEATS_CACHE[i]


def att_heur(tr, te):
    # choose best heuristic per subtask on train (fallback: per task, then global)
    acc = {}
    for name in HEUR:
        for i in tr:
            r = d.loc[i]
            s = heur_score(name, r, feats(i))
            ties = s == s.max()
            hit = float(ties[r.y]) / ties.sum()
            for key in (("st", r.subtask), ("task", r.task), ("all",)):
                a = acc.setdefault((key, name), [0.0, 0])
                a[0] += hit
                a[1] += 1
    def best(key):
        c = [(acc[(key, n)][0] / acc[(key, n)][1], n) for n in HEUR if (key, n) in acc]
        n = acc.get((key, "posA"), [0, 0])[1]
        return max(c)[1] if c else None, n
    out = []
    for i in te:
        r = d.loc[i]
        name, n = best(("st", r.subtask))
        if name is None or n < 8:
            name, n = best(("task", r.task))
        if name is None:
            name, _ = best(("all",))
        s = heur_score(name, r, feats(i))
        p = np.exp(3 * (s - s.max()) / (np.abs(s).max() + 1e-9))
        out.append(p / p.sum())
    return np.array(out)


HASH = FeatureHasher(n_features=2 ** 18, input_type="string", alternate_sign=False)
TXT = None


def text_matrix():
    global TXT
    if TXT is None:
        toks = [text_tokens(r, i) for r in d.itertuples() for i in range(4)]
        TXT = HASH.transform(toks).tocsr()
        TXT.data = np.log1p(TXT.data)
    return TXT


def opt_rows(idx):
    return np.concatenate([np.arange(4) + 4 * i for i in idx])


def softmax4(s):
    s = s.reshape(-1, 4)
    s = s - s.max(1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(1, keepdims=True)


def att_text(tr, te):
    X = text_matrix()
    ytr = np.zeros(4 * len(tr))
    ytr[np.arange(len(tr)) * 4 + d.loc[tr].y.values] = 1
    clf = LogisticRegression(C=0.5, max_iter=2000, class_weight={0: 1, 1: 3})
    clf.fit(X[opt_rows(tr)], ytr)
    return softmax4(clf.decision_function(X[opt_rows(te)]))


DENSE = {}


def dense(use_src, use_cf):
    k = (use_src, use_cf)
    if k not in DENSE:
        DENSE[k] = build_dense(d, use_src, use_cf)
    return DENSE[k]


def att_gbm(tr, te, use_src=False, use_cf=False):
    X = dense(use_src, use_cf)
    cats = [c for c in ["st", "task", "qdir", "opt_txt", "opt_key", "src", "cf"] if c in X.columns]
    Xc = X.copy()
    for c in cats:
        Xc[c] = Xc[c] + 1  # non-negative for categorical
    ytr = np.zeros(4 * len(tr))
    ytr[np.arange(len(tr)) * 4 + d.loc[tr].y.values] = 1
    clf = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=10,
                                         l2_regularization=1.0, categorical_features=[c in cats for c in Xc.columns],
                                         random_state=0)
    clf.fit(Xc.iloc[opt_rows(tr)], ytr)
    p = clf.predict_proba(Xc.iloc[opt_rows(te)])[:, 1]
    return softmax4(np.log(np.clip(p, 1e-6, 1)))


ATLAS = np.array([atlas_scores(r) for r in d.itertuples()])


def att_atlas(tr, te):
    s = ATLAS[te]
    s = (s == s.max(1, keepdims=True)).astype(float)
    return s / s.sum(1, keepdims=True)


def structure_rule(r, F):
    """fixed (not learned) distractor-structure rule: triples -> an option that is an axis
    permutation of another (tie: closest to my atlas); scalar numerics -> most isolated value."""
    if all("perm_of_other" in f for f in F):
        sh = np.array([f["shared_comp"] for f in F], float)
        return sh + 0.01 * softmax4(ATLAS[r.Index])[0]
    if all("gap_min" in f for f in F) and r.subtask in ("EXT.value", "VOL.value", "DIST.value", "VOL.sum",
                                                            "VOL.difference"):
        return np.array([f["gap_min"] for f in F])
    return np.zeros(4)


STRUCT = np.array([structure_rule(r, feats(r.Index)) for r in d.itertuples()])


def att_struct(tr, te):
    s = STRUCT[te]
    s = (s == s.max(1, keepdims=True)).astype(float)
    return s / s.sum(1, keepdims=True)


def att_stack(tr, te):
    """LR stacker on inner-OOF option scores of prior/text/gbm/heur + atlas indicator."""
    tr = np.asarray(tr)
    fams = d.loc[tr].fam.unique()
    rng = np.random.default_rng(len(tr))
    fold_of = dict(zip(fams, rng.integers(0, 3, len(fams))))
    inner = np.array([fold_of[f] for f in d.loc[tr].fam])
    base = [att_prior, att_text, att_gbm, att_heur]
    Z_tr = np.zeros((len(tr), 4, len(base) + 1))
    for k in range(3):
        a, b = tr[inner != k], tr[inner == k]
        for j, f in enumerate(base):
            Z_tr[inner == k, :, j] = np.log(f(a, b) + 1e-4)
    Z_tr[:, :, -1] = att_atlas(None, tr)
    Z_te = np.zeros((len(te), 4, len(base) + 1))
    for j, f in enumerate(base):
        Z_te[:, :, j] = np.log(f(tr, te) + 1e-4)
    Z_te[:, :, -1] = att_atlas(None, te)
    ytr = np.zeros(4 * len(tr))
    ytr[np.arange(len(tr)) * 4 + d.loc[tr].y.values] = 1
    clf = LogisticRegression(C=1.0, max_iter=1000)
    clf.fit(Z_tr.reshape(-1, Z_tr.shape[2]), ytr)
    return softmax4(clf.decision_function(Z_te.reshape(-1, Z_te.shape[2])))


ATTACKERS = {
    "prior(subtask pos)": att_prior,
    "heuristic-select": att_heur,
    "text-LR(hash)": att_text,
    "GBM(hand feats)": att_gbm,
    "GBM+cf-flag": lambda tr, te: att_gbm(tr, te, use_src=True, use_cf=True),
    "atlas-rules(fixed)": att_atlas,
    "distractor-structure(fixed)": att_struct,
    "stacker": att_stack,
}
only = os.environ.get("ONLY")
if only:
    ATTACKERS = {k: v for k, v in ATTACKERS.items() if k in only.split(",")}

# ---------------------------------------------------------------- cross-fitting
fams = np.array(sorted(d.fam.unique()))
CORR = {a: np.zeros((N_REPEATS, NQ)) for a in ATTACKERS}
for rep in range(N_REPEATS):
    rng = np.random.default_rng(100 + rep)
    perm = rng.permutation(len(fams))
    fold = {f: k % NFOLD for k, f in zip(range(len(fams)), fams[perm])}
    qf = d.fam.map(fold).values
    for k in range(NFOLD):
        tr, te = np.where(qf != k)[0], np.where(qf == k)[0]
        for a, fn in ATTACKERS.items():
            P = fn(tr, te)
            # ties -> expected accuracy (split credit)
            mx = P.max(1, keepdims=True)
            win = np.isclose(P, mx, rtol=0, atol=1e-12)
            CORR[a][rep, te] = win[np.arange(len(te)), d.y.values[te]] / win.sum(1)
    print("rep", rep, "done %.0fs" % (time.time() - T0), file=sys.stderr)

# ---------------------------------------------------------------- evaluation
fam_codes, fam_idx = np.unique(d.fam.values, return_inverse=True)
NF = len(fam_codes)
B = 2000
W = np.random.default_rng(7).multinomial(NF, np.ones(NF) / NF, size=B).astype(float)  # B x NF family weights


def acc_ci(c, mask):
    c = c[mask]
    fi = fam_idx[mask]
    s = np.bincount(fi, weights=c, minlength=NF)
    n = np.bincount(fi, minlength=NF).astype(float)
    bs = (W @ s) / np.maximum(W @ n, 1e-9)
    return c.mean(), np.percentile(bs, 2.5), np.percentile(bs, 97.5), int(mask.sum())


orig = d.pair_of.isna().values
real = ~d.src.str.startswith("phantom").values
qid_idx = {q: i for i, q in enumerate(d.qid)}
pairs = [(qid_idx[r.pair_of], i) for i, r in enumerate(d.itertuples()) if r.pair_of in qid_idx
         and d.answer_text[qid_idx[r.pair_of]] != r.answer_text]
pairs = np.array(pairs)
print("flip pairs", len(pairs), file=sys.stderr)

res = []
for a in ATTACKERS:
    c = CORR[a].mean(0)  # expected correctness averaged over repeats
    row = {"attacker": a}
    for name, mask in [("all", np.ones(NQ, bool)), ("orig", orig), ("real", real)]:
        m_, lo, hi, n = acc_ci(c, mask)
        row[name] = "%.1f [%.1f,%.1f]" % (100 * m_, 100 * lo, 100 * hi)
        row[name + "_lo"] = lo
    for t in ["DIR", "DIST", "EXT", "VOL", "COMP"]:
        m_, lo, hi, n = acc_ci(c, d.task.values == t)
        row[t] = "%.0f [%.0f,%.0f]" % (100 * m_, 100 * lo, 100 * hi)
    # flip-pair: both right, per repeat then averaged
    both = (CORR[a][:, pairs[:, 0]] * CORR[a][:, pairs[:, 1]]).mean(0)
    pf = fam_idx[pairs[:, 0]]
    s = np.bincount(pf, weights=both, minlength=NF)
    n = np.bincount(pf, minlength=NF).astype(float)
    bs = (W @ s) / np.maximum(W @ n, 1e-9)
    row["flip_both"] = "%.1f [%.1f,%.1f]" % (100 * both.mean(), 100 * np.percentile(bs, 2.5), 100 * np.percentile(bs, 97.5))
    res.append(row)
R = pd.DataFrame(res)
pd.set_option("display.width", 250)
pd.set_option("display.max_columns", 30)
print("N all=%d orig=%d real=%d flip pairs=%d" % (NQ, orig.sum(), real.sum(), len(pairs)))
print(R[["attacker", "all", "orig", "real", "flip_both"]].to_string(index=False))
print()
print(R[["attacker", "DIR", "DIST", "EXT", "VOL", "COMP"]].to_string(index=False))

# per-subtask breakdown
sub = {}
for a in ATTACKERS:
    c = CORR[a].mean(0)
    sub[a] = d.assign(c=c).groupby("subtask").c.mean() * 100
S = pd.DataFrame(sub).round(0)
S.insert(0, "n", d.groupby("subtask").size())
S.insert(1, "n_real", d[real].groupby("subtask").size())
print()
print(S.to_string())
# per-subtask on real only
sub = {}
for a in ATTACKERS:
    c = CORR[a].mean(0)
    sub[a] = d[real].assign(c=c[real]).groupby("subtask").c.mean() * 100
print("\nreal only per subtask")
print(pd.DataFrame(sub).round(0).to_string())
np.savez(os.path.join(OUT, "corr.npz"), **{k: v for k, v in CORR.items()})
d[["qid", "subtask", "src", "cf"]].to_csv(os.path.join(OUT, "qmeta.csv"), index=False)
print("elapsed %.0fs" % (time.time() - T0), file=sys.stderr)
