"""Answer extraction (`spatialvqa.parse`) on a corpus of realistic model outputs (tests/data/parse_corpus.jsonl:
terse letters, letters with option text, option text only, chain of thought, verbose chat answers, refusals,
garbled and report-like generations, several letters named; numbers with units, ranges, distractor numbers),
each with the parse a careful reader would make, plus properties that hold for any text."""
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from spatialvqa.parse import (STATUSES, UNITS, Parse, extract_choice, extract_number, parse_answer, parse_choice,
                              parse_counts, parse_number)

CORPUS = Path(__file__).resolve().parent / "data" / "parse_corpus.jsonl"
ROWS = [json.loads(l) for l in CORPUS.read_text().splitlines() if l.strip()]


def test_corpus_size_and_coverage():
    assert len(ROWS) >= 200
    c = Counter((r["kind"], r["status"]) for r in ROWS)
    for kind in ("choice", "number"):
        for status in ("ok", "no_answer", "ambiguous", "refused"):
            assert c[(kind, status)] > 0, (kind, status)


@pytest.mark.parametrize("row", ROWS, ids=[f"{i}-{r['kind']}-{r['status']}" for i, r in enumerate(ROWS)])
def test_corpus(row):
    if row["kind"] == "choice":
        p = parse_choice(row["text"], row["options"])
        assert extract_choice(row["text"], row["options"]) == row["expected"]
    else:
        p = parse_number(row["text"], row["unit"])
        assert extract_number(row["text"], row["unit"]) == row["expected"]
    assert (p.status, p.value) == (row["status"], row["expected"]), p.note


def test_options_as_mapping_or_list():
    opts = ["Left kidney", "Right kidney", "Liver", "Spleen"]
    m = dict(zip("ABCD", opts))
    for t in ("C", "the liver", "Answer: (c)"):
        assert extract_choice(t, opts) == extract_choice(t, m) == "C"
    assert extract_choice("E", m) is None                  # not an option
    assert extract_choice("C", {"A": "yes", "B": "no"}) is None


def test_exact_unit_conversions():
    assert extract_number("2.3 x 10^3 mm³") == 2.3
    assert extract_number("0.1 L") == 100.0
    assert extract_number("0.3 dL") == 30.0
    assert extract_number("100 mL", "L") == 0.1
    assert extract_number("7 cc", "mm³") == 7000.0
    with pytest.raises(ValueError, match="unknown unit"):
        parse_number("1", "gallon")


def test_parse_answer_and_counts():
    mc = {"format": "mc", "options": ["a", "b", "c", "d"]}
    num = {"format": "numeric", "unit": "mL"}
    ps = [parse_answer(mc, "B"), parse_answer(num, "120 mL"), parse_answer(mc, ""), parse_answer(num, "As an AI I cannot measure it.")]
    assert [p.value for p in ps] == ["B", 120.0, None, None]
    assert parse_counts(ps) == {"ok": 2, "no_answer": 1, "ambiguous": 0, "refused": 1, "error": 0}


LETTERS_OPTS = ["Superior (toward the head)", "Posterior (behind)", "Inferior (toward the feet)", "To the patient's left"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_choice_never_guesses(text):
    p = parse_choice(text, LETTERS_OPTS)
    assert isinstance(p, Parse) and p.status in STATUSES and p.status != "error"
    assert (p.value is not None) == (p.status == "ok")
    assert p.value is None or p.value in "ABCD"
    assert parse_choice(text, LETTERS_OPTS) == p          # deterministic


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789.,- xmLcLd³^e%abouttoand\n")), max_size=60),
       st.sampled_from(list(UNITS)))
def test_number_never_guesses(text, unit):
    p = parse_number(text, unit)
    assert p.status in STATUSES and (p.value is not None) == (p.status == "ok")
    assert p.value is None or isinstance(p.value, float)
