"""NumPy reference of every CMF v2 payload layout (docs/cmf-format.md §7-§8).

This module is the spec in executable form: the C quantizers and the matvec kernels
are tested against it bit for bit. It favours clarity over speed.

Rules shared by every quantizer (§8): each scale is rounded to f16 *before* the
integer codes are chosen, and floored at 2^-14 (the smallest normal f16); rounding is
half-to-even (np.rint); f32 -> f16 is round-to-nearest-even. Decoders compute in
float32 in the order the format writes (q*scale, then *col), which is what the
upstream readers do, so results are bit-identical to theirs.
"""
from __future__ import annotations


import numpy as np

from ..errors import FormatError
from . import ggml_dequant
from .ggml_blocks import FORMATS as GGML_FORMATS

DTYPES = {
    "f32": 0, "f16": 1, "bf16": 2, "q8_row": 3, "q4_block": 4, "mix8_4": 5, "u8": 6,
    "q4_col": 7, "vbit": 8, "q8_2f": 9, "vbit_ro": 10, "q4_tiled": 11, "q1": 12, "q1s": 13,
    "q1t": 14, "q4tp": 15, "q2tp": 16,
    # the ggml block formats, GGUF bytes kept as they are (§7.9): id = 64 + ggml type
    **{f.name: f.cmf_id for f in GGML_FORMATS.values()},
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

GROUP = 32
F16_MIN_NORMAL = np.float32(2.0 ** -14)
VBIT_WIDTHS = (3, 4, 5, 6, 8)

#: dtypes quantize() can produce
ENCODABLE = ("f32", "f16", "bf16", "u8", "q8_row", "q8_2f", "q4_block", "q4_tiled", "q4tp",
             "q2tp", "vbit", "vbit_ro")
#: dtypes whose writers need 2-D shapes with cols % 32 == 0
NEEDS_COLS32 = ("q4tp", "q2tp", "vbit", "vbit_ro", "q1", "q1t")


# ---- small helpers -------------------------------------------------------------
def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def rows_cols(shape) -> tuple[int, int]:
    """(rows, cols) as the format's size rules see a shape: rows = shape[0]."""
    n = numel(shape)
    if len(shape) == 0:
        return 1, 1
    rows = int(shape[0])
    return rows, (n // rows if rows else 0)


def f16_round(x) -> np.ndarray:
    """Round float32 values to the nearest f16 (ties to even), returned as float32."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def f16_floor(x) -> np.ndarray:
    """Round to f16, then floor at 2^-14: the scale rule of every quantizer."""
    return np.maximum(f16_round(x), F16_MIN_NORMAL)


def f16_bytes(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, np.float32).astype("<f2")).view(np.uint8).ravel()


def _f16_from(b: bytes, count: int) -> np.ndarray:
    return np.frombuffer(b, dtype="<f2", count=count).astype(np.float32)


def ggml_shape_error(dtype: str, shape) -> str | None:
    """Why `shape` cannot hold ggml format `dtype` (None when it can): rows of whole
    blocks, so the last dimension must be a multiple of the block's weights."""
    f = GGML_FORMATS[dtype]
    if len(shape) == 0 or int(shape[-1]) % f.block_elems:
        return (f"{dtype} stores rows of whole {f.block_elems}-weight blocks; shape "
                f"{tuple(shape)} has a last dimension that is not a multiple of {f.block_elems}")
    return None


def expected_nbytes(dtype: str, shape) -> int | None:
    """Exact payload size of a fixed-size dtype, None when it depends on the data (a ggml
    format's shape must also pass ggml_shape_error)."""
    n = numel(shape)
    if dtype in GGML_FORMATS:
        f = GGML_FORMATS[dtype]
        return n // f.block_elems * f.block_bytes
    rows, cols = rows_cols(shape)
    g = -(-n // GROUP)
    if dtype == "f32":
        return 4 * n
    if dtype in ("f16", "bf16"):
        return 2 * n
    if dtype == "u8":
        return n
    if dtype == "q8_row":
        return n + 2 * rows
    if dtype == "q8_2f":
        return n + 2 * rows + 2 * cols
    if dtype in ("q4_block", "q4_tiled"):
        return 18 * g
    if dtype == "q1":
        return 6 * g
    if dtype in ("q4tp", "q2tp"):
        gpr = cols // GROUP
        s = -(-5 * gpr // 8)
        return rows * gpr * (16 if dtype == "q4tp" else 8) + 4 * rows + rows * s
    return None


# ---- encoders ------------------------------------------------------------------
def _as2d(a: np.ndarray, dtype: str) -> np.ndarray:
    if a.ndim != 2:
        raise ValueError(f"{dtype} needs a 2-D tensor, got shape {a.shape}")
    return a


def _q8_row(a):
    a = _as2d(a, "q8_row")
    absmax = np.abs(a).max(axis=1) if a.shape[1] else np.zeros(a.shape[0], np.float32)
    scale = f16_floor(absmax / np.float32(127))
    q = np.clip(np.rint(a / scale[:, None]), -128, 127).astype(np.int8)
    return np.concatenate([q.view(np.uint8).ravel(), f16_bytes(scale)])


def _q8_2f(a):
    a = _as2d(a, "q8_2f")
    rows, cols = a.shape
    ms = (a.astype(np.float64) ** 2).mean(axis=0) if rows else np.zeros(cols)
    col = f16_floor(np.maximum(np.sqrt(ms), 1e-12).astype(np.float32))
    wn = a / col[None, :]
    absmax = np.abs(wn).max(axis=1) if cols else np.zeros(rows, np.float32)
    rs = f16_floor(np.maximum(absmax, np.float32(1e-12)) / np.float32(127))
    q = np.clip(np.rint(wn / rs[:, None]), -127, 127).astype(np.int8)
    return np.concatenate([q.view(np.uint8).ravel(), f16_bytes(rs), f16_bytes(col)])


def _groups(a):
    flat = a.ravel()
    g = -(-flat.size // GROUP)
    padded = np.zeros(g * GROUP, np.float32)
    padded[:flat.size] = flat
    return padded.reshape(g, GROUP)


def _q4_codes(grp):
    scale = f16_floor(np.abs(grp).max(axis=1) / np.float32(7))
    q = (np.clip(np.rint(grp / scale[:, None]), -8, 7) + 8).astype(np.uint8)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    return packed, scale


def _q4_block(a):
    packed, scale = _q4_codes(_groups(a))
    return np.concatenate([packed.ravel(), f16_bytes(scale)])


def _q4_tiled(a):
    packed, scale = _q4_codes(_groups(a))
    tiles = np.concatenate([f16_bytes(scale).reshape(-1, 2), packed], axis=1)
    return tiles.ravel()


def _load_exp2f():
    """libm's exp2f: §7.8 defines the ladder with it, so the reference calls the same
    function the C kernels do (numpy's own float32 exp2 may differ by an ulp)."""
    import ctypes
    import ctypes.util
    for name in (ctypes.util.find_library("m"), "libm.so.6", None):
        try:
            fn = ctypes.CDLL(name).exp2f
        except (OSError, AttributeError, TypeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
        return lambda x: np.float32(fn(float(x)))
    # No libm reachable (unusual): float64 exp2 rounded once to float32.
    return lambda x: np.float32(2.0 ** float(x))


_exp2f = _load_exp2f()


def _ladder_f32(lo, step):
    t = np.empty(32, np.float32)
    t[0] = _exp2f(lo)
    mult = _exp2f(step)
    for c in range(1, 32):
        t[c] = t[c - 1] * mult
    return t


def _tp_row_params(lg_live: np.ndarray, rungs: int):
    """(lo, step) as f16-rounded float32 for one row's live-tile log2 scales."""
    if lg_live.size == 0:
        return np.float32(0), np.float32(0)
    lo = f16_round(lg_live.min())[()]
    top = np.float32(lg_live.max())
    step16 = np.float16((top - lo) / np.float32(rungs))
    while np.float32(lo + np.float32(rungs) * np.float32(step16)) < top:
        step16 = np.nextafter(step16, np.float16(np.inf))
    return np.float32(lo), np.float32(step16)


def _pack_codes(codes: np.ndarray) -> np.ndarray:
    """5-bit codes [rows, gpr] -> [rows, ceil(5*gpr/8)] bytes, LSB-first."""
    rows, gpr = codes.shape
    bits = ((codes[:, :, None] >> np.arange(5)) & 1).astype(np.uint8).reshape(rows, gpr * 5)
    s = -(-5 * gpr // 8)
    pad = np.zeros((rows, s * 8), np.uint8)
    pad[:, :gpr * 5] = bits
    return np.packbits(pad.reshape(rows, s, 8), axis=2, bitorder="little").reshape(rows, s)


def _unpack_codes(b: np.ndarray, gpr: int) -> np.ndarray:
    rows = b.shape[0]
    bits = np.unpackbits(b, axis=1, bitorder="little")[:, :gpr * 5].reshape(rows, gpr, 5)
    return (bits.astype(np.uint8) << np.arange(5, dtype=np.uint8)).sum(axis=2).astype(np.int64)


def _exp2f_many(x: np.ndarray) -> np.ndarray:
    """libm exp2f of every element (each distinct value computed once: lo / step are f16
    values, so a tensor has few of them)."""
    u, inv = np.unique(np.asarray(x, np.float32), return_inverse=True)
    return np.array([_exp2f(v) for v in u], np.float32)[inv].reshape(np.shape(x))


def _tp_params(lg: np.ndarray, live: np.ndarray, rungs: int):
    """``_tp_row_params`` for every row at once: (lo, step) float32 [rows]."""
    any_live = live.any(axis=1)
    with np.errstate(invalid="ignore"):
        mn = np.where(live, lg, np.float32(np.inf)).min(axis=1)
        top = np.where(live, lg, np.float32(-np.inf)).max(axis=1).astype(np.float32)
    mn = np.where(any_live, mn, np.float32(0)).astype(np.float32)
    top = np.where(any_live, top, np.float32(0)).astype(np.float32)
    lo = f16_round(mn).astype(np.float32)
    step16 = ((top - lo) / np.float32(rungs)).astype(np.float16)
    r32 = np.float32(rungs)
    short = any_live & ((lo + r32 * step16.astype(np.float32)).astype(np.float32) < top)
    while short.any():
        step16 = np.where(short, np.nextafter(step16, np.float16(np.inf)), step16)
        short = any_live & ((lo + r32 * step16.astype(np.float32)).astype(np.float32) < top)
    lo = np.where(any_live, lo, np.float32(0)).astype(np.float32)
    step = np.where(any_live, step16.astype(np.float32), np.float32(0)).astype(np.float32)
    return lo, step


def _tp(a, dtype, slab: int = 2048):
    a = _as2d(a, dtype)
    rows, cols = a.shape
    if cols % GROUP:
        raise ValueError(f"{dtype} needs cols % 32 == 0, got {cols}")
    gpr = cols // GROUP
    q4 = dtype == "q4tp"
    denom = np.float32(7) if q4 else np.float32(1.5)
    params = np.zeros((rows, 2), np.float32)
    codes = np.zeros((rows, gpr), np.int64)
    vals = np.zeros((rows, gpr, GROUP), np.uint8)
    # rows are independent: a slab at a time, every step vectorized over its rows with the
    # same float32 operations, in the same order, as the per-row recipe of §7.8
    for r0 in range(0, rows, slab):
        tiles = a[r0:r0 + slab].reshape(-1, gpr, GROUP)
        n = tiles.shape[0]
        absmax = np.abs(tiles).max(axis=2)
        with np.errstate(divide="ignore"):
            lg = np.log2(f16_floor(absmax / denom)).astype(np.float32)
        live = absmax > 0
        lo, step = _tp_params(lg, live, 31 if q4 else 30)
        params[r0:r0 + n, 0], params[r0:r0 + n, 1] = lo, step
        t = np.empty((n, 32), np.float32)
        t[:, 0] = _exp2f_many(lo)
        mult = _exp2f_many(step)
        for c in range(1, 32):
            t[:, c] = t[:, c - 1] * mult
        with np.errstate(divide="ignore", invalid="ignore"):
            raw = np.rint((lg - lo[:, None]) / step[:, None])
        raw = np.where(step[:, None] > 0, raw, np.float32(0))
        if q4:
            c = np.clip(raw, 0, 31).astype(np.int64)
            c[~live] = 0
            s = np.take_along_axis(t, c, axis=1)
            inv = np.float32(1) / s
            v = (np.clip(np.rint(tiles * inv[:, :, None]), -8, 7) + 8).astype(np.uint8)
        else:
            c = np.clip(1 + raw, 1, 31).astype(np.int64)
            c[~live] = 0
            s = np.where(c > 0, np.take_along_axis(t, np.maximum(c - 1, 0), axis=1),
                         np.float32(0))
            with np.errstate(divide="ignore", invalid="ignore"):
                inv = np.float32(1) / s
                v = np.clip(np.rint(tiles * inv[:, :, None] + np.float32(1.5)), 0, 3)
            v[~live] = 0
            v = v.astype(np.uint8)
        vals[r0:r0 + n] = v
        codes[r0:r0 + n] = c
    if q4:
        body = (vals[..., 0::2] | (vals[..., 1::2] << 4)).ravel()
    else:
        v = vals.reshape(rows, gpr, 8, 4)
        body = (v[..., 0] | (v[..., 1] << 2) | (v[..., 2] << 4) | (v[..., 3] << 6)).ravel()
    return np.concatenate([body, f16_bytes(params).ravel(), _pack_codes(codes).ravel()])


def vbit_widths(a: np.ndarray, mean_bits: float = 4.25) -> np.ndarray:
    """Per-row widths by the writers' water-filling rule (§7.6)."""
    absmax = np.abs(a).max(axis=1).astype(np.float64)
    lg = np.log2(np.maximum(absmax, 1e-12))
    raw = mean_bits + (lg - lg.mean())
    levels = np.array(VBIT_WIDTHS, np.float64)
    # nearest level, ties to the lower one (argmin returns the first minimum)
    idx = np.argmin(np.abs(raw[:, None] - levels[None, :]), axis=1)
    return np.maximum(levels[idx], 3).astype(np.uint8)


def _vbit(a, dtype, bits=None):
    a = _as2d(a, dtype)
    rows, cols = a.shape
    if cols % GROUP or cols == 0:
        raise ValueError(f"{dtype} needs cols a positive multiple of 32, got {cols}")
    bits = vbit_widths(a) if bits is None else np.asarray(bits, np.uint8)
    gpr = cols // GROUP
    scales = np.zeros((rows, gpr), np.float32)
    packed_rows = []
    for r in range(rows):
        b = int(bits[r])
        lvl = (1 << (b - 1)) - 1
        grp = a[r].reshape(gpr, GROUP)
        s = f16_floor(np.abs(grp).max(axis=1) / np.float32(lvl))
        scales[r] = s
        u = np.clip(np.rint(grp / s[:, None]) + lvl, 0, (1 << b) - 1).astype(np.uint16).ravel()
        bitmat = ((u[:, None] >> np.arange(b - 1, -1, -1)) & 1).astype(np.uint8).ravel()
        packed_rows.append(np.packbits(bitmat))  # MSB-first, zero-padded to a byte
    parts = [bits.astype(np.uint8), f16_bytes(scales).ravel()]
    if dtype == "vbit_ro":
        offs = np.zeros(rows + 1, np.uint32)
        offs[1:] = np.cumsum([p.size for p in packed_rows])
        parts.append(offs.astype("<u4").view(np.uint8))
    parts.extend(packed_rows)
    return np.concatenate(parts)


def _bf16(a):
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a.ravel()).reshape(a.shape)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)  # keep NaN a (quiet) NaN
    return rounded.astype("<u2").view(np.uint8).ravel()


# Largest |w| each layout can hold once its scale is an f16 (max f16 = 65504 times the
# largest code magnitude); beyond it the scale would overflow to inf.
_F16_MAX = 65504.0
_LIMIT = {"f16": _F16_MAX, "q8_row": _F16_MAX * 127, "q8_2f": _F16_MAX * 127,
          "q4_block": _F16_MAX * 7, "q4_tiled": _F16_MAX * 7, "q4tp": _F16_MAX * 7,
          "q2tp": _F16_MAX * 1.5, "vbit": _F16_MAX * 3, "vbit_ro": _F16_MAX * 3}


def _check_representable(a: np.ndarray, dtype: str) -> None:
    if a.size == 0:
        return
    if not np.isfinite(a).all():
        raise ValueError(f"cannot encode {dtype}: the tensor holds NaN or infinite values")
    top = float(np.abs(a).max())
    if top > _LIMIT.get(dtype, np.inf):
        raise ValueError(f"cannot encode {dtype}: |w| reaches {top:.3g}, beyond what f16 "
                         f"scales can hold ({_LIMIT[dtype]:.3g}); use f32 or bf16")


def quantize(array, dtype: str) -> np.ndarray:
    """Encode a float array as the payload bytes of `dtype` (uint8 array)."""
    if dtype == "u8":
        return np.ascontiguousarray(array, np.uint8).ravel()
    a = np.ascontiguousarray(array, dtype=np.float32)
    if dtype not in ("f32", "bf16"):
        _check_representable(a, dtype)
    if dtype == "f32":
        return a.astype("<f4").view(np.uint8).ravel()
    if dtype == "f16":
        return a.astype("<f2").view(np.uint8).ravel()
    if dtype == "bf16":
        return _bf16(a)
    if dtype == "q8_row":
        return _q8_row(a)
    if dtype == "q8_2f":
        return _q8_2f(a)
    if dtype == "q4_block":
        return _q4_block(a)
    if dtype == "q4_tiled":
        return _q4_tiled(a)
    if dtype in ("q4tp", "q2tp"):
        return _tp(a, dtype)
    if dtype in ("vbit", "vbit_ro"):
        return _vbit(a, dtype)
    raise ValueError(f"cannot quantize to {dtype!r}; encodable: {', '.join(ENCODABLE)}")


# ---- decoders ------------------------------------------------------------------
def _need(buf: np.ndarray, n: int, dtype: str):
    if buf.size < n:
        raise FormatError(f"{dtype} payload has {buf.size} bytes, needs {n}")


def _dq_q4_groups(packed, scale, n):
    lo = (packed & 0x0F).astype(np.int16) - 8
    hi = (packed >> 4).astype(np.int16) - 8
    q = np.empty((packed.shape[0], GROUP), np.float32)
    q[:, 0::2] = lo
    q[:, 1::2] = hi
    return (q * scale[:, None]).ravel()[:n]


def _vbit_layout(buf, rows, cols, ro: bool, dtype: str):
    """(bits, scales[rows, gpr], row byte offsets, packed area) with §7.6 validation."""
    if cols % GROUP or cols == 0:
        raise FormatError(f"{dtype}: cols must be a positive multiple of 32, got {cols}")
    gpr = cols // GROUP
    _need(buf, rows + 2 * rows * gpr, dtype)
    bits = buf[:rows].astype(np.int64)
    if rows and not np.isin(bits, VBIT_WIDTHS).all():
        raise FormatError(f"{dtype}: row widths must be in {VBIT_WIDTHS}")
    p = rows
    scales = _f16_from(buf[p:p + 2 * rows * gpr].tobytes(), rows * gpr).reshape(rows, gpr)
    p += 2 * rows * gpr
    spans = (cols * bits + 7) // 8
    want = np.zeros(rows + 1, np.int64)
    want[1:] = np.cumsum(spans)
    if ro:
        _need(buf, p + 4 * (rows + 1), dtype)
        offs = np.frombuffer(buf[p:p + 4 * (rows + 1)].tobytes(), "<u4").astype(np.int64)
        p += 4 * (rows + 1)
        if not np.array_equal(offs, want):
            raise FormatError(f"{dtype}: row offsets are not the exact prefix sums of the spans")
    if buf.size != p + int(want[-1]):
        raise FormatError(f"{dtype}: payload is {buf.size} bytes, layout needs {p + int(want[-1])}")
    return bits, scales, want, buf[p:]


def validate_vbit(buf: np.ndarray, shape, dtype: str) -> None:
    """Open-time structural check of a vbit/vbit_ro payload (raises FormatError)."""
    if len(shape) != 2:
        raise FormatError(f"{dtype}: needs a 2-D shape, got {tuple(shape)}")
    _vbit_layout(buf, int(shape[0]), int(shape[1]), dtype == "vbit_ro", dtype)


def _dq_vbit(buf, rows, cols, ro, dtype):
    bits, scales, offs, packed = _vbit_layout(buf, rows, cols, ro, dtype)
    out = np.empty((rows, cols), np.float32)
    for r in range(rows):
        b = int(bits[r])
        row = np.unpackbits(packed[offs[r]:offs[r + 1]])[:cols * b].reshape(cols, b)
        u = (row.astype(np.int64) << np.arange(b - 1, -1, -1)).sum(axis=1)
        q = (u - ((1 << (b - 1)) - 1)).astype(np.float32)
        out[r] = q * np.repeat(scales[r], GROUP)
    return out


def _dq_tp(buf, rows, cols, dtype):
    if cols % GROUP:
        raise FormatError(f"{dtype}: cols must be a multiple of 32, got {cols}")
    gpr = cols // GROUP
    tile = 16 if dtype == "q4tp" else 8
    s = -(-5 * gpr // 8)
    _need(buf, rows * gpr * tile + 4 * rows + rows * s, dtype)
    body = buf[:rows * gpr * tile].reshape(rows, gpr, tile)
    p = rows * gpr * tile
    params = _f16_from(buf[p:p + 4 * rows].tobytes(), 2 * rows).reshape(rows, 2)
    p += 4 * rows
    codes = _unpack_codes(buf[p:p + rows * s].reshape(rows, s), gpr)
    out = np.empty((rows, gpr, GROUP), np.float32)
    for r in range(rows):
        t = _ladder_f32(params[r, 0], params[r, 1])
        if dtype == "q4tp":
            sc = t[codes[r]]
            lo = (body[r] & 0x0F).astype(np.float32) - 8
            hi = (body[r] >> 4).astype(np.float32) - 8
            q = np.empty((gpr, GROUP), np.float32)
            q[:, 0::2], q[:, 1::2] = lo, hi
        else:
            sc = np.where(codes[r] > 0, t[np.maximum(codes[r] - 1, 0)], np.float32(0))
            v = (body[r][:, :, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
            q = v.reshape(gpr, GROUP).astype(np.float32) - np.float32(1.5)
        out[r] = q * sc[:, None]
    return out.reshape(rows, cols)


def _dq_q1(buf, n):
    g = -(-n // GROUP)
    tiles = buf[:6 * g].reshape(g, 6)
    scale = _f16_from(tiles[:, :2].tobytes(), g)
    bits = np.unpackbits(tiles[:, 2:], axis=1, bitorder="little").astype(np.float32)
    return (np.where(bits > 0, np.float32(1), np.float32(-1)) * scale[:, None]).ravel()[:n]


def _dq_q1t(buf, rows, cols, n):
    g = -(-n // GROUP)
    _need(buf, 9 * g + 4 * (rows + 1), "q1t")
    tiles = buf[:9 * g].reshape(g, 9)
    scale = _f16_from(tiles[:, :2].tobytes(), g)
    k = np.arange(GROUP)
    code = (tiles[:, 2:][:, k // 5].astype(np.int64) // (3 ** (k % 5))) % 3
    val = np.select([code == 1, code == 2], [np.float32(1), np.float32(-1)], np.float32(0))
    out = (val.astype(np.float32) * scale[:, None]).ravel()[:n].reshape(rows, cols)
    p = 9 * g
    ptr = np.frombuffer(buf[p:p + 4 * (rows + 1)].tobytes(), "<u4").astype(np.int64)
    p += 4 * (rows + 1)
    if ptr[0] != 0 or np.any(np.diff(ptr) < 0) or buf.size < p + 4 * ptr[-1]:
        raise FormatError("q1t: sparse overlay row pointers are invalid")
    ent = buf[p:p + 4 * ptr[-1]].reshape(-1, 4)
    colv = np.frombuffer(ent[:, :2].tobytes(), "<u2").astype(np.int64)
    vals = _f16_from(ent[:, 2:].tobytes(), ent.shape[0])
    rowv = np.repeat(np.arange(rows), np.diff(ptr))
    if colv.size and colv.max() >= cols:
        raise FormatError("q1t: overlay column out of range")
    out[rowv, colv] = vals
    return out


def _dq_q1s(buf, n):
    g = -(-n // GROUP)
    _need(buf, 6 * g + 4, "q1s")
    base = _dq_q1(buf, n)
    cnt = int(np.frombuffer(buf[6 * g:6 * g + 4].tobytes(), "<u4")[0])
    _need(buf, 6 * g + 4 + 6 * cnt, "q1s")
    ent = buf[6 * g + 4:6 * g + 4 + 6 * cnt].reshape(cnt, 6)
    idx = np.frombuffer(ent[:, :4].tobytes(), "<u4").astype(np.int64)
    if idx.size and idx.max() >= n:
        raise FormatError("q1s: overlay index out of range")
    base[idx] = _f16_from(ent[:, 4:].tobytes(), cnt)
    return base


def dequantize(payload, dtype: str, shape) -> np.ndarray:
    """Decode payload bytes of `dtype` into a float32 array of `shape` (u8 -> uint8)."""
    buf = np.frombuffer(payload, np.uint8) if not isinstance(payload, np.ndarray) else payload
    buf = buf.view(np.uint8).ravel()
    shape = tuple(int(d) for d in shape)
    n = numel(shape)
    rows, cols = rows_cols(shape)
    fixed = expected_nbytes(dtype, shape)
    if fixed is not None:
        _need(buf, fixed, dtype)
    if dtype == "f32":
        return np.frombuffer(buf[:4 * n].tobytes(), "<f4").astype(np.float32).reshape(shape)
    if dtype == "f16":
        return _f16_from(buf[:2 * n].tobytes(), n).reshape(shape)
    if dtype == "bf16":
        u = np.frombuffer(buf[:2 * n].tobytes(), "<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    if dtype == "u8":
        return buf[:n].copy().reshape(shape)
    if dtype in ("q8_row", "q8_2f"):
        if len(shape) != 2:
            raise FormatError(f"{dtype} needs a 2-D shape, got {shape}")
        q = buf[:n].view(np.int8).astype(np.float32).reshape(rows, cols)
        s = _f16_from(buf[n:n + 2 * rows].tobytes(), rows)
        w = q * s[:, None]
        if dtype == "q8_2f":
            col = _f16_from(buf[n + 2 * rows:n + 2 * rows + 2 * cols].tobytes(), cols)
            w = w * col[None, :]
        return w.reshape(shape)
    if dtype in ("q4_block", "q4_tiled"):
        g = -(-n // GROUP)
        if dtype == "q4_block":
            packed = buf[:16 * g].reshape(g, 16)
            scale = _f16_from(buf[16 * g:18 * g].tobytes(), g)
        else:
            tiles = buf[:18 * g].reshape(g, 18)
            scale = _f16_from(tiles[:, :2].tobytes(), g)
            packed = tiles[:, 2:]
        return _dq_q4_groups(packed, scale, n).reshape(shape)
    if dtype in ("q4tp", "q2tp"):
        if len(shape) != 2:
            raise FormatError(f"{dtype} needs a 2-D shape, got {shape}")
        return _dq_tp(buf, rows, cols, dtype)
    if dtype in ("vbit", "vbit_ro"):
        if len(shape) != 2:
            raise FormatError(f"{dtype} needs a 2-D shape, got {shape}")
        return _dq_vbit(buf, rows, cols, dtype == "vbit_ro", dtype)
    if dtype == "q1":
        return _dq_q1(buf, n).reshape(shape)
    if dtype == "q1s":
        return _dq_q1s(buf, n).reshape(shape)
    if dtype == "q1t":
        if len(shape) != 2:
            raise FormatError(f"q1t needs a 2-D shape, got {shape}")
        return _dq_q1t(buf, rows, cols, n)
    if dtype in GGML_FORMATS:
        why = ggml_shape_error(dtype, shape)
        if why:
            raise FormatError(why)
        return ggml_dequant.dequantize(buf, dtype, n).reshape(shape)
    raise FormatError(f"dtype {dtype!r} cannot be decoded")
