"""Hugging Face Llama / Mistral / Qwen2 / Qwen3 checkpoint -> CMF v2 file.

The header is the generic CMF ``arch`` record (docs/cmf-format.md §4.1) with the keys the
reference engine writes for these families: ``arch_name`` = the HF ``model_type``
(``llama``, ``mistral``, ``qwen2``, ``qwen3``), ``layer_types`` (``FullAttention``, or
``SlidingAttention`` on the layers HF slides), ``sliding_window``, ``rope_theta``,
``yarn`` {factor, original_max_position_embeddings, beta_fast, beta_slow,
attention_factor}, ``rope_freq_factors`` (per-frequency divisors of the default
inverse frequencies: how Llama-3's and linear rope scaling are carried),
``tie_word_embeddings``. Biases and q/k norms are not flagged: the tensors exist or not.

Tensor names are HF's (``model.layers.{i}.self_attn.q_proj.weight``, ...); rotary
buffers are dropped, and so is ``lm_head.weight`` of a tied model (the head is the
embedding). 1-D tensors (norms, biases) are f16 when that is exact, else f32
(``hf_dory.vector_dtype``). A config cortiq cannot run is refused with a ConfigError
naming the ``config.json`` key.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ._safetensors import open_checkpoint
from .hf_dory import _loader, find_tokenizer_json, read_hf_config, tokenizer_bundle, vector_dtype

CONVERTER = "cortiq.convert.hf_llama"
#: HF architectures class -> CMF arch_name
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                 "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
MODEL_TYPES = tuple(ARCHITECTURES.values())


def _bad(key, msg):
    return ConfigError(f"config.json: {key}: {msg}")


def arch_name_of(hf: Mapping) -> str | None:
    """The CMF arch_name of an HF config of this family, else None."""
    for a in hf.get("architectures") or []:
        if a in ARCHITECTURES:
            return ARCHITECTURES[a]
    mt = hf.get("model_type")
    return mt if mt in MODEL_TYPES else None


# ---- rope ---------------------------------------------------------------------------
def llama3_freq_factors(hd: int, theta: float, rs: Mapping) -> list[float]:
    """Llama-3 rope scaling as per-frequency divisors of the default inverse frequencies
    (HF ``_compute_llama3_parameters``; evaluated in float64)."""
    try:
        factor = float(rs["factor"])
        low = float(rs.get("low_freq_factor", 1.0))
        high = float(rs.get("high_freq_factor", 4.0))
        old = float(rs["original_max_position_embeddings"])
    except (KeyError, TypeError, ValueError) as e:
        raise _bad("rope_scaling", f"llama3 needs factor and original_max_position_embeddings "
                                   f"({e})") from None
    if high == low:
        raise _bad("rope_scaling.high_freq_factor", "must differ from low_freq_factor")
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = old / low, old / high
    out = []
    for w in wavelen:
        if w < high_wl:
            out.append(1.0)
        elif w > low_wl:
            out.append(factor)
        else:
            smooth = (old / w - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def _rope(hf: Mapping, hd: int, theta: float) -> dict:
    """The arch keys of the config's rope profile (rope_parameters or rope_scaling)."""
    rp = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    key = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    if not isinstance(rp, Mapping):
        raise _bad(key, f"{rp!r} is not an object")
    kind = rp.get("rope_type", rp.get("type", "default")) or "default"
    if rp.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) not in (1, 1.0):
        raise _bad("partial_rotary_factor", "cortiq rotates whole heads in this family (1.0)")
    if kind == "default":
        return {}
    if kind == "linear":
        f = float(rp.get("factor") or 1.0)
        return {"rope_freq_factors": [f] * (hd // 2)}
    if kind == "llama3":
        return {"rope_freq_factors": llama3_freq_factors(hd, theta, rp)}
    if kind == "yarn":
        if rp.get("factor") is None:
            raise _bad(f"{key}.factor", "missing (required for yarn)")
        factor = float(rp["factor"])
        orig: Any = rp.get("original_max_position_embeddings") or hf.get("max_position_embeddings")
        if rp.get("truncate", True) is not True:
            raise _bad(f"{key}.truncate", "cortiq's YaRN truncates the correction range")
        af = rp.get("attention_factor")
        if af is None:
            def ms(s, m=1.0):
                return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
            m, mad = rp.get("mscale"), rp.get("mscale_all_dim")
            af = ms(factor, m) / ms(factor, mad) if m and mad else ms(factor)
        return {"yarn": {"factor": factor, "original_max_position_embeddings": int(orig),
                         "beta_fast": float(rp.get("beta_fast") or 32.0),
                         "beta_slow": float(rp.get("beta_slow") or 1.0),
                         "attention_factor": float(af)}}
    raise _bad(f"{key}.rope_type", f"{kind!r}: cortiq supports default, linear, llama3 and "
                                   "yarn rope for this family")


# ---- config -------------------------------------------------------------------------
def layer_types(hf: Mapping, name: str, n: int) -> tuple[list[str], int | None]:
    """(CMF layer_types, sliding_window or None) as HF's config classes derive them."""
    window: Any = hf.get("sliding_window")
    lt = hf.get("layer_types")
    if name in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
        window = None
    if lt is None:
        if name == "mistral":
            slide = [window is not None] * n
        elif name in ("qwen2", "qwen3"):
            mwl = int(hf.get("max_window_layers", n) or 0)
            slide = [window is not None and i >= mwl for i in range(n)]
        else:
            slide = [False] * n
    else:
        lt = list(lt)
        if len(lt) != n or any(t not in ("full_attention", "sliding_attention") for t in lt):
            raise _bad("layer_types", f"{lt!r}: want {n} of full_attention / sliding_attention")
        slide = [t == "sliding_attention" and window is not None for t in lt]
    if any(slide) and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise _bad("sliding_window", f"{window!r} is not a positive integer")
    return (["SlidingAttention" if s else "FullAttention" for s in slide],
            int(window) if any(slide) else None)


def arch_from_hf_config(hf: Mapping) -> dict:
    """HF ``config.json`` dict -> CMF header ``arch`` dict."""
    if not isinstance(hf, Mapping):
        raise ConfigError("config.json: not a JSON object")
    name = arch_name_of(hf)
    if name is None:
        raise _bad("architectures", f"{hf.get('architectures')!r} (model_type "
                                    f"{hf.get('model_type')!r}) is not one of "
                                    f"{', '.join(ARCHITECTURES)}")

    def need(k):
        v = hf.get(k)
        if v is None:
            raise _bad(k, "missing (required)")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise _bad(k, f"{v!r} is not a positive integer")
        return v

    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise _bad("hidden_act", f"{act!r}; cortiq runs this family with SwiGLU (silu)")
    if hf.get("pretraining_tp", 1) not in (None, 1):
        raise _bad("pretraining_tp", "must be 1 (split-weight checkpoints are not supported)")
    n, hidden, nh = need("num_hidden_layers"), need("hidden_size"), need("num_attention_heads")
    nk = hf.get("num_key_value_heads") or nh
    hd = hf.get("head_dim") or hidden // nh
    if nh % nk:
        raise _bad("num_key_value_heads", f"{nk} does not divide num_attention_heads = {nh}")
    if hd % 2:
        raise _bad("head_dim", f"{hd} must be even for RoPE")
    rp: Any = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), Mapping) else {}
    theta = float(rp.get("rope_theta", hf.get("rope_theta", 10000.0)))
    types, window = layer_types(hf, name, n)
    arch = {
        "arch_name": name, "hidden_size": hidden, "intermediate_size": need("intermediate_size"),
        "num_layers": n, "num_attention_heads": nh, "num_kv_heads": int(nk), "head_dim": int(hd),
        "vocab_size": need("vocab_size"),
        "max_position_embeddings": int(hf.get("max_position_embeddings") or 4096),
        "layer_types": types, "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "rope_theta": theta,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
    }
    if window is not None:
        arch["sliding_window"] = window
    arch.update(_rope(hf, int(hd), theta))
    return arch


# ---- tensors ------------------------------------------------------------------------
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_LAYER_KEYS = {
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias",
    "self_attn.v_proj.bias", "self_attn.o_proj.bias", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"}
_REQUIRED = ("input_layernorm.weight", "post_attention_layernorm.weight",
             "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
             "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
             "mlp.down_proj.weight")


def expected_shapes(arch: Mapping) -> dict[str, tuple]:
    """Shape of every tensor name this family may hold."""
    H, F, V = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    q, kv, hd = arch["num_attention_heads"] * arch["head_dim"], \
        arch["num_kv_heads"] * arch["head_dim"], arch["head_dim"]
    per = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
           "self_attn.q_proj.weight": (q, H), "self_attn.k_proj.weight": (kv, H),
           "self_attn.v_proj.weight": (kv, H), "self_attn.o_proj.weight": (H, q),
           "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
           "self_attn.v_proj.bias": (kv,), "self_attn.o_proj.bias": (H,),
           "self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,),
           "mlp.gate_proj.weight": (F, H), "mlp.up_proj.weight": (F, H),
           "mlp.down_proj.weight": (H, F), "mlp.gate_proj.bias": (F,),
           "mlp.up_proj.bias": (F,), "mlp.down_proj.bias": (H,)}
    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,),
           "lm_head.weight": (V, H)}
    for i in range(arch["num_layers"]):
        out.update({f"model.layers.{i}.{k}": s for k, s in per.items()})
    return out


def plan_tensors(arch: Mapping, shapes: Mapping[str, tuple]) -> list[str]:
    """The HF tensor names to write, in order, after checking names and shapes."""
    want = expected_shapes(arch)
    names = []
    for name, shape in shapes.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name == "lm_head.weight" and arch["tie_word_embeddings"]:
            continue
        if name not in want:
            m = _LAYER.fullmatch(name)
            if m and int(m.group(1)) >= arch["num_layers"]:
                raise ConfigError(f"{name}: layer {m.group(1)} beyond num_hidden_layers = "
                                  f"{arch['num_layers']}")
            raise ConfigError(f"{name}: not a {arch['arch_name']} tensor cortiq knows")
        if tuple(shape) != want[name]:
            raise ConfigError(f"{name}: shape {list(shape)}, the config needs {list(want[name])}")
        names.append(name)
    need = ["model.embed_tokens.weight", "model.norm.weight"]
    if not arch["tie_word_embeddings"]:
        need.append("lm_head.weight")
    need += [f"model.layers.{i}.{k}" for i in range(arch["num_layers"]) for k in _REQUIRED]
    have = set(names)
    missing = [k for k in need if k not in have]
    if missing:
        raise ConfigError(f"{missing[0]}: missing from the checkpoint"
                          + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
    # the same operators on every layer (a bias or norm on some layers only is a bad file)
    for k in _LAYER_KEYS - set(_REQUIRED):
        on = [i for i in range(arch["num_layers"]) if f"model.layers.{i}.{k}" in have]
        if on and len(on) != arch["num_layers"]:
            raise ConfigError(f"model.layers.*.{k}: present on layers {on} only")
    order = {n: j for j, n in enumerate(want)}
    return sorted(names, key=lambda n: order[n])


def convert(hf_dir, out_path, quant: str = "q8_row", progress: bool = True,
            expect: str | None = None) -> None:
    """Convert a Hugging Face Llama-family directory into one CMF v2 file (`expect`: the
    arch_name the caller asked for; another family in config.json is refused)."""
    from .. import cmf
    hf_dir = Path(hf_dir)
    hf = read_hf_config(hf_dir)
    arch = arch_from_hf_config(hf)
    if expect is not None and arch["arch_name"] != expect:
        raise _bad("architectures", f"{hf.get('architectures')!r} is a "
                                    f"{arch['arch_name']} model, not {expect}")
    shards = open_checkpoint(hf_dir)
    try:
        names = plan_tensors(arch, {k: s.shape(k) for k, s in shards.items()})
        dtypes = {}
        if quant != "f32":
            for n in names:
                if len(shards[n].shape(n)) == 1 and vector_dtype(shards[n].load(n)) == "f32":
                    dtypes[n] = "f32"

        def stream() -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
            for n in names:
                yield n, _loader(shards[n], n)

        provenance = {"converter": CONVERTER, "source": hf_dir.name, "hf_config": hf}
        cmf.write(out_path, stream(), arch=arch, quant=quant,
                  tokenizer_json=find_tokenizer_json(hf_dir),
                  tokenizer_config=tokenizer_bundle(hf_dir, hf), provenance=provenance,
                  dtypes=dtypes or None, progress=progress)
    finally:
        for s in set(shards.values()):
            s.close()
