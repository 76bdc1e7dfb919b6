"""The q4tp / q2tp encoder of docs/cmf-format.md §7.8 one row at a time, transcribed literally
(scalar exp2f ladder, the f16 ulp bump loop per row): the reference the vectorized
``cortiq.cmf.quant._tp`` must match byte for byte. Its f16 rounding, the ladder and the
code packing come from ``reference.cmf_spec``, written from the spec without cortiq."""
from __future__ import annotations

import numpy as np

from .cmf_spec import GROUP, f16_bits, f16_floor, f16_le, f16_round, f16_value, ladder, pack_codes


def next_up(h: int) -> int:
    """The next f16 bit pattern towards +inf (finite h)."""
    if h & 0x8000:
        return 0x0001 if h == 0x8000 else h - 1
    return h + 1


def row_params(lg_live, rungs):
    if lg_live.size == 0:
        return np.float32(0), np.float32(0)
    lo = np.float32(f16_round(lg_live.min()))
    top = np.float32(lg_live.max())
    r = np.float32(rungs)
    step = f16_bits(np.float32((top - lo) / r))
    # lo is rounded, so it can lie above top and the first step be negative
    while np.float32(lo + np.float32(r * f16_value(step))) < top:
        step = next_up(int(step))
    return lo, np.float32(f16_value(step))


def encode(a, dtype):
    a = np.ascontiguousarray(a, np.float32)
    rows, cols = a.shape
    gpr = cols // GROUP
    tiles = a.reshape(rows, gpr, GROUP)
    absmax = np.abs(tiles).max(axis=2)
    q4 = dtype == "q4tp"
    with np.errstate(divide="ignore"):
        lg = np.log2(f16_floor(absmax / np.float32(7 if q4 else 1.5))).astype(np.float32)
    live = absmax > 0
    params = np.zeros((rows, 2), np.float32)
    codes = np.zeros((rows, gpr), np.int64)
    vals = np.zeros((rows, gpr, GROUP), np.uint8)
    for r in range(rows):
        lo, step = row_params(lg[r][live[r]], 31 if q4 else 30)
        params[r] = lo, step
        t = ladder(lo, step)
        raw = np.rint((lg[r] - lo) / step) if step > 0 else np.zeros(gpr, np.float32)
        if q4:
            c = np.clip(raw, 0, 31).astype(np.int64)
            c[~live[r]] = 0
            inv = np.float32(1) / t[c]
            vals[r] = (np.clip(np.rint(tiles[r] * inv[:, None]), -8, 7) + 8).astype(np.uint8)
        else:
            c = np.clip(1 + raw, 1, 31).astype(np.int64)
            c[~live[r]] = 0
            s = np.where(c > 0, t[np.maximum(c - 1, 0)], np.float32(0))
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.clip(np.rint(tiles[r] * (np.float32(1) / s)[:, None] + np.float32(1.5)), 0, 3)
            v[~live[r]] = 0
            vals[r] = v.astype(np.uint8)
        codes[r] = c
    if q4:
        body = (vals[..., 0::2] | (vals[..., 1::2] << 4)).ravel()
    else:
        v = vals.reshape(rows, gpr, 8, 4)
        body = (v[..., 0] | (v[..., 1] << 2) | (v[..., 2] << 4) | (v[..., 3] << 6)).ravel()
    return np.concatenate([body, f16_le(params), pack_codes(codes).ravel()])
