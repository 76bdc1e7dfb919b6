"""The ggml K-quant block formats (q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs) as QTensor
dtypes, multiplied in place from llama.cpp's own block bytes.

The decode is checked bit for bit against the ``gguf`` package's dequantizer (an
independent implementation); products against a float64 dot of those weights; the int8
path (x quantized per group of 32, csrc/matvec/ggml_kq_scalar.h: kq_ref_i8_row) against
the quantization bound; every entry point and thread count against matvec bit for bit;
every ISA against the scalar reference table.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import cortiq
from cortiq.cmf.ggml_blocks import FORMATS
from cortiq.errors import FormatError
from cortiq.kernels import _kernels as K
from cortiq.kernels.tensor import QTensor

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

KQ = ("q4_k", "q6_k", "q5_k", "q2_k", "q3_k", "iq4_xs")
#: the K-quants with SIMD int8 rows (csrc/matvec/ggml_kq_avx512.h, ggml_kq_avx2.h)
TILED = ("q4_k", "q5_k", "q6_k", "iq4_xs")
U = 2.0 ** -24
#: byte offsets of each format's f16 super-block scales: (d, dmin or None)
SCALES = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208, None), "q2_k": (80, 82),
          "q3_k": (108, None), "iq4_xs": (0, None)}


def gguf_decode(raw, dtype, rows, cols):
    t = GGMLQuantizationType(FORMATS[dtype].ggml_type)
    with np.errstate(all="ignore"):  # inf/NaN scales: inf/NaN weights, as intended
        return gguf_quants.dequantize(raw.reshape(rows, -1), t).astype(np.float32).reshape(rows, cols)


def blocks(rng, dtype, rows, cols, special=None):
    """Random block bytes; d / dmin as normal halves of either sign (or `special`)."""
    f = FORMATS[dtype]
    nb = rows * cols // f.block_elems
    raw = rng.integers(0, 256, size=(nb, f.block_bytes), dtype=np.uint8)
    for off in SCALES[dtype]:
        if off is None:
            continue
        v = (rng.uniform(2.0 ** -12, 2.0 ** -4, nb) * rng.choice([-1.0, 1.0], nb)).astype(np.float16)
        if special is not None:
            pick = rng.random(nb) < 0.3
            v[pick] = np.float16(special)
        raw[:, off:off + 2] = v.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def abs_weights(raw, dtype, rows, cols):
    """|d * sc * q| + |dmin * mn| per weight: the magnitudes the products' rounding
    scales with (the mins cancel against the rest)."""
    off_d, off_m = SCALES[dtype]
    b = raw.reshape(-1, FORMATS[dtype].block_bytes).copy()
    d = b[:, off_d:off_d + 2].copy().view(np.float16)
    b[:, off_d:off_d + 2] = np.abs(d).view(np.uint8)
    if off_m is None:
        return np.abs(gguf_decode(b.reshape(-1), dtype, rows, cols)).astype(np.float64)
    m = b[:, off_m:off_m + 2].copy().view(np.float16)
    b[:, off_m:off_m + 2] = (-np.abs(m)).view(np.uint8)
    # with d >= 0 and dmin <= 0: d*sc*q - dmin*mn = |d*sc*q| + |dmin*mn| (sc, mn, q >= 0)
    return gguf_decode(b.reshape(-1), dtype, rows, cols).astype(np.float64)


def with_isa(isa, fn, *args):
    before = K.active_isa()
    try:
        K.set_isa(isa)
        return fn(*args)
    finally:
        K.set_isa(before)


@pytest.mark.parametrize("dtype", KQ)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), nblk=st.integers(1, 3), rows=st.integers(1, 5))
def test_decode_equals_gguf(dtype, seed, nblk, rows):
    rng = np.random.default_rng(seed)
    cols = 256 * nblk
    raw = blocks(rng, dtype, rows, cols)
    want = gguf_decode(raw, dtype, rows, cols)
    # the payload also at an odd address: the SIMD decoders load blocks unaligned
    buf = np.empty(raw.size + 128, np.uint8)
    off = (-buf.ctypes.data) % 64 + 1 + seed % 31
    moved = buf[off:off + raw.size]
    moved[:] = raw
    for isa in K.usable_isas():
        for payload in (raw, moved):
            got = with_isa(isa, lambda p=payload: QTensor(p, dtype, (rows, cols)).dequantize())
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{dtype} {isa}")


@pytest.mark.parametrize("dtype", KQ)
@pytest.mark.parametrize("special", [0.0, 6e-8, np.inf, -np.inf, np.nan])
def test_decode_special_scales(dtype, special):
    """Zero and subnormal scales decode as the gguf package does, bit for bit; inf and
    NaN scales give inf/NaN weights at the same places (NaN payloads aside)."""
    rng = np.random.default_rng(7)
    raw = blocks(rng, dtype, 4, 512, special=special)
    want = gguf_decode(raw, dtype, 4, 512)
    ok = ~np.isnan(want)
    for isa in K.usable_isas():
        with np.errstate(invalid="ignore"):
            got = with_isa(isa, QTensor(raw, dtype, (4, 512)).dequantize)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=isa)
        np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32), err_msg=isa)
    # the row dots: non-finite exactly where the reference's are, else within rounding
    x = np.random.default_rng(8).standard_normal(512).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        y_ref = with_isa("ref", QTensor(raw, dtype, (4, 512)).matvec, x)
        w = np.where(np.isfinite(want), want, 0.0).astype(np.float64)
        for isa in K.usable_isas():
            y = with_isa(isa, QTensor(raw, dtype, (4, 512)).matvec, x)
            np.testing.assert_array_equal(np.isfinite(y), np.isfinite(y_ref), err_msg=isa)
            fin = np.isfinite(y_ref)
            bound = 516 * U * (np.abs(w) @ np.abs(x.astype(np.float64)))
            assert (np.abs(y[fin] - y_ref[fin]) <= 2 * bound[fin]).all(), isa


def make(rng, dtype, rows, cols, precision="exact"):
    raw = blocks(rng, dtype, rows, cols)
    return QTensor(raw, dtype, (rows, cols), precision=precision), raw


@pytest.mark.parametrize("dtype", KQ)
def test_exact_products_within_float32_rounding(isa, dtype):
    rng = np.random.default_rng(1)
    rows, cols = 13, 768
    q, raw = make(rng, dtype, rows, cols)
    w = gguf_decode(raw, dtype, rows, cols).astype(np.float64)
    x = rng.standard_normal(cols).astype(np.float32)
    X = rng.standard_normal((5, cols)).astype(np.float32)
    bound = lambda xx: (cols + 4) * U * (np.abs(w) @ np.abs(xx.astype(np.float64)).T)  # noqa: E731
    assert (np.abs(q.matvec(x) - w @ x) <= bound(x)).all()
    assert (np.abs(q.matmat(X) - X.astype(np.float64) @ w.T) <= bound(X).T).all()
    assert (np.abs(q.matvec_batch(X) - X.astype(np.float64) @ w.T) <= bound(X).T).all()


def i8_bound(raw, dtype, rows, cols, x):
    """|int8 product - float64 product| allowance: x's rounding to d * xq (half a step
    of its group's d per weight) plus float32 rounding of the combination."""
    w = gguf_decode(raw, dtype, rows, cols).astype(np.float64)
    a = abs_weights(raw, dtype, rows, cols)
    xg = x.astype(np.float64).reshape(-1, 32)
    d = np.abs(xg).max(axis=1) / 127.0
    step = np.repeat(d, 32)
    quant = np.abs(w) @ (step / 2)
    groups = cols // 32
    rounding = (groups + 16) * 4 * U * (a @ (np.abs(x.astype(np.float64)) + step))
    return w @ x.astype(np.float64), quant + rounding


@pytest.mark.parametrize("dtype", KQ)
def test_int8_within_bound_and_entry_points_bit_identical(isa, dtype):
    rng = np.random.default_rng(2)
    rows, cols = 37, 1280
    q, raw = make(rng, dtype, rows, cols, precision="int8")
    assert q.int8
    x = rng.standard_normal(cols).astype(np.float32)
    x[rng.random(cols) < 0.05] = 0.0
    want, bound = i8_bound(raw, dtype, rows, cols, x)
    y = q.matvec(x)
    assert (np.abs(y - want) <= bound).all(), np.max(np.abs(y - want) / bound)
    # the other entry points, a misaligned x, odd row ranges
    buf = np.empty(cols * 4 + 128, np.uint8)
    off = (-buf.ctypes.data) % 64 + 4
    xm = buf[off:off + cols * 4].view(np.float32)
    xm[:] = x
    np.testing.assert_array_equal(q.matvec(xm), y)
    np.testing.assert_array_equal(q.rows_dot(3, 7, x), y[3:10])
    assert q.row_dot(rows - 1, x) == y[-1]
    other, _ = make(rng, dtype, 5, cols, precision="int8")
    many = QTensor.matvec_many([q, other], x)
    np.testing.assert_array_equal(many[0], y)
    np.testing.assert_array_equal(many[1], other.matvec(x))
    X = np.stack([x, rng.standard_normal(cols).astype(np.float32)])
    np.testing.assert_array_equal(q.matvec_batch(X)[0], y)


@pytest.mark.parametrize("dtype", KQ)
def test_prompt_matmat_equals_int8_matvecs(isa, dtype):
    """A prompt chunk's matmat (int8 activations: on the x86 tables with vpdpbusd the
    integer matmat of ggml_kq_matmat.h, elsewhere t int8 matvecs) equals t int8 matvecs
    within float32 rounding of the int8 combination, for odd t and a misaligned X, and
    stays within the int8 bound of the float64 product."""
    rng = np.random.default_rng(6)
    rows, cols = 29, 768
    q, raw = make(rng, dtype, rows, cols, precision="auto")
    a = abs_weights(raw, dtype, rows, cols)
    for t in (1, 2, 3, 5, 8, 9, 15, 16, 17, 33, 71):
        X = rng.standard_normal((t, cols)).astype(np.float32)
        X[rng.random((t, cols)) < 0.05] = 0.0
        X[0, :32] *= 1e3  # one loud group
        buf = np.empty(X.nbytes + 128, np.uint8)
        off = (-buf.ctypes.data) % 64 + 4
        Xm = buf[off:off + X.nbytes].view(np.float32).reshape(t, cols)
        Xm[:] = X
        Y = q.matmat(Xm, prompt=True)
        np.testing.assert_array_equal(q.matmat(X, prompt=True), Y)
        for i in range(t):
            y = q.matvec(X[i])
            want, bound = i8_bound(raw, dtype, rows, cols, X[i])
            step = np.repeat(np.abs(X[i].astype(np.float64)).reshape(-1, 32).max(axis=1) / 127.0, 32)
            rounding = 2 * (cols // 32 + 16) * 4 * U * (a @ (np.abs(X[i].astype(np.float64)) + step))
            assert (np.abs(Y[i] - y) <= rounding).all(), (t, i, np.max(np.abs(Y[i] - y) / rounding))
            assert (np.abs(Y[i] - want) <= bound).all(), (t, i)


@settings(max_examples=30, deadline=None)
@given(dtype=st.sampled_from(KQ), seed=st.integers(0, 2 ** 32 - 1), rows=st.integers(1, 53),
       nblk=st.integers(1, 3), t=st.integers(1, 70), off=st.integers(0, 15))
def test_prompt_matmat_shapes(dtype, seed, rows, nblk, t, off):
    """Every usable table's prompt matmat against its own int8 matvecs within float32
    rounding, over row counts around the 24-row blocks and the tile heights, 1-3 blocks
    a row, input counts around the 8/16-lane vectors and 24/64-input panels, and X at
    any 4-byte offset."""
    rng = np.random.default_rng(seed)
    cols = 256 * nblk
    raw = blocks(rng, dtype, rows, cols)
    a = abs_weights(raw, dtype, rows, cols)
    X = rng.standard_normal((t, cols)).astype(np.float32) * rng.uniform(0.01, 100, (t, 1)).astype(np.float32)
    buf = np.empty(X.nbytes + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + 4 * off
    Xm = buf[start:start + X.nbytes].view(np.float32).reshape(t, cols)
    Xm[:] = X
    q = QTensor(raw, dtype, (rows, cols), precision="auto")
    step = np.repeat(np.abs(X.astype(np.float64)).reshape(t, -1, 32).max(axis=2) / 127.0, 32, axis=1)
    rounding = 2 * (cols // 32 + 16) * 4 * U * ((np.abs(X.astype(np.float64)) + step) @ a.T)
    for isa in K.usable_isas():
        Y = with_isa(isa, q.matmat, Xm, None, True)
        V = np.stack([with_isa(isa, q.matvec, x) for x in X])
        assert (np.abs(Y - V) <= rounding).all(), (isa, np.max(np.abs(Y - V) / rounding))


@pytest.mark.parametrize("dtype", KQ)
def test_prompt_matmat_without_vnni_same_bits(isa, dtype):
    """Without vpdpbusd the tiles form the same integers by vpmaddubsw + vpmaddwd (all but
    iq4_xs, whose u8 weights could overflow their int16 pairs: its prompt matmat is the
    portable int8 one there, t int8 matvecs, which run iq4_xs's int8 rows), so the prompt
    matmat keeps its bits."""
    if isa == "ref":
        pytest.skip("no tiles in the reference table")
    rng = np.random.default_rng(8)
    rows, cols, t = 31, 512, 19
    q, _raw = make(rng, dtype, rows, cols, precision="auto")
    X = rng.standard_normal((t, cols)).astype(np.float32)
    Y = q.matmat(X, prompt=True)
    K._hide_cpu_features(["avx512vnni", "avxvnni"])
    try:
        Y2 = q.matmat(X, prompt=True)
        V = np.stack([q.matvec(X[i]) for i in range(t)])
    finally:
        K._hide_cpu_features([])
    if dtype == "iq4_xs":
        np.testing.assert_array_equal(Y2, V)
    else:
        np.testing.assert_array_equal(Y2, Y)


@pytest.mark.parametrize("dtype", KQ)
def test_prompt_matmat_special_values(isa, dtype):
    """inf/NaN in x or in a block's scales make the rows they touch non-finite, as the
    int8 matvec does; the other rows stay finite and equal to it within rounding."""
    rng = np.random.default_rng(7)
    rows, cols = 26, 512
    raw = blocks(rng, dtype, rows, cols)
    nbb = FORMATS[dtype].block_bytes
    off_d = SCALES[dtype][0]
    raw.reshape(-1, nbb)[3, off_d:off_d + 2] = np.array([np.inf], np.float16).view(np.uint8)  # row 1
    q = QTensor(raw, dtype, (rows, cols), precision="auto")
    X = rng.standard_normal((5, cols)).astype(np.float32)
    X[2, 100] = np.nan
    Y = q.matmat(X, prompt=True)
    V = np.stack([q.matvec(x) for x in X])
    np.testing.assert_array_equal(np.isfinite(Y), np.isfinite(V))
    assert not np.isfinite(Y[2]).any() and not np.isfinite(Y[:, 1]).any()
    ok = np.isfinite(V)
    assert np.allclose(Y[ok], V[ok], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", KQ)
def test_prompt_matmat_shared_pack_bit_identical(isa, threads, dtype):
    """A prompt chunk big enough that the pool's threads share the quantization of X
    (pieces of 16 inputs), with rows and inputs off the 8 x 8 stores of the result,
    gives the bits of one thread; all-zero groups (the scalar quantizer's bytes) and a
    loud one match the int8 matvecs as the rest do."""
    rng = np.random.default_rng(11)
    rows, cols, t = 45, 1024, 70
    q, _raw = make(rng, dtype, rows, cols, precision="auto")
    X = rng.standard_normal((t, cols)).astype(np.float32)
    X[3, 64:96] = 0.0                       # a zero group
    X[40, 224:256] = 0.0
    X[17, 300] = 1e30                       # a loud group
    before = cortiq.get_num_threads()
    cortiq.set_num_threads(1)
    try:
        Y1 = q.matmat(X, prompt=True)
        V = np.stack([q.matvec(x) for x in X])
    finally:
        cortiq.set_num_threads(before)
    np.testing.assert_array_equal(q.matmat(X, prompt=True), Y1)
    ok = np.isfinite(V)
    np.testing.assert_array_equal(np.isfinite(Y1), ok)
    assert np.allclose(Y1[ok], V[ok], rtol=1e-4, atol=1e-3 * np.abs(V[ok]).max())


@pytest.mark.parametrize("dtype", KQ)
def test_threads_bit_identical(isa, threads, dtype):
    rng = np.random.default_rng(3)
    rows, cols = 301, 512
    for precision in ("exact", "int8"):
        q, _ = make(rng, dtype, rows, cols, precision=precision)
        x = rng.standard_normal(cols).astype(np.float32)
        X = rng.standard_normal((3, cols)).astype(np.float32)
        y, Yb, Y = q.matvec(x), q.matvec_batch(X), q.matmat(X)
        before = cortiq.get_num_threads()
        cortiq.set_num_threads(1)
        try:
            np.testing.assert_array_equal(q.matvec(x), y)
            np.testing.assert_array_equal(q.matvec_batch(X), Yb)
            np.testing.assert_array_equal(q.matmat(X), Y)
        finally:
            cortiq.set_num_threads(before)


def test_simd_twins_agree_with_reference():
    """Every usable ISA (AVX-512 with VNNI and GFNI, without GFNI, without VNNI) against
    the scalar reference:
    the int8 path bit for bit (its spec fixes the float order), the exact path within
    float32 rounding."""
    rng = np.random.default_rng(11)
    rows, cols = 29, 2304
    for dtype in KQ:
        for precision in ("exact", "int8"):
            q, raw = make(rng, dtype, rows, cols, precision=precision)
            x = rng.standard_normal(cols).astype(np.float32)
            y_ref = with_isa("ref", q.matvec, x)
            tol = 2 * (cols // 32 + 16) * 4 * U * (abs_weights(raw, dtype, rows, cols) @ (np.abs(x) * 1.1))
            for isa in K.usable_isas():
                variants = []
                for hide in ([], ["gfni"], ["avx512vnni"]):
                    K._hide_cpu_features(hide)
                    try:
                        variants.append(with_isa(isa, q.matvec, x))
                    finally:
                        K._hide_cpu_features([])
                if precision == "int8":
                    assert_same_bits(variants[0], y_ref)
                else:
                    assert (np.abs(variants[0] - y_ref.astype(np.float64)) <= tol).all(), (dtype, precision, isa)
                for v in variants[1:]:
                    np.testing.assert_array_equal(v, variants[0])


@pytest.mark.parametrize("dtype", TILED)
@pytest.mark.parametrize("nblk", [1, 3, 64, 65])
def test_int8_rows_any_width_equal_reference(dtype, nblk):
    """The int8 rows of every usable ISA, with and without VNNI and GFNI, against the reference bit
    for bit at row widths on both sides of 64 blocks (the AVX-512 rows prepare x's side
    once per call up to that width and form it per row pair beyond it),
    with an odd row count so a lone row follows the pairs."""
    rng = np.random.default_rng(nblk)
    rows, cols = 3, 256 * nblk
    q, _ = make(rng, dtype, rows, cols, precision="int8")
    x = rng.standard_normal(cols).astype(np.float32)
    want = with_isa("ref", q.matvec, x)
    for isa in K.usable_isas():
        for hide in ([], ["gfni"], ["avx512vnni"]):
            K._hide_cpu_features(hide)
            try:
                assert_same_bits(with_isa(isa, q.matvec, x), want)
            finally:
                K._hide_cpu_features([])


def assert_same_bits(got, want):
    """Equal bit for bit, NaN anywhere matching NaN (its payload aside)."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def int8_everywhere(q, x):
    """The int8 matvec of q on every usable ISA, with and without VNNI and GFNI, with the ref's."""
    out = {"ref": with_isa("ref", q.matvec, x)}
    for isa in K.usable_isas():
        for hide in ([], ["gfni"], ["avx512vnni"]):
            K._hide_cpu_features(hide)
            try:
                out[(isa, tuple(hide))] = with_isa(isa, q.matvec, x)
            finally:
                K._hide_cpu_features([])
    return out


@pytest.mark.parametrize("dtype", TILED)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), nblk=st.integers(1, 6), rows=st.integers(1, 7),
       xkind=st.sampled_from(["normal", "sparse", "huge", "tiny", "inf", "nan"]),
       special=st.sampled_from([None, 0.0, 65504.0, 6e-8]))
def test_int8_kernels_equal_spec_bit_for_bit(dtype, seed, nblk, rows, xkind, special):
    """The SIMD int8 rows of q4_k / q5_k / q6_k / iq4_xs give kq_ref_i8_row's bits: odd row
    counts (a lone row after the pairs), one to six blocks, x with zeros, extremes and
    non-finite values, zero / largest / subnormal block scales, x misaligned."""
    rng = np.random.default_rng(seed)
    cols = 256 * nblk
    raw = blocks(rng, dtype, rows, cols, special=special)
    q = QTensor(raw, dtype, (rows, cols), precision="int8")
    x = rng.standard_normal(cols).astype(np.float32)
    if xkind == "sparse":
        x[rng.random(cols) < 0.7] = 0.0
    elif xkind == "huge":
        x *= np.float32(1e30)
    elif xkind == "tiny":
        x *= np.float32(1e-40)
    elif xkind in ("inf", "nan"):
        x[rng.integers(0, cols)] = np.inf if xkind == "inf" else np.nan
    buf = np.empty(cols * 4 + 128, np.uint8)
    off = (-buf.ctypes.data) % 64 + 4 * int(rng.integers(1, 16))
    xm = buf[off:off + cols * 4].view(np.float32)
    xm[:] = x
    got = int8_everywhere(q, xm)
    for key, y in got.items():
        try:
            assert_same_bits(y, got["ref"])
        except AssertionError as e:
            raise AssertionError(f"{dtype} on {key}") from e


@pytest.mark.parametrize("dtype", TILED)
def test_int8_rows_bit_identical_across_entry_points_and_threads(isa, dtype):
    """A row's bits do not depend on which row it is paired with (rows_dot from odd and
    even starts, row_dot), the thread count, matvec_many or matvec_batch (its tiles of
    up to four inputs)."""
    rng = np.random.default_rng(12)
    rows, cols = 23, 768
    q, _ = make(rng, dtype, rows, cols, precision="int8")
    x = rng.standard_normal(cols).astype(np.float32)
    y = q.matvec(x)
    for start, n in ((0, 1), (1, 1), (1, 4), (2, 5), (3, 20)):
        np.testing.assert_array_equal(q.rows_dot(start, n, x), y[start:start + n])
    assert all(q.row_dot(r, x) == y[r] for r in range(rows))
    before = cortiq.get_num_threads()
    try:
        for th in (1, 2, 3):
            cortiq.set_num_threads(th)
            np.testing.assert_array_equal(q.matvec(x), y)
            X = np.stack([x, -x, 2 * x, x * x, x + 1, 3 * x])  # a tile of four inputs, then two
            Y = q.matvec_batch(X)
            for j in range(len(X)):
                np.testing.assert_array_equal(Y[j], q.matvec(X[j]))
    finally:
        cortiq.set_num_threads(before)
    other, _ = make(rng, "q4_k" if dtype != "q4_k" else "q6_k", 3, cols, precision="int8")
    many = QTensor.matvec_many([q, other], x)
    np.testing.assert_array_equal(many[0], y)


@pytest.mark.parametrize("dtype", KQ)
def test_auto_precision_takes_int8(dtype):
    q, _ = make(np.random.default_rng(4), dtype, 2, 256, precision="auto")
    assert q.int8


@pytest.mark.parametrize("dtype", KQ)
def test_bad_shapes_refused(dtype):
    f = FORMATS[dtype]
    with pytest.raises(FormatError, match="cannot hold"):
        QTensor(np.zeros(f.block_bytes, np.uint8), dtype, (1, 128))
    with pytest.raises(FormatError, match="payload must be"):
        QTensor(np.zeros(f.block_bytes - 1, np.uint8), dtype, (1, 256))
    assert K.qmat_nbytes(dtype, 3, 512) == f.nbytes(3, 512)


def iq4_xs_blocks(rng, rows, cols, codes, scales):
    """iq4_xs block bytes with chosen contents: codes "random", "min" (0: level -127),
    "max" (15: level 113) or "minmax" (either, at random); 6-bit scales "random", "zero"
    (32: scale 0), "min" (0: -32), "max" (63: 31) or "mixed" (any of those per group)."""
    raw = blocks(rng, "iq4_xs", rows, cols).reshape(-1, 136)
    nb = raw.shape[0]
    if codes != "random":
        lo = {"min": [0], "max": [15], "minmax": [0, 15]}[codes]
        c = rng.choice(lo, size=(nb, 256)).astype(np.uint8)
        raw[:, 8:] = c[:, :128] | (c[:, 128:] << 4)
    if scales != "random":
        choice = {"zero": [32], "min": [0], "max": [63], "mixed": [0, 32, 63, 1, 62]}[scales]
        ls = rng.choice(choice, size=(nb, 8)).astype(np.uint32)
        sh = np.zeros(nb, np.uint32)
        for g in range(8):
            sh |= (ls[:, g] >> 4) << (2 * g)
        raw[:, 2] = sh & 0xFF
        raw[:, 3] = sh >> 8
        for i in range(4):
            raw[:, 4 + i] = (ls[:, 2 * i] & 15) | ((ls[:, 2 * i + 1] & 15) << 4)
    return raw.reshape(-1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), nblk=st.integers(1, 4), rows=st.sampled_from([1, 2, 3, 5]),
       t=st.integers(1, 5), codes=st.sampled_from(["random", "min", "max", "minmax"]),
       scales=st.sampled_from(["random", "zero", "min", "max", "mixed"]),
       xkind=st.sampled_from(["normal", "loud", "aligned", "opposed", "sparse"]))
def test_iq4_xs_int8_rows_extremes_equal_spec(seed, nblk, rows, t, codes, scales, xkind):
    """iq4_xs's SIMD int8 rows (AVX-512 bw / vnni / gfni tiles, AVX2) against
    kq_ref_i8_row bit for bit, at the integers' extremes: the levels -127 and 113 (u8
    241 under vpdpbusd, |level| 127 under vpmaddubsw), 6-bit scales 0, 32 and 63 (scale
    -32, 0, 31), and xq of 127 in every byte ("loud": |x| constant), with the level's
    sign or against it; odd row counts, 1-4 blocks, and matvec_batch's multi-input
    tiles for 1-5 inputs, each input's row equal to the reference's matvec of it."""
    rng = np.random.default_rng(seed)
    cols = 256 * nblk
    raw = iq4_xs_blocks(rng, rows, cols, codes, scales)
    q = QTensor(raw, "iq4_xs", (rows, cols), precision="int8")
    w = gguf_decode(raw, "iq4_xs", rows, cols)
    X = rng.standard_normal((t, cols)).astype(np.float32)
    if xkind == "loud":
        X = np.where(X < 0, -1.0, 1.0).astype(np.float32)
    elif xkind in ("aligned", "opposed"):  # xq = +-127 with (or against) row 0's level signs
        sign = np.where(w[0] < 0, -1.0, 1.0) * (1.0 if xkind == "aligned" else -1.0)
        X = np.tile(sign * 3.0, (t, 1)).astype(np.float32)
    elif xkind == "sparse":
        X[rng.random((t, cols)) < 0.7] = 0.0
    want = np.stack([with_isa("ref", q.matvec, x) for x in X])
    for isa in K.usable_isas():
        for hide in ([], ["gfni"], ["avx512vnni"]):
            K._hide_cpu_features(hide)
            try:
                V = np.stack([with_isa(isa, q.matvec, x) for x in X])
                B = with_isa(isa, q.matvec_batch, X)
            finally:
                K._hide_cpu_features([])
            for name, got in (("matvec", V), ("matvec_batch", B)):
                try:
                    assert_same_bits(got, want)
                except AssertionError as e:
                    raise AssertionError(f"iq4_xs {name} on {isa} {hide}") from e
    if xkind in ("aligned", "opposed") and scales == "max" and codes != "random":
        # the integers at their largest; x is exact in int8 (xq = +-127), so the result
        # is the float64 product's to the float32 rounding of the combination
        w0, x0 = w[0].astype(np.float64), X[0].astype(np.float64)
        assert abs(float(want[0, 0]) - w0 @ x0) <= 2 * (cols // 32 + 16) * 4 * U * (np.abs(w0) @ np.abs(x0))
