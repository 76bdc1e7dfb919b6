"""C quantizers (csrc/quant) against the numpy reference cortiq.cmf.quant: bit for bit,
for every usable ISA and thread count, on random shapes (rows 1..300, cols around
multiples of 32), scale-floor edge cases, and the worked byte examples of §7."""
import numpy as np
import pytest
from hypothesis import given
from arrays import stable_seed
from hypothesis import strategies as st

from cortiq.kernels import _kernels as K
from cortiq.cmf import quant as Q
from cortiq.cmf.writer import encode
from cortiq.errors import KernelError

C_FUNCS = {"q8_row": K.quantize_q8_row, "q8_2f": K.quantize_q8_2f,
           "q4_block": K.quantize_q4_block, "q4_tiled": K.quantize_q4_tiled}


def hexb(b):
    return np.asarray(b).tobytes().hex(" ")


def test_spec_byte_examples_through_c(isa):
    row = np.array([[0.5, -1, 0.25, 0, 0.1, -0.3, 0.7, 0.05]], np.float32)
    assert hexb(K.quantize_q8_row(row)) == "40 81 20 00 0d da 59 06 08 20"
    m = np.array([[0.5, -1, 0.25, 0], [2, 0.1, -0.2, 0.3]], np.float32)
    assert hexb(K.quantize_q8_2f(m)) == (
        "1f 81 64 00 7b 0d b1 7f ad 21 b3 21 d5 3d af 39 3f 33 ca 32")
    lin = np.linspace(-1, 1, 32).astype(np.float32)
    nib = "11 22 33 44 55 66 76 87 98 a9 aa bb cc dd ee ff"
    assert hexb(K.quantize_q4_block(lin)) == nib + " 92 30"
    assert hexb(K.quantize_q4_tiled(lin.reshape(1, 32))) == "92 30 " + nib


def _matrix(rng, rows, cols, kind):
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    if kind == "scaled":
        a *= np.float32(10.0) ** rng.uniform(-6, 4, (rows, 1)).astype(np.float32)
    elif kind == "tiny":  # absmax below the 2^-14 scale floor
        a *= np.float32(1e-7)
    elif kind == "zeros_rows":
        a[::3] = 0
    elif kind == "ties":  # exact halves hit round-half-even
        a = (rng.integers(-40, 40, (rows, cols)) / 2).astype(np.float32)
    return a


@pytest.mark.parametrize("dtype", list(C_FUNCS))
@pytest.mark.parametrize("kind", ["normal", "scaled", "tiny", "zeros_rows", "ties"])
def test_bit_exact_edge_kinds(isa, threads, dtype, kind):
    rng = np.random.default_rng(stable_seed(dtype, kind))
    for rows, cols in [(1, 1), (1, 31), (3, 32), (7, 33), (5, 64), (2, 95), (300, 96), (4, 0)]:
        a = _matrix(rng, rows, cols, kind)
        want = Q.quantize(a, dtype)
        np.testing.assert_array_equal(C_FUNCS[dtype](a), want, err_msg=f"{dtype} {a.shape}")


@given(rows=st.integers(1, 300), cols=st.sampled_from([1, 7, 31, 32, 33, 63, 64, 65, 96, 127,
                                                       128, 160, 257]),
       seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(list(C_FUNCS)))
def test_bit_exact_random(isas, rows, cols, seed, dtype):
    a = _matrix(np.random.default_rng(seed), rows, cols, "scaled")
    want = Q.quantize(a, dtype)
    for name in isas:
        before = K.active_isa()
        K.set_isa(name)
        try:
            np.testing.assert_array_equal(C_FUNCS[dtype](a), want)
        finally:
            K.set_isa(before)


def test_q4_any_shape_flattens(isa):
    a = np.random.default_rng(3).standard_normal((3, 5, 7)).astype(np.float32)
    for dt in ("q4_block", "q4_tiled"):
        np.testing.assert_array_equal(C_FUNCS[dt](a), Q.quantize(a, dt))


def test_f16_conversion_exact(isa):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200_000) * np.float32(10.0) ** rng.uniform(-12, 6, 200_000)
         ).astype(np.float32)
    edges = np.array([65504, 65519.99, 65520, 65536, 2**-14, 2**-24, 2**-25, 3 * 2**-26,
                      2**-25 * 1.0000001, 1e-30, -0.0, 0.0, np.inf, -np.inf], np.float32)
    x = np.concatenate([x, edges, -edges])
    with np.errstate(over="ignore"):
        want = x.astype("<f2").view(np.uint8)
    np.testing.assert_array_equal(K.f32_to_f16(x), want)
    h = np.arange(65536, dtype=np.uint16)
    ref = h.view(np.float16).astype(np.float32)
    got = K.f16_to_f32(h.view(np.uint8))
    same = (ref.view(np.uint32) == got.view(np.uint32)) | (np.isnan(ref) & np.isnan(got))
    assert same.all()


@pytest.mark.parametrize("dtype", list(C_FUNCS))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e12])
def test_refuses_what_the_reference_refuses(isa, dtype, bad):
    a = np.ones((4, 64), np.float32)
    a[2, 17] = bad
    with pytest.raises(KernelError, match="NaN/inf or values too large"):
        C_FUNCS[dtype](a)
    with pytest.raises(ValueError):
        Q.quantize(a, dtype)
    with pytest.raises(ValueError, match=f"cannot encode {dtype}"):
        encode(a, dtype)


def test_wrapper_argument_checks():
    with pytest.raises(TypeError, match="quantize_q8_row: w must be a float32"):
        K.quantize_q8_row(np.ones((2, 2)))
    with pytest.raises(ValueError, match="must be 2-D"):
        K.quantize_q8_2f(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        K.quantize_q4_block(np.ones((4, 64), np.float32)[:, ::2])


def test_writer_encode_matches_reference_for_every_encodable():
    a = np.random.default_rng(5).standard_normal((33, 64)).astype(np.float32)
    for dt in ("f32", "f16", "bf16", "q8_row", "q8_2f", "q4_block", "q4_tiled", "q4tp",
               "q2tp", "vbit", "vbit_ro"):
        np.testing.assert_array_equal(encode(a, dt), Q.quantize(a, dt), err_msg=dt)
