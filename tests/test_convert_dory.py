"""The HF -> CMF Dory converter: config mapping and refusals, tensor names, transforms
decision, safetensors reading, tokenizer bundle; end to end once cortiq.cmf.write exists.

Tolerances:
* F32_FILE = 1e-9: an f32 CMF file holds the HF values bit for bit, so the reference
  forward over the read-back tensors equals the one over the HF arrays (both float64).
* Q8_REL = 0.05: q8_row weights (per-row absmax/127 with an f16 scale) move these logits
  (size ~1-5) by ~1e-2; 5% of the largest logit still catches a transposed or misnamed
  tensor, which moves them by O(1).
"""
import json
import math
import os
import sys

import numpy as np
import pytest

from cortiq.convert import from_hf
from cortiq.convert import _safetensors as ST
from cortiq.convert import hf_dory as H
from cortiq.errors import ConfigError, FormatError
from cortiq.models.dory.config import DoryConfig

sys.path.insert(0, os.path.dirname(__file__))
from reference import dory_numpy as D
from reference import hf_tiny

F32_FILE = 1e-9
Q8_REL = 0.05


@pytest.fixture(scope="module")
def tiny():
    return hf_tiny.make(seed=11)


# ------------------------------------------------------------------ config -> arch

def test_arch_from_the_tiny_config(tiny):
    _, c = tiny
    arch = H.arch_from_hf_config(c)
    d = arch["dory"]
    assert arch["arch_name"] == "dory"
    assert (arch["num_layers"], arch["num_kv_heads"], arch["head_dim"]) == (12, 2, 8)
    assert d["layer_pattern"] == c["hybrid_layer_pattern"]
    assert (d["n_input_layers"], d["n_recurrent_layers"], d["n_output_layers"]) == (4, 4, 4)
    assert (d["rope_theta_full"], d["rope_theta_sliding"]) == (1e6, 1e4)
    assert d["sliding_window"] == 3 and d["initializer_range"] == 0.02
    assert d["gate_logit_scale_init"] == pytest.approx(math.sqrt(32))   # null -> sqrt(H)
    assert len(arch["layer_types"]) == 12
    assert json.loads(json.dumps(arch)) == arch
    DoryConfig.from_arch(arch)


def test_defaults_of_vllm_apply(tiny):
    _, c = tiny
    c = dict(c)
    for k in ("n_recurrent_layers", "rope_theta_2", "rope_profile_layers", "ngpt", "mixer_type",
              "recurrent_kv_cache_mode", "head_dim"):
        c.pop(k)
    arch = H.arch_from_hf_config(c)
    assert arch["dory"]["n_recurrent_layers"] == 4
    assert arch["dory"]["rope_theta_sliding"] == arch["dory"]["rope_theta_full"] == 1e6
    assert arch["dory"]["recurrent_kv_cache_mode"] == "per_loop"


REFUSE = [
    ("model_type", "llama", "model_type"),
    ("ngpt", False, "ngpt"),
    ("fngpt", 0, "fngpt"),
    ("dory_format_version", 2, "dory_format_version"),
    ("ngpt_enable_final_norm", True, "ngpt_enable_final_norm"),
    ("attention_output_gate", False, "attention_output_gate"),
    ("attention_bias", True, "attention_bias"),
    ("mlp_bias", True, "mlp_bias"),
    ("mlp_hidden_act", "gelu", "mlp_hidden_act"),
    ("tie_word_embeddings", True, "tie_word_embeddings"),
    ("initial_state", "zeros", "initial_state"),
    ("input_transform", "concat", "input_transform"),
    ("output_transform", "add", "output_transform"),
    ("mixer_type", "mamba", "mixer_type"),
    ("partial_rotary_factor", 0.5, "partial_rotary_factor"),
    ("partial_rotary_factor_2", 0.5, "partial_rotary_factor_2"),
    ("no_rope_layers", [1] + [0] * 11, "no_rope_layers"),
    ("rope_profile_layers", [3] * 12, "rope_profile_layers"),
    ("swa_num_attention_heads", 8, "swa_num_attention_heads"),
    ("swa_head_dim", 16, "swa_head_dim"),
    ("head_dim", 16, "head_dim"),
    ("hybrid_layer_pattern", "S-*-S-*-S-*", "hybrid_layer_pattern"),
    ("hybrid_layer_pattern", "S-*-S-*-S-*+", "hybrid_layer_pattern"),
    ("n_input_layers", 5, "n_recurrent_layers"),
    ("n_recurrent_loops", 0, "n_recurrent_loops"),
    ("n_recurrent_loops", 17, "n_recurrent_loops"),
    ("recurrent_kv_cache_mode", "sometimes", "recurrent_kv_cache_mode"),
    ("swa_window_size", 0, "swa_window_size"),
    ("swa_window_size", None, "swa_window_size"),
    ("init_method_std", 0, "init_method_std"),
    ("ngpt_alpha_init", -1.0, "ngpt_alpha_init"),
    ("num_key_value_heads", 3, "num_key_value_heads"),
    ("num_attention_heads", None, "num_attention_heads"),
    ("attention_output_gate_logit_scale_init", "big", "attention_output_gate_logit_scale_init"),
    ("vocab_size", 96.0, "vocab_size"),
]


@pytest.mark.parametrize("key,value,named", REFUSE, ids=[f"{r[0]}={r[1]!r}"[:50] for r in REFUSE])
def test_unrunnable_configs_are_refused_naming_the_key(tiny, key, value, named):
    c = dict(tiny[1])
    c[key] = value
    if key == "model_type":
        c["architectures"] = ["LlamaForCausalLM"]
    if key == "num_key_value_heads":
        c["swa_num_key_value_heads"] = value
    with pytest.raises(ConfigError) as e:
        H.arch_from_hf_config(c)
    assert str(e.value).startswith(f"config.json: {named}:"), str(e.value)


def test_rope_profiles_must_give_one_base_per_layer_kind(tiny):
    _t, c = tiny
    mixed = list(c["rope_profile_layers"])
    mixed[0] = 1                                             # one S layer on profile 1
    with pytest.raises(ConfigError, match="rope_profile_layers: the sliding"):
        H.arch_from_hf_config(dict(c, rope_profile_layers=mixed))
    # Same thetas: the profile numbers no longer matter.
    H.arch_from_hf_config(dict(c, rope_profile_layers=mixed, rope_theta_2=c["rope_theta"]))


def test_swapped_profiles_map_to_the_right_bases(tiny):
    """S on profile 1 and * on profile 2 is still one base per kind: the converter must
    swap the bases, and the reference over CMF semantics must then agree with HF's."""
    t, c = tiny
    profiles = [1 if ch == "S" else 2 for ch in c["hybrid_layer_pattern"]]
    swapped = dict(c, rope_profile_layers=profiles)
    arch = H.arch_from_hf_config(swapped)
    assert (arch["dory"]["rope_theta_sliding"], arch["dory"]["rope_theta_full"]) == (1e6, 1e4)
    ids = [5, 17, 3, 60, 2, 9, 44]
    cmf_t = {H.cmf_name(k): v for k, v in t.items()}
    a = D.DoryReference(t, swapped).forward(ids)
    b = D.DoryReference.from_cmf(arch, cmf_t).forward(ids)
    assert np.max(np.abs(a - b)) < F32_FILE


# ------------------------------------------------------------------ tensor names

def test_name_mapping_examples():
    cases = {"backbone.embeddings.weight": "model.embed_tokens.weight",
             "lm_head.weight": "lm_head.weight",
             "lm_head.logit_scale": "lm_head.logit_scale",
             "backbone.layers.0.mixer.q_proj.weight": "model.layers.0.mixer.q_proj.weight",
             "backbone.layers.11.mixer.sqk": "model.layers.11.mixer.sqk",
             "backbone.layers.3.mlp_alpha": "model.layers.3.mlp_alpha",
             "backbone.layers.70.mixer.suv_up": "model.layers.70.mixer.suv_up"}
    for hf, cmf in cases.items():
        assert H.cmf_name(hf) == cmf and H.hf_name(cmf) == hf
    for bad in ("model.embed_tokens.weight", "backbone.norm.weight", "backbone.layers.x.mixer"):
        with pytest.raises(ConfigError, match=bad.replace(".", r"\.")):
            H.cmf_name(bad)


def test_expected_tensors_are_exactly_the_checkpoint(tiny):
    t, c = tiny
    cfg = DoryConfig.from_arch(H.arch_from_hf_config(c))
    want = H.expected_tensors(cfg)
    assert set(want) == set(t)
    for k, shape in want.items():
        assert t[k].shape == shape, k
    plan = H.plan_tensors(cfg, {k: v.shape for k, v in t.items()})
    assert next(p[0] for p in plan) == "backbone.embeddings.weight"
    assert [p[1] for p in plan][-2:] == ["lm_head.weight", "lm_head.logit_scale"]


def test_release_tensor_set_has_the_published_parameter_count():
    """Spec §1.4: with exactly these tensors the release has 3,975,229,440 parameters."""
    h = {"arch_name": "dory", "hidden_size": 2560, "intermediate_size": 7168, "num_layers": 72,
         "num_attention_heads": 16, "num_kv_heads": 4, "head_dim": 256, "vocab_size": 131072,
         "max_position_embeddings": 262144,
         "dory": {"layer_pattern": "S-S-S-*-" * 9, "n_input_layers": 16, "n_recurrent_layers": 40,
                  "n_output_layers": 16, "n_recurrent_loops": 2, "sliding_window": 1024,
                  "rope_theta_full": 1e7, "rope_theta_sliding": 1e4, "initializer_range": 0.02,
                  "ngpt_alpha_init": 0.05}}
    shapes = H.expected_tensors(DoryConfig.from_arch(h))
    assert sum(math.prod(s) for s in shapes.values()) == 3_975_229_440


@pytest.mark.parametrize("edit,named", [
    (lambda s: s.pop("backbone.layers.2.mixer.sqk"), "backbone.layers.2.mixer.sqk: missing"),
    (lambda s: s.update({"backbone.layers.1.mixer.qkv_proj.weight": (8, 8)}),
     "backbone.layers.1.mixer.qkv_proj.weight: unexpected tensor in the checkpoint (q/k/v"),
    (lambda s: s.update({"backbone.norm.weight": (32,)}), "backbone.norm.weight: unexpected"),
    (lambda s: s.update({"lm_head.weight": (32, 96)}), "lm_head.weight: shape (32, 96)"),
])
def test_plan_refuses_missing_unexpected_and_misshapen_tensors(tiny, edit, named):
    t, c = tiny
    cfg = DoryConfig.from_arch(H.arch_from_hf_config(c))
    shapes = {k: v.shape for k, v in t.items()}
    edit(shapes)
    with pytest.raises(ConfigError) as e:
        H.plan_tensors(cfg, shapes)
    assert str(e.value).startswith(named), str(e.value)


def test_rotary_buffers_are_ignored(tiny):
    t, c = tiny
    cfg = DoryConfig.from_arch(H.arch_from_hf_config(c))
    shapes = {k: v.shape for k, v in t.items()}
    shapes["backbone.layers.0.mixer.rotary_emb.inv_freq"] = (4,)
    assert len(H.plan_tensors(cfg, shapes)) == len(t)


def test_transforms_are_left_to_the_loader():
    """The reference engine's loader applies every load-time transform, so none is applied here: the
    documented raw set covers each scale-vector suffix a checkpoint has."""
    suffixes = {"attn_alpha", "mlp_alpha", "mixer.sqk", "mixer.s_gate", "mixer.suv_gate",
                "mixer.suv_up", "lm_head.logit_scale"}
    assert set(H.STORED_RAW) == suffixes


def test_vector_dtype_rule():
    assert H.vector_dtype(hf_tiny.bf16_round(np.array([0.02, -0.013, 1.5], np.float32))) == "f16"
    assert H.vector_dtype(np.array([1e-6, 0.5], np.float32)) == "f32"       # subnormal in f16
    assert H.vector_dtype(np.array([7e4], np.float32)) == "f32"             # f16 overflow
    assert H.vector_dtype(np.array([0.0123456789], np.float32)) == "f32"    # f16 would round
    assert H.vector_dtype(np.zeros(3, np.float32)) == "f16"


# ------------------------------------------------------------------ safetensors + tokenizer

@pytest.mark.parametrize("dtype,shards", [("f32", 1), ("bf16", 1), ("bf16", 3), ("f32", 2)])
def test_checkpoint_reader_returns_the_stored_values(tmp_path, dtype, shards):
    t, c = hf_tiny.build(tmp_path, seed=2, dtype=dtype, shards=shards)
    hf, _arch, plan, where = H.plan_checkpoint(tmp_path)
    assert hf == c and len(plan) == len(t)
    for name, arr in t.items():
        got = where[name].load(name)
        assert got.dtype == np.float32 and np.array_equal(got, arr), name
    for s in set(where.values()):
        s.close()


def test_reader_refuses_broken_files(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(FormatError, match="model.safetensors"):
        ST.open_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FormatError, match="no \\*.safetensors"):
        ST.open_checkpoint(tmp_path)
    hf_tiny.save_safetensors(tmp_path / "a.safetensors", {"x": np.zeros(2, np.float32)})
    hf_tiny.save_safetensors(tmp_path / "b.safetensors", {"x": np.zeros(2, np.float32)})
    with pytest.raises(FormatError, match="also in"):
        ST.open_checkpoint(tmp_path)


@pytest.mark.parametrize("header", [b"[1, 2]", b'{"x": {"dtype": "F32"}}', b'{"x": 3}'])
def test_reader_refuses_malformed_headers(tmp_path, header):
    p = tmp_path / "model.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(FormatError, match="bad safetensors header"):
        ST.open_checkpoint(tmp_path)


def test_reader_refuses_a_malformed_index(tmp_path):
    hf_tiny.save_safetensors(tmp_path / "a.safetensors", {"x": np.zeros(2, np.float32)})
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(FormatError, match="not a safetensors index"):
        ST.open_checkpoint(tmp_path)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_reader_loads_a_part_of_a_stacked_tensor(tmp_path, dtype):
    a = np.random.default_rng(3).standard_normal((3, 6, 4)).astype(np.float32)
    if dtype == "bf16":
        a = hf_tiny.bf16_round(a)
    hf_tiny.save_safetensors(tmp_path / "model.safetensors", {"w": a}, dtype=dtype)
    sh = ST.open_checkpoint(tmp_path)["w"]
    part = sh.load("w", (1, slice(2, 5)))
    assert part.dtype == np.float32
    np.testing.assert_array_equal(part, a[1, 2:5])
    np.testing.assert_array_equal(sh.load("w", (2, slice(None, None))), a[2])
    sh.close()


def test_reader_gives_integer_tensors_raw_only(tmp_path):
    from safetensors.numpy import save_file
    save_file({"ids": np.arange(6, dtype=np.int64).reshape(2, 3)}, str(tmp_path / "x.safetensors"))
    sh = ST.open_checkpoint(tmp_path)["ids"]
    np.testing.assert_array_equal(sh.raw("ids"), np.arange(6).reshape(2, 3))
    with pytest.raises(FormatError, match="not a float"):
        sh.load("ids")
    sh.close()


@pytest.mark.parametrize("where", ["file", "config", None])
def test_tokenizer_bundle(tmp_path, where):
    hf_tiny.build(tmp_path, seed=0, chat_template=where)
    tok = json.loads(H.find_tokenizer_json(tmp_path))
    endoftext, im_end = H.token_id(tok, "<|endoftext|>"), H.token_id(tok, "<|im_end|>")
    b = H.tokenizer_bundle(tmp_path)
    assert (b.get("chat_template") == hf_tiny.CHATML) == (where is not None)
    assert ("chat_template" in b) == (where is not None)
    # generation_config's eos first, then the tokenizer's eos token (<|im_end|>)
    assert b["eos_token_ids"] == [endoftext, im_end]
    assert b["pad_token_id"] == endoftext and "bos_token_id" not in b


def test_chat_template_list_form_and_missing_dir(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"},
                           {"name": "default", "template": "D"}]}))
    assert H.find_chat_template(tmp_path) == "D"
    assert H.find_tokenizer_json(tmp_path) is None
    assert H.tokenizer_bundle(tmp_path, {}) == {"chat_template": "D", "eos_token_ids": []}
    with pytest.raises(ConfigError, match="config.json: missing"):
        from_hf(tmp_path / "nowhere", tmp_path / "x.cmf")


def test_chat_end_token_comes_from_the_template(tmp_path):
    hf_tiny.build(tmp_path, seed=0, chat_template="file")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": None}))
    tok = json.loads(H.find_tokenizer_json(tmp_path))
    ids = H.eos_token_ids(tmp_path, template=hf_tiny.CHATML)
    assert H.token_id(tok, "<|im_end|>") in ids
    assert H.token_id(tok, {"content": "<|im_start|>"}) == tok["added_tokens"][1]["id"]


def test_from_hf_refuses_other_model_types(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(ConfigError, match="no converter"):
        from_hf(tmp_path, tmp_path / "x.cmf")


# ------------------------------------------------------------------ end to end

def cmf_or_skip():
    from cortiq import cmf
    return cmf


@pytest.mark.parametrize("quant", ["f32", "q8_row"])
def test_convert_end_to_end(tmp_path, quant):
    cmf = cmf_or_skip()
    t, c = hf_tiny.build(tmp_path / "hf", seed=3, dtype="bf16", shards=2)
    out = tmp_path / "tiny.cmf"
    from_hf(tmp_path / "hf", out, quant=quant, progress=False)
    with cmf.open(out) as cf:
        assert cf.verify() == []
        cfg = DoryConfig.from_header(cf.header)
        assert cf.arch == H.arch_from_hf_config(c)
        assert cfg.layer_pattern == c["hybrid_layer_pattern"]
        assert set(cf.names()) == {H.cmf_name(k) for k in t}
        assert cf.tokenizer_json() == (tmp_path / "hf" / "tokenizer.json").read_bytes()
        assert cf.tokenizer_config["chat_template"] == hf_tiny.CHATML
        back = {n: cf.tensor(n) for n in cf.names()}
    for k, v in t.items():
        got = back[H.cmf_name(k)]
        assert got.shape == v.shape, k
        if v.ndim == 1:
            assert np.array_equal(got, v), k            # raw, f16-exact (bf16 values)
    ids = [4, 18, 77, 3, 3, 59, 21, 8, 40, 1]
    want = D.DoryReference(t, c).forward(ids)
    got = D.DoryReference.from_cmf(cf.arch, back).forward(ids)
    err = float(np.max(np.abs(got - want)))
    if quant == "f32":
        assert err < F32_FILE
    else:
        assert err < Q8_REL * float(np.max(np.abs(want)))


@pytest.mark.parametrize("bf16_values,quant", [(True, "q8_row"), (False, "q8_row"), (False, "f32")])
def test_convert_streams_into_the_writer_contract(tmp_path, monkeypatch, bf16_values, quant):
    """convert() against a stand-in for cortiq.cmf.write (the CONTRACTS.md signature):
    tensors arrive lazily, one at a time, raw, in plan order, with the bundle."""
    import cortiq.cmf
    t, c = hf_tiny.build(tmp_path / "hf", seed=4, shards=2, bf16_values=bf16_values)
    seen = {}

    def fake_write(path, tensors, *, arch, quant="q8_row", tokenizer_json=None,
                   tokenizer_config=None, skills=(), masks=None, provenance=None,
                   dtypes=None, progress=True):
        order = []
        for name, src in tensors:
            assert callable(src)                  # streamed, not materialised up front
            order.append(name)
            seen[name] = src()
        seen.update(_path=path, _arch=arch, _quant=quant, _tok=tokenizer_json,
                    _tcfg=tokenizer_config, _prov=provenance, _dtypes=dtypes,
                    _progress=progress, _order=order)

    monkeypatch.setattr(cortiq.cmf, "write", fake_write, raising=False)
    H.convert(tmp_path / "hf", tmp_path / "o.cmf", quant=quant, progress=False)
    assert seen["_order"] == [H.cmf_name(k) for k in H.expected_tensors(
        DoryConfig.from_arch(seen["_arch"]))]
    for k, v in t.items():
        assert np.array_equal(seen[H.cmf_name(k)], v), k          # raw HF values
    assert seen["_arch"] == H.arch_from_hf_config(c) and seen["_quant"] == quant
    assert seen["_tok"] == (tmp_path / "hf" / "tokenizer.json").read_bytes()
    assert seen["_tcfg"]["chat_template"] == hf_tiny.CHATML
    assert seen["_prov"]["hf_config"] == c and seen["_progress"] is False
    vectors = {H.cmf_name(k) for k, v in t.items() if v.ndim == 1}
    if bf16_values or quant == "f32":
        assert seen["_dtypes"] is None
    else:
        assert seen["_dtypes"] == {n: "f32" for n in vectors}
