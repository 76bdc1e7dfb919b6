"""NystromState (src/cortiq/models/dory/nystrom.py) and its kernels (csrc/nystrom, csrc/linalg).

Tolerances:
* GOLDEN_MAX / GOLDEN_MEAN: the contract against the reference engine's fixture (f64
  reference); the f32 streaming arithmetic reaches ~1.5e-6 max, so 1e-4 leaves room for
  the AVX2 rounding but fails on any algorithmic slip (a wrong shift, a missing row).
* EXACT_TOL: exact-only mode is plain softmax in f32 against an f64 softmax.
* ISA_TOL: ref vs AVX2 differ by FMA / accumulation order only, but the indefinite
  mixing matrix M (docs/nystrom.md §1.4) amplifies those roundings ~100x through u = F M.
* F64_TOL: the f64 helpers against numpy f64 formulas.
"""
import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortiq.kernels import _kernels
import optional
from cortiq.models.dory.nystrom import (AGGREGATE, FM, QT_STRIDE, NystromState, m_eff_for,
                                        ridge_pinv, seg_means)

# the reference engine's golden fixture (docs/nystrom.md §8), kept in tests/data
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "nystrom_golden.json")
GOLDEN_MAX, GOLDEN_MEAN = 1e-4, 1e-5
EXACT_TOL = 1e-5
ISA_TOL = 1e-4
F64_TOL = 1e-9


def lcg(seed, n):
    """The upstream tests' LCG: value = (state >> 32) / 2^31 - 1 as f32."""
    s = seed & (2**64 - 1)
    out = np.empty(n, np.float32)
    for i in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        out[i] = (s >> 32) / 2**31 - 1.0
    return out


def rows(rng, t, d, scale=1.0):
    return (rng.standard_normal((t, d)) * scale).astype(np.float32)


def golden():
    with open(GOLDEN) as fh:
        return json.load(fh)


@pytest.mark.parametrize("sink_key", [("sink", "out"), (0, "out_sink0")])
def test_golden(isa, sink_key):
    g = golden()
    sink = g["sink"] if sink_key[0] == "sink" else 0
    q, k, v = (np.array(g[x], np.float32) for x in "qkv")
    p, t = g["p"], g["t"]
    s = NystromState.new_group(g["m"], g["w"], sink, 1, rect=AGGREGATE)
    s.prefill_group([q[:p]], k[:p], v[:p])
    assert s.far_len() == p - sink - g["w"]
    ys = np.array([s.step_group(q[i], k[i], v[i])[0] for i in range(p, t)])
    err = np.abs(ys.astype(np.float64) - np.array(g[sink_key[1]])[p:t])
    assert err.max() <= GOLDEN_MAX and err.mean() <= GOLDEN_MEAN, (err.max(), err.mean())


def _run(seed, t, p, d, dv, m, w, sink, rep, rect=AGGREGATE, qscale=1.0):
    rng = np.random.default_rng(seed)
    ks, vs = rows(rng, t, d, qscale), rows(rng, t, dv)
    qs = rows(rng, rep * t, d, qscale).reshape(rep, t, d)
    s = NystromState.new_group(m, w, sink, rep, rect)
    s.prefill_group(qs[:, :p], ks[:p], vs[:p])
    ys = [s.step_group(np.ascontiguousarray(qs[:, i]), ks[i], vs[i]) for i in range(p, t)]
    return s, np.array(ys), (qs, ks, vs)


def test_ref_and_avx2_agree():
    optional.need_that("isa", "avx2" in _kernels.usable_isas(), "no AVX2 table usable here")
    before = _kernels.active_isa()
    out = {}
    try:
        for isa in ("ref", "avx2"):
            _kernels.set_isa(isa)
            out[isa] = _run(5, 150, 110, 37, 19, 8, 13, 3, 2)[1]
    finally:
        _kernels.set_isa(before)
    np.testing.assert_allclose(out["avx2"], out["ref"], atol=ISA_TOL, rtol=0)


def test_gqa_group_equals_independent_heads(isa):
    rng = np.random.default_rng(4242)
    d, dv, m, w, sink, t, p, rep = 16, 8, 8, 16, 4, 200, 120, 4
    ks, vs = rows(rng, t, d, 2.0), rows(rng, t, dv)
    qs = rows(rng, rep * t, d, 2.0).reshape(rep, t, d)
    g = NystromState.new_group(m, w, sink, rep)
    g.prefill_group(qs[:, :p], ks[:p], vs[:p])
    singles = []
    for h in range(rep):
        s = NystromState.new(m, w, sink)
        s.prefill_group([qs[h, :p]], ks[:p], vs[:p])
        singles.append(s)
    for i in range(p, t):
        y = g.step_group(np.ascontiguousarray(qs[:, i]), ks[i], vs[i])
        for h, s in enumerate(singles):
            assert np.array_equal(y[h], s.step_group(qs[h, i], ks[i], vs[i])[0])
    assert g.memory_bytes() < sum(s.memory_bytes() for s in singles)


def test_eviction_bookkeeping():
    d, dv, m, w, sink, t, p, rep = 8, 4, 4, 16, 4, 90, 64, 3
    s, _, _ = _run(99, p, p, d, dv, m, w, sink, rep)
    assert all(s.far_len(h) == p - sink - w == 44 for h in range(rep))
    s2, _, _ = _run(99, t, p, d, dv, m, w, sink, rep)
    assert s2.far_len() + w + sink == t and s2.rows_seen == t


def test_short_prompt_is_exact_softmax(isa):
    d, dv, m, w, sink, t, p = 16, 8, 4, 32, 4, 20, 12
    s, ys, (qs, ks, vs) = _run(7, t, p, d, dv, m, w, sink, 1)
    assert s.exact_only and s.sink_len == 0
    for j, i in enumerate(range(p, t)):
        sc = ks[: i + 1].astype(np.float64) @ qs[0, i].astype(np.float64) / math.sqrt(d)
        e = np.exp(sc - sc.max())
        want = e @ vs[: i + 1].astype(np.float64) / e.sum()
        np.testing.assert_allclose(ys[j, 0], want, atol=EXACT_TOL, rtol=0)
    assert s.memory_bytes() == 4 * t * (d + dv) + 4 * t


def test_exact_only_grows_past_its_buffer():
    s, ys, _ = _run(8, 200, 10, 8, 4, 4, 64, 2, 2)
    assert s.exact_only and s.win_len == 200 and np.isfinite(ys).all()


def test_fm_keeps_the_value_hull():
    d, dv, m, w, sink, t, p = 16, 4, 32, 16, 4, 320, 256
    x = lcg(777, t * d * 2 + t * dv)
    q = x[: t * d].reshape(t, d) * 3
    k = x[t * d: 2 * t * d].reshape(t, d) * 3
    v = (x[2 * t * d:].reshape(t, dv) + 1.0).astype(np.float32)   # in [0, 2)
    s = NystromState.new_group(m, w, sink, 1, rect=FM)
    s.prefill_group([q[:p]], k[:p], v[:p])
    assert s.m_eff == 32
    lo, hi = v.min(0), v.max(0)
    for i in range(p, t):
        y = s.step_group(q[i], k[i], v[i])[0]
        assert (y >= lo - 1e-3).all() and (y <= hi + 1e-3).all()


def test_memory_bytes_formula_and_constant():
    d, dv, m, w, sink, rep = 128, 128, 32, 128, 4, 4
    s = NystromState.new_group(m, w, sink, rep)
    rng = np.random.default_rng(1)
    t = 400
    s.prefill_group(rows(rng, rep * t, d).reshape(rep, t, d), rows(rng, t, d), rows(rng, t, dv))
    assert s.m_eff == 32
    assert s.memory_bytes() == 151_552 + rep * 38_032 == 303_680
    for _ in range(5):
        s.step_group(rows(rng, rep, d), rows(rng, 1, d), rows(rng, 1, dv))
    assert s.memory_bytes() == 303_680


def test_snapshot_restore_is_bit_exact(isa):
    rng = np.random.default_rng(11)
    d, dv, rep, t = 32, 32, 2, 110
    ks, vs = rows(rng, t, d), rows(rng, t, dv)
    qs = rows(rng, rep * t, d).reshape(rep, t, d)
    s = NystromState.new_group(8, 16, 2, rep)
    s.prefill_group(qs[:, :96], ks[:96], vs[:96])
    for i in range(96, 100):
        s.step_group(np.ascontiguousarray(qs[:, i]), ks[i], vs[i])
    snap = s.snapshot()
    a = [s.step_group(np.ascontiguousarray(qs[:, i]), ks[i], vs[i]) for i in range(100, 103)]
    s.restore(snap)
    assert s.far_len() == snap.far_len and s.rows_seen == 100
    b = [s.step_group(np.ascontiguousarray(qs[:, i]), ks[i], vs[i]) for i in range(100, 103)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


@settings(max_examples=20, deadline=None)
@given(t=st.integers(4, 90), extra=st.integers(1, 12), w=st.integers(1, 20),
       sink=st.integers(0, 6), rep=st.integers(1, 3), seed=st.integers(0, 2**16),
       fm=st.booleans())
def test_restep_after_step_equals_a_plain_step(isas, t, extra, w, sink, rep, seed, fm):
    d, dv = 8, 5
    rng = np.random.default_rng(seed)
    n = t + extra
    ks, vs = rows(rng, n, d), rows(rng, n, dv)
    qs = rows(rng, rep * n, d).reshape(rep, n, d)
    q2, k2, v2 = rows(rng, rep, d), rows(rng, 1, d)[0], rows(rng, 1, dv)[0]
    before = _kernels.active_isa()
    for isa in isas:
        _kernels.set_isa(isa)
        a = NystromState.new_group(4, w, sink, rep, FM if fm else AGGREGATE)
        b = NystromState.new_group(4, w, sink, rep, FM if fm else AGGREGATE)
        for s in (a, b):
            s.prefill_group(qs[:, :t], ks[:t], vs[:t])
            for i in range(t, n - 1):
                s.step_group(np.ascontiguousarray(qs[:, i]), ks[i], vs[i])
        a.step_group(np.ascontiguousarray(qs[:, n - 1]), ks[n - 1], vs[n - 1])
        mem = a.memory_bytes()
        far = a.far_len()
        a.restep_group(rows(rng, rep, d), rows(rng, 1, d)[0], rows(rng, 1, dv)[0])
        ya = a.restep_group(q2, k2, v2)
        yb = b.step_group(q2, k2, v2)
        assert np.array_equal(ya, yb)
        assert a.far_len() == far == b.far_len() and a.memory_bytes() == mem
        sa, sb = a.snapshot(), b.snapshot()
        for f in ("win_k", "win_v", "t_hat", "z_hat", "m_max"):
            assert np.array_equal(getattr(sa, f), getattr(sb, f)), f
        assert (sa.win_len, sa.win_head) == (sb.win_len, sb.win_head)
        # and the next step agrees too
        assert np.array_equal(a.step_group(q2, k2, v2),
                              b.step_group(q2, k2, v2))
    _kernels.set_isa(before)


@settings(max_examples=25, deadline=None)
@given(t=st.integers(2, 150), steps=st.integers(0, 40), w=st.integers(1, 40),
       sink=st.integers(0, 10), m=st.integers(4, 40))
def test_far_len_window_and_sinks_add_up_to_rows_seen(t, steps, w, sink, m):
    rng = np.random.default_rng(t * 1000 + steps)
    d = 4
    n = t + steps
    ks, vs, qs = rows(rng, n, d), rows(rng, n, d), rows(rng, n, d)
    s = NystromState.new_group(m, w, sink, 1)
    s.prefill_group([qs[:t]], ks[:t], vs[:t])
    for i in range(t, n):
        s.step_group(qs[i], ks[i], vs[i])
        assert s.far_len() + s.win_len + s.sink_len == s.rows_seen == i + 1
    assert s.far_len() + s.win_len + s.sink_len == n
    if not s.exact_only:
        assert s.m_eff == m_eff_for(t, m) and s.win_len == w and s.sink_len == sink
        assert s.far_len() == n - sink - w


def test_custom_order_keeps_sinks_and_kept_rows():
    rng = np.random.default_rng(3)
    t, d, n_s, n_e, w = 120, 8, 2, 5, 16
    ks, vs, qs = rows(rng, t, d), rows(rng, t, d), rows(rng, t, d)
    order = np.r_[0:n_s, [40, 41, 42, 77, 90], [r for r in range(n_s, t) if r not in (40, 41, 42, 77, 90)]]
    s = NystromState.new_group(8, w, n_s + n_e, 1)
    s.prefill_group([qs[order]], ks[order], vs[order])
    assert s.sink_len == n_s + n_e
    assert s.far_len() + w + s.sink_len == t
    np.testing.assert_array_equal(s._sink_k, ks[order[: n_s + n_e]])


def test_strided_query_trace():
    """A trace of one row in QT_STRIDE equals the full trace with those rows repeated."""
    rng = np.random.default_rng(4)
    t, d, rep = 203, 8, 2
    ks, vs = rows(rng, t, d), rows(rng, t, d)
    trace = rows(rng, rep * -(-t // QT_STRIDE), d).reshape(rep, -1, d)
    full = np.ascontiguousarray(np.repeat(trace, QT_STRIDE, axis=1)[:, :t])
    a, b = NystromState.new_group(16, 12, 2, rep), NystromState.new_group(16, 12, 2, rep)
    a.prefill_group(trace, ks, vs)
    b.prefill_group(full, ks, vs)
    assert np.array_equal(a._q_tilde, b._q_tilde) and np.array_equal(a._mu, b._mu)
    q = rows(rng, rep, d)
    assert np.array_equal(a.step_group(q, ks[0], vs[0]), b.step_group(q, ks[0], vs[0]))


def test_seg_means_and_ridge_pinv_match_numpy():
    rng = np.random.default_rng(5)
    x = rows(rng, 53, 7)
    idx = rng.permutation(53).astype(np.uint32)
    got = seg_means(x, 6, idx)
    xs = x[idx].astype(np.float64)
    want = np.array([xs[a * 53 // 6:(a + 1) * 53 // 6].mean(0) for a in range(6)])
    np.testing.assert_allclose(got, want, atol=F64_TOL)
    a = np.exp(rng.standard_normal((6, 6)) * 0.3)
    g = a.T @ a
    lam = 1e-6 * np.mean(np.diag(g))
    want = np.linalg.solve(g + lam * np.eye(6), a.T)
    np.testing.assert_allclose(ridge_pinv(a), want, rtol=1e-7, atol=F64_TOL)
    # a singular A still gives a finite M (ridge retries)
    assert np.isfinite(ridge_pinv(np.ones((5, 5)))).all()


def test_key_residuals_match_numpy():
    rng = np.random.default_rng(6)
    rows_, nk, hd, m = 40, 2, 8, 5
    k = rows(rng, rows_, nk * hd)
    got = _kernels.key_residuals(k, m, hd, hd)
    kh = k[:, hd:].astype(np.float64)
    L = np.array([kh[a * rows_ // m:(a + 1) * rows_ // m].mean(0) for a in range(m)])
    G = L @ L.T + 1e-4 * np.eye(m)
    y = kh @ L.T
    c = np.linalg.solve(G, y.T).T
    want = (kh * kh).sum(1) - (c * y).sum(1) - 1e-4 * (c * c).sum(1)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_errors():
    with pytest.raises(ValueError):
        NystromState.new_group(3, 8, 0, 1)
    with pytest.raises(ValueError):
        NystromState.new_group(4, 0, 0, 1)
    with pytest.raises(ValueError):
        NystromState.new_group(4, 8, 0, 0)
    s = NystromState.new_group(4, 8, 0, 2)
    with pytest.raises(RuntimeError):
        s.step_group(np.zeros((2, 4), np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32))
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        s.prefill_group([rows(rng, 30, 4)], rows(rng, 30, 4), rows(rng, 30, 4))   # 1 block, rep 2
    s.prefill_group([rows(rng, 30, 4)] * 2, rows(rng, 30, 4), rows(rng, 30, 4))
    with pytest.raises(ValueError):
        s.step_group(np.zeros((1, 4), np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(TypeError):
        s.step_group(np.zeros((2, 4)), np.zeros(4, np.float32), np.zeros(4, np.float32))


@pytest.mark.parametrize("t0", [12, 150])   # exact-only and skeleton
def test_step_rows_equals_step_group(isa, t0):
    rng = np.random.default_rng(t0)
    nk, rep, d, t = 2, 3, 8, 40
    ks, vs = rows(rng, t0 + t, nk * d), rows(rng, t0 + t, nk * d)
    qs = rows(rng, t0 + t, nk * rep * d)
    a = [NystromState.new_group(8, 16, 2, rep) for _ in range(nk)]
    b = [NystromState.new_group(8, 16, 2, rep) for _ in range(nk)]
    for kh in range(nk):
        q3 = qs[:t0, kh * rep * d:(kh + 1) * rep * d].reshape(t0, rep, d).transpose(1, 0, 2)
        for s in (a[kh], b[kh]):
            s.prefill_group(q3, ks[:t0, kh * d:(kh + 1) * d], vs[:t0, kh * d:(kh + 1) * d])
    ya = np.zeros((t, nk * rep * d), np.float32)
    for kh, s in enumerate(a):
        s.step_rows(qs[t0:], ks[t0:], vs[t0:], ya, kh * rep * d, kh * d, kh * d, kh * rep * d)
    for r in range(t):
        for kh, s in enumerate(b):
            y = s.step_group(qs[t0 + r, kh * rep * d:(kh + 1) * rep * d],
                             ks[t0 + r, kh * d:(kh + 1) * d], vs[t0 + r, kh * d:(kh + 1) * d])
            assert np.array_equal(y.reshape(-1), ya[r, kh * rep * d:(kh + 1) * rep * d])
    assert a[0].rows_seen == t0 + t


def test_a_nan_far_denominator_drops_the_far_field(isa):
    """The aggregate guard's `>= 0` test also catches NaN: the row reads sinks + window."""
    rng = np.random.default_rng(12)
    t, d, w, sink = 120, 8, 16, 2
    ks, vs, qs = rows(rng, t, d), rows(rng, t, d), rows(rng, t, d)
    a, b = NystromState.new(8, w, sink), NystromState.new(8, w, sink)
    a.prefill_group([qs], ks, vs)
    b.prefill_group([qs], ks, vs)
    a._z_hat[0, 0] = np.nan
    q = rows(rng, 1, d)
    y = a.readout(q)[0]
    assert np.isfinite(y).all()
    near_k = np.r_[ks[:sink], b._win_k].astype(np.float64)
    near_v = np.r_[vs[:sink], b._win_v].astype(np.float64)
    sc = near_k @ q[0].astype(np.float64) / math.sqrt(d)
    e = np.exp(sc - sc.max())
    np.testing.assert_allclose(y, e @ near_v / e.sum(), atol=EXACT_TOL)


def test_misaligned_rows_give_the_same_answer(isa):
    rng = np.random.default_rng(13)
    t, d, dv, rep = 100, 13, 7, 2
    ks, vs = rows(rng, t, d), rows(rng, t, dv)
    qs = rows(rng, rep * t, d).reshape(rep, t, d)
    s = NystromState.new_group(8, 9, 1, rep)
    s.prefill_group(qs, ks, vs)
    q, k, v = rows(rng, rep, d), rows(rng, 1, d)[0], rows(rng, 1, dv)[0]
    snap = s.snapshot()
    want = s.step_group(q, k, v)
    s.restore(snap)

    def shifted(a):
        buf = np.zeros(a.size + 1, np.float32)
        buf[1:] = a.reshape(-1)
        return buf[1:].reshape(a.shape)
    out = shifted(np.zeros((rep, dv), np.float32))
    got = s.step_group(shifted(q), shifted(k), shifted(v), out)
    assert np.array_equal(got, want)
