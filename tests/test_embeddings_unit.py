"""cortiq.runtime.embeddings on its own: `pool` against NumPy on given hidden rows,
`hidden_states`' checks of what the model returns, and `embed`'s input checks, over
a model object whose hidden states are a formula of the ids written here.

Tolerance: VEC_ATOL = 1e-6 -- the pooled vector is computed in float64 on both sides
and rounded to float32 once; unit-norm vectors' components are <= 1.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cortiq
from cortiq.runtime.embeddings import POOLINGS, embed, hidden_states, pool
from cortiq.errors import ConfigError, ModelError
from cortiq.models.base import ModelBase
from cortiq.text.tokenizer import Tokenizer

VEC_ATOL = 1e-6
HIDDEN = 12


def rows_of(ids) -> np.ndarray:
    """The fake model's final hidden states: token- and position-dependent."""
    k = np.arange(HIDDEN, dtype=np.float64)
    out = [np.sin((t + 1) * (k + 1) * 0.37) + 0.05 * i for i, t in enumerate(ids)]
    return np.asarray(out, np.float32).reshape(len(ids), HIDDEN)


class HiddenModel(ModelBase):
    arch = "hidden"
    vocab = 256

    def __init__(self, shape_fault=None):
        self.calls = []
        self.shape_fault = shape_fault

    def new_state(self):
        return {"fed": 0}

    def forward_batch(self, states, ids_list, wants, prompts):
        raise AssertionError("embeddings read final_hidden, not forward")

    def final_hidden(self, st, ids):
        assert st == {"fed": 0}, "a fresh state per text"
        st["fed"] += len(ids)
        self.calls.append(list(ids))
        h = rows_of(list(ids))
        return h[:-1] if self.shape_fault == "short" else (
            h[0] if self.shape_fault == "flat" else h)

    def can_rollback(self, st, n):
        return False

    def rollback(self, st, n):
        raise AssertionError


def ref_pool(h, pooling):
    h = np.asarray(h, np.float64)
    v = h.mean(axis=0) if pooling == "mean" else h[-1]
    n = np.sqrt((v * v).sum())
    return v / n if n else v


hidden = st.integers(1, 8).flatmap(lambda n: st.integers(1, 16).flatmap(
    lambda d: hnp.arrays(np.float32, (n, d), elements=st.floats(-100, 100, width=32))))


@given(hidden, st.sampled_from(POOLINGS))
def test_pool_matches_numpy(h, pooling):
    got = pool(h, pooling)
    want = ref_pool(h, pooling)
    assert got.dtype == np.float32 and got.shape == (h.shape[1],)
    assert np.allclose(got, want, rtol=0, atol=VEC_ATOL)
    norm = np.linalg.norm(got.astype(np.float64))
    if np.any(want):
        assert abs(norm - 1.0) < 1e-6
    else:                                   # a zero vector stays zero (no division)
        assert norm == 0.0


def test_pool_mean_and_last_differ_as_they_should():
    h = np.array([[3.0, 0.0], [0.0, 4.0], [0.0, 4.0]], np.float32)
    assert np.allclose(pool(h, "mean"), np.array([3, 8]) / np.hypot(3, 8), atol=VEC_ATOL)
    assert np.array_equal(pool(h, "last"), np.array([0.0, 1.0], np.float32))
    assert np.array_equal(pool(np.zeros((2, 3), np.float32), "mean"), np.zeros(3))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_pool_refuses_non_finite_states(bad):
    h = np.ones((3, 4), np.float32)
    h[1, 2] = bad
    with pytest.raises(ModelError, match="non-finite"):
        pool(h, "mean")
    assert np.allclose(pool(h, "last"), 0.5)       # the last row alone is finite
    h[2, 0] = bad
    with pytest.raises(ModelError):
        pool(h, "last")


def test_hidden_states_checks_the_model():
    m = HiddenModel()
    h = hidden_states(m, [4, 5, 6])
    assert h.dtype == np.float32 and np.array_equal(h, rows_of([4, 5, 6]))
    for fault in ("short", "flat"):
        with pytest.raises(ModelError, match="shape"):
            hidden_states(HiddenModel(fault), [4, 5, 6])

    class NoHidden(ModelBase):             # ModelBase's final_hidden refuses
        arch = "plain"
        vocab = 16

        def new_state(self):
            return {}
    with pytest.raises(ConfigError, match="plain model does not give hidden states"):
        hidden_states(NoHidden(), [1])


@pytest.fixture(scope="module")
def llm():
    with cortiq.LLM.from_model(HiddenModel(), tokenizer=Tokenizer.bytes_only()) as m:
        yield m


@pytest.mark.parametrize("pooling", POOLINGS)
def test_embed_pools_each_text(llm, pooling):
    texts = ["hello", "a", [7, 8, 9, 10]]
    ids = [list(b"hello"), list(b"a"), [7, 8, 9, 10]]
    out = embed(llm, texts, pooling)
    assert out.shape == (3, HIDDEN) and out.dtype == np.float32
    for row, i in zip(out, ids):
        assert np.allclose(row, ref_pool(rows_of(i), pooling), atol=VEC_ATOL)
    one = embed(llm, "hello", pooling)
    assert one.shape == (HIDDEN,) and np.array_equal(one, out[0])
    assert llm.model.calls[-1] == list(b"hello")


@pytest.mark.parametrize("texts, match", [
    ([], "non-empty"), (b"bytes", "string"), (42, "string"), (["ok", ""], r"input\[1\]"),
    ([[1, 2], [999]], r"input\[1\].*vocabulary"), ([1.5], r"input\[0\]"),
    ([[]], r"input\[0\].*empty"),
])
def test_embed_refuses_bad_input(llm, texts, match):
    with pytest.raises(ConfigError, match=match):
        embed(llm, texts)


@pytest.mark.parametrize("pooling", ["cls", "max", "", None, "MEAN"])
def test_embed_refuses_unknown_pooling(llm, pooling):
    with pytest.raises(ConfigError, match="pooling: expected one of mean, last"):
        embed(llm, ["x"], pooling)
