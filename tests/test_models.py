"""Model adapters (spatialvqa.models): the protocol and registry, prompts that state the answer format, the
baselines (random, prior, blind_text and the oracle, which must score 100% on a generated benchmark), the
OpenAI-compatible and Gemini adapters against local stand-ins, and replay of published prediction files."""
import json
import math
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from spatialvqa import models as M
from spatialvqa.core import read_jsonl, write_jsonl
from spatialvqa.llm import FakeOpenAIServer


@pytest.fixture(scope="module")
def bench(two_phantoms):
    "A small Track A benchmark over two phantoms (label maps on disk): conftest's `two_phantoms`, a copy of its records."
    import copy
    return copy.deepcopy(two_phantoms["recs"])


MC = {"qid": "q1", "format": "mc", "question": "Which is larger?", "options": ["Liver", "Spleen", "Left kidney", "Pancreas"], "unit": None}
NUM = {"qid": "q2", "format": "numeric", "question": "Volume of the spleen?", "options": None, "unit": "mL"}


def test_registry_and_protocol():
    assert {"random", "prior", "blind_text", "oracle", "openai", "gemini", "replay"} <= set(M.ADAPTERS)
    for name in ("random", "prior", "blind_text", "oracle"):
        a = M.make_adapter(name)
        assert isinstance(a, M.Adapter) and a.name == name and isinstance(a.config, dict)
    with pytest.raises(KeyError, match="unknown model adapter"): M.make_adapter("no-such-model")
    assert M.make_adapter("random", {"name": "coin"}).name == "coin"


def test_prompts_state_the_answer_format():
    p = M.build_prompt(MC)
    assert p.splitlines()[1:5] == ["A. Liver", "B. Spleen", "C. Left kidney", "D. Pancreas"]
    assert p.endswith("Answer with the option letter only.")
    assert M.build_prompt(NUM).endswith("Answer with a number in mL.")
    assert M.build_prompt({**NUM, "unit": "ratio"}).endswith("(a plain ratio, no unit).")
    assert M.build_prompt(MC, "radiologist") != p


def test_random_is_seeded_uniform_and_plausible():
    recs = [dict(MC, qid=f"m{i}") for i in range(400)] + [dict(NUM, qid=f"n{i}") for i in range(50)]
    inputs = [M.ModelInput(r, "") for r in recs]
    a, b = M.make_adapter("random", {"seed": 0}).predict(inputs), M.make_adapter("random", {"seed": 0}).predict(inputs)
    assert a == b and a != M.make_adapter("random", {"seed": 1}).predict(inputs)
    letters = Counter(a[:400])
    assert set(letters) == set("ABCD") and all(70 < n < 130 for n in letters.values()), letters
    lo, hi = M.RANDOM_RANGES["mL"]
    assert all(x.endswith(" mL") and lo * 0.99 <= float(x.split()[0]) <= hi * 1.01 for x in a[400:])


def _correct(r, raw) -> bool:
    from spatialvqa.parse import parse_answer
    p = parse_answer(r, raw)
    if not p.ok: return False
    if r["format"] == "mc": return p.value == r["answer_letter"]
    return abs(p.value - r["answer_value"]) <= r["tolerance"]


def test_oracle_scores_100_percent(bench):
    o = M.make_adapter("oracle")
    raw = o.predict([M.ModelInput(r, M.build_prompt(r)) for r in bench])
    assert raw == [r["answer"] for r in bench]
    assert all(_correct(r, x) for r, x in zip(bench, raw))


@pytest.mark.parametrize("name", ["prior", "blind_text"])
def test_blind_baselines_cross_fit(bench, name):
    a = M.make_adapter(name, {"seed": 0})
    a.prepare(bench)
    raw = a.predict([M.ModelInput(r, "") for r in bench])
    for r, x in zip(bench, raw):
        if r["format"] == "mc": assert x in "ABCD" and x
        else: assert x == "" or math.isfinite(float(x.split()[0]))
    b = M.make_adapter(name, {"seed": 0}); b.prepare(bench)
    assert b.predict([M.ModelInput(r, "") for r in bench]) == raw        # deterministic
    acc = sum(_correct(r, x) for r, x in zip(bench, raw) if r["format"] == "mc") / sum(r["format"] == "mc" for r in bench)
    assert acc < 0.9                                                      # far from the oracle: it never saw its own answers
    with pytest.raises(M.PredictionError): M.make_adapter(name).predict([M.ModelInput(MC, "")])


def test_openai_adapter_images_retries_and_key(tmp_path, monkeypatch):
    png = tmp_path / "v.png"; Image.new("RGB", (8, 8), (200, 0, 0)).save(png)
    monkeypatch.setenv("TEST_VLM_KEY", "sk-secret-123")
    with FakeOpenAIServer(reply=lambda body: "Answer: C") as srv:
        srv.push(status=429, headers={"Retry-After": "0"}).push(status=502)
        a = M.make_adapter("openai", {"model": "m", "base_url": srv.base_url, "api_key_env": "TEST_VLM_KEY",
                                      "backoff": 0.01, "workers": 2, "max_tokens": 8})
        out = a.predict([M.ModelInput(MC, M.build_prompt(MC), images=[str(png), str(png)]), M.ModelInput(NUM, M.build_prompt(NUM))])
    assert out == ["Answer: C", "Answer: C"]
    assert len(srv.requests) == 4
    assert all(r["headers"]["Authorization"] == "Bearer sk-secret-123" for r in srv.requests)
    bodies = [r["body"] for r in srv.requests]
    with_images = [b for b in bodies if isinstance(b["messages"][-1]["content"], list)]
    assert with_images and all(b["messages"][-1]["content"][2]["text"] == M.build_prompt(MC) for b in with_images)
    assert all(b["messages"][-1]["content"] == M.build_prompt(NUM) for b in bodies if b not in with_images)
    parts = with_images[0]["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"] and parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert all(b["max_tokens"] == 8 and b["temperature"] == 0.0 for b in bodies)
    assert "sk-secret" not in json.dumps(M.hashed_config(a))
    # the server's address, time-outs and key variable do not change the answers: same hash
    b = M.make_adapter("openai", {"model": "m", "base_url": "http://127.0.0.1:1/v1", "max_tokens": 8})
    assert M.hashed_config(a) == M.hashed_config(b)
    with pytest.raises(M.PredictionError, match="3D volume"):
        a.predict([M.ModelInput(MC, "", volume="x.npy")])


def test_gemini_adapter_with_stand_in_client(tmp_path):
    png = tmp_path / "v.png"; Image.new("RGB", (8, 8)).save(png)
    calls = []
    class Models:
        def generate_content(self, **req):
            calls.append(req)
            if len(calls) == 1: raise ConnectionError("reset")
            return type("R", (), {"text": "B"})()
    client = type("C", (), {"models": Models()})()
    a = M.make_adapter("gemini", {"model": "gemini-x", "client": client, "backoff": 0.01, "workers": 1})
    assert a.predict([M.ModelInput(MC, M.build_prompt(MC), images=[str(png)])]) == ["B"]
    assert len(calls) == 2 and calls[-1]["model"] == "gemini-x"
    parts = calls[-1]["contents"][-1].parts
    assert parts[0].inline_data.mime_type == "image/png" and parts[1].text == M.build_prompt(MC)


def test_replay_own_predictions_by_qid(tmp_path):
    recs = [dict(MC, qid=f"q{i}") for i in range(4)]
    pred = tmp_path / "p.jsonl"
    write_jsonl([{"qid": "q2", "raw": "C", "error": None, "model": "x"}, {"qid": "q0", "raw": "A", "error": None, "model": "x"},
                 {"qid": "q1", "raw": None, "error": "boom", "model": "x"}, {"qid": "q0", "raw": "B", "error": None, "model": "y"}], pred)
    a = M.make_adapter("replay", {"path": str(pred), "model": "x"})
    s = M.run_inference(a, recs, tmp_path / "out.jsonl", retry_wait=0)
    rows = {r["qid"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
    assert (rows["q0"]["raw"], rows["q2"]["raw"]) == ("A", "C")
    assert rows["q1"]["raw"] is None and "no prediction" in rows["q1"]["error"] and rows["q1"]["attempts"] == 2   # its batch, then alone; never retried
    assert s.errors == 2 and len(rows) == 4


def test_replay_ctsvqa_release_file_joined_by_key(tmp_path):
    qs = [{"qid": f"valid_1_a_1.nii.gz::{i}", "volume": "valid_1_a_1.nii.gz", "question": q, "answer": a}
          for i, (q, a) in enumerate([("Where is the nodule?", "Right lung."), ("Is the heart enlarged?", "No."),
                                      ("Where is the cyst?", "Left kidney.")])]
    pred = tmp_path / "m3d_predictions_full.jsonl"
    write_jsonl([{"image_path": "/x/valid_1_a_1.npy", "question": "Is the heart enlarged?", "prediction": "No", "answer": "No."},
                 {"image_path": "/x/valid_1_a_1.npy", "question": "Where is the nodule?", "prediction": "Left lung", "answer": "Right lung."}], pred)
    a = M.make_adapter("replay", {"path": str(pred)})
    a.prepare(qs)
    assert a.predict([M.ModelInput(qs[1], ""), M.ModelInput(qs[0], "")]) == ["No", "Left lung"]   # by key, not position
    with pytest.raises(M.PredictionError): a.predict([M.ModelInput(qs[2], "")])


def test_published_prediction_file_replays(tmp_path):
    from spatialvqa.ctsvqa.release import read_ctsvqa_questions
    from spatialvqa.core import shared_data
    root = shared_data("ct-spatialvqa")
    f = root / "predictions" / "m3d_predictions_full.jsonl"
    qs = read_ctsvqa_questions(root / "qa" / "spatial_qa_filtered_full.json")[:50]
    a = M.make_adapter("replay", {"path": str(f)}); a.prepare(qs)
    raw = a.predict([M.ModelInput(q, "") for q in qs])
    assert len(raw) == 50 and all(isinstance(x, str) for x in raw)


def test_parse_config(tmp_path):
    f = tmp_path / "c.yaml"; f.write_text("model: qwen\ntemperature: 0.2\n")
    assert M.parse_config([str(f), "temperature=0", '{"max_tokens": 16}', "system="]) == \
        {"model": "qwen", "temperature": 0, "max_tokens": 16, "system": None}
    with pytest.raises(ValueError): M.parse_config(["nonsense"])
    with pytest.raises(ValueError, match="unknown keys"): M.model_entry("x", {"seed": 1})


def test_inputs_from_views(bench, tmp_path):
    r = bench[0]
    blind = M.make_inputs("none")(r, "p")
    assert (blind.images, blind.volume, blind.prompt) == ([], None, "p")
    mk = M.make_inputs("axial", cache_dir=tmp_path / "cache")
    x = mk(r, M.build_prompt(r))
    assert x.images and all(Path(p).exists() and p.endswith(".png") for p in x.images) and x.volume is None
    assert mk.spec["representation"] == "axial" and "window" in mk.spec["params"]
    assert M.run_config(M.make_adapter("random"), inputs_spec=mk.spec) != M.run_config(M.make_adapter("random"))
    index = tmp_path / "index.jsonl"
    write_jsonl([{"qid": r["qid"], "paths": x.images, "meta": x.meta}], index)
    y = M.make_inputs("axial", index=index)(r, "p")
    assert y.images == x.images
    with pytest.raises(M.PredictionError, match="no rendered input"): M.make_inputs("axial", index=index)(bench[1], "p")
    v = M.make_inputs("volume:m3d", cache_dir=tmp_path / "cache")(r, "p")
    assert v.images == [] and v.volume.endswith(".npy") and Path(v.volume).exists() and v.meta["volumes"] == [v.volume]
