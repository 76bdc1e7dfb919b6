"""The micro-float formats of DeepSeek's release checkpoints, in NumPy.

* **E4M3** (OCP FP8 ``float8_e4m3fn``): sign, 4 exponent bits (bias 7), 3 mantissa bits;
  no infinities, ``S.1111.111`` is NaN, the largest finite value is 448.
* **E8M0** (``float8_e8m0fnu``): an unsigned exponent byte ``b`` standing for
  ``2^(b-127)``; 255 is NaN. The release stores one per 128x128 block of an FP8 weight
  and one per 32 elements of a row of an FP4 weight.
* **E2M1** (OCP FP4): sign, 2 exponent bits, 1 mantissa bit, the magnitudes
  {0, 0.5, 1, 1.5, 2, 3, 4, 6}; two codes a byte, element ``2i`` in the low nibble.

Decoding is a table lookup (every value is exact in float32). The block/group
dequantizers write into a preallocated float32 array a slab of rows at a time, so a
weight never exists twice in memory. The encoders (round to nearest, ties to the even
code, saturating; power-of-two scales rounded up so nothing saturates) exist so tests and
benchmarks can build release-layout checkpoints.
"""
from __future__ import annotations

import numpy as np

FP8_BLOCK = 128
FP4_GROUP = 32
E4M3_MAX = 448.0
E2M1_MAX = 6.0


def _e4m3_table() -> np.ndarray:
    c = np.arange(256)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e, m = (c >> 3) & 0xF, c & 0x7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * 2.0 ** (e - 7.0))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return (sign * mag).astype(np.float32)


def _e2m1_table() -> np.ndarray:
    c = np.arange(16)
    sign = np.where(c & 0x8, -1.0, 1.0)
    e, m = (c >> 1) & 0x3, c & 0x1
    mag = np.where(e == 0, m * 0.5, (1.0 + m / 2.0) * 2.0 ** (e - 1.0))
    return (sign * mag).astype(np.float32)


def _e8m0_table() -> np.ndarray:
    t = np.full(256, np.nan, np.float32)
    t[:255] = np.ldexp(1.0, np.arange(255) - 127)  # 2^-127 is an f32 subnormal
    return t


E4M3 = _e4m3_table()
E2M1 = _e2m1_table()
E8M0 = _e8m0_table()
#: every E2M1 byte (two codes) as its two float32 values, low nibble first, viewed as
#: one 8-byte word so a byte decodes with a single gather
_E2M1_PAIRS = np.ascontiguousarray(np.stack(
    [E2M1[np.arange(256) & 0xF], E2M1[np.arange(256) >> 4]], axis=1)).view(np.uint64).ravel()


def e4m3_to_f32(codes) -> np.ndarray:
    return E4M3[np.asarray(codes, np.uint8)]


def e8m0_to_f32(codes) -> np.ndarray:
    return E8M0[np.asarray(codes, np.uint8)]


def e2m1_unpack(packed) -> np.ndarray:
    """``uint8 [..., n]`` (two codes a byte) -> ``float32 [..., 2n]``."""
    p = np.asarray(packed, np.uint8)
    return _E2M1_PAIRS[p].view(np.float32).reshape(*p.shape[:-1], 2 * p.shape[-1])


def fp8_block_shape(rows: int, cols: int, block: int = FP8_BLOCK) -> tuple[int, int]:
    """Shape of the scale grid of an FP8 ``[rows, cols]`` weight (ragged edge blocks)."""
    return -(-rows // block), -(-cols // block)


def fp4_scale_shape(rows: int, cols: int, group: int = FP4_GROUP) -> tuple[int, int]:
    return rows, -(-cols // group)


def dequant_fp8_blocks(codes, scale, block: int = FP8_BLOCK, out=None) -> np.ndarray:
    """``E4M3(codes[r, c]) * scale[r // block, c // block]`` as float32 ``[rows, cols]``.

    ``codes`` is uint8 ``[rows, cols]`` (may be a view of a mapped file), ``scale`` the
    float32 multipliers ``fp8_block_shape(rows, cols)``. Works a block row at a time."""
    rows, cols = codes.shape
    if tuple(scale.shape) != fp8_block_shape(rows, cols, block):
        raise ValueError(f"scale shape {tuple(scale.shape)}, want "
                         f"{fp8_block_shape(rows, cols, block)} for [{rows}, {cols}]")
    out = np.empty((rows, cols), np.float32) if out is None else out
    for i, r0 in enumerate(range(0, rows, block)):
        per_col = np.repeat(scale[i].astype(np.float32), block)[:cols]
        np.multiply(E4M3[codes[r0:r0 + block]], per_col, out=out[r0:r0 + block])
    return out


def dequant_fp4_groups(packed, scale, group: int = FP4_GROUP, out=None,
                       slab: int = 256) -> np.ndarray:
    """``E2M1(code[r, c]) * scale[r, c // group]`` as float32 ``[rows, 2 * packed_cols]``."""
    rows, pc = packed.shape
    cols = 2 * pc
    if tuple(scale.shape) != fp4_scale_shape(rows, cols, group):
        raise ValueError(f"scale shape {tuple(scale.shape)}, want "
                         f"{fp4_scale_shape(rows, cols, group)} for [{rows}, {cols}]")
    out = np.empty((rows, cols), np.float32) if out is None else out
    for r0 in range(0, rows, slab):
        s = np.repeat(scale[r0:r0 + slab].astype(np.float32), group, axis=1)[:, :cols]
        np.multiply(e2m1_unpack(packed[r0:r0 + slab]), s, out=out[r0:r0 + slab])
    return out


# ------------------------------------------------------------------ encoders

def _nearest_code(mag: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Index into the ascending non-negative ``table`` nearest to ``mag`` (ties to the
    even index, i.e. the even code), saturating at the top."""
    hi = np.clip(np.searchsorted(table, mag, side="left"), 1, len(table) - 1)
    lo = hi - 1
    dlo, dhi = mag - table[lo], table[hi] - mag
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    return np.where(mag >= table[-1], len(table) - 1, np.where(pick_hi, hi, lo))


def f32_to_e4m3(x) -> np.ndarray:
    """Nearest E4M3 code (ties to even, saturating at +-448, NaN to 0x7F)."""
    x = np.asarray(x, np.float32)
    pos = E4M3[:127]                       # 0 .. 448, ascending
    code = _nearest_code(np.abs(x), pos).astype(np.uint8)
    code = np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)


def f32_to_e2m1(x) -> np.ndarray:
    """Nearest E2M1 code (0..15, ties to even, saturating at +-6)."""
    x = np.asarray(x, np.float32)
    code = _nearest_code(np.abs(x), E2M1[:8]).astype(np.uint8)
    return np.where(np.signbit(x), code | 0x8, code).astype(np.uint8)


def _pow2_scale_codes(amax: np.ndarray, top: float) -> np.ndarray:
    """E8M0 code of the smallest power of two ``s`` with ``amax / s <= top`` (1.0 for
    all-zero blocks)."""
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(np.maximum(amax.astype(np.float64), 1e-38) / top))
    e = np.where(amax > 0, e, 0.0)
    return np.clip(e + 127, 0, 254).astype(np.uint8)


def quant_fp8_blocks(w, block: int = FP8_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """float ``[rows, cols]`` -> (E4M3 codes uint8 [rows, cols], E8M0 scale codes
    uint8 ``fp8_block_shape``), the way DeepSeek's ue8m0 FP8 checkpoints are made."""
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    br, bc = fp8_block_shape(rows, cols, block)
    pad = np.zeros((br * block, bc * block), np.float32)
    pad[:rows, :cols] = np.abs(w)
    amax = pad.reshape(br, block, bc, block).max(axis=(1, 3))
    sc = _pow2_scale_codes(amax, E4M3_MAX)
    per = np.repeat(np.repeat(E8M0[sc], block, 0), block, 1)[:rows, :cols]
    return f32_to_e4m3(w / per), sc


def quant_fp4_groups(w, group: int = FP4_GROUP) -> tuple[np.ndarray, np.ndarray]:
    """float ``[rows, cols]`` (cols even) -> (packed E2M1 uint8 [rows, cols/2], E8M0 scale
    codes uint8 [rows, ceil(cols/group)])."""
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    if cols % 2:
        raise ValueError(f"FP4 packs two values a byte: cols {cols} must be even")
    g = -(-cols // group)
    pad = np.zeros((rows, g * group), np.float32)
    pad[:, :cols] = np.abs(w)
    sc = _pow2_scale_codes(pad.reshape(rows, g, group).max(axis=2), E2M1_MAX)
    per = np.repeat(E8M0[sc], group, axis=1)[:, :cols]
    codes = f32_to_e2m1(w / per)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8), sc
