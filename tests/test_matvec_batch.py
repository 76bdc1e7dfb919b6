"""matvec_batch: several inputs against the same matrices in one pass over the weights.

Every row must equal the matvec of its input: bit for bit for one input, for int8
activations (also where the integer multi-input tiles load each weight once for
several inputs: every int8 dtype on AVX2 / AVX-512, every integer path of each
table) and for the dtypes without a multi-input row kernel; within float32 rounding
(of sum |w x|, the exactness contract of cortiq.kernels.tensor) where a SIMD table decodes
each weight once for all float32 inputs (f32 and q8_row on AVX2 / AVX-512). Shapes
include odd column and group counts, tiny and tall matrices, misaligned inputs,
special values and any thread count.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortiq.kernels import _kernels as K
from cortiq.cmf.testing import qtensor_from_f32
from test_int8_act import I8, make, model

MULTI = ("f32", "q8_row")          # dtypes with multi-input rows in the SIMD tables
# the integer paths of each table: VNNI (AVX-512; AVX-VNNI or AVX-512 VL for AVX2) and
# the vpmaddubsw fallbacks, chosen at run time by the CPU features (int8 multi-input
# tiles: every int8 dtype on both x86 tables)
HIDES = ([], ["avxvnni"], ["avx512vnni"], ["avxvnni", "avx512vnni"])


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
    T = qtensor_from_f32(rng.standard_normal((rows, cols)).astype(np.float32), dtype)
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
    T = qtensor_from_f32(rng.standard_normal((700, 1056)).astype(np.float32), dtype)
    X = rng.standard_normal((9, 1056)).astype(np.float32)
    _check(T, X, isa)
    a = K.matvec_batch([T._m], X)[0]
    assert np.array_equal(a, T.matvec_batch(X))      # the same bits on a second call


def test_several_matrices_and_refusals():
    rng = np.random.default_rng(0)
    A = qtensor_from_f32(rng.standard_normal((40, 64)).astype(np.float32), "q8_row")
    B = qtensor_from_f32(rng.standard_normal((9, 64)).astype(np.float32), "f16")
    X = rng.standard_normal((3, 64)).astype(np.float32)
    a, b = K.matvec_batch([A._m, B._m], X)
    assert np.array_equal(a, A.matvec_batch(X)) and np.array_equal(b, B.matvec_batch(X))
    C = qtensor_from_f32(rng.standard_normal((9, 96)).astype(np.float32), "f32")
    with pytest.raises(ValueError, match="cols"):
        K.matvec_batch([A._m, C._m], X)
    with pytest.raises(ValueError, match="shape"):
        K.matvec_batch([A._m], np.ascontiguousarray(X[:, :32]))
    with pytest.raises(TypeError):
        K.matvec_batch([A._m], X.astype(np.float64))
    with pytest.raises(ValueError, match="contiguous"):
        K.matvec_batch([A._m], np.asfortranarray(X))


def _misaligned(X):
    """X's values in a buffer one float off a 64-byte boundary."""
    buf = np.empty(X.size + 17, np.float32)
    off = (-buf.ctypes.data // 4) % 16 + 1
    Y = buf[off:off + X.size].reshape(X.shape)
    Y[...] = X
    return Y


def _i8_variants(isas, run):
    """run() under every ISA table and integer path of it: (isa, hide, result)."""
    before = K.active_isa()
    try:
        for isa in isas:
            for hide in (HIDES if isa != "ref" else ([],)):
                K._hide_cpu_features(hide)
                try:
                    K.set_isa(isa)
                    yield isa, hide, run()
                finally:
                    K._hide_cpu_features([])
    finally:
        K.set_isa(before)


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(I8), rows=st.integers(1, 70), groups=st.integers(1, 9),
       t=st.integers(1, 9), special=st.sampled_from(["none", "zero", "huge", "nan", "inf"]),
       misalign=st.booleans(), seed=st.integers(0, 2**16))
def test_int8_batch_is_the_int8_matvec_bitwise(isas, dtype, rows, groups, t, special, misalign, seed):
    """Each input's rows of an int8 matvec_batch equal that input's int8 matvec bit for
    bit (multi-input tiles or not), on every table and integer path, and the model of
    the int8 algorithm (test_int8_act.model) within float32 rounding."""
    rng = np.random.default_rng(seed)
    cols = 32 * groups
    T = make(rng, (rows, cols), dtype)  # (int8; the ggml formats: random blocks)
    X = rng.standard_normal((t, cols)).astype(np.float32)
    j, g = int(rng.integers(t)), int(rng.integers(groups))
    if special != "none":
        X[j, 32 * g:32 * g + 32] = {"zero": 0.0, "huge": 1e30, "nan": np.nan, "inf": -np.inf}[special]
        if special in ("nan", "inf"):
            X[j, 32 * g + 1:32 * g + 32] = rng.standard_normal(31)
    if misalign:
        X = _misaligned(X)
    for isa, hide, (out, one) in _i8_variants(
            isas, lambda: (K.matvec_batch([T.qmat], X)[0], np.stack([T.matvec(x) for x in X]))):
        assert out.shape == (t, rows)
        assert np.array_equal(out, one, equal_nan=True), (isa, hide)
        for k in range(t):
            y, bound = model(T, X[k])
            ok = np.isfinite(y) & np.isfinite(bound)
            assert (np.abs(out[k][ok] - y[ok]) <= bound[ok]).all(), (isa, hide, k)
            assert np.array_equal(np.isnan(out[k]), np.isnan(y)), (isa, hide, k)


@pytest.mark.parametrize("dtype", I8)
def test_int8_batch_threads_and_tall(isa, threads, dtype):
    """Claims split over threads, a tail tile of one row, inputs beyond one tile of four,
    and 71 groups (scales decoded 64 groups at a time, a last block of three): the same
    bits as one int8 matvec each."""
    rng = np.random.default_rng(7)
    T = make(rng, (301, 2272), dtype)
    X = rng.standard_normal((9, 2272)).astype(np.float32)
    for _, hide, (out, one) in _i8_variants(
            [isa], lambda: (K.matvec_batch([T.qmat], X)[0], np.stack([T.matvec(x) for x in X]))):
        assert np.array_equal(out, one), hide


def test_int8_batch_several_matrices(isas):
    """One call over matrices that share a quantized x (two q8_row), have their own
    (q8_2f quantizes col * x), another family (q4_block) or none (f16): each equals
    its own int8 (or float32) matvec."""
    rng = np.random.default_rng(9)
    Ts = [qtensor_from_f32(rng.standard_normal((r, 320)).astype(np.float32), d)
          for r, d in ((33, "q8_row"), (17, "q8_2f"), (40, "q8_row"), (9, "q4_block"), (5, "f16"))]
    # two ggml block formats sharing their family's x (CQ_XQ_G32)
    Ts += [make(rng, (r, 320), d) for r, d in ((11, "q8_0"), (13, "q4_0"))]
    for T in Ts:
        T.precision = "int8"
    X = rng.standard_normal((6, 320)).astype(np.float32)
    for isa, hide, (outs, ones) in _i8_variants(
            isas, lambda: (K.matvec_batch([T.qmat for T in Ts], X),
                           [np.stack([T.matvec(x) for x in X]) for T in Ts])):
        for T, out, one in zip(Ts, outs, ones):
            if T.dtype == "f16" and isa != "ref" and len(X) > 1:
                continue        # float32 multi-input rows: within rounding (test_matches_matvec)
            assert np.array_equal(out, one), (isa, hide, T.dtype)
