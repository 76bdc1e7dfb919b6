"""Small helpers to build CMF fixtures in tests and benchmarks (no files outside tmp)."""
from __future__ import annotations

import numpy as np

from ..kernels.tensor import QTensor
from .ggml_blocks import FORMATS as GGML_FORMATS
from .quant import quantize


def tiny_arch(**over) -> dict:
    """A minimal valid `arch` block (§4.1); keyword arguments override/add keys."""
    a = dict(arch_name="dory", hidden_size=64, intermediate_size=96, num_layers=2,
             num_attention_heads=4, num_kv_heads=2, head_dim=16, vocab_size=128,
             max_position_embeddings=512, layer_types=["FullAttention", "SlidingAttention"],
             rms_norm_eps=1e-6)
    a.update(over)
    return a


def tiny_tensors(seed: int = 0, arch: dict | None = None) -> dict:
    """A dict name -> float32 array shaped like a small dense decoder."""
    a = arch or tiny_arch()
    rng = np.random.default_rng(seed)
    h, f, v = a["hidden_size"], a["intermediate_size"], a["vocab_size"]
    kv = a["num_kv_heads"] * a["head_dim"]
    t = {"model.embed_tokens.weight": rng.standard_normal((v, h)),
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(h)}
    for i in range(a["num_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(h)
        t[p + "self_attn.q_proj.weight"] = rng.standard_normal((h, h)) * 0.1
        t[p + "self_attn.k_proj.weight"] = rng.standard_normal((kv, h)) * 0.1
        t[p + "self_attn.v_proj.weight"] = rng.standard_normal((kv, h)) * 0.1
        t[p + "self_attn.o_proj.weight"] = rng.standard_normal((h, h)) * 0.1
        t[p + "mlp.gate_proj.weight"] = rng.standard_normal((f, h)) * 0.1
        t[p + "mlp.up_proj.weight"] = rng.standard_normal((f, h)) * 0.1
        t[p + "mlp.down_proj.weight"] = rng.standard_normal((h, f)) * 0.1
    t["lm_head.weight"] = rng.standard_normal((v, h)) * 0.1
    return {k: np.asarray(x, np.float32) for k, x in t.items()}


def qtensor_from_f32(array, dtype: str = "f32", precision="exact") -> QTensor:
    """A QTensor holding a 2-D float array quantized to `dtype` by cmf.quant.quantize.

    It lives in the file-format package, not in QTensor, because quantizing is the
    format's job: the tensor layer only wraps payloads, and never imports cmf."""
    a = np.ascontiguousarray(array, dtype=np.float32)
    if a.ndim != 2:
        raise ValueError(f"qtensor_from_f32: array must be 2-D, got shape {a.shape}")
    return QTensor(quantize(a, dtype), dtype, a.shape, precision=precision)


#: byte offsets of each ggml block format's f16 fields in a block (§7.9: the scale d,
#: then the min or dmin where the format has one)
GGML_F16_AT = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,),
               "q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2),
               "q6_k": (208,), "iq4_nl": (0,), "iq4_xs": (0,)}


def ggml_random_payload(rng, dtype: str, rows: int, cols: int, scale: float = 0.01) -> np.ndarray:
    """A [rows, cols] payload of ggml format `dtype` (cols a multiple of its block):
    random code bytes, f16 scales (and mins) drawn from a normal of that size."""
    f = GGML_FORMATS[dtype]
    nblk = rows * cols // f.block_elems
    raw = rng.integers(0, 256, nblk * f.block_bytes, dtype=np.uint8).reshape(nblk, f.block_bytes)
    for i, at in enumerate(GGML_F16_AT[dtype]):
        v = (rng.standard_normal(nblk) * (scale if i == 0 else 4 * scale)).astype("<f2")
        raw[:, at:at + 2] = v.view(np.uint8).reshape(nblk, 2)
    return raw.reshape(-1)
