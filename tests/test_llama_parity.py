"""Parity of cortiq's Llama family with transformers (Llama, Mistral, Qwen2, Qwen3).

Each case (tests/reference/hf_llama.py) is a tiny random checkpoint written by
transformers' ``save_pretrained`` and converted with ``cortiq.convert.from_hf``. HF runs
the whole sequence at once; cortiq runs it as one prefill (``want="all"``), in uneven
chunks across its CHUNK boundary, and token by token.

Tolerances:
* F32_TOL = 1e-4 on float32 weights (observed: a few 1e-6; the summation orders differ).
* Q8_TOL = 1e-3 on q8_row weights, against HF run on the dequantized weights, so only
  the arithmetic is measured, not the quantization error.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import optional

torch, transformers = optional.need("torch", "torch", "transformers")
from reference import hf_llama as H  # noqa: E402

import cortiq  # noqa: E402
import cortiq.cmf  # noqa: E402
import cortiq.convert  # noqa: E402
from cortiq.errors import ConfigError  # noqa: E402
from cortiq.models import llama as L  # noqa: E402

F32_TOL = 1e-4
Q8_TOL = 1e-3
N_TOK = 40


@pytest.fixture(scope="module", params=sorted(H.CASES))
def case(request, tmp_path_factory):
    name = request.param
    model = H.build(name, seed=11 + len(name))
    d = tmp_path_factory.mktemp(f"llama_{name}")
    H.save(model, d / "hf")
    ids = H.sequence(model.config.vocab_size, N_TOK, seed=5)
    f32 = d / "f32.cmf"
    cortiq.convert.from_hf(d / "hf", f32, quant="f32", progress=False)
    return name, model, d, ids, f32


def _diff(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max())


def test_header_matches_the_family(case):
    name, model, _d, _ids, f32 = case
    with cortiq.cmf.open(f32) as f:
        arch = dict(f.arch)
        names = set(f.tensors)
    assert arch["arch_name"] == H.MODEL_CLASS[type(model.config).__name__][:-len(
        "ForCausalLM")].lower()
    assert arch["num_layers"] == model.config.num_hidden_layers
    c = model.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert arch["head_dim"] == hd
    tied = model.config.tie_word_embeddings
    assert ("lm_head.weight" in names) is not tied
    if name == "mistral":
        assert set(arch["layer_types"]) == {"SlidingAttention"} and arch["sliding_window"] == 5
    if name == "qwen2":
        assert arch["layer_types"] == ["FullAttention", "SlidingAttention"]
        assert arch["yarn"]["factor"] == 4.0 and arch["yarn"]["attention_factor"] > 1
        assert "model.layers.0.self_attn.q_proj.bias" in names
    if name == "qwen3":
        assert "model.layers.1.self_attn.k_norm.weight" in names
    if name == "llama3":
        ff = arch["rope_freq_factors"]
        assert len(ff) == hd // 2 and ff[0] == 1.0 and ff[-1] == 8.0
        assert any(1.0 < f < 8.0 for f in ff)          # the smoothed band is there too


def test_parity_f32_prefill_chunks_and_tokens(case):
    name, model, _d, ids, f32 = case
    ref = H.full_logits(model, ids)
    with cortiq.LLM(f32) as llm:
        assert llm.arch == name.split("_")[0].replace("llama3", "llama")
        whole = llm.session().feed(ids, want="all")
        assert _diff(whole, ref) <= F32_TOL, f"prefill: {_diff(whole, ref):.3g}"
        s = llm.session()
        parts = [s.feed(ids[a:b], want="all") for a, b in ((0, 7), (7, 8), (8, 31), (31, N_TOK))]
        assert _diff(np.concatenate(parts), ref) <= F32_TOL
        s = llm.session()
        steps = np.stack([s.feed([t], want="last") for t in ids])
        assert _diff(steps, ref) <= F32_TOL, f"token by token: {_diff(steps, ref):.3g}"
        assert (whole.argmax(1) == ref.argmax(1)).all()


def test_chunk_boundary(case, monkeypatch):
    """A prompt longer than CHUNK runs in several chunks and still matches."""
    _name, model, _d, ids, f32 = case
    monkeypatch.setattr(L, "CHUNK", 16)
    with cortiq.LLM(f32) as llm:
        got = llm.session().feed(ids, want="all")
    assert _diff(got, H.full_logits(model, ids)) <= F32_TOL


def test_parity_q8_row(case, tmp_path):
    name, model, d, ids, _f32 = case
    out = d / "q8.cmf"
    cortiq.convert.from_hf(d / "hf", out, quant="q8_row", progress=False)
    with cortiq.cmf.open(out) as f:
        assert f.tensors["model.layers.0.mlp.up_proj.weight"].dtype == "q8_row"
        sd = {n: torch.from_numpy(np.ascontiguousarray(f.tensor(n), np.float32).reshape(
            tuple(f.tensors[n].shape))) for n in f.tensors}
    hq = H.build(name, seed=0)
    missing, unexpected = hq.load_state_dict(sd, strict=False)
    assert not unexpected and all(m.endswith("lm_head.weight") for m in missing)
    hq.tie_weights()
    ref = H.full_logits(hq, ids)
    with cortiq.LLM(out, precision="exact") as llm:   # float32 arithmetic, as HF's
        got = llm.session().feed(ids, want="all")
        s = llm.session()
        steps = np.stack([s.feed([t], want="last") for t in ids[:12]])
    assert _diff(got, ref) <= Q8_TOL, f"q8 prefill: {_diff(got, ref):.3g}"
    assert _diff(steps, ref[:12]) <= Q8_TOL
    # the default ("auto"): the prompt's products take int8 activations, decode steps
    # keep the exact ones
    with cortiq.LLM(out, precision="auto") as au, cortiq.LLM(out, precision="int8") as i8:
        pa = au.session().feed(ids, want="all")
        np.testing.assert_array_equal(pa, i8.session().feed(ids, want="all"))
        rel = np.linalg.norm(pa - ref) / np.linalg.norm(ref)
        assert rel < 0.02, f"q8 int8 prefill: relative error {rel:.3g}"
        s = au.session()
        np.testing.assert_array_equal(np.stack([s.feed([t], want="last") for t in ids[:12]]),
                                      steps)
    # and the quantization is really there: HF on the original weights differs more
    assert _diff(H.full_logits(model, ids), ref) > 10 * _diff(got, ref)


def test_matrices_are_what_the_forward_multiplies(case):
    """matrices() lists each layer's seven products and the head; the embedding is in
    it only when the head is tied to it (else it is looked up, never multiplied)."""
    _name, model, _d, _ids, f32 = case
    with cortiq.cmf.open(f32) as f:
        m = L.LlamaModel(f)
        mats = m.matrices()
        names = sorted(t.name for t in mats)
        n = model.config.num_hidden_layers
        assert len(names) == len(set(names)) == 7 * n + 1
        assert all(x.endswith("_proj.weight") for x in names if x.startswith("model.layers."))
        tied = model.config.tie_word_embeddings
        assert ("model.embed_tokens.weight" in names) is tied
        assert ("lm_head.weight" in names) is not tied
        assert m.set_precision("int8") == 7 * n + 1
        assert all(t.precision == "int8" for t in mats)
        with pytest.raises(ValueError, match="one of each per sequence"):
            m.forward_batch([m.new_state()], [[1], [2]], ["last", "last"], [False, False])


def test_features_bite():
    """Each feature the cases exercise changes the logits (so the parity tests can fail)."""
    ids = H.sequence(120, 24, seed=2)
    base = H.full_logits(H.build("mistral", seed=1), ids)
    assert _diff(base, H.full_logits(H.build("mistral", seed=1, sliding_window=None), ids)) > 1e-3
    yarn = H.full_logits(H.build("qwen2", seed=1), ids)
    plain = H.full_logits(H.build("qwen2", seed=1, rope_parameters={"rope_type": "default",
                                                                    "rope_theta": 1.0e6}), ids)
    assert _diff(yarn, plain) > 1e-3


def test_rollback_and_reuse(case):
    """Rolling back (in place, or by re-reading when a window dropped keys) and the
    LLM's cross-turn KV reuse give the logits of a straight run."""
    _name, _model, _d, ids, f32 = case
    with cortiq.LLM(f32) as llm:
        ref = llm.session().feed(ids, want="all")
        s = llm.session()
        s.feed(ids[:30], want="none")
        s.rollback(9)
        got = s.feed(ids[9:], want="all")
        assert _diff(got, ref[9:]) <= 1e-5
        # cross-turn reuse through LLM.generate: the second call reads only the new ids
        first = llm.create_completion(ids[:20], max_tokens=3, temperature=0)
        second = llm.create_completion(ids[:20] + ids[20:26], max_tokens=3, temperature=0)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 19
        fresh = cortiq.LLM(f32, max_sessions=0)
        try:
            again = fresh.create_completion(ids[:26], max_tokens=3, temperature=0)
        finally:
            fresh.close()
        assert again["choices"][0]["text"] == second["choices"][0]["text"]


def test_chat_template_and_eos_come_along(case):
    _name, _model, _d, _ids, f32 = case
    with cortiq.LLM(f32) as llm:
        text = llm.apply_chat_template([{"role": "user", "content": "w7 w8"}])
        assert text == "<|im_start|>user\nw7 w8<|im_end|>\n<|im_start|>assistant\n"
        assert 2 in llm.tokenizer.eos_token_ids
        out = llm.create_chat_completion([{"role": "user", "content": "w7 w8"}],
                                         max_tokens=4, temperature=0)
        assert out["usage"]["completion_tokens"] <= 4


# ---- refusals ------------------------------------------------------------------------
def _cfg(**over):
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 100}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("over,key", [
    (dict(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox"), "architectures"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(num_key_value_heads=3), "num_key_value_heads"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_type"),
    (dict(rope_scaling={"rope_type": "longrope"}), "rope_type"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(vocab_size=None), "vocab_size"),
    (dict(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=-3),
     "sliding_window"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "rope_scaling"),
])
def test_config_refusals_name_the_key(over, key):
    from cortiq.convert.hf_llama import arch_from_hf_config
    with pytest.raises(ConfigError, match=key):
        arch_from_hf_config(_cfg(**over))


def test_from_hf_refuses_unknown_and_bad_tensors(tmp_path, case):
    name, _model, d, _ids, _f32 = case
    (tmp_path / "config.json").write_text(json.dumps(_cfg(
        architectures=["FalconForCausalLM"], model_type="falcon")))
    with pytest.raises(ConfigError, match="falcon"):
        cortiq.convert.from_hf(tmp_path, tmp_path / "x.cmf", progress=False)
    from cortiq.convert.hf_llama import arch_from_hf_config, plan_tensors
    arch = arch_from_hf_config(json.loads((d / "hf" / "config.json").read_text()))
    from cortiq.convert._safetensors import open_checkpoint
    shapes = {k: s.shape(k) for k, s in open_checkpoint(d / "hf").items()}
    plan_tensors(arch, shapes)
    bad = dict(shapes)
    bad["model.layers.0.mlp.up_proj.weight"] = (3, 3)
    with pytest.raises(ConfigError, match="up_proj"):
        plan_tensors(arch, bad)
    bad = dict(shapes)
    del bad["model.layers.1.self_attn.o_proj.weight"]
    with pytest.raises(ConfigError, match="o_proj.weight: missing"):
        plan_tensors(arch, bad)
    bad = dict(shapes, **{"model.layers.0.mystery.weight": (4,)})
    with pytest.raises(ConfigError, match="mystery"):
        plan_tensors(arch, bad)
    assert not (tmp_path / "x.cmf").exists()
    from cortiq.serve.cli import main
    other = "qwen2" if name != "qwen2" else "llama"
    assert main(["convert", "--arch", other, str(d / "hf"), str(tmp_path / "z.cmf"),
                 "--quiet"]) == 1
    assert main(["convert", str(d / "hf"), str(tmp_path / "z.cmf"), "--quiet"]) == 0
    with cortiq.cmf.open(tmp_path / "z.cmf") as f:
        assert f.arch["arch_name"] == arch["arch_name"]


@pytest.mark.parametrize("case", ["qwen3"], indirect=True)   # one family is enough
def test_served_like_any_model(case):
    """The OpenAI server runs a Llama-family file through the same LLM paths."""
    _name, _model, _d, _ids, f32 = case
    optional.need("extras", "starlette", "httpx")
    from starlette.testclient import TestClient
    from cortiq.serve import create_app
    with cortiq.LLM(f32, seed=1) as llm:
        want = llm.create_chat_completion([{"role": "user", "content": "w5 w6"}],
                                          max_tokens=5, temperature=0)
        with TestClient(create_app(llm)) as c:
            r = c.post("/v1/chat/completions", json={
                "model": "f32", "messages": [{"role": "user", "content": "w5 w6"}],
                "max_tokens": 5, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == \
                want["choices"][0]["message"]["content"]
            bad = c.post("/v1/completions", json={"model": "f32", "prompt": [10 ** 6],
                                                  "max_tokens": 2})
            assert bad.status_code == 400 and "error" in bad.json()


@pytest.mark.parametrize("case", ["llama3"], indirect=True)   # one file is enough
def test_model_refuses_bad_headers(case, tmp_path):
    """A file whose header cannot describe this family is refused when opened."""
    _name, _model, _d, _ids, f32 = case
    with cortiq.cmf.open(f32) as f:
        arch, tensors = dict(f.arch), {n: np.asarray(f.tensor(n)) for n in f.tensors}
    for over, key in ((dict(rope_freq_factors=[0.0] * 8), "rope_freq_factors"),
                      (dict(rope_freq_factors=[1.0] * 3), "rope_freq_factors"),
                      (dict(num_kv_heads=3), "num_kv_heads"),
                      (dict(layer_types=["FullAttention", "LinearAttention"]), "layer_types"),
                      (dict(layer_types=["SlidingAttention"] * 2), "sliding_window"),
                      (dict(norm_style="gemma"), "norm_style")):
        p = tmp_path / f"{key}.cmf"
        cortiq.cmf.write(p, tensors, arch={**arch, **over}, quant="f32", progress=False)
        with pytest.raises(ConfigError, match=key):
            cortiq.LLM(p)
    p = tmp_path / "short.cmf"
    cortiq.cmf.write(p, {k: v for k, v in tensors.items() if "layers.1.mlp.up" not in k},
                     arch=arch, quant="f32", progress=False)
    with pytest.raises(cortiq.errors.FormatError, match="up_proj"):
        cortiq.LLM(p)
