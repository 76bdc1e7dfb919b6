"""matvec_batch: several inputs against the same matrices in one pass over the weights.

Every row must equal the matvec of its input: bit for bit for one input, for int8
activations and for the dtypes without a multi-input row kernel; within float32
rounding (of sum |w x|, the exactness contract of cortiq.tensor) where a SIMD table
decodes each weight once for all inputs (f32 and q8_row on AVX2 / AVX-512). Shapes
include odd column counts, tiny and tall matrices, and any thread count.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortiq import _kernels as K
from cortiq.tensor import QTensor

MULTI = ("f32", "q8_row")          # dtypes with multi-input rows in the SIMD tables


def _check(T, X, isa):
    out = K.matvec_batch([T.qmat], X)[0]
    ref = np.stack([T.matvec(x) for x in X]) if X.shape[0] else np.zeros((0, T.rows))
    assert out.shape == (X.shape[0], T.rows)
    exact = X.shape[0] <= 1 or T.int8 or T.dtype not in MULTI or isa == "ref"
    if exact:
        assert np.array_equal(out, ref)
    else:
        w = T.dequantize().astype(np.float64)
        bound = np.abs(X.astype(np.float64)) @ np.abs(w).T * 2e-6 + 1e-30
        assert (np.abs(out - ref) <= bound).all()


@settings(max_examples=25, deadline=None)
@given(dtype=st.sampled_from(["f32", "f16", "bf16", "q8_row", "q8_2f", "q4_block", "q4tp",
                              "q2tp"]),
       rows=st.integers(1, 70), groups=st.integers(1, 5), odd=st.integers(0, 31),
       t=st.integers(0, 11), int8=st.booleans(), seed=st.integers(0, 2**16))
def test_matches_matvec(isas, dtype, rows, groups, odd, t, int8, seed):
    rng = np.random.default_rng(seed)
    cols = 32 * groups + (odd if dtype in ("f32", "f16", "bf16") else 0)
    T = QTensor.from_f32(rng.standard_normal((rows, cols)).astype(np.float32), dtype)
    T.precision = "int8" if int8 else "exact"
    X = rng.standard_normal((t, cols)).astype(np.float32)
    before = K.active_isa()
    try:
        for isa in isas:
            K.set_isa(isa)
            _check(T, X, isa)
    finally:
        K.set_isa(before)


@pytest.mark.parametrize("dtype", MULTI)
def test_large_and_threads(isa, threads, dtype):
    rng = np.random.default_rng(3)
    T = QTensor.from_f32(rng.standard_normal((700, 1056)).astype(np.float32), dtype)
    X = rng.standard_normal((9, 1056)).astype(np.float32)
    _check(T, X, isa)
    a = K.matvec_batch([T._m], X)[0]
    assert np.array_equal(a, T.matvec_batch(X))      # the same bits on a second call


def test_several_matrices_and_refusals():
    rng = np.random.default_rng(0)
    A = QTensor.from_f32(rng.standard_normal((40, 64)).astype(np.float32), "q8_row")
    B = QTensor.from_f32(rng.standard_normal((9, 64)).astype(np.float32), "f16")
    X = rng.standard_normal((3, 64)).astype(np.float32)
    a, b = K.matvec_batch([A._m, B._m], X)
    assert np.array_equal(a, A.matvec_batch(X)) and np.array_equal(b, B.matvec_batch(X))
    C = QTensor.from_f32(rng.standard_normal((9, 96)).astype(np.float32), "f32")
    with pytest.raises(ValueError, match="cols"):
        K.matvec_batch([A._m, C._m], X)
    with pytest.raises(ValueError, match="shape"):
        K.matvec_batch([A._m], np.ascontiguousarray(X[:, :32]))
    with pytest.raises(TypeError):
        K.matvec_batch([A._m], X.astype(np.float64))
    with pytest.raises(ValueError, match="contiguous"):
        K.matvec_batch([A._m], np.asfortranarray(X))
