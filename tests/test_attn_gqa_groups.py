"""Grouped-query attention gives every query head the bits it gets alone: the score
pass that runs several heads of a kv group against each key at once (the AVX2 table's
`gqa_scores`, four heads a pass) must equal, bit for bit, the same head attended as a
group of one (one head a pass, the plain `vdot`), in every kernel table, over group
sizes that leave remainders, head dims that leave 8-lane and scalar tails, windows,
misaligned rows and extreme values; and it stays within rounding of a float64 softmax."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from cortiq.kernels import _kernels as K


def _attend(isa, q, keys, vals, *args):
    """attn_gqa_window under kernel table `isa`."""
    before = K.active_isa()
    try:
        K.set_isa(isa)
        return K.attn_gqa_window(q, keys, vals, *args)
    finally:
        K.set_isa(before)


def _misaligned(a: np.ndarray, off: int) -> np.ndarray:
    """A C-contiguous copy of `a` starting `off` floats into its buffer."""
    buf = np.empty(a.size + off, np.float32)
    out = buf[off:].reshape(a.shape)
    out[...] = a
    return out


def _f64(q, keys, vals, pos0, window, first, scale):
    t, nh, hd = q.shape
    rep = nh // keys.shape[1]
    out = np.zeros((t, nh, hd))
    for r in range(t):
        p = pos0 + r
        lo = max(first, p + 1 - window) if window else first
        for h in range(nh):
            k = keys[lo - first:p - first + 1, h // rep].astype(np.float64)
            v = vals[lo - first:p - first + 1, h // rep].astype(np.float64)
            s = k @ q[r, h].astype(np.float64) * scale
            w = np.exp(s - s.max())
            out[r, h] = (w / w.sum()) @ v
    return out


@settings(max_examples=60, deadline=None)
@given(rep=st.integers(1, 9), nk=st.integers(1, 3), hd=st.integers(1, 40),
       t=st.integers(1, 3), past=st.integers(0, 40), window=st.sampled_from([0, 1, 5]),
       first=st.integers(0, 3), off=st.integers(0, 7), big=st.booleans(),
       seed=st.integers(0, 2**31))
def test_heads_of_a_group_get_their_bits_alone(isas, rep, nk, hd, t, past, window, first,
                                               off, big, seed):
    rng = np.random.default_rng(seed)
    nh, nkeys = rep * nk, past + t
    pos0 = first + past
    q = rng.standard_normal((t, nh, hd)).astype(np.float32)
    keys = rng.standard_normal((nkeys, nk, hd)).astype(np.float32)
    vals = rng.standard_normal((nkeys, nk, hd)).astype(np.float32)
    if big:      # scores far apart: softmax weights underflow to 0 next to the top one
        q *= 40
        keys[rng.random(keys.shape) < 0.05] = 1e4
        vals[rng.random(vals.shape) < 0.05] = -3e4
    q, keys, vals = _misaligned(q, off), _misaligned(keys, off + 1), _misaligned(vals, off)
    scale = float(hd) ** -0.5
    for isa in isas:
        group = _attend(isa, q, keys, vals, pos0, window, first, scale)
        for h in range(nh):
            kh = h // rep
            alone = _attend(isa, np.ascontiguousarray(q[:, h:h + 1]),
                            np.ascontiguousarray(keys[:, kh:kh + 1]),
                            np.ascontiguousarray(vals[:, kh:kh + 1]), pos0, window, first, scale)
            assert np.array_equal(group[:, h], alone[:, 0], equal_nan=True), (isa, h)
        if not big:
            want = _f64(q, keys, vals, pos0, window, first, scale)
            np.testing.assert_allclose(group, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
