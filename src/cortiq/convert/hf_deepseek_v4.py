"""DeepSeek-V4 checkpoint -> CMF v2 file.

Reads two layouts, told apart tensor by tensor:

* transformers' (``save_pretrained``): float tensors (F32/BF16/F16) under the names below;
* DeepSeek's release: the reference implementation's names without ``model.``
  (``embed.weight``, ``head.weight``, ``norm.weight``, ``hc_head_{fn,base,scale}``,
  ``layers.N.attn.*``, ``layers.N.ffn.*``), FP8 weights (E4M3 with an E8M0 ``.scale`` per
  128x128 block) and FP4 routed experts (E2M1 with an E8M0 ``.scale`` per 32 of a row),
  decoded by ``scaled_weights`` / ``microfloat``. MTP layers (``mtp.*``) are skipped with
  one log line. ``config.json`` may carry the reference keys (``compress_ratios``,
  ``num_hash_layers``, ``qk_rope_head_dim``, or the inference code's ``dim``,
  ``n_layers``, ``rope_factor``...) beside or instead of transformers' ones.

``--quant f32`` stores the release values exactly; ``experts_quant`` gives the routed
experts their own dtype (``q4tp``, ``q2tp,q4tp``, or ``exact``: FP4 losslessly as 5-bit
vbit). Names accepted, in both spellings HF writes:

* ``save_pretrained`` (reference-style names under ``model.``): ``attn.{wq_a,q_norm,wq_b,
  wkv,wo_a,wo_b}``, the kv norm as ``attn.norm`` or ``attn.kv_norm``, ``attn.attn_sink``,
  ``attn.compressor.*``, ``attn.indexer.*``, ``attn_norm``/``ffn_norm``,
  ``hc_{attn,ffn}_{fn,base,scale}``, ``ffn.gate.{weight,bias,tid2eid}``,
  ``ffn.experts.{e}.w{1,2,3}``, ``ffn.shared_experts.w{1,2,3}``, ``head.weight``,
  ``model.hc_head.hc_{fn,base,scale}``;
* the module names (``self_attn.q_a_proj``, ``kv_proj``, ``o_a_proj``, ``sinks``,
  ``compressor.position_bias``, ``compressor.indexer.*``, ``attn_hc.fn``,
  ``mlp.gate.e_score_correction_bias``, stacked ``mlp.experts.gate_up_proj [E, 2I, D]``
  / ``down_proj [E, D, I]``, ``mlp.shared_experts.{gate,up,down}_proj``, ``lm_head``).

``tid2eid`` may be int64 or int32 (stored f32, docs/cmf-format.md §4.3). MTP weights and rotary
buffers are dropped. Tensors stream one at a time (stacked experts are sliced per expert
straight from the mapped shard), so memory stays bounded. The tokenizer and chat
template come along (``hf_dory.tokenizer_bundle``). A config cortiq cannot run is refused
with a ConfigError naming the ``config.json`` key.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..errors import ConfigError, FormatError
from . import scaled_weights as SW
from ._safetensors import FLOAT_DTYPES, SafetensorsShard, open_checkpoint
from .hf_dory import find_tokenizer_json, read_hf_config, tokenizer_bundle

CONVERTER = "cortiq.convert.hf_deepseek_v4"
ARCH_NAME = "deepseek_v4"
_RATIO_TYPES = {"sliding_attention": 0, "compressed_sparse_attention": 4,
                "heavily_compressed_attention": 128}
_INT_DT = {"I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"),
           "U8": np.dtype("u1"), "I8": np.dtype("i1")}


def _bad(key, msg):
    return ConfigError(f"config.json: {key}: {msg}")


# ------------------------------------------------------------------ config

#: DeepSeek's reference ``ModelArgs`` keys -> the transformers keys they stand for
REFERENCE_KEYS = {
    "dim": "hidden_size", "moe_inter_dim": "moe_intermediate_size",
    "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
    "n_activated_experts": "num_experts_per_tok", "score_func": "scoring_func",
    "route_scale": "routed_scaling_factor", "rope_head_dim": "qk_rope_head_dim",
    "norm_eps": "rms_norm_eps", "window_size": "sliding_window",
    "n_hash_layers": "num_hash_layers", "n_mtp_layers": "num_nextn_predict_layers",
}


def is_reference_config(hf: dict) -> bool:
    """A config.json in DeepSeek's reference spelling (no ``model_type``)."""
    return (not hf.get("model_type") and "compress_ratios" in hf
            and ("hc_mult" in hf or "n_hash_layers" in hf))


def with_transformers_keys(hf: dict) -> dict:
    """``hf`` with the reference keys (``dim``, ``n_layers``, ``rope_factor`` +
    ``original_seq_len``, ...) copied to the transformers keys they stand for, where those
    are absent. A transformers key always wins."""
    out = dict(hf)
    for ref, key in REFERENCE_KEYS.items():
        if out.get(key) is None and hf.get(ref) is not None:
            out[key] = hf[ref]
    if is_reference_config(hf):
        out["model_type"] = ARCH_NAME
    if (out.get("rope_parameters") is None and out.get("rope_scaling") is None
            and hf.get("rope_factor") is not None and int(hf.get("original_seq_len") or 0) > 0):
        out["rope_scaling"] = {"type": "yarn", "factor": hf["rope_factor"],
                               "original_max_position_embeddings": hf["original_seq_len"],
                               "beta_fast": hf.get("beta_fast", 32),
                               "beta_slow": hf.get("beta_slow", 1)}
    return out


def fp8_block_size(hf: dict) -> int:
    """The FP8 tile edge from ``quantization_config.weight_block_size`` (default 128)."""
    q = hf.get("quantization_config") or {}
    bs = q.get("weight_block_size") if isinstance(q, dict) else None
    if bs is None:
        return 128
    if (not isinstance(bs, (list, tuple)) or len(bs) != 2 or bs[0] != bs[1]
            or not isinstance(bs[0], int) or bs[0] < 1):
        raise _bad("quantization_config.weight_block_size",
                   f"{bs!r}: cortiq reads square FP8 blocks [b, b]")
    return int(bs[0])


def arch_from_hf_config(hf: dict) -> dict:
    """HF ``config.json`` -> CMF ``arch`` (generic keys + ``arch.deepseek_v4``). Accepts
    transformers' keys, DeepSeek's reference keys, or both."""
    hf = with_transformers_keys(hf)
    if hf.get("model_type") != ARCH_NAME and "DeepseekV4ForCausalLM" not in (hf.get("architectures") or []):
        raise _bad("model_type", f"{hf.get('model_type')!r} is not a DeepSeek-V4 model")

    def need(k):
        if hf.get(k) is None:
            raise _bad(k, "missing (required)")
        return hf[k]

    n = int(need("num_hidden_layers"))
    hd = int(need("head_dim"))
    fixed = {"scoring_func": ("sqrtsoftplus", "sqrtsoftplus"), "norm_topk_prob": (True, True),
             "num_key_value_heads": (1, 1), "n_shared_experts": (1, 1),
             "hidden_act": ("silu", "silu"), "attention_bias": (False, False),
             "mlp_bias": (False, False)}
    for key, (want, default) in fixed.items():
        got = hf.get(key, default)
        if got != want:
            raise _bad(key, f"{got!r}; cortiq runs DeepSeek-V4 only with {key} = {want!r}")
    if hf.get("qk_rope_head_dim") is not None:
        rd = int(hf["qk_rope_head_dim"])
    else:
        rd = int(hd * float(hf.get("partial_rotary_factor") or 64 / 512))
    if rd % 2 or not 0 < rd <= hd:
        raise _bad("partial_rotary_factor", f"rope dim {rd} must be even and in 1..{hd}")
    # per-layer compress ratios
    rates = dict({"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
                 **(hf.get("compress_rates") or {}))
    for legacy, key in (("compress_rate_csa", "compressed_sparse_attention"),
                        ("compress_rate_hca", "heavily_compressed_attention")):
        if hf.get(legacy) is not None:
            rates[key] = hf[legacy]
    lt = hf.get("layer_types")
    if lt is None and hf.get("compress_ratios") is not None:
        # the reference's per-layer ratios (its list may go on for the MTP layers)
        cr = hf["compress_ratios"]
        if (not isinstance(cr, (list, tuple)) or len(cr) < n
                or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in cr)):
            raise _bad("compress_ratios", f"{cr!r}: want {n} integers >= 0 (0 = sliding only)")
        ratios = [int(r) for r in cr[:n]]
    else:
        if lt is None:
            lt = ["heavily_compressed_attention"] * min(n, 2) + [
                "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
                for i in range(max(n - 2, 0))]
        lt = list(lt)[:n]
        if len(lt) != n or any(t not in _RATIO_TYPES for t in lt):
            raise _bad("layer_types", f"{lt!r}: want {n} of {sorted(_RATIO_TYPES)}")
        ratios = [0 if t == "sliding_attention" else int(rates[t]) for t in lt]
        for t in set(lt) - {"sliding_attention"}:
            if int(rates[t]) < 1:
                raise _bad("compress_rates", f"{t}: rate {rates[t]!r} must be >= 1")
    mlt = hf.get("mlp_layer_types")
    if mlt is None:
        nh = hf.get("num_hash_layers", 3)
        mlt = ["hash_moe"] * min(n, nh) + ["moe"] * max(0, n - nh)
    mlt = list(mlt)[:n]
    if len(mlt) != n or any(t not in ("hash_moe", "moe") for t in mlt):
        raise _bad("mlp_layer_types", f"{mlt!r}: want {n} of hash_moe / moe")
    # rope
    rp = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    comp = cast(dict, rp.get("compress")) if isinstance(rp.get("compress"), dict) else rp
    main = cast(dict, rp.get("main")) if isinstance(rp.get("main"), dict) else {}
    if main.get("rope_type", "default") not in ("default", None):
        raise _bad("rope_parameters.main.rope_type", f"{main.get('rope_type')!r}; cortiq runs "
                                                     "the sliding layers with plain RoPE only")
    ctype = comp.get("rope_type", comp.get("type", "default"))
    if ctype not in ("default", "yarn"):
        raise _bad("rope_parameters.rope_type", f"{ctype!r}: cortiq supports default or yarn")
    yarn = None
    if ctype == "yarn":
        af = comp.get("attention_factor", 1.0)
        if af not in (None, 1, 1.0) or comp.get("mscale") not in (None, 0, 1, 1.0):
            raise _bad("rope_parameters.attention_factor",
                       f"{af!r}: DeepSeek-V4 applies no YaRN mscale (want 1.0)")
        if comp.get("truncate", True) is not True:
            raise _bad("rope_parameters.truncate", "cortiq's YaRN truncates the correction range")
        yarn = {"factor": float(comp.get("factor") or 16.0),
                "original_max_position_embeddings": int(comp.get("original_max_position_embeddings") or 65536),
                "beta_fast": float(comp.get("beta_fast") or 32.0),
                "beta_slow": float(comp.get("beta_slow") or 1.0)}
    rope_theta = float(main.get("rope_theta", hf.get("rope_theta", 10000.0)))
    ctheta = float(comp.get("rope_theta", hf.get("compress_rope_theta", 160000.0)))
    hc = int(hf.get("hc_mult", 4))
    if hc < 1:
        raise _bad("hc_mult", f"{hc} must be >= 1")
    E, k = int(need("n_routed_experts")), int(need("num_experts_per_tok"))
    if not 0 < k <= E:
        raise _bad("num_experts_per_tok", f"{k} must be in 1..n_routed_experts ({E})")
    inter = int(need("moe_intermediate_size"))
    arch: dict[str, Any] = {
        "arch_name": ARCH_NAME, "hidden_size": int(need("hidden_size")), "num_layers": n,
        "num_attention_heads": int(need("num_attention_heads")), "num_kv_heads": 1,
        "head_dim": hd, "vocab_size": int(need("vocab_size")),
        "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "partial_rotary_factor": rd / hd, "sliding_window": int(hf.get("sliding_window", 128)),
        "max_position_embeddings": int(hf.get("max_position_embeddings", 1048576)),
        "intermediate_size": inter,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "moe": {"num_experts": E, "top_k": k, "moe_intermediate_size": inter,
                "shared_expert_intermediate_size": inter, "norm_topk_prob": True,
                "routed_scaling_factor": float(hf.get("routed_scaling_factor", 1.0))},
        "deepseek_v4": {
            "hc_mult": hc, "hc_sinkhorn_iters": int(hf.get("hc_sinkhorn_iters", 20)),
            "hc_eps": float(hf.get("hc_eps", 1e-6)),
            "swiglu_limit": float(hf.get("swiglu_limit") or 0.0),
            "index_topk": int(hf.get("index_topk", 512)),
            "index_n_heads": int(hf.get("index_n_heads", 64)),
            "index_head_dim": int(hf.get("index_head_dim", 128)),
            "q_lora_rank": int(need("q_lora_rank")), "o_groups": int(need("o_groups")),
            "o_lora_rank": int(need("o_lora_rank")), "rope_theta": rope_theta,
            "compress_rope_theta": ctheta, "yarn": yarn, "compress_ratios": ratios,
            "hash_layers": [i for i, t in enumerate(mlt) if t == "hash_moe"],
        },
    }
    nh = arch["num_attention_heads"]
    if (nh * hd) % arch["deepseek_v4"]["o_groups"]:
        raise _bad("o_groups", f"{arch['deepseek_v4']['o_groups']} does not divide heads*head_dim")
    return arch


# ------------------------------------------------------------------ names

_LAYER_RULES: list[tuple[Any, str]] = [
    # attention (both spellings)
    (r"(?:attn|self_attn)\.(?:wq_a|q_a_proj)\.weight", "self_attn.wq_a.weight"),
    (r"(?:attn|self_attn)\.(?:q_norm|q_a_norm)\.weight", "self_attn.q_norm.weight"),
    (r"(?:attn|self_attn)\.(?:wq_b|q_b_proj)\.weight", "self_attn.wq_b.weight"),
    (r"(?:attn|self_attn)\.(?:wkv|kv_proj)\.weight", "self_attn.wkv.weight"),
    (r"(?:attn|self_attn)\.(?:norm|kv_norm)\.weight", "self_attn.kv_norm.weight"),
    (r"(?:attn|self_attn)\.(?:wo_a|o_a_proj)\.weight", "self_attn.wo_a.weight"),
    (r"(?:attn|self_attn)\.(?:wo_b|o_b_proj)\.weight", "self_attn.wo_b.weight"),
    (r"(?:attn|self_attn)\.(?:attn_sink|sinks)", "self_attn.attn_sink"),
    (r"(?:attn_sink)", "self_attn.attn_sink"),
    # indexer (reference: attn.indexer.*; modules: self_attn.compressor.indexer.*)
    (r"(?:attn|self_attn)\.(?:compressor\.)?indexer\.(?:wq_b|q_b_proj)\.weight",
     "self_attn.indexer.wq_b.weight"),
    (r"(?:attn|self_attn)\.(?:compressor\.)?indexer\.(?:scorer\.)?weights_proj\.weight",
     "self_attn.indexer.weights_proj.weight"),
    (r"(?:attn|self_attn)\.indexer\.compressor\.(wkv|wgate|norm)\.weight",
     r"self_attn.indexer.compressor.\1.weight"),
    (r"(?:attn|self_attn)\.indexer\.compressor\.ape", "self_attn.indexer.compressor.ape"),
    (r"self_attn\.compressor\.indexer\.kv_proj\.weight", "self_attn.indexer.compressor.wkv.weight"),
    (r"self_attn\.compressor\.indexer\.gate_proj\.weight", "self_attn.indexer.compressor.wgate.weight"),
    (r"self_attn\.compressor\.indexer\.kv_norm\.weight", "self_attn.indexer.compressor.norm.weight"),
    (r"self_attn\.compressor\.indexer\.position_bias", "self_attn.indexer.compressor.ape"),
    # compressor
    (r"(?:attn|self_attn)\.compressor\.(?:wkv|kv_proj)\.weight", "self_attn.compressor.wkv.weight"),
    (r"(?:attn|self_attn)\.compressor\.(?:wgate|gate_proj)\.weight", "self_attn.compressor.wgate.weight"),
    (r"(?:attn|self_attn)\.compressor\.(?:norm|kv_norm)\.weight", "self_attn.compressor.norm.weight"),
    (r"(?:attn|self_attn)\.compressor\.(?:ape|position_bias)", "self_attn.compressor.ape"),
    # norms and hyper-connections
    (r"(?:attn_norm|input_layernorm)\.weight", "input_layernorm.weight"),
    (r"(?:ffn_norm|post_attention_layernorm)\.weight", "post_attention_layernorm.weight"),
    (r"hc_(attn|ffn)_(fn|base|scale)", r"hc_\1_\2"),
    (r"(attn|ffn)_hc\.(fn|base|scale)", r"hc_\1_\2"),
    # MoE
    (r"(?:ffn|mlp)\.gate\.weight", "mlp.gate.weight"),
    (r"(?:ffn|mlp)\.gate\.(?:bias|e_score_correction_bias)", "mlp.expert_bias"),
    (r"(?:ffn|mlp)\.(?:expert_bias|e_score_correction_bias)", "mlp.expert_bias"),
    (r"(?:ffn|mlp)\.gate\.tid2eid", "mlp.tid2eid"),
    (r"(?:ffn|mlp)\.tid2eid", "mlp.tid2eid"),
    (r"(?:ffn|mlp)\.experts\.(\d+)\.(?:w1|gate_proj)\.weight", r"mlp.experts.\1.gate_proj.weight"),
    (r"(?:ffn|mlp)\.experts\.(\d+)\.(?:w3|up_proj)\.weight", r"mlp.experts.\1.up_proj.weight"),
    (r"(?:ffn|mlp)\.experts\.(\d+)\.(?:w2|down_proj)\.weight", r"mlp.experts.\1.down_proj.weight"),
    (r"(?:ffn|mlp)\.shared_experts?\.(?:w1|gate_proj)\.weight", "mlp.shared_expert.gate_proj.weight"),
    (r"(?:ffn|mlp)\.shared_experts?\.(?:w3|up_proj)\.weight", "mlp.shared_expert.up_proj.weight"),
    (r"(?:ffn|mlp)\.shared_experts?\.(?:w2|down_proj)\.weight", "mlp.shared_expert.down_proj.weight"),
    (r"(?:ffn|mlp)\.experts\.gate_up_proj", "@stacked_gate_up"),
    (r"(?:ffn|mlp)\.experts\.down_proj", "@stacked_down"),
]
_LAYER_RULES = [(re.compile(p), r) for p, r in _LAYER_RULES]
_GLOBAL = {
    "model.embed_tokens.weight": "model.embed_tokens.weight", "embed.weight": "model.embed_tokens.weight",
    "model.embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight", "lm_head.weight": "lm_head.weight",
    "model.head.weight": "lm_head.weight",
    "model.norm.weight": "model.norm.weight", "norm.weight": "model.norm.weight",
}
_LAYER = re.compile(r"(?:model\.)?layers\.(\d+)\.(.+)")
_HC_HEAD = re.compile(r"(?:model\.)?(?:hc_head\.hc_|hc_head_)(fn|base|scale)")
_DROP = re.compile(r"(^|.*\.)(mtp\.|rotary_emb\.).*|.*inv_freq")


def cmf_name(hf: str) -> str | None:
    """HF name -> CMF name; None for dropped tensors (MTP, rotary buffers); names starting
    with '@' are stacked-expert tensors the converter splits."""
    if _DROP.fullmatch(hf):
        return None
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    m = _HC_HEAD.fullmatch(hf)
    if m:
        return f"model.hc_head_{m.group(1)}"
    m = _LAYER.fullmatch(hf)
    if m:
        i, rest = m.group(1), m.group(2)
        for pat, rep in _LAYER_RULES:
            mm = pat.fullmatch(rest)
            if mm:
                if rep.startswith("@"):
                    return f"{rep}:{i}"
                return f"model.layers.{i}." + mm.expand(rep)
    raise ConfigError(f"{hf}: not a DeepSeek-V4 tensor name cortiq knows")


_KEEP_F32 = re.compile(r".*(hc_(attn|ffn)_(fn|base|scale)|hc_head_(fn|base|scale)|\.ape|attn_sink"
                       r"|norm\.weight|layernorm\.weight|expert_bias|tid2eid)$")


def _load(shard: SafetensorsShard, name: str) -> np.ndarray:
    """A float tensor, or an integer one (the tid2eid tables), as float32."""
    if shard.dtype(name) in _INT_DT:
        return shard.raw(name).astype(np.float32)
    return shard.load(name)


def _load_slice(shard: SafetensorsShard, name: str, e: int, lo: int | None = None,
                hi: int | None = None) -> np.ndarray:
    """Expert `e` of a stacked [E, R, C] tensor (rows lo..hi), read from the mapping."""
    return shard.load(name, (e, slice(lo, hi)))


def _plain_loader(sh: SafetensorsShard, name: str, cmf: str):
    """Loader of a tensor stored as plain values; code dtypes (FP8/FP4/E8M0) without a
    scale and integers outside the expert-id tables are refused."""
    dt = sh.dtype(name)
    if dt in SW.CODE_DTYPES or (dt in _INT_DT and not cmf.endswith("tid2eid")):
        raise FormatError(f"{sh.path.name}: {name}: dtype {dt} without a .scale tensor: "
                          f"cortiq reads {dt} only as block-scaled weights"
                          + ("" if dt in SW.CODE_DTYPES else " (or the tid2eid table)"))
    if dt not in _INT_DT and dt not in FLOAT_DTYPES:
        raise FormatError(f"{sh.path.name}: {name}: dtype {dt} is not one cortiq converts")
    return lambda: _load(sh, name)


def plan(hf_dir, log: Callable[[str], None] | None = None):
    """``(hf_config, arch, [(cmf_name, loader, shape)], shards, sources)`` after checking
    every tensor; ``sources`` maps the CMF names of FP8/FP4 weights to their
    ``ScaledWeight``. Both layouts: transformers' ``save_pretrained`` and DeepSeek's
    release (reference names, ``.scale`` siblings)."""
    hf = read_hf_config(hf_dir)
    arch = arch_from_hf_config(hf)
    block = fp8_block_size(hf)
    shards = open_checkpoint(hf_dir)
    n, E = arch["num_layers"], arch["moe"]["num_experts"]
    inter = arch["moe"]["moe_intermediate_size"]
    scales = SW.pair(shards)
    scale_names = set(scales.values())
    out: dict[str, tuple] = {}
    sources: dict[str, SW.ScaledWeight] = {}
    mtp = 0
    origin: dict[str, str] = {}   # CMF name -> checkpoint name, for error messages
    for name, sh in shards.items():
        if name in scale_names:
            continue
        c = cmf_name(name)
        if c is None:
            mtp += name.startswith("mtp.") or ".mtp." in name
            continue
        origin[c] = name
        shape = sh.shape(name)
        if name in scales:
            if c.startswith("@"):
                raise FormatError(f"{scales[name]}: scales of stacked experts are not a "
                                  f"layout cortiq reads")
            sn = scales[name]
            sw = SW.describe(sh, name, shards[sn], sn, fp8_block=block)
            if c in out:
                raise ConfigError(f"{name}: a second spelling of {c}")
            out[c] = (sw.load, sw.shape)
            sources[c] = sw
            continue
        if c.startswith("@"):
            kind, li = c[1:].split(":")
            if len(shape) != 3 or shape[0] != E:
                raise ConfigError(f"{name}: shape {shape}, want [{E}, ...] stacked experts")
            p = f"model.layers.{li}.mlp.experts"
            for e in range(E):
                if kind == "stacked_gate_up":
                    if shape[1] != 2 * inter:
                        raise ConfigError(f"{name}: shape {shape}, want [{E}, {2 * inter}, D]")
                    out[f"{p}.{e}.gate_proj.weight"] = (
                        lambda s=sh, nm=name, e=e: _load_slice(s, nm, e, 0, inter),
                        (inter, shape[2]))
                    out[f"{p}.{e}.up_proj.weight"] = (
                        lambda s=sh, nm=name, e=e: _load_slice(s, nm, e, inter, 2 * inter),
                        (inter, shape[2]))
                else:
                    out[f"{p}.{e}.down_proj.weight"] = (
                        lambda s=sh, nm=name, e=e: _load_slice(s, nm, e), tuple(shape[1:]))
            continue
        if c in out:
            raise ConfigError(f"{name}: a second spelling of {c}")
        out[c] = (_plain_loader(sh, name, c), shape)
    if mtp and log is not None:
        log(f"skipping {mtp} multi-token-prediction tensors (mtp.*): cortiq decodes "
            f"one token at a time")
    if "lm_head.weight" not in out and arch.get("tie_word_embeddings"):
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    # presence checks
    need = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
            "model.hc_head_fn", "model.hc_head_base", "model.hc_head_scale"]
    ratios = arch["deepseek_v4"]["compress_ratios"]
    hash_layers = set(arch["deepseek_v4"]["hash_layers"])
    for i in range(n):
        p = f"model.layers.{i}"
        need += [f"{p}.{s}" for s in (
            "input_layernorm.weight", "post_attention_layernorm.weight",
            "self_attn.wq_a.weight", "self_attn.q_norm.weight", "self_attn.wq_b.weight",
            "self_attn.wkv.weight", "self_attn.kv_norm.weight", "self_attn.wo_a.weight",
            "self_attn.wo_b.weight", "self_attn.attn_sink", "mlp.gate.weight",
            "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
            "mlp.shared_expert.down_proj.weight")]
        need += [f"{p}.hc_{a}_{b}" for a in ("attn", "ffn") for b in ("fn", "base", "scale")]
        need += [f"{p}.mlp.experts.{e}.{r}_proj.weight" for e in range(E) for r in ("gate", "up", "down")]
        if ratios[i]:
            need += [f"{p}.self_attn.compressor.{s}" for s in ("wkv.weight", "wgate.weight", "norm.weight", "ape")]
        need.append(f"{p}.mlp.tid2eid" if i in hash_layers else f"{p}.mlp.expert_bias")
    missing = [k for k in need if k not in out]
    if missing:
        raise ConfigError(f"{missing[0]}: missing from the checkpoint"
                          + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
    for c, w in expected_shapes(arch).items():
        if c in out and tuple(out[c][1]) != w:
            raise ConfigError(f"{origin.get(c, c)}: shape {list(out[c][1])}, the config says "
                              f"{list(w)}")
    names = [k for k in need if k in out] + sorted(k for k in out if k not in set(need))
    return hf, arch, [(k, out[k][0], out[k][1]) for k in names], shards, sources


def expected_shapes(arch: dict) -> dict[str, tuple]:
    """The shape the config implies for every tensor it fixes (CMF names)."""
    D, V, H, hd = (arch[k] for k in ("hidden_size", "vocab_size", "num_attention_heads",
                                     "head_dim"))
    moe, d4 = arch["moe"], arch["deepseek_v4"]
    E, k, inter = moe["num_experts"], moe["top_k"], moe["moe_intermediate_size"]
    hc, ql, og, ol = d4["hc_mult"], d4["q_lora_rank"], d4["o_groups"], d4["o_lora_rank"]
    ih, ihd = d4["index_n_heads"], d4["index_head_dim"]
    mix = (2 + hc) * hc
    out = {"model.embed_tokens.weight": (V, D), "lm_head.weight": (V, D),
           "model.norm.weight": (D,), "model.hc_head_fn": (hc, hc * D),
           "model.hc_head_base": (hc,), "model.hc_head_scale": (1,)}
    for i, r in enumerate(d4["compress_ratios"]):
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        out.update({
            f"{p}.input_layernorm.weight": (D,), f"{p}.post_attention_layernorm.weight": (D,),
            f"{a}.wq_a.weight": (ql, D), f"{a}.q_norm.weight": (ql,),
            f"{a}.wq_b.weight": (H * hd, ql), f"{a}.wkv.weight": (hd, D),
            f"{a}.kv_norm.weight": (hd,), f"{a}.wo_a.weight": (og * ol, H * hd // og),
            f"{a}.wo_b.weight": (D, og * ol), f"{a}.attn_sink": (H,),
            f"{p}.mlp.gate.weight": (E, D), f"{p}.mlp.expert_bias": (E,),
            f"{p}.mlp.tid2eid": (V, k),
            f"{p}.mlp.shared_expert.gate_proj.weight": (inter, D),
            f"{p}.mlp.shared_expert.up_proj.weight": (inter, D),
            f"{p}.mlp.shared_expert.down_proj.weight": (D, inter)})
        for which in ("attn", "ffn"):
            out.update({f"{p}.hc_{which}_fn": (mix, hc * D), f"{p}.hc_{which}_base": (mix,),
                        f"{p}.hc_{which}_scale": (3,)})
        for e in range(E):
            out.update({f"{p}.mlp.experts.{e}.gate_proj.weight": (inter, D),
                        f"{p}.mlp.experts.{e}.up_proj.weight": (inter, D),
                        f"{p}.mlp.experts.{e}.down_proj.weight": (D, inter)})
        if r:
            w = (2 if r == 4 else 1) * hd
            out.update({f"{a}.compressor.wkv.weight": (w, D), f"{a}.compressor.wgate.weight": (w, D),
                        f"{a}.compressor.norm.weight": (hd,), f"{a}.compressor.ape": (r, w)})
        if r == 4:
            x = f"{a}.indexer"
            out.update({f"{x}.wq_b.weight": (ih * ihd, ql), f"{x}.weights_proj.weight": (ih, D),
                        f"{x}.compressor.wkv.weight": (2 * ihd, D),
                        f"{x}.compressor.wgate.weight": (2 * ihd, D),
                        f"{x}.compressor.norm.weight": (ihd,),
                        f"{x}.compressor.ape": (4, 2 * ihd)})
    return out


#: ``--experts-quant exact``: FP4 experts stored bit-exactly as 5-bit vbit
EXACT = "exact"
_EXPERT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight")


def experts_dtypes(spec: str | None) -> tuple[str, str] | None:
    """``--experts-quant``: one dtype for every routed expert matrix (``q4tp``), or
    ``GATE_UP,DOWN`` (``q2tp,q4tp``: 2-bit gate/up, 4-bit down). None: follow ``quant``."""
    if spec is None:
        return None
    from ..cmf.writer import QUANT_LABEL
    parts = [p.strip() for p in str(spec).split(",")]
    if len(parts) not in (1, 2) or any(p not in QUANT_LABEL and p != EXACT for p in parts):
        raise ConfigError(f"--experts-quant {spec!r}: want DTYPE or GATE_UP,DOWN with each "
                          f"{EXACT!r} or one of {', '.join(QUANT_LABEL)}")
    return parts[0], parts[-1]


def tensor_dtypes(items, quant: str, experts_quant: str | None = None) -> dict[str, str]:
    """The dtype of every tensor that does not follow ``quant`` alone: f32 for the small
    control tensors, ``experts_quant`` (cols % 32 fallbacks as in docs/cmf-format.md §8) for the
    routed experts."""
    from ..cmf.writer import choose_dtype
    ex = experts_dtypes(experts_quant)
    out = {}
    for name, _, shape in items:
        if _KEEP_F32.match(name):
            out[name] = "f32"
            continue
        m = _EXPERT.fullmatch(name) if ex else None
        if m:
            assert ex is not None                         # m is only matched when ex is set
            want = ex[1] if m.group(1) == "down" else ex[0]
            if want != EXACT:
                out[name] = choose_dtype(name, shape, want)
    return out


def _exact_experts(items, sources, experts_quant):
    """``items`` with the loaders of the experts ``exact`` applies to replaced by their
    bit-exact vbit payloads; an expert that is not FP4 is refused."""
    ex = experts_dtypes(experts_quant)
    if not ex or EXACT not in ex:
        return items
    out = []
    for name, load, shape in items:
        m = _EXPERT.fullmatch(name)
        if m and (ex[1] if m.group(1) == "down" else ex[0]) == EXACT:
            sw = sources.get(name)
            if sw is None or sw.kind != "fp4":
                raise ConfigError(f"{name}: --experts-quant exact maps FP4 (E2M1) experts "
                                  f"only; this one is stored as plain values")
            if shape[1] % 32:
                raise ConfigError(f"{name}: --experts-quant exact needs cols a multiple of "
                                  f"32 (vbit), got shape {list(shape)}")
            load = sw.as_vbit5
        out.append((name, load, shape))
    return out


def convert(hf_dir, out_path, quant: str = "q8_row", progress: bool = True,
            experts_quant: str | None = None) -> None:
    """Convert a DeepSeek-V4 directory (transformers' ``save_pretrained`` or DeepSeek's
    release layout with FP8/FP4 weights) into one CMF v2 file, one tensor at a time.

    ``experts_quant`` stores the routed experts in another dtype than ``quant`` (e.g.
    attention ``q8_row``, experts ``q4tp`` or ``q2tp,q4tp``)."""
    import sys
    from .. import cmf
    hf_dir = Path(hf_dir)
    log = (lambda msg: print(msg, file=sys.stderr)) if progress else None
    hf, arch, items, shards, sources = plan(hf_dir, log=log)
    dtypes = tensor_dtypes(items, quant, experts_quant)
    items = _exact_experts(items, sources, experts_quant)
    if sources and log is not None:
        kinds = [sw.kind for sw in sources.values()]
        log(f"release layout: {kinds.count('fp8')} FP8 (E4M3 x E8M0 blocks) and "
            f"{kinds.count('fp4')} FP4 (E2M1 x E8M0 / 32) weights, dequantized block by block")

    # (name, loader) pairs: the writer calls each loader in turn, so one tensor at a time
    # is in memory, and the list's length gives the progress bar its total
    stream = [(name, load) for name, load, _ in items]
    provenance = {"converter": CONVERTER, "source": hf_dir.name, "hf_config": hf,
                  "layout": "release" if sources else "transformers"}
    if sources:
        kinds = [sw.kind for sw in sources.values()]
        provenance["source_dtypes"] = {"fp8_e4m3_block": kinds.count("fp8"),
                                       "fp4_e2m1_group32": kinds.count("fp4")}
    if experts_quant:
        provenance["experts_quant"] = experts_quant
    try:
        cmf.write(out_path, stream, arch=arch, quant=quant,
                  tokenizer_json=find_tokenizer_json(hf_dir),
                  tokenizer_config=tokenizer_bundle(hf_dir, hf), provenance=provenance,
                  dtypes=dtypes, progress=progress)
    finally:
        for s in set(shards.values()):
            s.close()
