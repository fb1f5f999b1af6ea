"""The one-patient atlas of Table 2 (`models.baselines.SubjectAtlasAdapter` with `pool`) knows the patients the filter's
answerer knows (`validate.validate` fits it on its whole input), not only those of the questions it answers: fitted on
a subset alone it answers from fewer patients, and the filter would hold at chance an answerer Table 2 never reports."""
import copy

from spatialvqa.core import read_jsonl, write_jsonl
from spatialvqa.models.registry import make_adapter
from spatialvqa.validate.answerers import SubjectAtlasAnswerer, expected_right, predictions


def test_pool_gives_the_filters_patients(phantom_benchmark, tmp_path):
    pool = write_jsonl(copy.deepcopy(phantom_benchmark["recs"]), tmp_path / "pool.jsonl")
    recs = read_jsonl(pool)                  # as the validate stage reads the generate stage's file
    mc = [r for r in recs if r["format"] == "mc"]
    few = [r for i, r in enumerate(mc) if i % 5 == 0]            # a "release": a fifth of the questions
    filt = SubjectAtlasAnswerer(seed=8).fit(recs).fit(few)         # the filter's: the whole input, then the rounds' set
    with_pool = make_adapter("atlas_subject", {"seed": 8, "pool": str(pool)})._make()[0].fit(few)
    alone = make_adapter("atlas_subject", {"seed": 8})._make()[0].fit(few)
    assert with_pool.measured == filt.measured                     # every patient and structure of the pool
    assert alone.measured != filt.measured and len(alone.measured) <= len(filt.measured)
    same = [expected_right(r, e) for r, e in zip(few, predictions(with_pool, few))]
    want = [expected_right(r, e) for r, e in zip(few, predictions(filt, few))]
    assert same == want                                            # the filter's answers, question by question
