"""The reference engine's DeepSeek-V4 unit tests (dsv4.rs `mod tests`) as Python tests, plus the
`mix` kernel family against a float64 numpy reference on every usable ISA.

Tolerances: SINK_TOL 1e-4 is the reference engine's own bound on the Sinkhorn reference numbers
(comb; pre/post use 1e-5). MIX_RTOL 2e-6 * sum|terms| bounds float32 summation-order
differences between the AVX2 (8-lane FMA) and scalar kernels and the float64 reference.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from cortiq.kernels import _kernels as K
from cortiq.models import deepseek_v4 as D
from cortiq.models import rope
from cortiq.cmf.testing import qtensor_from_f32

SINK_TOL = 1e-4
MIX_RTOL = 2e-6


def f32(a):
    return np.ascontiguousarray(a, np.float32)


def sinkhorn_ref(mixes, scale, base, hc, iters, eps):
    m, b = np.float64(mixes), np.float64(base)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    pre = sig(m[:hc] * scale[0] + b[:hc]) + eps
    post = 2 * sig(m[hc:2 * hc] * scale[1] + b[hc:2 * hc])
    c = (m[2 * hc:] * scale[2] + b[2 * hc:]).reshape(hc, hc)
    c = np.exp(c - c.max(1, keepdims=True))
    c = c / c.sum(1, keepdims=True) + eps
    c = c / (c.sum(0, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(1, keepdims=True) + eps)
        c = c / (c.sum(0, keepdims=True) + eps)
    return pre, post, c


# ---------------------------------------------- the reference engine's tests

def seed_mixes():
    return f32(np.sin(np.arange(24) * 0.37) * 3.0), f32(np.cos(np.arange(24) * 0.11))


def test_sinkhorn_matches_the_reference_numbers(isa):
    mixes, base = seed_mixes()
    pre, post, comb = K.hc_split_sinkhorn(mixes, f32([1, 1, 1]), base, 4, 20, 1e-6)
    np.testing.assert_allclose(pre, [0.7310596, 0.8888268, 0.9525191, 0.97424865], atol=1e-5)
    np.testing.assert_allclose(post, [1.9600224, 1.9534285, 1.9201256, 1.8160983], atol=1e-5)
    want = [0.5996052, 0.28253591, 0.09218107, 0.025676856, 0.17564717, 0.22228767,
            0.27174541, 0.33031881, 0.029528176, 0.12206022, 0.32619134, 0.5222193,
            0.19521846, 0.37311527, 0.30988118, 0.12178412]
    np.testing.assert_allclose(comb.ravel(), want, atol=SINK_TOL)
    _rp, _rq, rc = sinkhorn_ref(mixes, [1, 1, 1], base, 4, 20, 1e-6)
    np.testing.assert_allclose(comb, rc, atol=1e-6)


def test_sinkhorn_leaves_the_mixing_matrix_doubly_stochastic(isa):
    mixes, base = seed_mixes()
    pre, post, comb = K.hc_split_sinkhorn(mixes, f32([1, 1, 1]), base, 4, 20, 1e-6)
    assert np.abs(comb.sum(0) - 1).max() < 2e-3 and np.abs(comb.sum(1) - 1).max() < 2e-3
    assert (pre > 0).all() and (pre < 1.001).all() and (post >= 0).all() and (post <= 2).all()


def test_expand_of_identical_copies_is_a_fixed_point(isa):
    res = f32(np.tile([1.5, -2.0, 0.25], (4, 1)))
    out = K.hc_expand(f32(np.zeros(3)), res, f32(np.zeros(4)), f32(np.full((4, 4), 0.25)))
    np.testing.assert_allclose(out, res, atol=1e-6)


def test_selection_bias_steers_the_choice_but_not_the_weights():
    idx, w = D.route(f32([3.0, 0.1, 2.0, 0.05]), f32([0, 10, 0, 0]), 2, 1.5)
    assert list(idx) == [1, 0]
    assert w[0] < w[1]
    assert abs(w.sum() - 1.5) < 1e-5


def test_attention_sink_drains_weight_without_contributing_output():
    q, kv = f32([[1, 0]]), f32([[1, 0], [0, 1]])
    idx = np.array([0, 1], np.int64)
    plain = K.sparse_attend(q, kv, idx, None, 1.0)[0]
    assert plain[0] > plain[1]
    drained = K.sparse_attend(q, kv, idx, f32([20.0]), 1.0)[0]
    assert drained[0] < plain[0] * 0.01 and drained[1] < plain[1] * 0.01


def test_masked_positions_leave_the_denominator_alone():
    q, kv = f32([[1, 0]]), f32([[1, 0], [0, 1]])
    a = K.sparse_attend(q, kv, np.array([0], np.int64), None, 1.0)
    b = K.sparse_attend(q, kv, np.array([0, -1], np.int64), None, 1.0)
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_rope_tail_inverts_itself():
    inv = f32([1.0, 0.5])
    orig = f32([9, 8, 1, 2, 3, 4])
    v = orig.copy()
    c, s = rope.RopeTable(inv).at(7)
    K.rope_interleaved_tail(v, c, s, 4)
    assert (v[:2] == orig[:2]).all() and (v[2:] != orig[2:]).any()
    # interleaved pairs (2i, 2i+1), not halves
    th = 7 * 1.0
    assert abs(v[2] - (1 * math.cos(th) - 2 * math.sin(th))) < 1e-5
    K.rope_interleaved_tail(v, c, s, 4, True)
    np.testing.assert_allclose(v, orig, atol=1e-5)


def test_compressor_pools_the_window_per_dimension(isa):
    out = K.pool_by_score(f32([[1, 10], [3, 20]]), f32([[0, 0], [0, 50]]))
    assert abs(out[0] - 2.0) < 1e-5 and abs(out[1] - 20.0) < 1e-3
    assert (K.pool_by_score(f32([[1.0]]), f32([[-np.inf]])) == 0).all()


def test_overlapping_compressor_folds_both_windows(isa):
    cur_kv = f32([[1, 1, 1, 10, 20, 30], [2, 2, 2, 40, 50, 60]])
    cur_sc = f32([[0, 0, 0, 0, 0, 100], [0, 0, 0, 100, 100, 0]])
    prev_kv = f32([[7, 8, 9, 0, 0, 0], [5, 6, 7, 0, 0, 0]])
    prev_sc = f32(np.zeros((2, 6)))
    out = D.compress_overlap(prev_kv, prev_sc, cur_kv, cur_sc, 2, 3)
    np.testing.assert_allclose(out, [40, 50, 30], atol=1e-3)
    first = D.compress_overlap(None, None, cur_kv, cur_sc, 2, 3)
    assert np.isfinite(first).all() and abs(first[0] - 40) < 1e-3
    both = D.compress_overlap(prev_kv, f32(np.full((2, 6), 100.0)), cur_kv, cur_sc, 2, 3)
    assert abs(both[0] - 40) > 1.0


def test_index_scores_relu_before_weighting():
    sc = D.index_scores(f32([[1, 0], [-1, 0]]), f32([[1, 0], [0, 1]]), f32([1, 1]), 2)
    assert sc[0] > 0.9


def test_index_scores_mask_the_future():
    sc = D.index_scores(f32([[1, 0]]), f32([[1, 0], [1, 0], [1, 0]]), f32([1]), 2)
    assert np.isfinite(sc[:2]).all() and sc[2] == -np.inf
    assert list(D.top_k_positions(sc, 3)) == [0, 1]


def test_top_k_is_deterministic_on_ties():
    assert list(D.top_k_positions(f32([1, 1, 1, 0]), 2)) == [0, 1]


def test_hc_block_preserves_the_copy_structure_and_applies_the_block(isa):
    hc, dim = 4, 4
    fn = f32(((np.arange(24 * hc * dim) % 13) - 6.0) * 0.05).reshape(24, hc * dim)
    base = f32(np.sin(np.arange(24) * 0.2))
    x = f32(np.cos(np.arange(hc * dim) * 0.3)).reshape(hc, dim)
    _folded, post, comb = K.hc_pre(x, fn, f32([1, 1, 1]), base, f32(np.ones(dim)), 20, 1e-6, 1e-6)
    y = K.hc_expand(f32(np.ones(dim)), x, post, comb)
    assert y.shape == x.shape and np.isfinite(y).all() and np.abs(y - x).max() > 1e-4


@pytest.mark.parametrize("hc,dim,weighted", [(4, 37, True), (2, 64, False), (8, 16, True)])
def test_hc_pre_is_mixes_sinkhorn_and_fold_in_one_call(isa, hc, dim, weighted):
    rng = np.random.default_rng(hc * dim)
    mix = (2 + hc) * hc
    fn = f32(rng.standard_normal((mix, hc * dim)) * 0.1)
    base, sc = f32(rng.standard_normal(mix) * 0.3), f32([0.7, 1.1, 0.9])
    x = f32(rng.standard_normal((hc, dim)))
    w = f32(rng.uniform(0.5, 1.5, dim)) if weighted else None
    mixes = K.hc_mixes(x, fn, 1e-6)
    pre, post, comb = K.hc_split_sinkhorn(mixes, sc, base, hc, 20, 1e-6)
    want = K.hc_fold(x, pre, w, 1e-6)
    got = K.hc_pre(x, fn, sc, base, w, 20, 1e-6, 1e-6)
    for a, b in zip(got, (want, post, comb)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="hc_pre"):
        K.hc_pre(x, fn[1:], sc, base, w, 20, 1e-6, 1e-6)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 33, 2048])
@pytest.mark.parametrize("limit", [0.0, 0.7, 10.0])
def test_swiglu_clamp_matches_float64_on_every_isa(isa, n, limit):
    """The AVX2 twin evaluates exp on 8 lanes (Cephes), the reference with libm: both
    within float32 rounding of the float64 formula; NaN lanes as the reference."""
    rng = np.random.default_rng(n)
    g, u = f32(rng.normal(0, 3, n)), f32(rng.normal(0, 3, n))
    got = K.swiglu_clamp(g.copy(), u, limit, 0.75)
    gd, ud = g.astype(np.float64), u.astype(np.float64)
    if limit > 0:
        gd, ud = np.minimum(gd, limit), np.clip(ud, -limit, limit)
    want = gd / (1 + np.exp(-gd)) * ud * 0.75
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    if n >= 9:
        g[1], u[2] = np.nan, np.nan
        got = K.swiglu_clamp(g.copy(), u, limit, 0.75)
        assert np.isnan(got[2]) and (np.isnan(got[1]) == (limit <= 0))


def test_swiglu_extreme_gates_as_the_reference(isa):
    """Gates far below zero, where libm's expf(-g) overflows to inf and the 8-lane exp
    saturates: every ISA gives the reference's -0 there (NaN for -inf), not g / FLT_MAX."""
    g = f32([-np.inf, -1e30, -1e4, -100, -89, -88.73, np.inf, 1e30, -20, -5, 0, 5, 20, 3, -3, 1])
    u = f32(np.ones(16))
    got = K.swiglu_clamp(g.copy(), u, 0.0, 1.0)
    assert np.isnan(got[0]) and got[6] == np.inf and got[7] == np.float32(1e30)
    np.testing.assert_array_equal(got[1:6], np.zeros(5, np.float32))
    assert np.signbit(got[1:6]).all()
    want = g[8:].astype(np.float64) / (1 + np.exp(-g[8:].astype(np.float64)))
    np.testing.assert_allclose(got[8:], want, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("mix,n", [(1, 37), (4, 64), (7, 1027), (24, 256)])
def test_hc_mixes_rows_are_exactly_the_isa_dot(isa, mix, n):
    """hc_mixes works on several rows at once; each row is still exactly the ISA's
    dot (dot_f32) times the shared rsqrt."""
    rng = np.random.default_rng(mix * n)
    x, fn = f32(rng.standard_normal((1, n))), f32(rng.standard_normal((mix, n)))
    ss = np.float32(K.dot_f32(x[0], x[0]))
    r = np.float32(1) / np.sqrt(ss / np.float32(n) + np.float32(1e-6))
    want = f32([np.float32(K.dot_f32(fn[i], x[0])) * r for i in range(mix)])
    np.testing.assert_array_equal(K.hc_mixes(x, fn, 1e-6), want)


def test_hash_route_reads_the_table_row():
    t = np.array([[7, 9], [1, 2], [5, 6]])
    assert list(D.hash_route(t, 0)) == [7, 9]
    assert list(D.hash_route(t, 2)) == [5, 6]
    assert list(D.hash_route(t, 99)) == [5, 6]


def test_a_task_mask_restricts_selection_and_renormalizes():
    s = f32([0.1, 4.0, 1.0, 9.0])
    idx, w = D.route(s, None, 2, 1.0)
    assert list(idx) == [3, 1] and abs(w.sum() - 1) < 1e-5
    idx, w = D.route(s, None, 2, 1.0, mask=[True, False, True, True])
    assert list(idx) == [3, 2] and abs(w.sum() - 1) < 1e-5
    idx, w = D.route(s, None, 2, 1.0, mask=[False, False, False, True])
    assert list(idx) == [3] and len(w) == 1


def test_hash_layers_weight_the_experts_the_table_names():
    s = f32([0.1, 0.4, 0.2, 5.0])
    forced = D.hash_route(np.array([[0, 1]]), 0)
    idx, w = D.route(s, None, 2, 1.0, forced=forced)
    assert list(idx) == [0, 1]
    sp = lambda x: math.sqrt(math.log1p(math.exp(x)))  # noqa: E731
    tot = sp(0.1) + sp(0.4)
    assert abs(w[0] - sp(0.1) / tot) < 1e-6 and abs(w[1] - sp(0.4) / tot) < 1e-6
    assert D.route(s, None, 2, 1.0)[0][0] == 3


def test_swiglu_limit_clamps_up_both_ways_and_gate_only_from_above(isa):
    silu = lambda g: g / (1 + math.exp(-g))  # noqa: E731
    g = K.swiglu_clamp(f32([-50, 50, 1, -1]), f32([50, -50, 1, -1]), 10.0)
    want = [silu(-50) * 10, silu(10) * -10, silu(1), silu(-1) * -1]
    np.testing.assert_allclose(g, want, atol=1e-5)
    raw = K.swiglu_clamp(f32([-50, 50, 1, -1]), f32([50, -50, 1, -1]), 0.0)
    assert abs(raw[1] - silu(50) * -50) < 1e-3


@pytest.mark.parametrize("dtype", ["f32", "q8_row", "q4_tiled", "q4tp", "q2tp"])
@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("lora", [1, 3, 129])
def test_grouped_projection_of_several_rows_is_each_rows_own(isa, threads, dtype, n, lora):
    """x [n, groups*per]: row i is bit for bit the call with x[i] alone (the batched
    decode of DeepSeek-V4 reads wo_a once for all its rows); int8 activations too."""
    groups, per = 3, 64
    rng = np.random.default_rng(n * 7 + lora)
    T = qtensor_from_f32(f32(rng.standard_normal((groups * lora, per))), dtype)
    X = f32(rng.standard_normal((n, groups * per)))
    X[0, :5] = [0.0, -0.0, 1e-30, -3e4, 7.5]             # zeros, a denormal, a large value
    for precision in ("exact", "int8"):
        T.precision = precision
        got = K.grouped_rows(T, X, groups)
        assert got.shape == (n, groups * lora)
        for i in range(n):
            assert np.array_equal(got[i], K.grouped_rows(T, X[i].copy(), groups)), (precision, i)
    out = np.empty((n, groups * lora), np.float32)
    assert K.grouped_rows(T, X, groups, out=out) is out
    with pytest.raises(ValueError, match="floats a row"):
        K.grouped_rows(T, X[:, 1:].copy(), groups)
    with pytest.raises(ValueError, match="1-D or 2-D"):
        K.grouped_rows(T, X.reshape(1, n, -1), groups)


@pytest.mark.parametrize("dtype", ["f32", "q8_row", "q4tp"])
def test_grouped_projection_is_identical_with_any_thread_count(isa, threads, dtype):
    groups, lora, per = 4, 128, 64
    rng = np.random.default_rng(0)
    W = f32(rng.standard_normal((groups * lora, per)))
    x = f32(np.sin(np.arange(groups * per) * 13 * 0.021))
    T = qtensor_from_f32(W, dtype)
    got = K.grouped_rows(T, x, groups)
    Wd = T.dequantize().astype(np.float64)
    want = np.concatenate([Wd[g * lora:(g + 1) * lora] @ x[g * per:(g + 1) * per] for g in range(groups)])
    bound = MIX_RTOL * 64 * (np.abs(Wd) @ np.abs(np.float64(x).reshape(groups, per)).max(0).repeat(1)).max()
    assert np.abs(got - want).max() <= max(bound, 1e-4)
    # identical to matvec of each row, and to the single-thread run
    for r in (0, lora, groups * lora - 1):
        assert got[r] == T.row_dot(r, x[(r // lora) * per:(r // lora + 1) * per])
    import cortiq
    n = cortiq.get_num_threads()
    cortiq.set_num_threads(1)
    one = K.grouped_rows(T, x, groups)
    cortiq.set_num_threads(n)
    assert (one == got).all()


@pytest.mark.parametrize("dtype", ["f32", "q8_row", "q4tp"])
@pytest.mark.parametrize("groups,lora", [(1, 300), (3, 129), (4, 128), (2, 1)])
def test_grouped_rows_equal_each_rows_row_dot_across_blocks(isa, threads, dtype, groups, lora):
    """The kernel works in blocks of rows (one rows_dot call each); every row must
    still be exactly its own row_dot, whatever the block and thread boundaries."""
    per = 64
    rng = np.random.default_rng(groups * 1000 + lora)
    T = qtensor_from_f32(f32(rng.standard_normal((groups * lora, per))), dtype)
    x = f32(rng.standard_normal(groups * per))
    got = K.grouped_rows(T, x, groups)
    want = np.array([T.row_dot(r, x[(r // lora) * per:(r // lora + 1) * per])
                     for r in range(groups * lora)], np.float32)
    assert (got == want).all()


@pytest.mark.parametrize("dtype", ["f32", "q8_row", "q4tp"])
@pytest.mark.parametrize("rows", [1, 127, 128, 300])
def test_rows_sum_across_blocks_is_the_sum_of_matvecs(isa, threads, dtype, rows):
    rng = np.random.default_rng(rows)
    Ts = [qtensor_from_f32(f32(rng.standard_normal((rows, 64))), dtype) for _ in range(3)]
    xs = [f32(rng.standard_normal(64)) for _ in range(3)]
    seq = Ts[0].matvec(xs[0])
    for T, x in zip(Ts[1:], xs[1:]):
        seq = seq + T.matvec(x)
    assert (K.rows_sum(Ts, xs) == seq).all()


@pytest.mark.parametrize("dtype", ["f32", "q8_row", "q4tp", "q2tp"])
def test_rows_sum_is_the_sum_of_matvecs(isa, threads, dtype):
    rng = np.random.default_rng(1)
    Ts = [qtensor_from_f32(f32(rng.standard_normal((37, 64))), dtype) for _ in range(5)]
    xs = [f32(rng.standard_normal(64)) for _ in range(5)]
    got = K.rows_sum(Ts, xs)
    want = sum(T.dequantize().astype(np.float64) @ np.float64(x) for T, x in zip(Ts, xs))
    scale = sum(np.abs(T.dequantize()) @ np.abs(x) for T, x in zip(Ts, xs))
    assert (np.abs(got - want) <= 1e-5 * scale + 1e-6).all()
    # the same terms in the same order as separate matvecs
    seq = Ts[0].matvec(xs[0])
    for T, x in zip(Ts[1:], xs[1:]):
        seq = seq + T.matvec(x)
    assert (got == seq).all()
    with pytest.raises(ValueError, match="rows_sum"):
        K.rows_sum(Ts, xs[:2])


# ---------------------------------------------------------------- mix kernels vs float64

@pytest.mark.parametrize("hc,dim", [(4, 37), (3, 64), (4, 1027)])
def test_mix_kernels_match_float64(isa, threads, hc, dim):
    rng = np.random.default_rng(dim)
    x = f32(rng.standard_normal((hc, dim)))
    fn = f32(rng.standard_normal(((2 + hc) * hc, hc * dim)) * 0.1)
    x64 = np.float64(x)
    r = 1 / np.sqrt((x64 ** 2).mean() + 1e-6)
    want = fn.astype(np.float64) @ x64.ravel() * r
    got = K.hc_mixes(x, fn, 1e-6)
    tol = MIX_RTOL * 8 * (np.abs(fn) @ np.abs(x64.ravel())) * r + 1e-7
    assert (np.abs(got - want) <= tol).all()
    base = f32(rng.standard_normal((2 + hc) * hc))
    pre, post, comb = K.hc_split_sinkhorn(got, f32([0.7, 1.1, 0.9]), base, hc, 20, 1e-6)
    rp, rq, rc = sinkhorn_ref(got, [0.7, 1.1, 0.9], base, hc, 20, 1e-6)
    np.testing.assert_allclose(pre, rp, rtol=1e-5)
    np.testing.assert_allclose(post, rq, rtol=1e-5)
    np.testing.assert_allclose(comb, rc, atol=1e-5)
    w = f32(rng.standard_normal(dim))
    y = K.hc_fold(x, pre, w, 1e-6)
    f64 = (np.float64(pre)[:, None] * x64).sum(0)
    f64 = f64 / np.sqrt((f64 ** 2).mean() + 1e-6) * w
    np.testing.assert_allclose(y, f64, rtol=1e-4, atol=1e-5)
    blk = f32(rng.standard_normal(dim))
    e = K.hc_expand(blk, x, post, comb)
    e64 = np.float64(post)[:, None] * np.float64(blk)[None] + np.float64(comb).T @ x64
    np.testing.assert_allclose(e, e64, rtol=1e-5, atol=1e-5)
    # nan propagates through the fold
    xn = x.copy()
    xn[0, 3] = np.nan
    assert np.isnan(K.hc_fold(xn, pre)[3])


def test_mix_wrappers_check_arguments():
    with pytest.raises(TypeError, match="hc_mixes"):
        K.hc_mixes(np.zeros((4, 8)), f32(np.zeros((24, 32))), 1e-6)
    with pytest.raises(ValueError, match="hc_mixes"):
        K.hc_mixes(f32(np.zeros((4, 8))), f32(np.zeros((24, 31))), 1e-6)
    with pytest.raises(ValueError, match="hc_expand"):
        x = f32(np.zeros((4, 8)))
        K.hc_expand(f32(np.zeros(8)), x, f32(np.zeros(4)), f32(np.zeros((4, 4))), out=x)
    with pytest.raises(ValueError, match="grouped_rows"):
        K.grouped_rows(qtensor_from_f32(f32(np.zeros((6, 32))), "f32"), f32(np.zeros(64)), 4)


def test_yarn_matches_the_seed_where_they_coincide():
    # rope dim 64 (the release): the reference engine's dim/2-1 clamp and HF's dim-1 clamp agree
    inv = rope.yarn_inv_freq(64, 160000.0, 16.0, 65536, 32.0, 1.0)
    dim, base = 64, 160000.0
    cd = lambda r: dim * math.log(65536 / (2 * math.pi * r)) / (2 * math.log(base))  # noqa: E731
    low, high = max(math.floor(cd(32)), 0), min(math.ceil(cd(1)), dim // 2 - 1)
    ex = base ** (-np.arange(0, dim, 2) / dim)
    ramp = np.clip((np.arange(dim // 2) - low) / max(high - low, 1), 0, 1)
    want = ex / 16 * ramp + ex * (1 - ramp)
    np.testing.assert_allclose(inv, want, rtol=1e-5)
