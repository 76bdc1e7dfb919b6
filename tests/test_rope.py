"""models/rope.py: the rotary tables every architecture reads, against float64 NumPy
transcriptions of the formulas, and the block cache against direct evaluation."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortiq.models import rope


@pytest.mark.parametrize("dim,theta", [(8, 1e4), (64, 5e5), (128, 1e6), (6, 10.0)])
def test_inverse_frequencies_follow_the_formula(dim, theta):
    want = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    for f64 in (False, True):
        got = rope.inv_freq(dim, theta, f64=f64)
        assert got.dtype == np.float32 and got.shape == (dim // 2,)
        np.testing.assert_allclose(got, want, rtol=3e-7 if f64 else 2e-6)
    # float64 rounded once is the correctly rounded value
    assert (rope.inv_freq(dim, theta, f64=True) == want.astype(np.float32)).all()


def test_yarn_blends_interpolated_and_extrapolated():
    dim, theta, factor, orig = 64, 1e4, 8.0, 4096
    inv = rope.yarn_inv_freq(dim, theta, factor, orig)
    base = rope.inv_freq(dim, theta)
    # the fastest pairs keep their frequency, the slowest are divided by the factor
    np.testing.assert_allclose(inv[0], base[0], rtol=1e-6)
    np.testing.assert_allclose(inv[-1], base[-1] / factor, rtol=1e-6)
    assert (inv <= base * (1 + 1e-6)).all() and (inv >= base / factor * (1 - 1e-6)).all()
    assert rope.yarn_attention_factor(1.0) == 1.0
    assert rope.yarn_attention_factor(4.0) == pytest.approx(0.1 * math.log(4.0) + 1.0)


@given(pos0=st.integers(0, 5000), t=st.integers(1, 70), f64=st.booleans(),
       block=st.sampled_from([0, 1, 16, 64]), scale=st.sampled_from([1.0, 1.25]))
def test_table_matches_float64_and_the_block_cache_is_exact(pos0, t, f64, block, scale):
    inv = rope.inv_freq(16, 1e4, f64=True)
    tab = rope.RopeTable(inv, scale, f64=f64, block=block)
    c, s = tab(pos0, t)
    ang = np.arange(pos0, pos0 + t, dtype=np.float64)[:, None] * inv.astype(np.float64)
    assert c.shape == s.shape == (t, 8) and c.dtype == np.float32
    np.testing.assert_allclose(c, scale * np.cos(ang), atol=2e-3 * (1 + pos0 * 1e-3))
    np.testing.assert_allclose(s, scale * np.sin(ang), atol=2e-3 * (1 + pos0 * 1e-3))
    # the cached block gives the very floats a direct evaluation gives, row by row
    plain = rope.RopeTable(inv, scale, f64=f64)
    for p in range(pos0, pos0 + min(t, 5)):
        a, b = tab.at(p), plain(p, 1)
        assert (a[0] == b[0][0]).all() and (a[1] == b[1][0]).all()
    dc, ds = plain(pos0, t)
    assert (dc == c).all() and (ds == s).all()
