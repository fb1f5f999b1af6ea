"""Independent blind-shortcut attack on the MC part of the benchmark (a second outside reviewer, 2026-11-26, who had not
seen the filter's answerers or the generator; like benchmarks/independent_attack.py it imports nothing from spatialvqa).

    python benchmarks/outside_attack_2.py [data/benchmark/validated.jsonl] [OUT]

or from Python (a stage notebook loads this file by its path; nothing runs on import):

    main(src, out, n_repeats=3, only=None, verbose=True) -> dict

Eight attackers (answer-position prior, option heuristics, a hashed text classifier, gradient boosting on hand-made
features with and without the copy tag, fixed anatomy rules, a fixed distractor-structure rule, a stacker), cross-fitted
on 5 folds of scan families repeated 3 times; 95% intervals from 2,000 bootstrap resamples of families. Prints the
table the README quotes. On the command line NREP (environment) sets the repeats and ONLY (attacker names, comma
separated) keeps some attackers.

Writes to OUT, none of them with a timing in it (timings go to stderr):
  corr.npz      per attacker, repeats x questions: expected correctness (ties split), questions in qmeta.csv's order
  qmeta.csv     qid, subtask, src, cf of each MC question
  table.txt     the tables printed to stdout
  summary.json  what main returns: counts, and per attacker the accuracy with its 95% interval (fractions in [0, 1]) on
                all questions, on originals (no pair_of), on real-patient (non-phantom) questions, per task, and on flip
                pairs (a pair_of twin whose answer differs: both answered right)

Only uses: question, options, task, subtask, source (dataset), qid/pair_of/scan_id
(for grouping + pairing), and answer_letter/answer_text as training labels/evaluation.

Cost: everything that depends on a question alone (option features, structure phrases, heuristic scores, hashed text,
the fixed rules) is computed once; the stacker reuses the fold's prior, text, GBM and heuristic fits on the outer fold
instead of refitting them. What remains is the fits (60 text LRs and 75 HistGradientBoosting fits with 3 repeats),
run on one thread (OpenMP and BLAS). The numbers are the same, bit for bit, as the first version's (2026-11-26, run
with OPENBLAS_NUM_THREADS=1), which recomputed features and refitted per fold.
"""
import io, json, re, sys, time, math, os
from functools import lru_cache

import numpy as np, pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.feature_extraction import FeatureHasher
from threadpoolctl import threadpool_limits

NFOLD = 5
B = 2000  # bootstrap resamples of families
L = "ABCD"
KEEP = ["qid", "scan_id", "source", "task", "subtask", "format", "question", "options",
        "answer_letter", "answer_text", "pair_of"]
TASK_TABLE = ["DIR", "DIST", "EXT", "VOL", "COMP"]  # column order of the printed task table

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

PHR_LONGEST_FIRST = [(re.compile(re.escape(ph)), k) for ph, k in sorted(PHR, key=lambda p: -len(p[0]))]


@lru_cache(maxsize=None)
def find_structs(text):
    """structure keys in the order they appear in text (a longer phrase wins an overlap); a tuple, cached per text."""
    t = text.lower()
    out, used = [], np.zeros(len(t) + 1, bool)
    for rx, k in PHR_LONGEST_FIRST:
        for mm in rx.finditer(t):
            if not used[mm.start():mm.end()].any():
                used[mm.start():mm.end()] = True
                out.append((mm.start(), k))
    return tuple(k for _, k in sorted(out))


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
        elif st in ("VOL.value", "VOL.closest", "VOL.range"):
            z = range_scores(opts, vol(S[0])) if st == "VOL.range" else near_scores(opts, vol(S[0]))
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
def opt_rows(idx):
    return np.concatenate([np.arange(4) + 4 * i for i in idx])


def softmax4(s):
    s = s.reshape(-1, 4)
    s = s - s.max(1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(1, keepdims=True)


def heur_score(name, r, F):
    h = HEUR[name]
    s = h(r) if name.startswith("pos") else h(r, F)
    # the first version added `1e-3 * RNG.random(4) * 0`: zeros (deterministic; ties -> first); + 0.0 is the same sum
    return np.asarray(s, float) + 0.0


HASH = FeatureHasher(n_features=2 ** 18, input_type="string", alternate_sign=False)


def load(src):
    "The MC questions (VOLEST aside) of a validated.jsonl, with family, dataset, copy tag, label and stem."
    with open(src) as fh:
        rows = [json.loads(line) for line in fh]
    d = pd.DataFrame([{k: r[k] for k in KEEP} for r in rows])
    d = d[(d.format == "mc") & (d.task != "VOLEST")].reset_index(drop=True)
    d["fam"] = d.scan_id.str.split("~").str[0]
    d["src"] = d.source.str.split("+").str[0]
    d["cf"] = d.source.str.split("+").str[1].fillna("orig")
    d["y"] = d.answer_letter.map(L.index)
    d["stem"] = d.question.str.split(r"\? ").str[0]  # drop boilerplate sentence
    return d


# ---------------------------------------------------------------- attackers (fit on train idx, score test idx)
class Attack:
    """The questions `d` and what depends on a question alone, computed once: option features, heuristic scores and
    hits, fixed-rule scores, and (on first use) the hashed text and the dense feature tables. The attackers are methods
    (tr, te) -> test x 4 option probabilities, tr and te positions in `d`. Within one fold (`memo`, cleared by the
    caller) a fit asked again with the same tr and te (the stacker's outer fit of a base attacker) is not redone."""

    def __init__(self, d, log=lambda *a: None):
        self.d, self.nq = d, len(d)
        self.y = d.y.values
        self.fam = d.fam.values
        self.subtask, self.task = d.subtask.values, d.task.values
        self.cat_subtasks = sorted(d.subtask.unique())
        self.cat_src = sorted(d.src.unique())
        self.st_code = np.array([self.cat_subtasks.index(s) for s in self.subtask], int)
        common = pd.Series([o for os in d.options for o in os]).value_counts()
        self.common_opts = [o for o, c in common.items() if c >= 8 and not NUM.search(o)]
        self.qkeys = sorted({k for s in d.stem for k in find_structs(s)})
        log("common opt texts", len(self.common_opts), "struct keys", len(self.qkeys))
        self.rows = list(d.itertuples())
        self.F = [opt_feats(r) for r in self.rows]
        ar = np.arange(self.nq)
        self.hs, self.hit = {}, {}
        for name in HEUR:
            s = np.array([heur_score(name, r, F) for r, F in zip(self.rows, self.F)]).reshape(self.nq, 4)
            ties = s == s.max(1, keepdims=True)
            self.hs[name], self.hit[name] = s, ties[ar, self.y] / ties.sum(1)
        self.atlas = np.array([atlas_scores(r) for r in self.rows]).reshape(self.nq, 4)
        self.struct = np.array([structure_rule(r, F, self.atlas) for r, F in zip(self.rows, self.F)]).reshape(self.nq, 4)
        self._txt, self._dense, self.memo = None, {}, {}

    def once(self, name, fn, tr, te):
        key = (name, tr.tobytes(), te.tobytes())
        if key not in self.memo:
            self.memo[key] = fn(tr, te)
        return self.memo[key]

    def labels(self, tr):
        ytr = np.zeros(4 * len(tr))
        ytr[np.arange(len(tr)) * 4 + self.y[tr]] = 1
        return ytr

    def prior(self, tr, te):
        "answer-position counts per subtask on train (+1 each; the global counts for a subtask train lacks)"
        cnt = np.ones((len(self.cat_subtasks), 4))
        np.add.at(cnt, (self.st_code[tr], self.y[tr]), 1)
        glob = np.ones(4) + np.bincount(self.y[tr], minlength=4)
        seen = np.zeros(len(self.cat_subtasks), bool)
        seen[self.st_code[tr]] = True
        p_st = cnt / cnt.sum(1, keepdims=True) + 1e-6 * glob / glob.sum()
        p_glob = glob / glob.sum() + 1e-6 * glob / glob.sum()
        code = self.st_code[te]
        return np.where(seen[code][:, None], p_st[code], p_glob)

    def heur(self, tr, te):
        "choose best heuristic per subtask on train (fallback: per task, then global)"
        acc = {}
        groups = [(("st", g), tr[self.subtask[tr] == g]) for g in pd.unique(self.subtask[tr])]
        groups += [(("task", g), tr[self.task[tr] == g]) for g in pd.unique(self.task[tr])] + [(("all",), tr)]
        for key, idx in groups:
            for name in HEUR:  # hits summed one by one in train order (cumsum), as the first version's loop did
                acc[(key, name)] = (np.cumsum(self.hit[name][idx])[-1], len(idx))

        def best(key):
            c = [(acc[(key, n)][0] / acc[(key, n)][1], n) for n in HEUR if (key, n) in acc]
            n = acc.get((key, "posA"), [0, 0])[1]
            return max(c)[1] if c else None, n
        out = []
        for i in te:
            name, n = best(("st", self.subtask[i]))
            if name is None or n < 8:
                name, n = best(("task", self.task[i]))
            if name is None:
                name, _ = best(("all",))
            s = self.hs[name][i]
            p = np.exp(3 * (s - s.max()) / (np.abs(s).max() + 1e-9))
            out.append(p / p.sum())
        return np.array(out)

    def text_matrix(self):
        if self._txt is None:
            toks = [text_tokens(r, i) for r in self.rows for i in range(4)]
            self._txt = HASH.transform(toks).tocsr()
            self._txt.data = np.log1p(self._txt.data)
        return self._txt

    def text(self, tr, te):
        X = self.text_matrix()
        clf = LogisticRegression(C=0.5, max_iter=2000, class_weight={0: 1, 1: 3})
        clf.fit(X[opt_rows(tr)], self.labels(tr))
        return softmax4(clf.decision_function(X[opt_rows(te)]))

    def dense(self, use_src, use_cf):
        "the option x feature table (categorical codes + 1) and which columns are categorical"
        k = (use_src, use_cf)
        if k not in self._dense:
            X = build_dense(self, use_src, use_cf)
            cats = [c for c in ["st", "task", "qdir", "opt_txt", "opt_key", "src", "cf"] if c in X.columns]
            for c in cats:
                X[c] = X[c] + 1  # non-negative for categorical
            self._dense[k] = X, [c in cats for c in X.columns]
        return self._dense[k]

    def gbm(self, tr, te, use_src=False, use_cf=False):
        Xc, is_cat = self.dense(use_src, use_cf)
        clf = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=10,
                                             l2_regularization=1.0, categorical_features=is_cat, random_state=0)
        clf.fit(Xc.iloc[opt_rows(tr)], self.labels(tr))
        p = clf.predict_proba(Xc.iloc[opt_rows(te)])[:, 1]
        return softmax4(np.log(np.clip(p, 1e-6, 1)))

    def atlas_att(self, tr, te):
        s = self.atlas[te]
        s = (s == s.max(1, keepdims=True)).astype(float)
        return s / s.sum(1, keepdims=True)

    def struct_att(self, tr, te):
        s = self.struct[te]
        s = (s == s.max(1, keepdims=True)).astype(float)
        return s / s.sum(1, keepdims=True)

    # the fits the stacker repeats on the outer fold: each once per fold
    def prior_1(self, tr, te): return self.once("prior", self.prior, tr, te)
    def heur_1(self, tr, te): return self.once("heur", self.heur, tr, te)
    def text_1(self, tr, te): return self.once("text", self.text, tr, te)
    def gbm_1(self, tr, te): return self.once("gbm", self.gbm, tr, te)
    def gbm_cf(self, tr, te): return self.gbm(tr, te, use_src=True, use_cf=True)

    def stack(self, tr, te):
        """LR stacker on inner-OOF option scores of prior/text/gbm/heur + atlas indicator."""
        tr = np.asarray(tr)
        fams = pd.unique(self.fam[tr])
        rng = np.random.default_rng(len(tr))
        fold_of = dict(zip(fams, rng.integers(0, 3, len(fams))))
        inner = np.array([fold_of[f] for f in self.fam[tr]])
        base = [self.prior_1, self.text_1, self.gbm_1, self.heur_1]
        Z_tr = np.zeros((len(tr), 4, len(base) + 1))
        for k in range(3):
            a, b = tr[inner != k], tr[inner == k]
            for j, f in enumerate(base):
                Z_tr[inner == k, :, j] = np.log(f(a, b) + 1e-4)
        Z_tr[:, :, -1] = self.atlas_att(None, tr)
        Z_te = np.zeros((len(te), 4, len(base) + 1))
        for j, f in enumerate(base):
            Z_te[:, :, j] = np.log(f(tr, te) + 1e-4)
        Z_te[:, :, -1] = self.atlas_att(None, te)
        clf = LogisticRegression(C=1.0, max_iter=1000)
        clf.fit(Z_tr.reshape(-1, Z_tr.shape[2]), self.labels(tr))
        return softmax4(clf.decision_function(Z_te.reshape(-1, Z_te.shape[2])))

    def attackers(self):
        return {
            "prior(subtask pos)": self.prior_1,
            "heuristic-select": self.heur_1,
            "text-LR(hash)": self.text_1,
            "GBM(hand feats)": self.gbm_1,
            "GBM+cf-flag": self.gbm_cf,
            "atlas-rules(fixed)": self.atlas_att,
            "distractor-structure(fixed)": self.struct_att,
            "stacker": self.stack,
        }


def build_dense(A, use_src=False, use_cf=False):
    recs = []
    for r in A.rows:
        qk = set(find_structs(r.stem))
        dv = dir_of(r.stem)
        for i, f in enumerate(A.F[r.Index]):
            f = dict(f)
            f["st"] = A.cat_subtasks.index(r.subtask)
            f["task"] = ["COMP", "DIR", "DIST", "EXT", "VOL"].index(r.task)
            f["qdir"] = -1 if dv is None else int(np.argmax(np.abs(dv)) * 2 + (dv.sum() > 0))
            f["opt_txt"] = A.common_opts.index(r.options[i]) if r.options[i] in A.common_opts else -1
            ok = find_structs(r.options[i])
            f["opt_key"] = A.qkeys.index(ok[0]) if ok and ok[0] in A.qkeys else -1
            for k in A.qkeys:
                f["q_" + k] = float(k in qk)
            f["asc"] = float("smallest to largest" in r.stem.lower())
            if use_src:
                f["src"] = A.cat_src.index(r.src)
            if use_cf:
                f["cf"] = ["orig", "mirror", "resize"].index(r.cf)
            recs.append(f)
    X = pd.DataFrame(recs).fillna(-2.0)
    return X


def structure_rule(r, F, atlas):
    """fixed (not learned) distractor-structure rule: triples -> an option that is an axis
    permutation of another (tie: closest to my atlas); scalar numerics -> most isolated value."""
    if all("perm_of_other" in f for f in F):
        sh = np.array([f["shared_comp"] for f in F], float)
        return sh + 0.01 * softmax4(atlas[r.Index])[0]
    if all("gap_min" in f for f in F) and r.subtask in ("EXT.value", "VOL.value", "VOL.closest", "DIST.value",
                                                            "VOL.sum", "VOL.difference"):
        return np.array([f["gap_min"] for f in F])
    return np.zeros(4)


# ---------------------------------------------------------------- cross-fitting
def crossfit(A, attackers, n_repeats, log=lambda *a: None):
    """repeats x questions expected correctness per attacker (ties split), 5 folds of families per repeat; and the
    seconds each attacker took (the stacker's without the outer fits it shares)."""
    t0 = time.time()
    fams = np.array(sorted(A.d.fam.unique()))
    CORR = {a: np.zeros((n_repeats, A.nq)) for a in attackers}
    secs = dict.fromkeys(attackers, 0.0)
    for rep in range(n_repeats):
        rng = np.random.default_rng(100 + rep)
        perm = rng.permutation(len(fams))
        fold = {f: k % NFOLD for k, f in zip(range(len(fams)), fams[perm])}
        qf = A.d.fam.map(fold).values
        for k in range(NFOLD):
            tr, te = np.where(qf != k)[0], np.where(qf == k)[0]
            A.memo.clear()
            for a, fn in attackers.items():
                t = time.time()
                P = fn(tr, te)
                secs[a] += time.time() - t
                # ties -> expected accuracy (split credit)
                mx = P.max(1, keepdims=True)
                win = np.isclose(P, mx, rtol=0, atol=1e-12)
                CORR[a][rep, te] = win[np.arange(len(te)), A.y[te]] / win.sum(1)
        log("rep", rep, "done %.0fs" % (time.time() - t0))
    A.memo.clear()
    return CORR, secs


# ---------------------------------------------------------------- evaluation
def evaluate(d, CORR, n_repeats):
    "(the printed tables, the summary) of the cross-fitted correctness"
    NQ = len(d)
    fam_codes, fam_idx = np.unique(d.fam.values, return_inverse=True)
    NF = len(fam_codes)
    W = np.random.default_rng(7).multinomial(NF, np.ones(NF) / NF, size=B).astype(float)  # B x NF family weights

    def acc_ci(c, mask):
        c = c[mask]
        fi = fam_idx[mask]
        s = np.bincount(fi, weights=c, minlength=NF)
        n = np.bincount(fi, minlength=NF).astype(float)
        bs = (W @ s) / np.maximum(W @ n, 1e-9)
        return c.mean(), np.percentile(bs, 2.5), np.percentile(bs, 97.5), int(mask.sum())

    def ci(m_, lo, hi, n):
        return {"acc": float(m_), "lo": float(lo), "hi": float(hi), "n": int(n)}

    orig = d.pair_of.isna().values
    real = ~d.src.str.startswith("phantom").values
    qid_idx = {q: i for i, q in enumerate(d.qid)}
    pairs = [(qid_idx[r.pair_of], i) for i, r in enumerate(d.itertuples()) if r.pair_of in qid_idx
             and d.answer_text[qid_idx[r.pair_of]] != r.answer_text]
    pairs = np.array(pairs, int).reshape(-1, 2)

    res = []
    summary = {"n_questions": NQ, "n_orig": int(orig.sum()), "n_real": int(real.sum()), "n_families": NF,
               "n_flip_pairs": len(pairs), "n_repeats": n_repeats, "folds": NFOLD,
               "bootstrap": B, "attackers": {}}
    for a in CORR:
        c = CORR[a].mean(0)  # expected correctness averaged over repeats
        row = {"attacker": a}
        sa = summary["attackers"][a] = {}
        for name, mask in [("all", np.ones(NQ, bool)), ("orig", orig), ("real", real)]:
            m_, lo, hi, n = acc_ci(c, mask)
            row[name] = "%.1f [%.1f,%.1f]" % (100 * m_, 100 * lo, 100 * hi)
            row[name + "_lo"] = lo
            sa[name] = ci(m_, lo, hi, n)
        sa["tasks"] = {}
        for t in TASK_TABLE:
            m_, lo, hi, n = acc_ci(c, d.task.values == t)
            row[t] = "%.0f [%.0f,%.0f]" % (100 * m_, 100 * lo, 100 * hi)
            sa["tasks"][t] = ci(m_, lo, hi, n)
        # flip-pair: both right, per repeat then averaged
        both = (CORR[a][:, pairs[:, 0]] * CORR[a][:, pairs[:, 1]]).mean(0)
        pf = fam_idx[pairs[:, 0]]
        s = np.bincount(pf, weights=both, minlength=NF)
        n = np.bincount(pf, minlength=NF).astype(float)
        bs = (W @ s) / np.maximum(W @ n, 1e-9)
        lo, hi = np.percentile(bs, 2.5), np.percentile(bs, 97.5)
        m_ = both.mean() if len(both) else float("nan")
        row["flip_both"] = "%.1f [%.1f,%.1f]" % (100 * m_, 100 * lo, 100 * hi)
        sa["flip_both"] = ci(m_, lo, hi, len(both))
        res.append(row)

    buf = io.StringIO()
    R = pd.DataFrame(res)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print("N all=%d orig=%d real=%d flip pairs=%d" % (NQ, orig.sum(), real.sum(), len(pairs)), file=buf)
        print(R[["attacker", "all", "orig", "real", "flip_both"]].to_string(index=False), file=buf)
        print(file=buf)
        print(R[["attacker"] + TASK_TABLE].to_string(index=False), file=buf)

        # per-subtask breakdown
        sub = {}
        for a in CORR:
            c = CORR[a].mean(0)
            sub[a] = d.assign(c=c).groupby("subtask").c.mean() * 100
        S = pd.DataFrame(sub).round(0)
        S.insert(0, "n", d.groupby("subtask").size())
        S.insert(1, "n_real", d[real].groupby("subtask").size())
        print(file=buf)
        print(S.to_string(), file=buf)
        # per-subtask on real only
        sub = {}
        for a in CORR:
            c = CORR[a].mean(0)
            sub[a] = d[real].assign(c=c[real]).groupby("subtask").c.mean() * 100
        print("\nreal only per subtask", file=buf)
        print(pd.DataFrame(sub).round(0).to_string(), file=buf)
    return buf.getvalue(), summary


def main(src="data/benchmark/validated.jsonl", out="/tmp/outside_attack_2", n_repeats=3, only=None, verbose=True):
    """Run the attack on the validated benchmark `src`, write corr.npz, qmeta.csv, table.txt and summary.json to `out`
    (created) and return the summary. `only`: attacker names to keep (all eight by default). verbose: print the
    tables to stdout and progress and timings to stderr."""
    t0 = time.time()
    log = (lambda *a: print(*a, file=sys.stderr)) if verbose else (lambda *a: None)
    os.makedirs(out, exist_ok=True)
    d = load(src)
    log("MC questions", len(d), "families", d.fam.nunique())
    A = Attack(d, log)
    attackers = A.attackers()
    if only:
        attackers = {k: v for k, v in attackers.items() if k in only}
    log("features %.1fs" % (time.time() - t0))
    # One thread for OpenMP (HistGradientBoosting) and BLAS: the same bits as with 2 (checked for OpenMP; the text LR
    # differs in the last bits with 2 BLAS threads, so this also keeps the numbers of OPENBLAS_NUM_THREADS=1, which the
    # Makefile sets), and many times faster on a busy 2-core machine, where 2 OpenMP threads wait on each other.
    with threadpool_limits(limits=1):
        CORR, secs = crossfit(A, attackers, n_repeats, log)
    log("seconds per attacker: " + ", ".join("%s %.1f" % kv for kv in secs.items()))
    table, summary = evaluate(d, CORR, n_repeats)
    log("flip pairs", summary["n_flip_pairs"])
    if verbose:
        sys.stdout.write(table)
    with open(os.path.join(out, "table.txt"), "w") as fh:
        fh.write(table)
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
        fh.write("\n")
    np.savez(os.path.join(out, "corr.npz"), **{k: v for k, v in CORR.items()})
    d[["qid", "subtask", "src", "cf"]].to_csv(os.path.join(out, "qmeta.csv"), index=False)
    log("elapsed %.0fs" % (time.time() - t0))
    return summary


if __name__ == "__main__":
    _only = os.environ.get("ONLY")
    main(sys.argv[1] if len(sys.argv) > 1 else "data/benchmark/validated.jsonl",
         sys.argv[2] if len(sys.argv) > 2 else "/tmp/outside_attack_2",
         n_repeats=int(os.environ.get("NREP", 3)), only=_only.split(",") if _only else None)
