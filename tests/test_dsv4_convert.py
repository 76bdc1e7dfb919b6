"""DeepSeek-V4 converter and loader tests that need no torch: checkpoints written with
safetensors.numpy in every spelling HF uses, every storage dtype, masks from the file.

DTYPE_TOL: a file in dtype X against an f32 file of X's dequantized values -- the same
weights, so only float32 summation order differs (the SIMD kernels factor scales out of
their partial sums): 1e-4 on logits of magnitude ~1."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

import cortiq
from cortiq import cmf
from cortiq.cmf.masks import Masks, MaskTask
from cortiq.convert import hf_deepseek_v4 as C
from cortiq.errors import ConfigError

sys.path.insert(0, os.path.dirname(__file__))
from reference.dsv4_toy import tokenizer_json, toy_tensors

import optional
st_numpy = optional.need("extras", "safetensors.numpy")
DTYPE_TOL = 1e-4
IDS = [3, 7, 1, 9, 4, 2, 8, 5, 6, 0, 11, 13]

HF_CONFIG = {
    "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
    "vocab_size": 24, "hidden_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8, "q_lora_rank": 16,
    "qk_rope_head_dim": 4, "num_experts_per_tok": 2, "n_routed_experts": 8,
    "n_shared_experts": 1, "routed_scaling_factor": 1.0, "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True, "layer_types": ["sliding_attention", "compressed_sparse_attention"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    "mlp_layer_types": ["hash_moe", "moe"], "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "swiglu_limit": 10.0, "sliding_window": 6, "o_groups": 2,
    "o_lora_rank": 16, "index_n_heads": 2, "index_head_dim": 16, "index_topk": 8,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_parameters": {"rope_type": "yarn", "factor": 16.0,
                        "original_max_position_embeddings": 65536, "beta_fast": 32.0,
                        "beta_slow": 1.0},
}

REF = {  # cmf suffix -> reference-style (save_pretrained) suffix
    "self_attn.wq_a.weight": "attn.wq_a.weight", "self_attn.q_norm.weight": "attn.q_norm.weight",
    "self_attn.wq_b.weight": "attn.wq_b.weight", "self_attn.wkv.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.norm.weight", "self_attn.wo_a.weight": "attn.wo_a.weight",
    "self_attn.wo_b.weight": "attn.wo_b.weight", "self_attn.attn_sink": "attn.attn_sink",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn.gate.weight", "mlp.expert_bias": "ffn.gate.bias",
    "mlp.tid2eid": "ffn.gate.tid2eid",
}
MOD = {  # cmf suffix -> module-name suffix
    "self_attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "self_attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "self_attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "self_attn.wkv.weight": "self_attn.kv_proj.weight",
    "self_attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "self_attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "self_attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "self_attn.attn_sink": "self_attn.sinks",
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate.weight", "mlp.expert_bias": "mlp.gate.e_score_correction_bias",
    "mlp.tid2eid": "mlp.gate.tid2eid",
    "self_attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "self_attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "self_attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "self_attn.compressor.ape": "self_attn.compressor.position_bias",
    "self_attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "self_attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "self_attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "self_attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "self_attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "self_attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
}


def hf_checkpoint(d, style, tid_dtype=np.int64):
    t, _ = toy_tensors()
    out = {}
    E = 8
    for name, a in t.items():
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            p = f"model.layers.{i}"
            if ".mlp.experts." in "." + rest + ".":
                e, role = rest[len("mlp.experts."):].split(".", 1)
                if style == "ref":
                    w = {"gate_proj.weight": "w1", "up_proj.weight": "w3", "down_proj.weight": "w2"}[role]
                    out[f"{p}.ffn.experts.{e}.{w}.weight"] = a
                continue   # module style: stacked below
            if rest.startswith("mlp.shared_expert."):
                role = rest.split(".")[2]
                if style == "ref":
                    w = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[role]
                    out[f"{p}.ffn.shared_experts.{w}.weight"] = a
                else:
                    out[f"{p}.mlp.shared_experts.{role}.weight"] = a
                continue
            if rest.startswith("hc_"):
                which, part = rest[3:].split("_")
                out[f"{p}.hc_{which}_{part}" if style == "ref" else f"{p}.{which}_hc.{part}"] = a
                continue
            table = REF if style == "ref" else MOD
            key = table.get(rest, rest.replace("self_attn.", "attn."))
            if rest == "mlp.tid2eid":
                a = a.astype(tid_dtype)
            out[f"{p}.{key}"] = a
        elif name.startswith("model.hc_head_"):
            part = name[len("model.hc_head_"):]
            out[f"model.hc_head.hc_{part}"] = a
        elif name == "lm_head.weight":
            out["head.weight" if style == "ref" else "lm_head.weight"] = a
        else:
            out[name] = a
    if style == "mod":
        for li in range(2):
            p = f"model.layers.{li}"
            g = np.stack([t[f"{p}.mlp.experts.{e}.gate_proj.weight"] for e in range(E)])
            u = np.stack([t[f"{p}.mlp.experts.{e}.up_proj.weight"] for e in range(E)])
            out[f"{p}.mlp.experts.gate_up_proj"] = np.concatenate([g, u], axis=1)
            out[f"{p}.mlp.experts.down_proj"] = np.stack(
                [t[f"{p}.mlp.experts.{e}.down_proj.weight"] for e in range(E)])
        out["model.layers.0.self_attn.compressor.rotary_emb.main_inv_freq"] = np.ones(2, np.float32)
    out["mtp.0.emb.weight"] = np.zeros((2, 2), np.float32)
    d.mkdir(parents=True, exist_ok=True)
    st_numpy.save_file({k: np.ascontiguousarray(v) for k, v in out.items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(HF_CONFIG))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (d / "tokenizer.json").write_bytes(tokenizer_json())
    return d


@pytest.fixture(scope="module")
def direct(tmp_path_factory):
    t, arch = toy_tensors()
    p = tmp_path_factory.mktemp("dsv4c") / "direct.cmf"
    cmf.write(p, t, arch=arch, quant="f32", tokenizer_json=tokenizer_json(), progress=False)
    llm = cortiq.LLM(p)
    out = llm.session().feed(IDS, want="all")
    llm.close()
    return out


@pytest.mark.parametrize("style,tid", [("ref", np.int64), ("mod", np.int32)])
def test_both_spellings_convert_to_the_same_model(tmp_path, direct, style, tid):
    d = hf_checkpoint(tmp_path / "hf", style, tid)
    out = tmp_path / "m.cmf"
    cortiq.convert.from_hf(d, out, quant="f32", progress=False)
    f = cmf.open(out)
    assert f.tensors["model.layers.0.mlp.tid2eid"].dtype == "f32"
    assert not any("mtp" in n or "inv_freq" in n for n in f.tensors)
    assert f.tokenizer_config["chat_template"] == "{{ messages }}"
    f.close()
    llm = cortiq.LLM(out)
    got = llm.session().feed(IDS, want="all")
    llm.close()
    np.testing.assert_allclose(got, direct, atol=1e-5)


def test_cli_convert_quiet(tmp_path, capsys):
    from cortiq.serve.cli import main
    d = hf_checkpoint(tmp_path / "hf", "ref")
    assert main(["convert", "--arch", "deepseek_v4", str(d), str(tmp_path / "o.cmf"),
                 "--quant", "q8_row", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err == ""
    assert main(["convert", "--arch", "dory", str(d), str(tmp_path / "p.cmf"), "--quiet"]) == 1


@pytest.mark.parametrize("key,value", [
    ("scoring_func", "softmax"), ("num_key_value_heads", 2), ("norm_topk_prob", False),
    ("layer_types", ["sliding_attention", "full_attention"]), ("hidden_act", "gelu"),
    ("mlp_layer_types", ["hash_moe", "dense"]),
])
def test_unsupported_config_is_refused_with_the_key(key, value):
    hf = dict(HF_CONFIG, **{key: value})
    with pytest.raises(ConfigError, match=key):
        C.arch_from_hf_config(hf)


def test_yarn_mscale_is_refused():
    hf = dict(HF_CONFIG, rope_parameters=dict(HF_CONFIG["rope_parameters"], attention_factor=1.3))
    with pytest.raises(ConfigError, match="attention_factor"):
        C.arch_from_hf_config(hf)


def test_missing_tensor_is_named(tmp_path):
    d = hf_checkpoint(tmp_path / "hf", "ref")
    t = st_numpy.load_file(str(d / "model.safetensors"))
    del t["model.layers.1.attn.wo_b.weight"]
    st_numpy.save_file(t, str(d / "model.safetensors"))
    with pytest.raises(ConfigError, match="model.layers.1.self_attn.wo_b.weight"):
        cortiq.convert.from_hf(d, tmp_path / "x.cmf", progress=False)


@pytest.mark.parametrize("quant", ["f16", "bf16", "q8_row", "q8_2f", "q4_tiled", "q4tp", "q2tp"])
def test_every_storage_dtype_decodes_like_its_dequantized_values(tmp_path, quant):
    t, arch = toy_tensors()
    qpath = tmp_path / f"{quant}.cmf"
    cmf.write(qpath, t, arch=arch, quant=quant, tokenizer_json=tokenizer_json(), progress=False)
    f = cmf.open(qpath)
    dts = {i.dtype for i in f.tensors.values()}
    deq = {n: np.asarray(f.tensor(n), np.float32).reshape(t[n].shape) for n in t}
    f.close()
    if quant not in ("f16", "bf16"):
        assert quant in dts
    fpath = tmp_path / "deq.cmf"
    cmf.write(fpath, deq, arch=arch, quant="f32", tokenizer_json=tokenizer_json(), progress=False)
    outs = []
    for p in (qpath, fpath):
        llm = cortiq.LLM(p, precision="exact")  # the decoding alone (auto: int8 for q4/q2)
        outs.append(llm.session().feed(IDS, want="all"))
        llm.close()
    np.testing.assert_allclose(outs[0], outs[1], atol=DTYPE_TOL)


def test_task_mask_from_the_file(tmp_path):
    t, arch = toy_tensors()
    E, L = 8, 2
    allow = np.ones((L, E), bool)
    allow[1] = False
    allow[1, [2, 5]] = True
    task = MaskTask(name="code", ffn=np.ones((L, 16), bool), heads=np.ones((L, 4), bool),
                    layers=np.ones(L, bool), experts=allow)
    other = MaskTask(name="all", ffn=np.ones((L, 16), bool), heads=np.ones((L, 4), bool),
                     layers=np.ones(L, bool), experts=np.ones((L, E), bool), task_id=1)
    p = tmp_path / "m.cmf"
    cmf.write(p, t, arch=arch, quant="f32", masks=Masks("code", [task, other]),
              tokenizer_json=tokenizer_json(), progress=False)
    llm = cortiq.LLM(p, task="code")
    assert list(np.nonzero(llm.model.layers[1].mask)[0]) == [2, 5]
    assert llm.model.layers[0].mask is None   # hash layer: never masked
    llm.close()
    llm = cortiq.LLM(p, task="all")
    assert llm.model.layers[1].mask.all()
    llm.close()
    llm = cortiq.LLM(p)                      # no task: no mask
    assert llm.model.layers[1].mask is None
    llm.close()
    from cortiq.models.deepseek_v4 import DeepseekV4Model
    with cmf.open(p) as cf:                  # True: the file's default task
        assert list(np.nonzero(DeepseekV4Model(cf, task=True).layers[1].mask)[0]) == [2, 5]
    with pytest.raises(ConfigError, match="nope"):
        cortiq.LLM(p, task="nope")
