"""The fused Dory sub-layer kernels (qk_prep, slerp, gate_norm): on every ISA each one
equals the composition of the separate kernels bit for bit (same operations in the same
order), and matches a float64 numpy transcription.

REL = 1e-5: a justnorm in float32 (sum of squares over <= 300 terms, one rsqrt) against
float64, plus the rotary's two roundings."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortiq import _kernels as K

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
