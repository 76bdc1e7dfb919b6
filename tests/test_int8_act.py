"""The opt-in int8-activation path of the q4 matvecs (cortiq.set_int8_activations).

The reference here is an independent NumPy model of the algorithm the C code promises
(csrc/matvec/qmat.h, ref_i8_row): per group of 32, d = max|x| / 127 and
xq = rint(x * (127 / max|x|)) in float32 (ties to even), an exact integer sum of
(nibble - 8) * xq, then scale * d * isum. Every ISA must match it within float32
rounding of the final combination (the integers are exact), and agree bit for bit
between matvec, matvec_many, row_dot, rows_dot and any thread count. Separately the
error against the exact float32 product stays inside the analytic quantization bound.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

import cortiq
from cortiq import _kernels as K
from cortiq.cmf import quant
from cortiq.errors import ConfigError
from cortiq.tensor import QTensor

Q4 = ("q4_block", "q4_tiled", "q4tp")
U = 2.0 ** -24


@pytest.fixture
def int8_on():
    before = cortiq.get_int8_activations()
    cortiq.set_int8_activations(True)
    yield
    cortiq.set_int8_activations(before)


def model(q, x):
    """(y, bound): the int8 algorithm in float64 from the decoded nibbles and scales,
    and the float32 rounding allowance of its final combination."""
    rows, cols = q.rows, q.cols
    w = q.dequantize().astype(np.float64).reshape(rows, cols // 32, 32)
    xg = x.reshape(cols // 32, 32)
    amax = np.abs(xg).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(amax > 0, np.float32(127.0) / amax.astype(np.float32), np.float32(0))
    xq = np.rint((xg * idv[:, None].astype(np.float32)).astype(np.float32)).astype(np.float64)
    d = (amax.astype(np.float32) / np.float32(127.0)).astype(np.float64)
    # w = (nib - 8) * scale (a float32 product, exact but for q4tp's float32 ladder),
    # so w @ xq per group is scale * isum
    terms = np.einsum("rgk,gk->rg", w, xq) * d[None, :]
    mags = np.einsum("rgk,gk->rg", np.abs(w), np.abs(xq)) * d[None, :]
    y = terms.sum(axis=1)
    bound = (4 * (cols // 32) + 8) * U * mags.sum(axis=1) + 1e-30
    return y, bound


def quantization_bound(q, x):
    """|y_int8 - W @ x| <= sum_c |w_c| * d_g / 2 (+ rounding): the int8 error budget."""
    rows, cols = q.rows, q.cols
    w = np.abs(q.dequantize().astype(np.float64)).reshape(rows, cols // 32, 32)
    d = np.abs(x.reshape(cols // 32, 32)).max(axis=1).astype(np.float64) / 127.0
    # 0.5 d per element from rounding, plus the float32 rounding of x * (127 / amax)
    return (w.sum(axis=2) * d[None, :] * (0.5 + 1e-4)).sum(axis=1)


def check(q, x):
    y = q.matvec(x)
    exp, b = model(q, x)
    err = np.abs(y.astype(np.float64) - exp)
    assert (err <= b).all(), f"max err/bound {np.max(err / b):.3g}"
    exact = q.dequantize().astype(np.float64) @ x.astype(np.float64)
    assert (np.abs(y - exact) <= quantization_bound(q, x) + b).all()
    return y


@pytest.mark.parametrize("dtype", Q4)
@pytest.mark.parametrize("shape", [(1, 32), (3, 64), (5, 96), (9, 128), (17, 160), (33, 4128), (64, 320)])
def test_matches_model_and_bound(isa, int8_on, dtype, shape):
    rows, cols = shape
    rng = np.random.default_rng(rows * 7919 + cols)
    q = QTensor.from_f32(rng.standard_normal(shape).astype(np.float32), dtype)
    x = rng.standard_normal(cols).astype(np.float32)
    x[:32] *= 1000.0  # groups of very different magnitude
    y = check(q, x)
    # the same rows through every entry point, bit for bit
    for i in range(rows):
        assert q.row_dot(i, x) == y[i]
    np.testing.assert_array_equal(q.rows_dot(rows // 2, rows - rows // 2, x), y[rows // 2:])
    np.testing.assert_array_equal(QTensor.matvec_many([q, q], x)[1], y)


@given(st.integers(1, 70), st.integers(1, 40), st.sampled_from(Q4), st.integers(0, 2**31))
def test_hypothesis_shapes(isas, rows, groups, dtype, seed):
    rng = np.random.default_rng(seed)
    cols = 32 * groups
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w *= np.float32(10.0) ** rng.integers(-3, 3, size=(rows, 1)).astype(np.float32)
    q = QTensor.from_f32(w, dtype)
    x = (rng.standard_normal(cols) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
    x[rng.random(cols) < 0.1] = 0.0
    before_isa, before = K.active_isa(), cortiq.get_int8_activations()
    try:
        cortiq.set_int8_activations(True)
        for isa in isas:
            K.set_isa(isa)
            check(q, x)
    finally:
        K.set_isa(before_isa)
        cortiq.set_int8_activations(before)


@pytest.mark.parametrize("dtype", Q4)
def test_ties_round_to_even_and_zero_groups(isa, int8_on, dtype):
    cols = 128
    x = np.zeros(cols, np.float32)
    x[:32] = np.arange(32, dtype=np.float32) - 15.5  # amax 15.5 -> id 127/15.5: no ties
    x[32] = 127.0
    x[33:64] = np.float32(0.5) + np.arange(31, dtype=np.float32) % 7  # x * 1 = k + 0.5: ties
    # group 2 stays all zero; group 3: one tiny value
    x[100] = 1e-30
    rng = np.random.default_rng(5)
    q = QTensor.from_f32(rng.standard_normal((20, cols)).astype(np.float32), dtype)
    check(q, x)


def test_simd_twins_agree_with_reference(int8_on):
    """Every usable ISA (and AVX-512 without VNNI or VBMI) against the scalar reference
    table; an odd group count exercises the tiled loader's partial last block."""
    rng = np.random.default_rng(11)
    before = K.active_isa()
    try:
        for dtype in Q4:
            q = QTensor.from_f32(rng.standard_normal((37, 4128 + 64)).astype(np.float32), dtype)
            x = rng.standard_normal(4128 + 64).astype(np.float32)
            K.set_isa("ref")
            y_ref = q.matvec(x)
            exp, b = model(q, x)
            for isa in K.usable_isas():
                variants = []
                for hide in ([], ["avx512vnni"], ["avx512vbmi"]):
                    K._hide_cpu_features(hide)
                    try:
                        K.set_isa(isa)
                        y = q.matvec(x)
                    finally:
                        K._hide_cpu_features([])
                    assert (np.abs(y.astype(np.float64) - exp) <= b).all(), (isa, hide)
                    assert (np.abs(y.astype(np.float64) - y_ref) <= 2 * b).all(), (isa, hide)
                    variants.append(y)
                # VNNI, maddubs and the VBMI tile loader compute the same integers and
                # combine them in the same order: the same bits
                for y in variants[1:]:
                    np.testing.assert_array_equal(y, variants[0])
    finally:
        K.set_isa(before)


@pytest.mark.parametrize("dtype", Q4)
def test_threads_bit_identical(isa, int8_on, threads, dtype):
    rng = np.random.default_rng(3)
    q = QTensor.from_f32(rng.standard_normal((301, 512)).astype(np.float32), dtype)
    x = rng.standard_normal(512).astype(np.float32)
    y = q.matvec(x)
    cortiq.set_num_threads(1)
    np.testing.assert_array_equal(q.matvec(x), y)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", Q4)
def test_non_finite_input_is_not_hidden(isa, int8_on, dtype, bad):
    rng = np.random.default_rng(1)
    q = QTensor.from_f32(rng.standard_normal((6, 96)).astype(np.float32), dtype)
    x = rng.standard_normal(96).astype(np.float32)
    x[40] = bad
    y = q.matvec(x)
    assert not np.isfinite(y).any()  # what the float32 path gives (inf * 0 scale terms -> NaN)


def test_other_dtypes_and_matmat_stay_exact(isa):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((24, 256)).astype(np.float32)
    x = rng.standard_normal(256).astype(np.float32)
    before = cortiq.get_int8_activations()
    try:
        for dtype in ("f32", "f16", "bf16", "q8_row", "q8_2f", "q2tp", "q4_block"):
            q = QTensor.from_f32(w, dtype)
            cortiq.set_int8_activations(False)
            y0, m0 = q.matvec(x), q.matmat(np.stack([x, x]))
            cortiq.set_int8_activations(True)
            y1, m1 = q.matvec(x), q.matmat(np.stack([x, x]))
            np.testing.assert_array_equal(m0, m1)  # prefill never quantizes
            if dtype != "q4_block":
                np.testing.assert_array_equal(y0, y1)
            else:
                assert not np.array_equal(y0, y1)  # the switch does reach the q4 path
    finally:
        cortiq.set_int8_activations(before)


def test_switch_validates_and_reports():
    before = cortiq.get_int8_activations()
    try:
        for bad in (1, "yes", None):
            with pytest.raises(ConfigError):
                cortiq.set_int8_activations(bad)
        cortiq.set_int8_activations(True)
        assert cortiq.config()["int8_activations"] is True
    finally:
        cortiq.set_int8_activations(before)


def test_env_var():
    # run where the imported cortiq lives, so `-c` cannot pick up an unbuilt source tree
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(cortiq.__file__)))
    code = "import cortiq; print(cortiq.get_int8_activations())"
    env = dict(os.environ, CORTIQ_INT8_ACT="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=cwd)
    assert out.stdout.strip() == "True", out.stderr
    env["CORTIQ_INT8_ACT"] = "maybe"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=cwd)
    assert out.returncode != 0 and "CORTIQ_INT8_ACT" in out.stderr


def test_matvec_many_mixes_kinds(isa, int8_on):
    """More matrices than the drivers' stack arrays hold, mixing the int8 path (q4),
    a prepared x (q8_2f, q2tp) and x as given (f16), with a misaligned x: each output
    equals that matrix's own matvec."""
    rng = np.random.default_rng(9)
    dtypes = ["q4_block", "q8_2f", "f16", "q4tp", "q2tp", "q4_tiled", "q8_row"] * 3
    qs = [QTensor.from_f32(rng.standard_normal((5 + i, 96)).astype(np.float32), d)
          for i, d in enumerate(dtypes)]
    buf = np.empty(96 * 4 + 64, np.uint8)
    off = (-buf.ctypes.data) % 64 + 4
    x = buf[off:off + 96 * 4].view(np.float32)
    x[:] = rng.standard_normal(96)
    outs = QTensor.matvec_many(qs, x)
    assert len(outs) == len(qs) > 16
    for q, y in zip(qs, outs):
        np.testing.assert_array_equal(y, q.matvec(x))
