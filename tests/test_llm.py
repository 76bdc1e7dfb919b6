"""cortiq.LLM: generation, stop rules, OpenAI shapes, session reuse, threads, skills.

Runs on the deterministic toy model of tests/toy_model.py (registered as arch "toy"),
stored in real CMF files with a trained tokenizer and a chat bundle, so the file path
(cortiq.cmf -> model registry -> Tokenizer.from_cmf -> ChatTemplate.from_bundle) is
the one users take. Exact equality everywhere: the toy is deterministic and the
sampler is seeded, so there is no tolerance to name.
"""
import os
import sys
import threading

import numpy as np
import pytest

import cortiq
from cortiq import ConfigError, SamplingParams
from cortiq.cmf import Masks, MaskTask
from cortiq.runtime.session import Session

sys.path.insert(0, os.path.dirname(__file__))
import toy_model as T

T.register()

PROMPT = "the quick brown fox"
CHAT = [{"role": "system", "content": "you are a tiny model"},
        {"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("toy") / "toy.cmf"
    T.write_toy(p)
    return str(p)


@pytest.fixture()
def llm(toy_path):
    with cortiq.LLM(toy_path, seed=7) as m:
        yield m


def greedy_reference(model, ids, n):
    """Token ids a plain loop over a fresh state produces (argmax, no penalties)."""
    st = model.new_state()
    logits = model.forward(st, np.asarray(ids), "last")
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        logits = model.forward(st, np.asarray([t]), "last")
    return out


# ---------------------------------------------------------------- basics

def test_open_tokenize_detokenize(llm):
    assert llm.arch == "toy" and llm.vocab_size == llm.tokenizer.vocab_size
    ids = llm.tokenize(PROMPT)
    assert llm.detokenize(ids) == PROMPT
    assert llm.tokenize(PROMPT.encode()) == ids
    assert llm.n_ctx == 4096
    assert "<|im_start|>user\nhello world<|im_end|>" in llm.apply_chat_template(CHAT)


def test_greedy_generation_matches_a_plain_loop(llm):
    ids = llm.tokenize(PROMPT)
    res = llm.create_completion(ids, max_tokens=12, temperature=0, repetition_penalty=1.0,
                                suppress_tokens=list(llm.tokenizer.eos_token_ids))
    ref = greedy_reference(llm.model, ids, 12)
    assert res["choices"][0]["text"] == llm.detokenize(ref)
    assert res["choices"][0]["finish_reason"] == "length"
    assert res["usage"]["completion_tokens"] == 12 and res["usage"]["prompt_tokens"] == len(ids)


def test_seeded_sampling_is_reproducible_and_stream_equals_batch(llm):
    a = llm.generate(PROMPT, max_tokens=20, seed=3, temperature=1.0)
    b = llm.generate(PROMPT, max_tokens=20, seed=3, temperature=1.0)
    c = "".join(llm.generate(PROMPT, max_tokens=20, seed=3, temperature=1.0, stream=True))
    assert a == b == c and a
    assert llm.generate(PROMPT, max_tokens=20, seed=4, temperature=1.0) != a


def test_eos_stops_generation(llm):
    eos = llm.tokenizer.eos_token_ids[0]
    ids = llm.tokenize(PROMPT)
    # EOS as the first token: empty text, reason stop.
    res = llm.create_completion(ids, max_tokens=10, temperature=0, logit_bias={eos: 100})
    assert res["choices"][0] == {"text": "", "index": 0, "logprobs": None,
                                 "finish_reason": "stop"}
    assert res["usage"]["completion_tokens"] == 0
    # Mid-generation: declare the 4th greedy token an EOS id through the chat bundle's
    # eos_token_ids; generation ends right before it.
    ref = greedy_reference(llm.model, ids, 10)
    k = next(i for i in range(3, 10) if ref[i] not in ref[:i])
    cfg = dict(llm.tokenizer.tokenizer_config, eos_token_ids=[ref[k]])
    other = cortiq.LLM.from_model(llm.model, tokenizer=llm.tokenizer.backend.to_str().encode(),
                                  tokenizer_config=cfg)
    for stream in (False, True):
        out = other.create_completion(ids, max_tokens=10, temperature=0,
                                      repetition_penalty=1.0, stream=stream)
        if stream:
            chunks = list(out)
            out = {"choices": [{"text": "".join(c["choices"][0]["text"] for c in chunks),
                                "finish_reason": chunks[-1]["choices"][0]["finish_reason"]}],
                   "usage": chunks[-1]["usage"]}
        assert out["choices"][0]["text"] == llm.detokenize(ref[:k])
        assert out["choices"][0]["finish_reason"] == "stop"
        assert out["usage"]["completion_tokens"] == k


def test_stop_string_straddling_tokens(llm):
    ids = llm.tokenize(PROMPT)
    kw = dict(max_tokens=24, temperature=0, repetition_penalty=1.0,
              suppress_tokens=list(llm.tokenizer.eos_token_ids))
    ref_ids = greedy_reference(llm.model, ids, 24)
    full = llm.generate(ids, **kw)
    assert full == llm.detokenize(ref_ids)
    # A stop string that starts inside one token and ends inside a later one.
    pieces = [llm.detokenize([t]) for t in ref_ids]
    k = next(i for i in range(2, len(pieces)) if len(pieces[i]) >= 2 and len(pieces[i - 1]) >= 1)
    start = sum(len(p) for p in pieces[:k]) - 1
    stop = full[start:start + 3]
    assert len(stop) == 3
    cut = full[:full.find(stop)]
    res = llm.create_completion(ids, stop=[stop, "zzzz-never"], **kw)
    assert res["choices"][0]["text"] == cut and res["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(c["choices"][0]["text"] for c in
                       llm.create_completion(ids, stop=stop, stream=True, **kw))
    assert streamed == cut


def test_max_tokens_and_context_limits(llm, toy_path):
    with pytest.raises(ConfigError, match="max_tokens"):
        llm.generate(PROMPT, max_tokens=0)
    with pytest.raises(ConfigError, match="empty prompt"):
        llm.generate("")
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        llm.generate([llm.vocab_size])
    with pytest.raises(ConfigError, match="stop"):
        llm.generate(PROMPT, stop=[""])
    with pytest.raises(TypeError, match="bogus"):
        llm.generate(PROMPT, bogus=1)
    with pytest.raises(ConfigError, match="top_p"):
        llm.generate(PROMPT, top_p=2.0)
    with pytest.raises(ConfigError, match="lone UTF-16 surrogate '\\\\ud800' at character 2"):
        llm.generate("ab\ud800")
    with pytest.raises(ConfigError, match="surrogate"):
        llm.create_chat_completion([{"role": "user", "content": "\udfff abc"}])
    with cortiq.LLM(toy_path, n_ctx=8) as small:
        ids = small.tokenize(PROMPT)[:5]
        res = small.create_completion(ids, max_tokens=100, temperature=0,
                                      suppress_tokens=list(small.tokenizer.eos_token_ids))
        assert res["usage"]["completion_tokens"] == 8 - len(ids)    # prompt + completion
        assert res["choices"][0]["finish_reason"] == "length"
        with pytest.raises(ConfigError, match="do not fit the context of 8"):
            small.generate(small.tokenize(PROMPT * 3))


def test_chat_completion_shapes(llm):
    r = llm.create_chat_completion(CHAT, max_tokens=8, temperature=0)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    msg = r["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    chunks = list(llm.create_chat_completion(CHAT, max_tokens=8, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == msg["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == r["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == \
        r["usage"]["completion_tokens"]


# ---------------------------------------------------------------- sessions

def test_session_feed_logits_rollback(llm):
    ids = llm.tokenize(PROMPT)
    s = llm.session()
    assert s.pos == 0
    rows = s.feed(ids, want="all")
    assert rows.shape == (len(ids), llm.vocab_size) and s.pos == len(ids)
    np.testing.assert_array_equal(s.logits(), rows[-1])
    s.rollback(2)
    assert s.pos == 2
    again = s.feed(ids[2:], want="last")
    np.testing.assert_array_equal(again, rows[-1])
    assert s.feed(ids[:1], want="none") is None


def test_session_reuse_gives_the_tokens_of_a_fresh_session(llm):
    """Turn 2 on a session that holds turn 1 equals turn 2 on a fresh session, and
    re-reads only the tokens after the common prefix."""
    kw = dict(max_tokens=12, temperature=0.8, seed=11)
    s = llm.session()
    r1 = llm.create_chat_completion(CHAT, session=s, **kw)
    turn2 = CHAT + [r1["choices"][0]["message"],
                    {"role": "user", "content": "the lazy dog"}]
    before = llm.model.forward_tokens
    reused = llm.create_chat_completion(turn2, session=s, **kw)
    cost_reused = llm.model.forward_tokens - before
    before = llm.model.forward_tokens
    fresh = llm.create_chat_completion(turn2, session=Session(llm.model), **kw)
    cost_fresh = llm.model.forward_tokens - before
    assert reused["choices"][0]["message"] == fresh["choices"][0]["message"]
    cached = reused["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cached >= r1["usage"]["prompt_tokens"]
    assert cost_fresh - cost_reused == cached


def test_pool_reuses_sessions_across_calls(llm):
    kw = dict(max_tokens=6, temperature=0)
    a = llm.create_chat_completion(CHAT, **kw)
    b = llm.create_chat_completion(CHAT, **kw)
    assert a["choices"] == b["choices"]
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == b["usage"]["prompt_tokens"] - 1


def test_rollback_to_prefix_when_the_prompt_diverges(llm):
    s = llm.session()
    llm.generate("the quick brown fox jumps", max_tokens=3, temperature=0, session=s)
    r = llm.create_completion("the quick brown cat", max_tokens=5, temperature=0, session=s)
    f = llm.create_completion("the quick brown cat", max_tokens=5, temperature=0,
                              session=llm.session())
    assert r["choices"] == f["choices"]
    assert 0 < r["usage"]["prompt_tokens_details"]["cached_tokens"] < r["usage"]["prompt_tokens"]


# ---------------------------------------------------------------- threads

def test_four_threads_equal_serial(llm):
    jobs = [dict(prompt=p, seed=s) for p in (PROMPT, "hello world", "the lazy dog",
                                             "sliding window") for s in (1, 2)]
    kw = dict(max_tokens=16, temperature=0.9)
    serial = [llm.generate(j["prompt"], seed=j["seed"], **kw) for j in jobs]
    out = [None] * len(jobs)
    errors = []
    barrier = threading.Barrier(4)

    def work(k):
        try:
            barrier.wait(timeout=30)
            for i in range(k, len(jobs), 4):
                out[i] = llm.generate(jobs[i]["prompt"], seed=jobs[i]["seed"], **kw)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and out == serial


# ---------------------------------------------------------------- from_model, registry

def test_from_model_and_unknown_arch(toy_path, tmp_path):
    with cortiq.cmf.open(toy_path) as cf:
        model = T.ToyModel(cf)
        tok = cf.tokenizer_json()
        bundle = cf.tokenizer_config
    llm = cortiq.LLM.from_model(model, tokenizer=tok, tokenizer_config=bundle, name="toy-mem")
    r = llm.create_chat_completion(CHAT, max_tokens=4, temperature=0)
    assert r["model"] == "toy-mem"
    with cortiq.LLM(toy_path) as ref:
        assert ref.create_chat_completion(CHAT, max_tokens=4, temperature=0)["choices"] == \
            r["choices"]
    p = tmp_path / "other.cmf"
    T.write_toy(p, arch_name="nosuch")
    with pytest.raises(ConfigError, match="'nosuch' is not supported"):
        cortiq.LLM(p)


def test_sampling_params_object(llm):
    sp = SamplingParams.greedy(seed=1)
    assert llm.generate(PROMPT, max_tokens=5, sampling=sp) == \
        llm.generate(PROMPT, max_tokens=5, temperature=0, repetition_penalty=1.0)


# ---------------------------------------------------------------- skills and tasks

@pytest.fixture(scope="module")
def skill_file(tmp_path_factory):
    rng = np.random.default_rng(5)
    base = T.random_tensors(1, 0)          # shapes only
    p = tmp_path_factory.mktemp("skills") / "skills.cmf"
    probe = T.write_toy(p)                 # to learn the vocab size
    v = probe[T.HEAD].shape[0]
    heads = {s: rng.standard_normal((v, T.HIDDEN)).astype(np.float32) for s in ("sql", "math")}
    emb = probe[T.EMBED]
    # sql's subspace contains the mean embedding of the SQL prompt; math's is orthogonal.
    import tokenizers
    tok = tokenizers.Tokenizer.from_str(cortiq.cmf.open(p).tokenizer_json().decode())
    ids = tok.encode("the quick brown fox").ids
    phi = emb[ids].mean(0)
    u = phi / np.linalg.norm(phi)
    w = rng.standard_normal(T.HIDDEN)
    w -= (w @ u) * u
    w /= np.linalg.norm(w)
    sel = {"sql": (np.zeros(T.HIDDEN), u[None]), "math": (np.zeros(T.HIDDEN), w[None])}
    T.write_toy(p, skills={s: {T.HEAD: h} for s, h in heads.items()}, selections=sel)
    del base
    return str(p), heads, probe


def test_single_skill_and_blend(skill_file):
    path, heads, base = skill_file
    with cortiq.LLM(path) as llm:
        np.testing.assert_array_equal(llm.model.W, base[T.HEAD])
    with cortiq.LLM(path, skill="sql") as llm:
        np.testing.assert_array_equal(llm.model.W, heads["sql"])
        np.testing.assert_array_equal(llm.model.E, base[T.EMBED])
    with cortiq.LLM(path, skill={"sql": 0.7, "math": 0.3}) as llm:
        want = np.float32(0.7) * heads["sql"] + np.float32(0.3) * heads["math"]
        np.testing.assert_allclose(llm.model.W, want, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="skill='nope'.*skills: math, sql"):
        cortiq.LLM(path, skill="nope")
    with pytest.raises(ConfigError, match="weight"):
        cortiq.LLM(path, skill={"sql": -1})


def test_skill_keyword_reaches_models_that_take_it(skill_file, tmp_path):
    _path, heads, _ = skill_file
    p = tmp_path / "t.cmf"
    T.write_toy(p, arch_name="toytask", skills={"sql": {T.HEAD: heads["sql"]}})
    with cortiq.LLM(p, skill="sql") as llm:
        assert llm.model.skill == "sql"
        np.testing.assert_array_equal(llm.model.W, heads["sql"])


def test_auto_skill_routes_by_reconstruction_error(skill_file):
    path, _heads, _ = skill_file
    with cortiq.LLM(path, skill="auto") as llm:
        errs = llm.skill_errors("the quick brown fox")
        assert errs["sql"] < 1e-3 and errs["math"] > 0.5
        assert llm.select_skill("the quick brown fox") == "sql"
        res = llm.create_completion("the quick brown fox", max_tokens=4, temperature=0)
        with cortiq.LLM(path, skill="sql") as sql:
            ref = sql.create_completion("the quick brown fox", max_tokens=4, temperature=0)
        assert res["choices"] == ref["choices"]


def test_task_option(toy_path, tmp_path):
    with pytest.raises(ConfigError, match="task='coding'.*no MoE"):
        cortiq.LLM(toy_path, task="coding")
    p = tmp_path / "task.cmf"
    L, inter, heads = 1, T.HIDDEN, 1
    masks = Masks("general", [MaskTask("coding", np.ones((L, inter), bool),
                                       np.ones((L, heads), bool), np.ones(L, bool))])
    T.write_toy(p, arch_name="toytask", masks=masks)
    with cortiq.LLM(p, task="coding") as llm:
        assert llm.model.task == "coding"
    with pytest.raises(ConfigError, match="no such mask task.*coding"):
        cortiq.LLM(p, task="math")


def test_overlay_file_feeds_qtensor_from_cmf(tmp_path):
    """Models that load with QTensor.from_cmf(cf, name) (DoryModel) see the skill's
    weights through OverlayFile, quantized replacements included."""
    from cortiq.models.overlay import OverlayFile
    from cortiq.kernels.tensor import QTensor
    rng = np.random.default_rng(1)
    base = rng.standard_normal((64, 64)).astype(np.float32)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    p = tmp_path / "q.cmf"
    arch = {"arch_name": "toy", "hidden_size": 64, "intermediate_size": 64, "num_layers": 1,
            "num_attention_heads": 1, "num_kv_heads": 1, "head_dim": 64, "vocab_size": 64,
            "layer_types": ["FullAttention"], "rms_norm_eps": 1e-6,
            "max_position_embeddings": 64}
    cortiq.cmf.write(p, [("w", base), ("skill.a.w", a), ("skill.b.w", b)], arch=arch,
                     quant="q8_row", skills=[{"id": "a"}, {"id": "b"}], progress=False)
    with cortiq.cmf.open(p) as cf:
        x = rng.standard_normal(64).astype(np.float32)
        plain = QTensor.from_cmf(cf, "w").dequantize()
        np.testing.assert_array_equal(plain, cf.tensor("w"))
        one = OverlayFile(cf, "a")
        assert one.info("w").dtype == "q8_row" and one.resolve("w") == "skill.a.w"
        np.testing.assert_array_equal(QTensor.from_cmf(one, "w").dequantize(),
                                      cf.tensor("skill.a.w"))
        np.testing.assert_array_equal(one.tensor("w"), cf.tensor("skill.a.w"))
        blend = OverlayFile(cf, {"a": 0.25, "b": 0.75})
        want = np.float32(0.25) * cf.tensor("skill.a.w") + np.float32(0.75) * cf.tensor(
            "skill.b.w")
        q = QTensor.from_cmf(blend, "w")
        assert q.dtype == "f32" and blend.tensors["w"].dtype == "f32"
        np.testing.assert_array_equal(q.dequantize(), want)
        np.testing.assert_allclose(q.matvec(x), want @ x, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(blend.tensor("w"), want)
