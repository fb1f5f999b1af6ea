"""Model adapters (spatialvqa.models.*): the protocol and registry, prompts that state the answer format, the
baselines (random, prior, blind_text and the oracle, which must score 100% on a generated benchmark), the
OpenAI-compatible and Gemini adapters against local stand-ins, and replay of published prediction files."""
import json
import math
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from spatialvqa.models.baselines import RANDOM_RANGES
from spatialvqa.models.commands import model_entry, parse_config
from spatialvqa.models.inputs import make_inputs
from spatialvqa.models.protocol import ADAPTERS, Adapter, ModelInput, PredictionError, hashed_config
from spatialvqa.models.registry import make_adapter
from spatialvqa.models.run import run_config, run_inference
from spatialvqa.prompt import build_prompt
from spatialvqa.core import read_jsonl, write_jsonl
from spatialvqa.llm.openai import FakeOpenAIServer


@pytest.fixture(scope="module")
def bench(two_phantoms):
    "A small Track A benchmark over two phantoms (label maps on disk): conftest's `two_phantoms`, a copy of its records."
    import copy
    return copy.deepcopy(two_phantoms["recs"])


MC = {"qid": "q1", "format": "mc", "question": "Which is larger?", "options": ["Liver", "Spleen", "Left kidney", "Pancreas"], "unit": None}
NUM = {"qid": "q2", "format": "numeric", "question": "Volume of the spleen?", "options": None, "unit": "mL"}


def test_registry_and_protocol():
    assert {"random", "prior", "blind_text", "oracle", "openai", "gemini", "replay"} <= set(ADAPTERS)
    for name in ("random", "prior", "blind_text", "oracle"):
        a = make_adapter(name)
        assert isinstance(a, Adapter) and a.name == name and isinstance(a.config, dict)
    with pytest.raises(KeyError, match="unknown model adapter"): make_adapter("no-such-model")
    assert make_adapter("random", {"name": "coin"}).name == "coin"


def test_prompts_state_the_answer_format():
    p = build_prompt(MC)
    assert p.splitlines()[1:5] == ["A. Liver", "B. Spleen", "C. Left kidney", "D. Pancreas"]
    assert p.endswith("Answer with the option letter only.")
    assert build_prompt(NUM).endswith("Answer with a number in mL.")
    assert build_prompt({**NUM, "unit": "ratio"}).endswith("(a plain ratio, no unit).")
    assert build_prompt(MC, "radiologist") != p


def test_random_is_seeded_uniform_and_plausible():
    recs = [dict(MC, qid=f"m{i}") for i in range(400)] + [dict(NUM, qid=f"n{i}") for i in range(50)]
    inputs = [ModelInput(r, "") for r in recs]
    a, b = make_adapter("random", {"seed": 0}).predict(inputs), make_adapter("random", {"seed": 0}).predict(inputs)
    assert a == b and a != make_adapter("random", {"seed": 1}).predict(inputs)
    letters = Counter(a[:400])
    assert set(letters) == set("ABCD") and all(70 < n < 130 for n in letters.values()), letters
    lo, hi = RANDOM_RANGES["mL"]
    assert all(x.endswith(" mL") and lo * 0.99 <= float(x.split()[0]) <= hi * 1.01 for x in a[400:])


def _correct(r, raw) -> bool:
    from spatialvqa.parse import parse_answer
    p = parse_answer(r, raw)
    if not p.ok: return False
    if r["format"] == "mc": return p.value == r["answer_letter"]
    return abs(p.value - r["answer_value"]) <= r["tolerance"]


def test_oracle_scores_100_percent(bench):
    o = make_adapter("oracle")
    raw = o.predict([ModelInput(r, build_prompt(r)) for r in bench])
    assert raw == [r["answer"] for r in bench]
    assert all(_correct(r, x) for r, x in zip(bench, raw))


@pytest.mark.parametrize("name", ["prior", "blind_text"])
def test_blind_baselines_cross_fit(bench, name):
    a = make_adapter(name, {"seed": 0})
    a.prepare(bench)
    raw = a.predict([ModelInput(r, "") for r in bench])
    for r, x in zip(bench, raw):
        if r["format"] == "mc": assert x in "ABCD" and x
        else: assert x == "" or math.isfinite(float(x.split()[0]))
    b = make_adapter(name, {"seed": 0}); b.prepare(bench)
    assert b.predict([ModelInput(r, "") for r in bench]) == raw        # deterministic
    acc = sum(_correct(r, x) for r, x in zip(bench, raw) if r["format"] == "mc") / sum(r["format"] == "mc" for r in bench)
    # far from the oracle: it never saw its own answers
    assert acc < 0.9
    with pytest.raises(PredictionError): make_adapter(name).predict([ModelInput(MC, "")])


def test_openai_adapter_images_retries_and_key(tmp_path, monkeypatch):
    png = tmp_path / "v.png"; Image.new("RGB", (8, 8), (200, 0, 0)).save(png)
    monkeypatch.setenv("TEST_VLM_KEY", "sk-secret-123")
    with FakeOpenAIServer(reply=lambda body: "Answer: C") as srv:
        srv.push(status=429, headers={"Retry-After": "0"}).push(status=502)
        a = make_adapter("openai", {"model": "m", "base_url": srv.base_url, "api_key_env": "TEST_VLM_KEY",
                                      "backoff": 0.01, "workers": 2, "max_tokens": 8})
        out = a.predict([ModelInput(MC, build_prompt(MC), images=[str(png), str(png)]), ModelInput(NUM, build_prompt(NUM))])
    assert out == ["Answer: C", "Answer: C"]
    assert len(srv.requests) == 4
    assert all(r["headers"]["Authorization"] == "Bearer sk-secret-123" for r in srv.requests)
    bodies = [r["body"] for r in srv.requests]
    with_images = [b for b in bodies if isinstance(b["messages"][-1]["content"], list)]
    assert with_images and all(b["messages"][-1]["content"][2]["text"] == build_prompt(MC) for b in with_images)
    assert all(b["messages"][-1]["content"] == build_prompt(NUM) for b in bodies if b not in with_images)
    parts = with_images[0]["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"] and parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert all(b["max_tokens"] == 8 and b["temperature"] == 0.0 for b in bodies)
    assert "sk-secret" not in json.dumps(hashed_config(a))
    # the server's address, time-outs and key variable do not change the answers: same hash
    b = make_adapter("openai", {"model": "m", "base_url": "http://127.0.0.1:1/v1", "max_tokens": 8})
    assert hashed_config(a) == hashed_config(b)
    with pytest.raises(PredictionError, match="3D volume"):
        a.predict([ModelInput(MC, "", volume="x.npy")])


def test_gemini_adapter_with_stand_in_client(tmp_path):
    png = tmp_path / "v.png"; Image.new("RGB", (8, 8)).save(png)
    calls = []
    class Models:
        def generate_content(self, **req):
            calls.append(req)
            if len(calls) == 1: raise ConnectionError("reset")
            return type("R", (), {"text": "B"})()
    client = type("C", (), {"models": Models()})()
    a = make_adapter("gemini", {"model": "gemini-x", "client": client, "backoff": 0.01, "workers": 1})
    assert a.predict([ModelInput(MC, build_prompt(MC), images=[str(png)])]) == ["B"]
    assert len(calls) == 2 and calls[-1]["model"] == "gemini-x"
    parts = calls[-1]["contents"][-1].parts
    assert parts[0].inline_data.mime_type == "image/png" and parts[1].text == build_prompt(MC)


def test_replay_own_predictions_by_qid(tmp_path):
    recs = [dict(MC, qid=f"q{i}") for i in range(4)]
    pred = tmp_path / "p.jsonl"
    write_jsonl([{"qid": "q2", "raw": "C", "error": None, "model": "x"}, {"qid": "q0", "raw": "A", "error": None, "model": "x"},
                 {"qid": "q1", "raw": None, "error": "boom", "model": "x"}, {"qid": "q0", "raw": "B", "error": None, "model": "y"}], pred)
    a = make_adapter("replay", {"path": str(pred), "model": "x"})
    s = run_inference(a, recs, tmp_path / "out.jsonl", retry_wait=0)
    rows = {r["qid"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
    assert (rows["q0"]["raw"], rows["q2"]["raw"]) == ("A", "C")
    # its batch, then alone; never retried
    assert rows["q1"]["raw"] is None and "no prediction" in rows["q1"]["error"] and rows["q1"]["attempts"] == 2
    assert s.errors == 2 and len(rows) == 4


def test_replay_ctsvqa_release_file_joined_by_key(tmp_path):
    qs = [{"qid": f"valid_1_a_1.nii.gz::{i}", "volume": "valid_1_a_1.nii.gz", "question": q, "answer": a}
          for i, (q, a) in enumerate([("Where is the nodule?", "Right lung."), ("Is the heart enlarged?", "No."),
                                      ("Where is the cyst?", "Left kidney.")])]
    pred = tmp_path / "m3d_predictions_full.jsonl"
    write_jsonl([{"image_path": "/x/valid_1_a_1.npy", "question": "Is the heart enlarged?", "prediction": "No", "answer": "No."},
                 {"image_path": "/x/valid_1_a_1.npy", "question": "Where is the nodule?", "prediction": "Left lung", "answer": "Right lung."}], pred)
    a = make_adapter("replay", {"path": str(pred)})
    a.prepare(qs)
    assert a.predict([ModelInput(qs[1], ""), ModelInput(qs[0], "")]) == ["No", "Left lung"]   # by key, not position
    with pytest.raises(PredictionError): a.predict([ModelInput(qs[2], "")])


def test_published_prediction_file_replays(tmp_path):
    from spatialvqa.ctsvqa.release import read_ctsvqa_questions
    from spatialvqa.core import shared_data
    root = shared_data("ct-spatialvqa")
    f = root / "predictions" / "m3d_predictions_full.jsonl"
    qs = read_ctsvqa_questions(root / "qa" / "spatial_qa_filtered_full.json")[:50]
    a = make_adapter("replay", {"path": str(f)}); a.prepare(qs)
    raw = a.predict([ModelInput(q, "") for q in qs])
    assert len(raw) == 50 and all(isinstance(x, str) for x in raw)


def test_parse_config(tmp_path):
    f = tmp_path / "c.yaml"; f.write_text("model: qwen\ntemperature: 0.2\n")
    assert parse_config([str(f), "temperature=0", '{"max_tokens": 16}', "system="]) == \
        {"model": "qwen", "temperature": 0, "max_tokens": 16, "system": None}
    with pytest.raises(ValueError): parse_config(["nonsense"])
    with pytest.raises(ValueError, match="unknown keys"): model_entry("x", {"seed": 1})


def test_inputs_from_views(bench, tmp_path):
    r = bench[0]
    blind = make_inputs("none")(r, "p")
    assert (blind.images, blind.volume, blind.prompt) == ([], None, "p")
    mk = make_inputs("axial", cache_dir=tmp_path / "cache")
    x = mk(r, build_prompt(r))
    assert x.images and all(Path(p).exists() and p.endswith(".png") for p in x.images) and x.volume is None
    assert mk.spec["representation"] == "axial" and "window" in mk.spec["params"]
    assert run_config(make_adapter("random"), inputs_spec=mk.spec) != run_config(make_adapter("random"))
    index = tmp_path / "index.jsonl"
    write_jsonl([{"qid": r["qid"], "paths": x.images, "meta": x.meta}], index)
    y = make_inputs("axial", index=index)(r, "p")
    assert y.images == x.images
    with pytest.raises(PredictionError, match="no rendered input"): make_inputs("axial", index=index)(bench[1], "p")
    v = make_inputs("volume:m3d", cache_dir=tmp_path / "cache")(r, "p")
    assert v.images == [] and v.volume.endswith(".npy") and Path(v.volume).exists() and v.meta["volumes"] == [v.volume]
