"""DeepSeek-V4 checkpoints in the layout DeepSeek publishes, built from tiny models.

``release_tensors(cmf_tensors, fp8=..., fp4=...)`` takes float32 tensors under CMF names
(what cortiq's converter produces from transformers' layout) and returns

* ``stored``: ``{release name: (safetensors dtype, shape, bytes)}`` -- reference names
  without ``model.`` (``embed.weight``, ``layers.N.attn.wq_a.weight``,
  ``layers.N.ffn.experts.E.w1.weight``, ``hc_head_fn``, ...); attention, compressor,
  indexer and shared-expert projections in FP8 (``F8_E4M3`` + ``F8_E8M0`` scale per
  128x128 block), routed experts in FP4 (``I8 [rows, cols/2]`` + ``F8_E8M0`` scale per 32
  of a row), embeddings / head / router / norms in BF16, hyper-connections, ``ape`` and
  sinks in F32, ``tid2eid`` in I32 -- plus an MTP layer the converter must skip;
* ``values``: the float32 values the release stores, under CMF names (what transformers
  must run as the reference).

``save_raw(path, stored)`` writes one safetensors file by hand (numpy cannot spell FP8),
``reference_config(hf_config)`` the reference keys of a transformers config.

The micro-floats are encoded and decoded by ``ml_dtypes`` (``float8_e4m3fn``,
``float8_e8m0fnu``, ``float4_e2m1fn``: round to nearest even), not by the
``cortiq.convert.microfloat`` the converter reads them with; the power-of-two scales are
the smallest with ``absmax / scale <= 448`` (FP8) or ``<= 6`` (FP4), 1 for an all-zero
block. No torch needed here.
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

import optional

_FP8 = re.compile(r".*(self_attn\.(wq_a|wq_b|wkv|wo_a|wo_b|compressor\.(wkv|wgate)|"
                  r"indexer\.wq_b|indexer\.compressor\.(wkv|wgate))\.weight|"
                  r"mlp\.shared_expert\.(gate|up|down)_proj\.weight)$")
_FP4 = re.compile(r".*mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
_F32 = re.compile(r".*(hc_(attn|ffn)_(fn|base|scale)|hc_head_(fn|base|scale)|\.ape|attn_sink"
                  r"|expert_bias)$")
_ROLE = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def release_name(cmf: str) -> str:
    """CMF tensor name -> the name DeepSeek's reference implementation uses."""
    glob = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
            "model.norm.weight": "norm.weight"}
    if cmf in glob:
        return glob[cmf]
    if cmf.startswith("model.hc_head_"):
        return cmf[len("model."):]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", cmf)
    i, rest = m.group(1), m.group(2)
    rest = rest.replace("self_attn.", "attn.", 1)
    rest = {"input_layernorm.weight": "attn_norm.weight",
            "post_attention_layernorm.weight": "ffn_norm.weight",
            "mlp.gate.weight": "ffn.gate.weight", "mlp.expert_bias": "ffn.gate.bias",
            "mlp.tid2eid": "ffn.gate.tid2eid"}.get(rest, rest)
    e = re.fullmatch(r"mlp\.experts\.(\d+)\.(\w+)\.weight", rest)
    if e:
        rest = f"ffn.experts.{e.group(1)}.{_ROLE[e.group(2)]}.weight"
    s = re.fullmatch(r"mlp\.shared_expert\.(\w+)\.weight", rest)
    if s:
        rest = f"ffn.shared_experts.{_ROLE[s.group(1)]}.weight"
    return f"layers.{i}.{rest}"


FP8_BLOCK = 128
FP4_GROUP = 32


def _md():
    return optional.need("extras", "ml_dtypes")


def _bf16(x: np.ndarray) -> tuple[np.ndarray, bytes]:
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype("<u2")
    return (b.astype(np.uint32) << 16).view(np.float32), b.tobytes()


def e8m0(codes) -> np.ndarray:
    """E8M0 scale codes -> float32 multipliers (ml_dtypes)."""
    return np.ascontiguousarray(codes, np.uint8).view(_md().float8_e8m0fnu).astype(np.float32)


def _pow2_codes(amax: np.ndarray, top: float) -> np.ndarray:
    """E8M0 codes of the smallest powers of two s with amax / s <= top (1 where amax is 0)."""
    m, k = np.frexp(amax.astype(np.float64) / top)       # amax / top = m * 2^k, m in [0.5, 1)
    e = np.where(amax > 0, np.where(m == 0.5, k - 1, k), 0)
    s = np.ldexp(np.float32(1), np.clip(e, -127, 127).astype(np.int32)).astype(np.float32)
    return s.astype(_md().float8_e8m0fnu).view(np.uint8)


def fp8_blocks(w, block: int = FP8_BLOCK):
    """float [rows, cols] -> (E4M3 codes uint8 [rows, cols], E8M0 codes per block x block
    tile (ragged at the edges), the float32 values they stand for)."""
    md = _md()
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    br, bc = -(-rows // block), -(-cols // block)
    pad = np.zeros((br * block, bc * block), np.float32)
    pad[:rows, :cols] = np.abs(w)
    sc = _pow2_codes(pad.reshape(br, block, bc, block).max(axis=(1, 3)), 448.0)
    per = np.repeat(np.repeat(e8m0(sc), block, 0), block, 1)[:rows, :cols]
    codes = (w / per).astype(md.float8_e4m3fn)
    return codes.view(np.uint8), sc, codes.astype(np.float32) * per


def fp4_groups(w, group: int = FP4_GROUP):
    """float [rows, cols] (cols even) -> (E2M1 codes two a byte, element 2i in the low
    nibble, uint8 [rows, cols/2]; E8M0 codes per `group` of a row; the float32 values)."""
    md = _md()
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    g = -(-cols // group)
    pad = np.zeros((rows, g * group), np.float32)
    pad[:, :cols] = np.abs(w)
    sc = _pow2_codes(pad.reshape(rows, g, group).max(axis=2), 6.0)
    per = np.repeat(e8m0(sc), group, axis=1)[:, :cols]
    q = (w / per).astype(md.float4_e2m1fn)
    c = q.view(np.uint8) & 0xF
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8), sc, q.astype(np.float32) * per


def release_tensors(t: dict, fp8_block: int = FP8_BLOCK, mtp: bool = True):
    """(stored, values): see the module docstring."""
    stored, values = {}, {}
    for c, a in t.items():
        a = np.asarray(a, np.float32)
        r = release_name(c)
        base = r[: -len(".weight")]
        if _FP8.match(c):
            codes, sc, values[c] = fp8_blocks(a, fp8_block)
            stored[r] = ("F8_E4M3", a.shape, codes.tobytes())
            stored[base + ".scale"] = ("F8_E8M0", sc.shape, sc.tobytes())
        elif _FP4.match(c):
            packed, sc, values[c] = fp4_groups(a)
            stored[r] = ("I8", packed.shape, packed.tobytes())
            stored[base + ".scale"] = ("F8_E8M0", sc.shape, sc.tobytes())
        elif c.endswith("tid2eid"):
            stored[r] = ("I32", a.shape, a.astype("<i4").tobytes())
            values[c] = a
        elif _F32.match(c):
            stored[r] = ("F32", a.shape, a.astype("<f4").tobytes())
            values[c] = a
        else:
            v, raw = _bf16(a)
            stored[r] = ("BF16", a.shape, raw)
            values[c] = v.reshape(a.shape)
    if mtp:  # one MTP stage with an FP8 projection: skipped by the converter
        codes, sc, _ = fp8_blocks(np.ones((8, 16), np.float32))
        stored["mtp.0.e_proj.weight"] = ("F8_E4M3", codes.shape, codes.tobytes())
        stored["mtp.0.e_proj.scale"] = ("F8_E8M0", sc.shape, sc.tobytes())
        stored["mtp.0.norm.weight"] = ("BF16", (16,), _bf16(np.ones(16))[1])
    return stored, values


def save_raw(path, stored: dict, shards: int = 1) -> None:
    """Write ``{name: (dtype, shape, bytes)}`` as safetensors (an index when shards > 1)."""
    path = Path(path)
    names = sorted(stored)
    files = [path] if shards == 1 else [
        path.with_name(f"model-{i + 1:05d}-of-{shards:05d}.safetensors") for i in range(shards)]
    weight_map = {}
    for k, f in enumerate(files):
        part = names[k::shards]
        header, at, blobs = {"__metadata__": {"format": "pt"}}, 0, []
        for n in part:
            dt, shape, raw = stored[n]
            header[n] = {"dtype": dt, "shape": [int(d) for d in shape],
                         "data_offsets": [at, at + len(raw)]}
            blobs.append(raw)
            at += len(raw)
            weight_map[n] = f.name
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(f, "wb") as fh:
            fh.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    if shards > 1:
        (path.parent / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}))


def reference_config(hf: dict, keep_transformers_keys: bool = False) -> dict:
    """The reference ``config.json`` keys (``compress_ratios``, ``num_hash_layers``,
    ``qk_rope_head_dim``, ``quantization_config``...) for a transformers config dict;
    with ``keep_transformers_keys`` beside them, else instead of ``layer_types``,
    ``compress_rates`` and ``mlp_layer_types``."""
    rates = hf.get("compress_rates") or {}
    ratios = [0 if t == "sliding_attention" else int(rates[t]) for t in hf["layer_types"]]
    out = dict(hf) if keep_transformers_keys else {
        k: v for k, v in hf.items()
        if k not in ("layer_types", "compress_rates", "mlp_layer_types", "partial_rotary_factor")}
    out["compress_ratios"] = ratios + [0]          # the reference lists the MTP layer too
    out["num_hash_layers"] = list(hf["mlp_layer_types"]).count("hash_moe")
    out["qk_rope_head_dim"] = round(hf["head_dim"] * hf["partial_rotary_factor"])
    out["num_nextn_predict_layers"] = 1
    out["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                  "activation_scheme": "dynamic",
                                  "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    out["expert_dtype"] = "fp4"
    return out
