"""GGUF (llama.cpp) file -> CMF v2 file, for the Llama family (``cortiq import-gguf``).

Reads the file with cortiq's own GGUF reader (`cortiq.gguf`: the same metadata -> arch
record, ggml -> HF names and tokenizer.json as running the GGUF directly) and writes
what ``cortiq.models.llama`` runs. llama.cpp stores Llama's q/k rows (weights and
biases) permuted for its interleaved rope; the CMF file gets them back in HF's
half-split order by moving whole rows (of blocks, for a quantized matrix: exact), so
it runs the usual way, with no ``rope_interleaved`` flag.

Tensor types (``quant=None``, the default, keeps every tensor's bytes where CMF has
the layout):

===========  =======================================================================
GGUF         CMF
===========  =======================================================================
F32          f32 (the bytes as they are)
F16, BF16    f16, bf16 (the bytes as they are)
Q4_0 ...     the ggml block formats of `cortiq.cmf.ggml_blocks` (Q4_0, Q4_1, Q5_0,
             Q5_1, Q8_0, Q2_K ... Q6_K, IQ4_NL, IQ4_XS) as the CMF dtype of the same
             name (q4_0 ... q6_k, iq4_nl, iq4_xs): the GGUF bytes copied as they are,
             so the CMF file is the GGUF's size. Where this build's CMF writer does
             not know those dtypes yet, Q4_0 is re-packed into q4_tiled (the same
             scale and codes: exact), Q8_0 re-quantized to q8_row (each weight moves by
             at most half a q8_row step) and the rest dequantized and re-quantized to
             q8_row with a warning naming the types
other        (IQ1_*, IQ2_*, IQ3_*, TQ*, ...) dequantized and re-quantized to q8_row,
             with a warning naming the types
===========  =======================================================================

Any other ``quant`` re-quantizes every matrix from its dequantized values (``f32``:
every value exact).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..gguf.llama_meta import permuted_heads, unpermute_rows

CONVERTER = "cortiq.convert.gguf_import"
#: the plain float types, copied as they are
_FLOATS = ("f32", "f16", "bf16")


def q4_0_to_q4_tiled(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 blocks [n, 18] (f16 d, 16 bytes: element j low nibble of byte j, element j+16
    high nibble) -> q4_tiled tiles [n, 18] (f16 scale, byte k: elements 2k low, 2k+1 high).
    Same scale and codes: decoding gives the same floats."""
    b = np.asarray(blocks, np.uint8).reshape(-1, 18)
    qs = b[:, 2:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1)        # element order 0..31
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return np.concatenate([b[:, :2], packed], axis=1)


def _rows_in_hf_order(raw: np.ndarray, shape: tuple, heads: int | None) -> np.ndarray:
    """A payload as [rows, row bytes], q/k rows moved back to HF's order when `heads`."""
    rows = raw.reshape(shape[0], -1)
    return unpermute_rows(rows, heads) if heads else rows


def import_gguf(path, out_path, quant: str | None = None, progress: bool = True) -> None:
    """Convert a Llama/Mistral/Qwen2/Qwen3 GGUF file into one CMF v2 file (any part of a
    split GGUF: the whole set into one file)."""
    from .. import cmf
    from ..cmf import quant as Q
    from ..cmf.writer import QUANT_LABEL
    from ..gguf.file import GgufFile
    if quant is not None and quant not in QUANT_LABEL:
        raise ConfigError(f"quant {quant!r} is not one of {', '.join(QUANT_LABEL)}")
    path = Path(path)
    with GgufFile(path) as gf:
        arch = {k: v for k, v in gf.arch.items() if k != "rope_interleaved"}
        g = gf.gguf_architecture
        from .hf_llama import plan_tensors
        order = plan_tensors(arch, {h: t.shape for h, t in gf.tensors.items()})
        tok_json, bundle = gf.tokenizer_json(), gf.tokenizer_config
        lossy: dict[str, list[str]] = {}
        provenance = {"converter": CONVERTER, "source": Path(gf.path).name,
                      "gguf_architecture": g,
                      "quant": quant or "nearest"}
        w = cmf.Writer(out_path, arch=arch, quant=quant or "q8_row", tokenizer_json=tok_json,
                       tokenizer_config=bundle, provenance=provenance, progress=progress,
                       total=len(order))
        with w:
            for h in order:
                t = gf.tensors[h]
                heads = permuted_heads(g, arch, h)
                shape = tuple(t.shape)
                if quant is None and (t.dtype in _FLOATS or t.dtype in Q.DTYPES):
                    # the GGUF bytes as they are (rows moved whole)
                    w.add_encoded(h, _rows_in_hf_order(gf.raw(h), shape, heads).ravel(),
                                  t.dtype, shape)
                    continue
                if quant is None and t.dtype == "q4_0":
                    blocks = _rows_in_hf_order(gf.raw(h), shape, heads)
                    w.add_encoded(h, q4_0_to_q4_tiled(blocks), "q4_tiled", shape)
                    continue
                a = np.ascontiguousarray(gf.tensor(h), np.float32).reshape(shape)
                if heads:
                    a = unpermute_rows(a, heads)
                if quant is not None:
                    dtype = None                              # the file quant's §8 rule
                elif len(shape) == 1:
                    dtype = "f32"
                else:
                    dtype = "q8_row"
                    if t.dtype != "q8_0":
                        lossy.setdefault(t.ggml_type.name, []).append(h)
                w.add(h, a, dtype)
    if lossy:
        warnings.warn("GGUF tensor types with no exact CMF layout were dequantized and "
                      "re-quantized to q8_row: " + ", ".join(
                          f"{k} ({len(v)} tensors)" for k, v in sorted(lossy.items())),
                      RuntimeWarning, stacklevel=2)
