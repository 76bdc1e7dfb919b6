"""The fused Dory sub-layer kernels (qk_prep, slerp, gate_norm): on every ISA each one
equals the composition of the separate kernels bit for bit (same operations in the same
order), and matches a float64 numpy transcription.

REL = 1e-5: a justnorm in float32 (sum of squares over <= 300 terms, one rsqrt) against
float64, plus the rotary's two roundings."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortiq.kernels import _kernels as K

REL = 1e-5


def _f64_justnorm(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


@given(t=st.integers(1, 5), heads=st.integers(1, 6), half=st.integers(1, 40),
       seed=st.integers(0, 2**31), scaled=st.booleans())
def test_qk_prep(isas, t, heads, half, seed, scaled):
    rng = np.random.default_rng(seed)
    hd = 2 * half
    x = rng.normal(size=(t, heads, hd)).astype(np.float32)
    ang = rng.uniform(0, 6.3, (t, half))
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    w = rng.uniform(0.5, 2, heads * hd).astype(np.float32) if scaled else None
    for isa in isas:
        K.set_isa(isa)
        want = x.copy()
        K.rope_halfsplit(want, c, s)
        K.justnorm(want)
        if w is not None:
            want *= w.reshape(heads, hd)
        got = K.qk_prep(x.copy(), c, s, w)
        np.testing.assert_array_equal(got, want)
        a, b = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
        cc, ss = c[:, None, :], s[:, None, :]
        ref = _f64_justnorm(np.concatenate([a * cc - b * ss, a * ss + b * cc], -1))
        if w is not None:
            ref = ref * w.reshape(heads, hd)
        np.testing.assert_allclose(got, ref, rtol=REL, atol=1e-6)


@given(rows=st.integers(1, 4), n=st.integers(1, 300), seed=st.integers(0, 2**31))
def test_slerp(isas, rows, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, n)).astype(np.float32)
    o = rng.normal(size=(rows, n)).astype(np.float32)
    al = rng.uniform(0, 1, n).astype(np.float32)
    for isa in isas:
        K.set_isa(isa)
        xs, os_ = x.copy(), o.copy()
        K.justnorm(xs)
        K.justnorm(os_)
        os_ -= xs
        os_ *= al
        xs += os_
        K.justnorm(xs)
        got = K.slerp(x.copy(), o.copy(), al)
        np.testing.assert_array_equal(got, xs)
        xh, oh = _f64_justnorm(x.astype(np.float64)), _f64_justnorm(o.astype(np.float64))
        ref = _f64_justnorm(xh + al * (oh - xh))
        np.testing.assert_allclose(got, ref, rtol=REL, atol=2e-6)


@pytest.mark.parametrize("n", [1, 7, 8, 33, 256])
def test_gate_norm(isa, n):
    rng = np.random.default_rng(n)
    y = rng.normal(size=(3, n)).astype(np.float32)
    g = rng.normal(0, 3, (3, n)).astype(np.float32)
    s = rng.uniform(0.5, 2, n).astype(np.float32)
    want = K.justnorm(K.gate_mul(y.copy(), g, s))
    got = K.gate_norm(y.copy(), g, s)
    np.testing.assert_array_equal(got, want)
    ref = _f64_justnorm(y.astype(np.float64) / (1 + np.exp(-(g.astype(np.float64) * s))))
    np.testing.assert_allclose(got, ref, rtol=REL, atol=1e-6)


def test_fused_argument_errors():
    z = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="qk_prep: cos and sin"):
        K.qk_prep(z, np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="qk_prep: head dim 3"):
        K.qk_prep(np.zeros((1, 1, 3), np.float32), np.zeros(1, np.float32), np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="qk_prep: scale"):
        K.qk_prep(z, np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32),
                  np.zeros(5, np.float32))
    x = np.ones((2, 5), np.float32)
    with pytest.raises(ValueError, match="slerp: x and out must not overlap"):
        K.slerp(x, x, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="slerp: alpha"):
        K.slerp(x, x.copy(), np.ones(4, np.float32))
    with pytest.raises(ValueError, match="gate_norm: s"):
        K.gate_norm(x, x.copy(), np.ones(4, np.float32))
    with pytest.raises(TypeError, match="gate_norm: y must be a float32"):
        K.gate_norm(x.astype(np.float64), x, np.ones(5, np.float32))


# ---- the Dory decode rows: one sub-layer per call -------------------------------------
def _qt(rng, rows, cols, dtype):
    from cortiq.cmf.testing import qtensor_from_f32
    return qtensor_from_f32(rng.normal(0, 0.3, (rows, cols)).astype(np.float32), dtype)


def _attn_case(seed, dtype, nh=4, nk=2, hd=16, hidden=64):
    rng = np.random.default_rng(seed)
    ws = [_qt(rng, r, hidden, dtype) for r in (nh * hd, nk * hd, nk * hd, nh * hd)]
    ws.append(_qt(rng, hidden, nh * hd, dtype))
    vec = lambda n: rng.uniform(0.2, 1.5, n).astype(np.float32)  # noqa: E731
    ang = rng.uniform(0, 6.3, hd // 2)
    return dict(ws=ws, h=K.justnorm(rng.normal(size=hidden).astype(np.float32)),
                sq=vec(nh * hd), sg=vec(nh * hd), alpha=vec(hidden) * 0.1,
                cos=np.cos(ang).astype(np.float32), sin=np.sin(ang).astype(np.float32),
                keys=rng.normal(size=(40, nk, hd)).astype(np.float32),
                vals=rng.normal(size=(40, nk, hd)).astype(np.float32), nh=nh, nk=nk, hd=hd)


def _attn_separate(c, row, first, pos, window, scale):
    """dory.py's general path for one row, call by call."""
    wq, wk, wv, wg, wo = c["ws"]
    nh, nk, hd = c["nh"], c["nk"], c["hd"]
    h, keys, vals = c["h"].copy()[None], c["keys"].copy(), c["vals"].copy()
    q, k, v, g = K.matvec_many([w.qmat for w in (wq, wk, wv, wg)], h[0])
    q, k = q.reshape(1, nh, hd), k.reshape(1, nk, hd)
    K.qk_prep(q, c["cos"][None], c["sin"][None], c["sq"])
    K.qk_prep(k, c["cos"][None], c["sin"][None], None)
    keys[row], vals[row] = k[0], v.reshape(nk, hd)
    y = K.attn_gqa_window(q, keys[:row + 1], vals[:row + 1], pos, window, first, scale)
    y = y.reshape(1, nh * hd)
    K.gate_norm(y, g[None], c["sg"])
    K.slerp(h, wo.matvec(y[0])[None], c["alpha"])
    return h[0], keys, vals


@pytest.mark.parametrize("dtype", ["f32", "q8_row"])
@pytest.mark.parametrize("row,first,window", [(0, 0, 0), (9, 0, 4), (17, 30, 0), (39, 3, 8)])
def test_dory_attn_row_equals_the_separate_calls(isa, dtype, row, first, window):
    c = _attn_case(row * 7 + window, dtype)
    pos, scale = first + row, float(np.float32(c["hd"] ** -0.5))
    want_h, want_k, want_v = _attn_separate(c, row, first, pos, window, scale)
    h, keys, vals = c["h"].copy(), c["keys"].copy(), c["vals"].copy()
    scratch = np.full(K.dory_attn_scratch(h.size, c["nh"] * c["hd"]) + 5, np.nan, np.float32)
    K.dory_attn_row(*(w.qmat for w in c["ws"]), h, c["sq"], c["sg"], c["alpha"], c["cos"],
                    c["sin"], keys, vals, row, first, pos, window, scale, scratch)
    np.testing.assert_array_equal(h, want_h)
    np.testing.assert_array_equal(keys, want_k)
    np.testing.assert_array_equal(vals, want_v)


def test_dory_attn_row_refuses_bad_arguments():
    c = _attn_case(1, "f32")
    h, keys, vals = c["h"].copy(), c["keys"].copy(), c["vals"].copy()
    scratch = np.empty(K.dory_attn_scratch(h.size, c["nh"] * c["hd"]), np.float32)
    mats = [w.qmat for w in c["ws"]]

    def call(**kw):
        a = dict(h=h, sq=c["sq"], sg=c["sg"], alpha=c["alpha"], cos=c["cos"], sin=c["sin"],
                 keys=keys, vals=vals, row=3, first=0, pos=3, window=0, scale=0.25,
                 scratch=scratch)
        a.update(kw)
        K.dory_attn_row(*mats, a["h"], a["sq"], a["sg"], a["alpha"], a["cos"], a["sin"],
                        a["keys"], a["vals"], a["row"], a["first"], a["pos"], a["window"],
                        a["scale"], a["scratch"])
    call()
    with pytest.raises(ValueError, match="at least"):
        call(scratch=scratch[:-1])
    with pytest.raises(ValueError, match="keys must hold at least"):
        call(row=40, pos=40)
    with pytest.raises(ValueError, match="not in the cache"):
        call(pos=4)
    with pytest.raises(ValueError, match="overlap"):
        call(scratch=keys.reshape(-1))
    with pytest.raises(TypeError, match="float32"):
        call(h=h.astype(np.float64))
    with pytest.raises(ValueError, match="read-only"):
        ro = h.copy()
        ro.flags.writeable = False
        call(h=ro)
    with pytest.raises(ValueError, match="weight shapes"):
        K.dory_attn_row(mats[0], mats[1], mats[2], mats[3], mats[1], h, c["sq"], c["sg"],
                        c["alpha"], c["cos"], c["sin"], keys, vals, 3, 0, 3, 0, 0.25, scratch)


@pytest.mark.parametrize("dtype", ["f32", "q8_row"])
@pytest.mark.parametrize("hidden,ffn", [(32, 64), (64, 96)])
def test_dory_mlp_row_equals_the_separate_calls(isa, dtype, hidden, ffn):
    rng = np.random.default_rng(hidden + ffn)
    wg, wu = _qt(rng, ffn, hidden, dtype), _qt(rng, ffn, hidden, dtype)
    wd = _qt(rng, hidden, ffn, dtype)
    h = K.justnorm(rng.normal(size=hidden).astype(np.float32))
    sg = rng.uniform(0.5, 2, ffn).astype(np.float32)
    su = rng.uniform(0.5, 2, ffn).astype(np.float32)
    alpha = rng.uniform(0, 0.2, hidden).astype(np.float32)
    want = h.copy()[None]
    g, u = K.matvec_many([wg.qmat, wu.qmat], want[0])
    K.silu_mul(g[None], u[None], sg, su)
    K.justnorm(g)
    K.slerp(want, wd.matvec(g)[None], alpha)
    got = h.copy()
    scratch = np.empty(K.dory_mlp_scratch(hidden, ffn), np.float32)
    K.dory_mlp_row(wg.qmat, wu.qmat, wd.qmat, got, sg, su, alpha, scratch)
    np.testing.assert_array_equal(got, want[0])
    with pytest.raises(ValueError, match="at least"):
        K.dory_mlp_row(wg.qmat, wu.qmat, wd.qmat, got, sg, su, alpha, scratch[:-1])
    with pytest.raises(ValueError, match="weight shapes"):
        K.dory_mlp_row(wg.qmat, wu.qmat, wg.qmat, got, sg, su, alpha, scratch)


def test_fused_rows_read_the_process_precision_in_force(isa):
    """Matrices that follow the process default (precision None), the default moved
    after they were last used: the fused Dory rows multiply with the default now in
    force, as the separate calls do (not with the one their matrices last saw)."""
    from cortiq.kernels import _config
    before = _config.get_precision()
    rng = np.random.default_rng(7)
    hidden, ffn = 64, 96
    wg, wu, wd = _qt(rng, ffn, hidden, "q8_row"), _qt(rng, ffn, hidden, "q8_row"), \
        _qt(rng, hidden, ffn, "q8_row")
    h = K.justnorm(rng.normal(size=hidden).astype(np.float32))
    sg, su = (rng.uniform(0.5, 2, ffn).astype(np.float32) for _ in range(2))
    alpha = rng.uniform(0, 0.2, hidden).astype(np.float32)
    c = _attn_case(3, "q8_row")
    pos, scale = 5, float(np.float32(c["hd"] ** -0.5))

    def separate():
        want = h.copy()[None]
        g, u = K.matvec_many([wg.qmat, wu.qmat], want[0])
        K.silu_mul(g[None], u[None], sg, su)
        K.justnorm(g)
        K.slerp(want, wd.matvec(g)[None], alpha)
        return want[0], _attn_separate(c, 5, 0, pos, 0, scale)[0]

    def fused():
        got = h.copy()
        K.dory_mlp_row(wg.qmat, wu.qmat, wd.qmat, got, sg, su, alpha,
                       np.empty(K.dory_mlp_scratch(hidden, ffn), np.float32))
        ha, keys, vals = c["h"].copy(), c["keys"].copy(), c["vals"].copy()
        K.dory_attn_row(*(w.qmat for w in c["ws"]), ha, c["sq"], c["sg"], c["alpha"],
                        c["cos"], c["sin"], keys, vals, 5, 0, pos, 0, scale,
                        np.empty(K.dory_attn_scratch(ha.size, c["nh"] * c["hd"]), np.float32))
        return got, ha
    try:
        _config.set_precision("exact")
        for w in (wg, wu, wd, *c["ws"]):
            w.precision = None          # resolved now: exact
        exact = separate()
        _config.set_precision("int8")
        got = fused()                   # before any separate call re-resolves them
        want = separate()
    finally:
        _config.set_precision(before)
    for g, w, e in zip(got, want, exact):
        np.testing.assert_array_equal(g, w)
        assert not np.array_equal(g, e)     # the two precisions differ here
