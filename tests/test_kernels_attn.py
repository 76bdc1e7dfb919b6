"""attn family (rmsnorm, justnorm, rotary, top-k, windowed GQA attention, sparse
attention with a sink): every usable ISA against float64 numpy references and the
scalar reference table.

Tolerances, and why:
  NORM_REL = 1e-6    a float32 sum of squares (n terms, any order) then one sqrt, one
                     divide and one or two multiplies: ~ (n u + 4u) relative to the
                     exact scaling for n <= 4099 with random data (measured <= 3e-7)
  ROPE_ABS = 4 u     x*c - y*s in float32 from float32 cos/sin: two products and a
                     difference, <= 3u * (|x c| + |y s|); checked relative to |x|+|y|
  ATTN_TOL = 1e-5    scores (dot of hd terms) -> exp (2e-7 rel) -> weighted value sum
                     over n keys; checked absolutely against max|v| (values O(1))
  Rotary AVX2 vs ref is bit-identical (same operations, no FMA); top-k is exact.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import cortiq
from cortiq.kernels import _kernels as K
from arrays import misaligned  # tests/arrays.py

U = 2.0 ** -24
NORM_REL = 1e-6
ROPE_ABS = 4 * U
ATTN_TOL = 1e-5


def with_isa(name, fn, *args, **kw):
    before = K.active_isa()
    K.set_isa(name)
    try:
        return fn(*args, **kw)
    finally:
        K.set_isa(before)


# ---- norms -----------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 8, 9, 31, 33, 64, 67, 255, 4099])
@pytest.mark.parametrize("weighted", [False, True])
def test_rmsnorm(isa, n, weighted):
    rng = np.random.default_rng(n)
    x = misaligned(rng.standard_normal((3, n)).astype(np.float32) * 3)
    w = rng.standard_normal(n).astype(np.float32) if weighted else None
    eps = 1e-6
    y = K.rmsnorm(x, w, eps)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps)
    if weighted:
        ref = ref * w
    np.testing.assert_allclose(y, ref, rtol=NORM_REL, atol=1e-30)
    # in place, and 1-D
    z = x.copy()
    assert K.rmsnorm(z, w, eps, out=z) is z
    np.testing.assert_array_equal(z, y)
    np.testing.assert_array_equal(K.rmsnorm(x[1].copy(), w, eps), y[1])


@pytest.mark.parametrize("n", [1, 9, 64, 257, 4099])
def test_justnorm(isa, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((4, n)).astype(np.float32)
    x[2] = 0
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).sum(axis=1, keepdims=True) + 1e-6)
    y = x.copy()
    assert K.justnorm(y) is y
    np.testing.assert_allclose(y, ref, rtol=NORM_REL, atol=1e-30)
    assert (y[2] == 0).all()
    y2 = with_isa("ref", K.justnorm, x.copy())
    np.testing.assert_allclose(y, y2, rtol=NORM_REL)


def test_norm_errors():
    with pytest.raises(TypeError, match="rmsnorm"):
        K.rmsnorm(np.ones(4), None)
    with pytest.raises(ValueError, match="rmsnorm: w"):
        K.rmsnorm(np.ones(4, np.float32), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="justnorm"):
        a = np.ones(4, np.float32)
        a.flags.writeable = False
        K.justnorm(a)


# ---- rotary ----------------------------------------------------------------
def tables(pos, inv):
    ang = np.outer(np.asarray(pos, np.float32), inv).astype(np.float32)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rot_ref(a, b, c, s, inverse):
    a, b, c, s = (v.astype(np.float64) for v in (a, b, c, s))
    s = -s if inverse else s
    return a * c - b * s, a * s + b * c


@pytest.mark.parametrize("hd", [2, 8, 16, 34, 64, 128])
def test_rope_halfsplit(isa, hd):
    t, heads, h = 5, 3, hd // 2
    rng = np.random.default_rng(hd)
    x = rng.standard_normal((t, heads, hd)).astype(np.float32)
    inv = (1.0 / 10000 ** (np.arange(h) * 2 / hd)).astype(np.float32)
    c, s = tables(np.arange(7, 7 + t), inv)
    for inverse in (False, True):
        y = x.copy()
        K.rope_halfsplit(y, c, s, inverse=inverse)
        ra, rb = rot_ref(x[..., :h], x[..., h:], c[:, None, :], s[:, None, :], inverse)
        mag = np.abs(x[..., :h]) + np.abs(x[..., h:])
        assert (np.abs(y[..., :h] - ra) <= ROPE_ABS * mag).all()
        assert (np.abs(y[..., h:] - rb) <= ROPE_ABS * mag).all()
        np.testing.assert_array_equal(y, with_isa("ref", K.rope_halfsplit, x.copy(), c, s, inverse))
    y = x.copy()
    K.rope_halfsplit(y, c, s)
    K.rope_halfsplit(y, c, s, inverse=True)
    np.testing.assert_allclose(y, x, atol=1e-5)
    # one position, [heads, hd]
    y1 = x[0].copy()
    K.rope_halfsplit(y1, c[0], s[0])
    y = x.copy()
    K.rope_halfsplit(y, c, s)
    np.testing.assert_array_equal(y1, y[0])


@pytest.mark.parametrize("hd,rd", [(8, 4), (8, 8), (64, 16), (192, 64), (6, 2)])
def test_rope_interleaved_tail(isa, hd, rd):
    P, heads = 3, 4
    rng = np.random.default_rng(hd + rd)
    x = rng.standard_normal((P, heads, hd)).astype(np.float32)
    inv = (1.0 / 10000 ** (np.arange(rd // 2) * 2 / rd)).astype(np.float32)
    c, s = tables([0, 5, 100], inv)
    for inverse in (False, True):
        y = x.copy()
        K.rope_interleaved_tail(y, c, s, rd, inverse=inverse)
        b = hd - rd
        np.testing.assert_array_equal(y[..., :b], x[..., :b])
        ra, rb = rot_ref(x[..., b::2], x[..., b + 1::2], c[:, None, :], s[:, None, :], inverse)
        mag = np.abs(x[..., b::2]) + np.abs(x[..., b + 1::2])
        assert (np.abs(y[..., b::2] - ra) <= ROPE_ABS * mag).all()
        assert (np.abs(y[..., b + 1::2] - rb) <= ROPE_ABS * mag).all()
        np.testing.assert_array_equal(y[0], x[0] if not inverse else y[0])  # position 0 = identity
        np.testing.assert_array_equal(
            y, with_isa("ref", K.rope_interleaved_tail, x.copy(), c, s, rd, inverse))
    # the reference engine's rope_tail_inverts_itself
    v = x[1, 0].copy()
    K.rope_interleaved_tail(v, c[1], s[1], rd)
    K.rope_interleaved_tail(v, c[1], s[1], rd, inverse=True)
    np.testing.assert_allclose(v, x[1, 0], atol=1e-5)


def test_rope_errors():
    x = np.ones((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match="rope_halfsplit"):
        K.rope_halfsplit(x, np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="rope_interleaved_tail"):
        K.rope_interleaved_tail(x, np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), 10)
    with pytest.raises(ValueError, match="positions"):
        K.rope_interleaved_tail(x, np.ones((4, 2), np.float32), np.ones((4, 2), np.float32), 4)


# ---- top-k -----------------------------------------------------------------
def topk_ref(x, k):
    idx = [i for i in range(len(x)) if np.isfinite(x[i])]
    idx.sort(key=lambda i: (-float(x[i]), i))
    return idx[:k]


def test_topk_ties_and_masks(isa):
    assert K.topk(np.array([1, 1, 1, 0], np.float32), 2).tolist() == [0, 1]
    x = np.array([0.5, np.nan, -np.inf, 3, np.inf, 3, -1], np.float32)
    assert K.topk(x, 10).tolist() == [3, 5, 0, 6]
    assert K.topk(x, 0).tolist() == []
    idx, cnt = K.topk_rows(np.stack([x, -x]), 3)
    assert cnt.tolist() == [3, 3]
    assert idx[0].tolist() == [3, 5, 0]
    assert idx[1].tolist() == [6, 0, 3]
    idx, cnt = K.topk_rows(np.full((1, 4), np.nan, np.float32), 2)
    assert cnt.tolist() == [0] and idx.tolist() == [[-1, -1]]


@given(n=st.integers(0, 300), k=st.integers(0, 40), levels=st.integers(1, 50),
       seed=st.integers(0, 2**31))
def test_topk_hypothesis(isas, n, k, levels, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, levels, n).astype(np.float32)  # many ties
    x[rng.random(n) < 0.1] = -np.inf
    x[rng.random(n) < 0.05] = np.nan
    want = topk_ref(x, k)
    for isa in isas:
        assert with_isa(isa, K.topk, x, k).tolist() == want


# ---- windowed GQA attention ---------------------------------------------------
def attn_ref(q, keys, vals, pos0, window, first, scale):
    t, nh, hd = q.shape
    nk = keys.shape[1]
    rep = nh // nk
    out = np.zeros((t, nh, hd))
    for r in range(t):
        p = pos0 + r
        lo = max(first, p + 1 - window) if window else first
        for h in range(nh):
            kh = h // rep
            k = keys[lo - first:p - first + 1, kh].astype(np.float64)
            v = vals[lo - first:p - first + 1, kh].astype(np.float64)
            s = k @ q[r, h].astype(np.float64) * scale
            e = np.exp(s - s.max())
            out[r, h] = (e / e.sum()) @ v
    return out


@pytest.mark.parametrize("t,nh,nk,hd,window,first", [
    (1, 4, 2, 8, 0, 0), (5, 8, 2, 16, 3, 0), (4, 6, 6, 33, 0, 2), (7, 4, 1, 64, 4, 5),
    (3, 2, 2, 1, 1, 0)])
def test_attn_gqa_window(isa, threads, t, nh, nk, hd, window, first):
    rng = np.random.default_rng(t * 100 + hd)
    pos0 = first + 6
    nkeys = pos0 + t - first
    q = misaligned(rng.standard_normal((t, nh, hd)).astype(np.float32))
    keys = rng.standard_normal((nkeys, nk, hd)).astype(np.float32)
    vals = rng.standard_normal((nkeys, nk, hd)).astype(np.float32)
    scale = hd ** -0.5
    out = K.attn_gqa_window(q, keys, vals, pos0, window=window, first=first)
    ref = attn_ref(q, keys, vals, pos0, window, first, scale)
    np.testing.assert_allclose(out, ref, atol=ATTN_TOL, rtol=0)
    # same result on one thread (bit for bit) and under the reference table
    cortiq.set_num_threads(1)
    np.testing.assert_array_equal(K.attn_gqa_window(q, keys, vals, pos0, window=window, first=first), out)
    r = with_isa("ref", K.attn_gqa_window, q, keys, vals, pos0, window=window, first=first)
    np.testing.assert_allclose(out, r, atol=ATTN_TOL, rtol=0)


@pytest.mark.parametrize("hd", [64, 136, 200])
def test_attn_gqa_long_rows(isa, threads, hd):
    """Value pass in slices of 64 floats plus 8-float and scalar tails, and keys past
    the prefetch distance (40 keys, a window that slides)."""
    rng = np.random.default_rng(hd)
    t, nh, nk, first = 3, 8, 2, 4
    pos0 = first + 37
    nkeys = pos0 + t - first
    q = rng.standard_normal((t, nh, hd)).astype(np.float32)
    keys = rng.standard_normal((nkeys, nk, hd)).astype(np.float32)
    vals = rng.standard_normal((nkeys, nk, hd)).astype(np.float32)
    for window in (0, 29):
        out = K.attn_gqa_window(q, keys, vals, pos0, window=window, first=first)
        np.testing.assert_allclose(out, attn_ref(q, keys, vals, pos0, window, first, hd ** -0.5),
                                   atol=ATTN_TOL, rtol=0)


def test_attn_gqa_errors():
    q = np.ones((2, 4, 8), np.float32)
    kv = np.ones((3, 3, 8), np.float32)
    with pytest.raises(ValueError, match="group"):
        K.attn_gqa_window(q, kv, kv, 1)
    kv = np.ones((3, 2, 8), np.float32)
    with pytest.raises(ValueError, match="cache"):
        K.attn_gqa_window(q, kv, kv, 2)


# ---- sparse attention with a sink -------------------------------------------------
def sparse_ref(q, kv, idx, sink, scale):
    nh, hd = q.shape
    out = np.zeros((nh, hd))
    for h in range(nh):
        live = [int(i) for i in idx if i >= 0]
        s = np.array([kv[i].astype(np.float64) @ q[h] * scale for i in live])
        sk = -np.inf if sink is None else float(sink[h])
        m = max([sk] + list(s))
        if m == -np.inf:
            continue
        e = np.exp(s - m)
        den = e.sum() + (np.exp(sk - m) if sk != -np.inf else 0)
        out[h] = (e @ kv[live].astype(np.float64)) / den if live else 0
    return out


@pytest.mark.parametrize("nh,hd,m", [(1, 4, 2), (4, 16, 9), (8, 64, 33), (3, 7, 0)])
def test_sparse_attend(isa, threads, nh, hd, m):
    rng = np.random.default_rng(nh * hd + m)
    nkv = 40
    q = rng.standard_normal((nh, hd)).astype(np.float32)
    kv = rng.standard_normal((nkv, hd)).astype(np.float32)
    idx = rng.integers(-1, nkv, m).astype(np.int64)
    sink = rng.standard_normal(nh).astype(np.float32)
    for sk in (None, sink):
        out = K.sparse_attend(q, kv, idx, sk)
        np.testing.assert_allclose(out, sparse_ref(q, kv, idx, sk, hd ** -0.5), atol=ATTN_TOL, rtol=0)
        cortiq.set_num_threads(1)
        np.testing.assert_array_equal(K.sparse_attend(q, kv, idx, sk), out)


def test_sparse_attend_seed_cases(isa):
    # the reference engine's tests: no sink averages equal-score keys; a big sink swallows the mass
    q = np.zeros(4, np.float32)
    kv = np.array([[1, 0, 0, 0], [0, 1, 0, 0]], np.float32)
    out = K.sparse_attend(q, kv, np.array([0, 1], np.int64), None, scale=1.0)
    np.testing.assert_allclose(out, [0.5, 0.5, 0, 0], rtol=1e-6)
    out = K.sparse_attend(q, kv, np.array([0, 1], np.int64), np.array([20.0], np.float32), scale=1.0)
    assert np.abs(out).max() < 1e-8
    # masked everything and no sink: zeros
    out = K.sparse_attend(q, kv, np.array([-1, -1], np.int64), None)
    assert (out == 0).all()
    with pytest.raises(ValueError, match="idx"):
        K.sparse_attend(q, kv, np.array([2], np.int64))
    with pytest.raises(TypeError, match="int64"):
        K.sparse_attend(q, kv, np.array([1], np.int32))


@pytest.mark.parametrize("n,window", [(1, 0), (9, 0), (70, 16), (300, 0)])
def test_attn_softmax_weights_equal_the_reference_bit_for_bit(n, window):
    """The AVX2 softmax evaluates the reference's exp (cq_exp1) on 8 lanes with the same
    operations, so its weights are the reference's bit for bit. Seen through attention
    on inputs where everything else is exact in any order (integer q.k, a power-of-two
    scale, values in {0, +-1, +-2}): the outputs must then be equal too. The scores span
    more than 87 below the top, so the exp's clamp is used as well."""
    rng = np.random.default_rng(n)
    nh, nk, hd = 4, 2, 16
    q = rng.integers(-3, 4, (1, nh, hd)).astype(np.float32)
    k = rng.integers(-3, 4, (n, nk, hd)).astype(np.float32)
    v = rng.integers(-2, 3, (n, nk, hd)).astype(np.float32)
    got, before = {}, K.active_isa()
    try:
        for isa in K.usable_isas():
            K.set_isa(isa)
            got[isa] = K.attn_gqa_window(q, k, v, n - 1, window, 0, 2.0)
    finally:
        K.set_isa(before)
    for isa, out in got.items():
        np.testing.assert_array_equal(out, got["ref"], err_msg=isa)
