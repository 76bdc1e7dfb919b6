"""The numpy reference of the CMF layouts (cortiq.cmf.quant): the byte examples of
docs/cmf-format.md §7, size rules, and encode/decode round trips within one quantization
step. Bit-exact agreement of the C paths with this module is tested by their owners."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortiq.cmf import quant as Q
from cortiq.errors import FormatError


def hexb(b):
    return b.tobytes().hex(" ")


def test_spec_examples():
    row = np.array([[0.5, -1, 0.25, 0, 0.1, -0.3, 0.7, 0.05]], np.float32)
    assert hexb(Q.quantize(row, "q8_row")) == "40 81 20 00 0d da 59 06 08 20"
    m = np.array([[0.5, -1, 0.25, 0], [2, 0.1, -0.2, 0.3]], np.float32)
    assert hexb(Q.quantize(m, "q8_2f")) == (
        "1f 81 64 00 7b 0d b1 7f ad 21 b3 21 d5 3d af 39 3f 33 ca 32")
    lin = np.linspace(-1, 1, 32).astype(np.float32)
    nib = "11 22 33 44 55 66 76 87 98 a9 aa bb cc dd ee ff"
    assert hexb(Q.quantize(lin, "q4_block")) == nib + " 92 30"
    assert hexb(Q.quantize(lin.reshape(1, 32), "q4_tiled")) == "92 30 " + nib


def test_q8_row_scale_floor_and_zero_rows():
    z = np.zeros((2, 5), np.float32)
    b = Q.quantize(z, "q8_row")
    assert np.all(b[:10] == 0)
    assert np.frombuffer(b[10:].tobytes(), "<f2")[0] == np.float16(2 ** -14)
    np.testing.assert_array_equal(Q.dequantize(b, "q8_row", (2, 5)), z)


STEP = {"q8_row": 1 / 127, "q8_2f": 1 / 127, "q4_block": 1 / 7, "q4_tiled": 1 / 7,
        "q4tp": 1 / 7, "q2tp": 1 / 1.5, "vbit": 1 / 3, "vbit_ro": 1 / 3}


@given(rows=st.integers(1, 40), gpr=st.integers(1, 5), seed=st.integers(0, 10**6),
       dtype=st.sampled_from(sorted(STEP)), zero_tile=st.booleans())
def test_round_trip_within_a_step(rows, gpr, seed, dtype, zero_tile):
    rng = np.random.default_rng(seed)
    cols = 32 * gpr
    w = (rng.normal(size=(rows, cols)) * np.exp(rng.normal(size=(rows, 1)))).astype(np.float32)
    if zero_tile:
        w[0, :32] = 0
    b = Q.quantize(w, dtype)
    fixed = Q.expected_nbytes(dtype, w.shape)
    assert fixed is None or b.size == fixed
    got = Q.dequantize(b, dtype, w.shape)
    assert got.dtype == np.float32 and got.shape == w.shape
    # error bound: half a code step of the group's (or row's) absmax, with slack for the
    # f16 rounding of scales and the q4tp/q2tp ladder spacing (at most 2^(step) > 1)
    grp = np.abs(w).reshape(rows, gpr, 32).max(axis=2, keepdims=True)
    if dtype in ("q8_row", "q8_2f"):
        grp = np.abs(w).max(axis=1, keepdims=True)[:, :, None] * np.ones((1, gpr, 1))
    bound = grp * STEP[dtype] * (1.6 if dtype in ("q4tp", "q2tp") else 0.51) + 1e-6
    if dtype == "q8_2f":  # half a code of row scale x column field, read from the payload
        n = rows * cols
        rs = np.frombuffer(b[n:n + 2 * rows].tobytes(), "<f2").astype(np.float64)
        col = np.frombuffer(b[n + 2 * rows:].tobytes(), "<f2").astype(np.float64)
        bound = (0.5 * rs[:, None] * col[None, :] * (1 + 1e-3)).reshape(rows, gpr, 32)
    err = np.abs(got - w).reshape(rows, gpr, 32)
    assert np.all(err <= bound + 1e-7), float((err - bound).max())
    if zero_tile and dtype not in ("q8_row", "q8_2f"):
        assert np.all(got[0, :32] == 0)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_float_types_round_trip_exactly(dtype):
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 7)).astype(np.float32)
    w = {"f32": w, "f16": Q.f16_round(w),
         "bf16": (w.view(np.uint32) & 0xFFFF0000).view(np.float32)}[dtype]
    np.testing.assert_array_equal(Q.dequantize(Q.quantize(w, dtype), dtype, w.shape), w)


def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, np.nan, -np.inf], np.float32)
    got = Q.dequantize(Q.quantize(x, "bf16"), "bf16", x.shape)
    assert got[0] == 1.0 and got[1] == 1.0 + 2 ** -6 and np.isnan(got[2]) and got[3] == -np.inf


def test_odd_sizes_and_padding():
    w = np.arange(45, dtype=np.float32).reshape(5, 9) / 10
    for dt in ("q4_block", "q4_tiled"):
        b = Q.quantize(w, dt)
        assert b.size == 18 * 2
        np.testing.assert_allclose(Q.dequantize(b, dt, w.shape), w, atol=4.4 / 7 / 2 + 1e-6)


def test_q4tp_ladder_and_codes_layout():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(3, 96)).astype(np.float32)
    b = Q.quantize(w, "q4tp")
    gpr, s = 3, 2
    assert b.size == 3 * gpr * 16 + 4 * 3 + 3 * s
    params = np.frombuffer(b[3 * gpr * 16:3 * gpr * 16 + 12].tobytes(), "<f2").astype(np.float32)
    lo, step = params[0], params[1]
    t = [Q._exp2f(lo)]
    for _ in range(31):
        t.append(np.float32(t[-1] * Q._exp2f(step)))
    codes = Q._unpack_codes(b[-3 * s:].reshape(3, s), gpr)
    # every scale used is a rung of the row's ladder, and decoding uses it
    nib = b[:gpr * 16].reshape(gpr, 16)
    q0 = (nib[0, 0] & 15).astype(np.float32) - 8
    assert Q.dequantize(b, "q4tp", w.shape)[0, 0] == np.float32(q0 * t[codes[0, 0]])


def test_truncated_payload_is_a_format_error():
    b = Q.quantize(np.ones((4, 32), np.float32), "q8_row")
    with pytest.raises(FormatError, match="q8_row payload has"):
        Q.dequantize(b[:-1], "q8_row", (4, 32))
    v = Q.quantize(np.ones((2, 32), np.float32), "vbit_ro")
    with pytest.raises(FormatError):
        Q.dequantize(v[:-1], "vbit_ro", (2, 32))


@pytest.mark.parametrize("dtype", ["f16", "q8_row", "q8_2f", "q4_block", "q4tp", "q2tp"])
def test_unencodable_values_are_refused(dtype):
    w = np.ones((2, 32), np.float32)
    w[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        Q.quantize(w, dtype)
    w[1, 3] = 3e38
    with pytest.raises(ValueError, match="beyond what f16"):
        Q.quantize(w, dtype)


@settings(max_examples=40)
@given(rows=st.integers(1, 40), gpr=st.integers(1, 6), seed=st.integers(0, 2**31),
       zero_frac=st.floats(0, 0.97), dtype=st.sampled_from(["q4tp", "q2tp"]))
def test_tp_vectorized_matches_the_per_row_recipe(rows, gpr, seed, zero_frac, dtype):
    from reference import tp_rowwise
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((rows, 32 * gpr)) * np.exp(rng.uniform(-8, 4, (rows, 1)))
         * np.exp(rng.uniform(-3, 3, (1, 32 * gpr)))).astype(np.float32)
    a[rng.random(a.shape) < zero_frac] = 0
    # a row on an exact power-of-two ladder (every tile's absmax 7 or 1.5 times 2^k, so
    # step 0) holding halves of the scale: every value is a rounding tie
    top = 14 if dtype == "q4tp" else 3
    tie = rng.integers(-top, top + 1, 32 * gpr).astype(np.float32) / 2
    tie[::32] = top / 2
    a[-1] = tie * np.float32(2.0 ** int(rng.integers(-12, 8)))
    a[rng.integers(0, rows)] = 0 if seed % 3 == 0 else a[0]
    want = tp_rowwise.encode(a, dtype)
    np.testing.assert_array_equal(Q._tp(a, dtype), want)
    np.testing.assert_array_equal(Q._tp(a, dtype, slab=3), want)
