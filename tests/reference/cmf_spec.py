"""The CMF v2 payload layouts of docs/cmf-format.md §7, transcribed from the text alone.

An independent reference for ``cortiq.cmf.quant`` and the C kernels: it imports nothing
from cortiq. f16 conversion is done on the bits (round to nearest, ties to even, gradual
underflow), not through numpy's float16; the 5-bit tile codes and the MSB-first vbit rows
are read and written through Python integers; the q4tp/q2tp ladder calls the C library's
``exp2f``, the function the format names (§7.8). Scalar loops where the spec is written
per element: slow, meant for small tensors.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

GROUP = 32
F16_MIN_NORMAL = np.float32(2.0 ** -14)
VBIT_WIDTHS = (3, 4, 5, 6, 8)


# ---- f16 on the bits -------------------------------------------------------------------
def _rne_shift(v: np.ndarray, s: np.ndarray) -> np.ndarray:
    """v / 2^s rounded to nearest, ties to even (v >= 0, int64; s >= 1)."""
    q = v >> s
    r = v & ((np.int64(1) << s) - 1)
    half = np.int64(1) << (s - 1)
    return q + ((r > half) | ((r == half) & ((q & 1) == 1)))


def f16_bits(x) -> np.ndarray:
    """float32 values -> IEEE binary16 bit patterns (uint16), round to nearest even."""
    x = np.asarray(x, np.float32)
    u = np.ascontiguousarray(x).view(np.uint32).astype(np.int64).reshape(x.shape)
    sign = (u >> 16) & 0x8000
    e = ((u >> 23) & 0xFF) - 127
    m = u & 0x7FFFFF
    sig = np.where(e > -127, m | 0x800000, m)      # the value is sig * 2^(e_eff - 23)
    e_eff = np.where(e > -127, e, -126)
    normal = e_eff >= -14
    # f16 normal: 10 fraction bits kept of 23 (a carry moves into the exponent field);
    # f16 subnormal: units of 2^-24, i.e. sig * 2^(e_eff + 1)
    s = np.clip(np.where(normal, 13, -e_eff - 1), 1, 40)
    h = np.where(normal, (e_eff + 14) << 10, 0) + _rne_shift(sig, s)
    h = np.minimum(h, 0x7C00)                      # past the largest finite f16: inf
    h = np.where(e == 128, np.where(m == 0, 0x7C00, 0x7E00), h)
    return (sign | h).astype(np.uint16)


def f16_value(bits) -> np.ndarray:
    """binary16 bit patterns -> float32 (exact)."""
    h = np.asarray(bits, np.int64)
    e, m = (h >> 10) & 0x1F, h & 0x3FF
    mag = np.where(e == 0, np.ldexp(m.astype(np.float64), -24),
                   np.ldexp((m + 1024).astype(np.float64), (e - 25).astype(np.int32)))
    mag = np.where(e == 31, np.where(m == 0, np.inf, np.nan), mag)
    return np.where(h & 0x8000, -mag, mag).astype(np.float32)


def f16_round(x) -> np.ndarray:
    return f16_value(f16_bits(x))


def f16_floor(x) -> np.ndarray:
    """The scale rule of every quantizer (§8): round to f16, then at least 2^-14."""
    return np.maximum(f16_round(x), F16_MIN_NORMAL)


def f16_le(x) -> np.ndarray:
    """float32 values as little-endian f16 bytes (uint8)."""
    b = f16_bits(np.asarray(x, np.float32).ravel()).astype(np.int64)
    return np.stack([b & 0xFF, b >> 8], axis=1).astype(np.uint8).ravel()


def _read_f16(buf: np.ndarray, at: int, count: int) -> np.ndarray:
    b = buf[at:at + 2 * count].astype(np.int64)
    return f16_value(b[0::2] | (b[1::2] << 8))


# ---- the tile ladder (§7.8) --------------------------------------------------------------
def _libm_exp2f():
    for name in (ctypes.util.find_library("m"), "libm.so.6", "libm.dylib", None):
        try:
            fn = ctypes.CDLL(name).exp2f
        except (OSError, AttributeError, TypeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
        return lambda v: np.float32(fn(float(v)))
    raise RuntimeError("no C library exp2f reachable: the ladder of §7.8 is defined by it")


exp2f = _libm_exp2f()


def ladder(lo, step) -> np.ndarray:
    """t[0] = exp2f(lo), t[c] = t[c-1] * exp2f(step), all float32."""
    t = np.empty(32, np.float32)
    t[0] = exp2f(lo)
    mult = exp2f(step)
    for c in range(1, 32):
        t[c] = np.float32(t[c - 1] * mult)
    return t


def code_bytes(row_codes) -> bytes:
    """One row's 5-bit codes, code g at bit 5g, LSB-first: ceil(5*gpr/8) bytes."""
    acc = 0
    for g, c in enumerate(row_codes):
        acc |= (int(c) & 31) << (5 * g)
    return acc.to_bytes(-(-5 * len(row_codes) // 8), "little")


def pack_codes(codes) -> np.ndarray:
    """[rows, gpr] codes -> [rows, S] bytes."""
    codes = np.asarray(codes)
    return np.array([list(code_bytes(r)) for r in codes], np.uint8).reshape(
        codes.shape[0], -(-5 * codes.shape[1] // 8))


def read_code(row_bytes, g: int) -> int:
    return (int.from_bytes(bytes(row_bytes), "little") >> (5 * g)) & 31


# ---- decoders ----------------------------------------------------------------------------
def _decode_tp(buf, rows, cols, dtype):
    gpr = cols // GROUP
    tile = 16 if dtype == "q4tp" else 8
    stride = -(-5 * gpr // 8)
    p_params = rows * gpr * tile
    p_codes = p_params + 4 * rows
    assert buf.size == p_codes + rows * stride, "q4tp/q2tp size"
    out = np.empty((rows, cols), np.float32)
    for r in range(rows):
        lo, step = _read_f16(buf, p_params + 4 * r, 2)
        t = ladder(lo, step)
        crow = buf[p_codes + r * stride:p_codes + (r + 1) * stride]
        for g in range(gpr):
            code = read_code(crow, g)
            body = buf[(r * gpr + g) * tile:(r * gpr + g + 1) * tile]
            for k in range(GROUP):
                if dtype == "q4tp":
                    nib = (int(body[k // 2]) >> (4 * (k % 2))) & 0xF
                    v = np.float32(nib - 8) * t[code]
                else:
                    val = (int(body[k // 4]) >> (2 * (k % 4))) & 3
                    s = np.float32(0) if code == 0 else t[code - 1]
                    v = (np.float32(val) - np.float32(1.5)) * s
                out[r, g * GROUP + k] = v
    return out


def _decode_vbit(buf, rows, cols, ro: bool):
    gpr = cols // GROUP
    bits = [int(b) for b in buf[:rows]]
    assert all(b in VBIT_WIDTHS for b in bits), "vbit widths"
    scales = _read_f16(buf, rows, rows * gpr).reshape(rows, gpr)
    p = rows + 2 * rows * gpr
    spans = [-(-cols * b // 8) for b in bits]
    starts = np.concatenate([[0], np.cumsum(spans)]).astype(np.int64)
    if ro:
        offs = buf[p:p + 4 * (rows + 1)].astype(np.int64).reshape(rows + 1, 4)
        offs = offs @ np.array([1, 1 << 8, 1 << 16, 1 << 24], np.int64)
        assert (offs == starts).all(), "vbit_ro offsets are the prefix sums of the spans"
        p += 4 * (rows + 1)
    assert buf.size == p + starts[-1], "vbit size"
    out = np.empty((rows, cols), np.float32)
    for r, b in enumerate(bits):
        row = buf[p + starts[r]:p + starts[r + 1]]
        acc, total = int.from_bytes(bytes(row), "big"), 8 * len(row)
        lvl = (1 << (b - 1)) - 1
        for c in range(cols):
            u = (acc >> (total - (c + 1) * b)) & ((1 << b) - 1)
            out[r, c] = np.float32(u - lvl) * scales[r, c // GROUP]
    return out


def decode(payload, dtype: str, shape) -> np.ndarray:
    """Payload bytes of `dtype` -> float32 array of `shape` (u8 -> uint8)."""
    buf = np.frombuffer(bytes(payload), np.uint8)
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape, dtype=np.int64))
    rows = shape[0] if shape else 1
    cols = n // rows if rows else 0
    if dtype == "u8":
        return buf[:n].copy().reshape(shape)
    if dtype == "f32":
        u = buf[:4 * n].astype(np.uint32).reshape(n, 4)
        u = u[:, 0] | (u[:, 1] << 8) | (u[:, 2] << 16) | (u[:, 3] << 24)
        return u.view(np.float32).reshape(shape)
    if dtype == "f16":
        return _read_f16(buf, 0, n).reshape(shape)
    if dtype == "bf16":
        u = buf[:2 * n].astype(np.uint32)
        return ((u[0::2] | (u[1::2] << 8)) << 16).view(np.float32).reshape(shape)
    if dtype in ("q8_row", "q8_2f"):
        q = buf[:n].view(np.int8).astype(np.float32).reshape(rows, cols)
        rs = _read_f16(buf, n, rows)
        w = q * rs[:, None]
        if dtype == "q8_2f":
            w = w * _read_f16(buf, n + 2 * rows, cols)[None, :]
        return w.reshape(shape)
    if dtype in ("q4_block", "q4_tiled"):
        groups = -(-n // GROUP)
        out = np.empty(groups * GROUP, np.float32)
        for g in range(groups):
            if dtype == "q4_block":
                nib, scale = buf[16 * g:16 * g + 16], _read_f16(buf, 16 * groups + 2 * g, 1)[0]
            else:
                nib, scale = buf[18 * g + 2:18 * g + 18], _read_f16(buf, 18 * g, 1)[0]
            for k in range(GROUP):
                v = (int(nib[k // 2]) >> (4 * (k % 2))) & 0xF
                out[g * GROUP + k] = np.float32(v - 8) * scale
        return out[:n].reshape(shape)
    if dtype in ("q4tp", "q2tp"):
        return _decode_tp(buf, rows, cols, dtype)
    if dtype in ("vbit", "vbit_ro"):
        return _decode_vbit(buf, rows, cols, dtype == "vbit_ro")
    raise ValueError(f"no spec decoder for {dtype!r}")
