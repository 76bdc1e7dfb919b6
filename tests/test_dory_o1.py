"""The exact-row choice and the options of Dory's far field (src/cortiq/models/dory/far_field.py).

No tolerances: these are orderings and integer bookkeeping, compared exactly."""
import numpy as np
import pytest

from cortiq.errors import ConfigError
from cortiq.models.dory.config import DoryTurbo
from cortiq.models.dory.far_field import (MAX_NEAR, DoryO1, ExactRows, exact_from_var, far_states,
                                          pick_exact_rows, rank_share, resolve_exact, resolve_o1,
                                          seal_order)


def test_exact_rows_take_what_the_landmarks_cannot_span():
    # Keys in a thin subspace, one row off it: the row and its neighbours come first.
    rows, nk, hd = 400, 1, 16
    ks = np.zeros((rows, hd), np.float32)
    ks[:, 0] = 1.0
    ks[:, 1] = np.sin(np.arange(rows, dtype=np.float32) * np.float32(0.01)) * np.float32(0.1)
    ks[200, 7] = 1.0
    vs = np.ones((rows, hd), np.float32)
    x = ExactRows(np.array([1.0, 0.0], np.float32), 5)
    keep = pick_exact_rows(x, [(ks, vs)], rows, nk, hd, 8, 4, 300, env={})
    assert keep == [198, 199, 200, 201, 202]


def test_pick_respects_budget_bounds_and_weights():
    rng = np.random.default_rng(0)
    rows, nk, hd = 100, 2, 8
    k = rng.standard_normal((rows, nk * hd)).astype(np.float32)
    v = rng.standard_normal((rows, nk * hd)).astype(np.float32)
    w = np.ones(2 * 2 * nk, np.float32)
    keep = pick_exact_rows(ExactRows(w, 7), [(k, v), (k, v)], rows, nk, hd, 4, 10, 60, env={})
    assert len(keep) == 7 and all(10 <= r < 60 for r in keep) and keep == sorted(keep)
    # a weight vector of the wrong length picks nothing
    assert pick_exact_rows(ExactRows(w[:3], 7), [(k, v)], rows, nk, hd, 4, 10, 60, env={}) == []
    assert pick_exact_rows(ExactRows(w, 7), [(k, v)] * 2, rows, nk, hd, 4, 60, 60, env={}) == []
    # the value-norm feature alone: the largest values win, with their neighbours
    v2 = np.ones_like(v)
    v2[33] *= 10
    wv = np.zeros(2 * nk, np.float32)
    wv[nk:] = 1
    assert pick_exact_rows(ExactRows(wv, 5), [(k, v2)], rows, nk, hd, 4, 0, 100, env={}) == \
        [31, 32, 33, 34, 35]


def test_rank_share_and_seal_order():
    np.testing.assert_array_equal(rank_share(np.array([3.0, 1.0, 2.0])), [1.0, 0.0, 0.5])
    assert rank_share(np.array([5.0]))[0] == 0.0
    assert seal_order(10, 2, [5, 6]).tolist() == [0, 1, 5, 6, 2, 3, 4, 7, 8, 9]
    assert seal_order(10, 0, []).tolist() == list(range(10))


def test_far_states_keep_sinks_plus_kept_rows():
    rng = np.random.default_rng(1)
    rows, nh, nk, hd = 200, 4, 2, 8
    ks = rng.standard_normal((rows, nk * hd)).astype(np.float32)
    vs = rng.standard_normal((rows, nk * hd)).astype(np.float32)
    qs = rng.standard_normal((-(-rows // 8), nh * hd)).astype(np.float32)
    o1 = DoryO1.of(4, 6, 1, 24)
    order = seal_order(rows, 1, [50, 51, 52])
    st = far_states(nh, nk, hd, o1, ks, vs, qs, 8, rows, order, 3)
    assert len(st) == nk
    for s in st:
        assert s.sink_len == 4 and s.far_len() + 6 + 4 == rows
        np.testing.assert_array_equal(s._sink_k[1:], ks[[50, 51, 52], :hd] if s is st[0]
                                      else ks[[50, 51, 52], hd:])


def test_options():
    assert DoryO1.parse("4,6,0,24") == DoryO1(4, 6, 0, 24)
    assert DoryO1.parse("4,6,0,3") == DoryO1(4, 6, 0, 22)          # seal >= w + sink + 16
    assert DoryO1.parse("off") is None
    for bad in ("4,6,0", "x", "2,6,0,24", (4, 0, 0, 1)):
        with pytest.raises(ConfigError):
            DoryO1.parse(bad)
    turbo = DoryTurbo(exit_bias=0.0, o1=(32, 128, 4, 1024), exact_rows=64)
    assert resolve_o1(None, turbo, env={}) == DoryO1(32, 128, 4, 1024)
    assert resolve_o1(None, turbo, env={"CORTIQ_DORY_O1": "off"}) is None
    assert resolve_o1(None, turbo, env={"CORTIQ_DORY_O1": "8,16,2,64"}) == DoryO1(8, 16, 2, 64)
    assert resolve_o1("off", turbo, env={"CORTIQ_DORY_O1": "8,16,2,64"}) is None
    assert resolve_o1(None, None, env={}) is None
    o1 = DoryO1(32, 128, 4, 1024)
    x = resolve_exact(o1, turbo, lambda: np.ones(8, np.float32), env={})
    assert x.budget == 64 and x.weights.shape == (8,)
    with pytest.raises(ConfigError, match="near field"):
        resolve_exact(o1, None, None, env={}, keyword=ExactRows(np.ones(2), MAX_NEAR))


def test_exact_from_var(tmp_path):
    f = tmp_path / "w.bin"
    np.array([9.0, 1.0, 2.0], "<f4").tofile(f)
    x = exact_from_var(f"{f}:12")
    assert x.budget == 12 and x.weights.tolist() == [1.0, 2.0]
    assert exact_from_var(f"{tmp_path / 'none'}:3").weights.size == 0
    assert exact_from_var("nocolon") is None
