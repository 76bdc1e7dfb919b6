"""QTensor and the matvec kernel family: every dtype x every usable ISA against the
float64 product of cortiq.cmf.quant.dequantize (the decode reference), plus the
exactness contracts between matvec / row_dot / matvec_many / matmat / threads.

Tolerances, and why:
  DOT_ULPS = 2   a float32 dot of n terms (any summation order, FMA or not) is within
  EXTRA_ULPS = 8 n * u * sum|w*x| of the exact value (u = 2**-24). Factoring a scale out
                 (q8: rs * sum q*(col*x); q4/q2: sum_g s_g * sum q*x) adds a few
                 roundings per term that the decoded weight did not have (q8_2f's w is
                 itself rounded once): we allow (2n + 8) * u * sum|w*x| + tiny.
                 A wrong decode (a nibble off, a scale misplaced) errs by ~|w*x| and
                 fails this by orders of magnitude.
  Decoding (dequantize/row) and matvec_many/row_dot/threads are checked bit for bit.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import cortiq
from cortiq.kernels import _kernels as K
from cortiq.cmf import quant
from cortiq.errors import FormatError
from cortiq.kernels.tensor import DTYPES, QTensor
from cortiq.cmf.ggml_blocks import FORMATS as GGML
from cortiq.cmf.testing import GGML_F16_AT, ggml_random_payload, qtensor_from_f32
from arrays import misaligned  # tests/arrays.py
import optional

# cortiq's own encodable dtypes (the ggml block formats have no encoder here: they are
# imported from GGUF files; tests/test_ggml_kquants.py covers them)

U = 2.0 ** -24
DOT_ULPS = 2
EXTRA_ULPS = 8
GROUPED_ROWS = ("q4tp", "q2tp", "vbit", "vbit_ro")  # need cols % 32 == 0


def _ok_shape(dtype, cols):
    if dtype in GGML:  # rows of whole blocks
        return cols % GGML[dtype].block_elems == 0
    return not (dtype in GROUPED_ROWS and cols % 32)


def _cols_unit(dtype):
    return GGML[dtype].block_elems if dtype in GGML else 32


def _whole(dtype, cols):
    """cols, rounded up to whole blocks of a ggml format (256 for the K-quants)."""
    unit = GGML[dtype].block_elems if dtype in GGML else 1
    return -(-cols // unit) * unit


def make_ggml(dtype, rows, cols, rng, zero_rows=(), big=False):
    """A ggml block format has no encoder: random blocks, f16 scales from a normal (big:
    times 10^-4 .. 10^2 per block), zero rows by zero scales and mins."""
    f = GGML[dtype]
    raw = ggml_random_payload(rng, dtype, rows, cols)
    blocks = raw.reshape(rows, cols // f.block_elems, f.block_bytes)
    for at in GGML_F16_AT[dtype]:
        field = blocks[:, :, at:at + 2].copy().view("<f2").astype(np.float32)
        if big:
            field *= np.float32(10.0) ** rng.integers(-4, 3, size=field.shape).astype(np.float32)
        for r in zero_rows:
            if r < rows:
                field[r] = 0
        blocks[:, :, at:at + 2] = field.astype("<f2").view(np.uint8)
    return QTensor(raw, dtype, (rows, cols)), quant.dequantize(raw, dtype, (rows, cols))


def make(dtype, rows, cols, seed=0, zero_rows=(), big=False):
    rng = np.random.default_rng(seed)
    if dtype in GGML:
        return make_ggml(dtype, rows, cols, rng, zero_rows, big)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if big:  # mixed magnitudes inside rows and groups
        w *= np.float32(10.0) ** rng.integers(-4, 3, size=w.shape).astype(np.float32)
    for r in zero_rows:
        if r < rows:
            w[r] = 0
    q = qtensor_from_f32(w, dtype)
    d = quant.dequantize(quant.quantize(w, dtype), dtype, (rows, cols))
    return q, d


def bound(d, x):
    """(2n + 8) * u * |D| @ |x| (+ tiny for all-zero rows)."""
    return (DOT_ULPS * d.shape[-1] + EXTRA_ULPS) * U * (np.abs(d).astype(np.float64) @ np.abs(x).astype(np.float64)) + 1e-30


def assert_dot_close(y, d, x):
    exact = d.astype(np.float64) @ x.astype(np.float64)
    err = np.abs(y.astype(np.float64) - exact)
    b = bound(d, x)
    assert (err <= b).all(), f"max err/bound {np.max(err / b):.3g} at {np.argmax(err / b)}"


SHAPES = [(1, 32), (3, 64), (7, 96), (33, 128), (5, 40), (9, 7), (2, 1), (17, 33), (64, 320)]


@pytest.mark.parametrize("dtype,shape", [(d, s) for s in SHAPES for d in DTYPES
                                         if _ok_shape(d, s[1])])
def test_decode_and_matvec(isa, dtype, shape):
    rows, cols = shape
    q, d = make(dtype, rows, cols, seed=rows * 1000 + cols, zero_rows=(1,))
    assert q.rows == rows and q.cols == cols and q.dtype == dtype
    assert q.nbytes == (quant.expected_nbytes(dtype, (rows, cols)) or q.raw.size)
    np.testing.assert_array_equal(q.dequantize(), d)
    for i in (0, rows - 1, rows // 2):
        np.testing.assert_array_equal(q.row(i), d[i])
    x = np.random.default_rng(1).standard_normal(cols).astype(np.float32)
    y = q.matvec(x)
    assert y.shape == (rows,) and y.dtype == np.float32
    assert_dot_close(y, d, x)
    for i in range(rows):
        assert q.row_dot(i, x) == y[i]
    np.testing.assert_array_equal(q.qmat.rows_dot(0, rows, x), y)
    np.testing.assert_array_equal(q.qmat.rows_dot(rows // 2, rows - rows // 2, x), y[rows // 2:])
    out = np.full(rows, np.nan, np.float32)
    assert q.matvec(x, out=out) is out
    np.testing.assert_array_equal(out, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference_table(isa, dtype):
    cols = _whole(dtype, 160)
    q, d = make(dtype, 45, cols, seed=3, big=True)
    x = np.random.default_rng(4).standard_normal(cols).astype(np.float32)
    y = q.matvec(x)
    K.set_isa("ref")
    try:
        yr = q.matvec(x)
    finally:
        K.set_isa(isa)
    assert_dot_close(y, d, x)
    assert_dot_close(yr, d, x)
    # the twin and the spec agree within the same rounding bound of each other
    assert (np.abs(y.astype(np.float64) - yr) <= 2 * bound(d, x)).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmat(isa, dtype):
    rows, cols, t = 37, _whole(dtype, 96), 11
    q, d = make(dtype, rows, cols, seed=5, zero_rows=(0,))
    X = np.random.default_rng(6).standard_normal((t, cols)).astype(np.float32)
    Y = q.matmat(X)
    assert Y.shape == (t, rows)
    V = np.stack([q.matvec(X[i]) for i in range(t)])
    for i in range(t):
        assert_dot_close(Y[i], d, X[i])
    if isa == "ref":  # the reference matmat is t reference matvecs, bit for bit
        np.testing.assert_array_equal(Y, V)
    out = np.empty((t, rows), np.float32)
    assert q.matmat(X, out=out) is out
    np.testing.assert_array_equal(out, Y)
    assert q.matmat(np.empty((0, cols), np.float32)).shape == (0, rows)


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_row", "q4_block"])
@pytest.mark.parametrize("rows,cols,t", [(37, 100, 13), (16, 64, 6), (70, 33, 64), (5, 16, 7)])
def test_matmat_blocks_and_tails(isa, dtype, rows, cols, t):
    """Row quads, input groups and column tails of the blocked prefill kernels."""
    if not _ok_shape(dtype, cols):
        pytest.skip("layout needs cols % 32 == 0")
    q, d = make(dtype, rows, cols, seed=rows + cols + t)
    X = misaligned(np.random.default_rng(t).standard_normal((t, cols)).astype(np.float32))
    Y = q.matmat(X)
    for i in range(t):
        assert_dot_close(Y[i], d, X[i])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols,t", [(25, 160, 1), (49, 4128, 17), (24, 256, 64), (7, 288, 65),
                                         (30, 384, 130), (61, 96, 33), (3, 4160, 48), (9, 64, 1030)])
def test_matmat_panels_and_chunks(isa, dtype, rows, cols, t):
    """The packed prefill path: inputs in panels of up to 64 (t = 65, 130: a narrow last
    panel; 1, 17, 33, 48: 1-3 vectors), rows in blocks of 24 with a partial last one,
    columns in chunks of 128 (4128, 4160: a short last chunk; 160, 288: q4tp's codes,
    8 groups per 5 bytes, start mid-byte in a chunk), inputs in pieces of 16-64 (65, 130, 1030),
    mixed magnitudes; misaligned X."""
    if not _ok_shape(dtype, cols):
        pytest.skip("layout needs cols % 32 == 0")
    q, d = make(dtype, rows, cols, seed=rows + 7 * t, zero_rows=(2,), big=True)
    X = misaligned(np.random.default_rng(t).standard_normal((t, cols)).astype(np.float32))
    Y = q.matmat(X)
    for i in range(t):
        assert_dot_close(Y[i], d, X[i])
    np.testing.assert_array_equal(Y[:, 2], 0)  # an all-zero row


@pytest.mark.parametrize("dtype", ["q4_tiled", "q4tp", "q2tp"])
@pytest.mark.parametrize("groups", [1, 3, 4, 7, 16, 17, 64, 67, 130])
def test_q4_vbmi_loaders_agree(dtype, groups):
    """Exact q4 rows on AVX-512 with and without VBMI give the same bits, through matvec,
    rows_dot and row_dot: q4_tiled's VBMI tile loader (halves by one vpermb, nibbles
    blended from four loads) against the plain one (four loads, three inserts, gathered
    scales), and q4tp's VBMI scale-code
    decoder (vpermb, vpmultishiftqb; q2tp shares it) against 64-bit shifts; blocks of four groups plus
    0-3 tail groups, a scale row decoded 64 groups at a time, 16 codes at a time."""
    optional.need_that("isa", "avx512" in K.usable_isas(), "no AVX-512 table usable here")
    cols = 32 * groups
    q, d = make(dtype, 19, cols, seed=groups, big=True)
    x = misaligned(np.random.default_rng(groups).standard_normal(cols).astype(np.float32))
    before = K.active_isa()
    out = []
    try:
        K.set_isa("avx512")
        for hide in ([], ["avx512vbmi"]):
            K._hide_cpu_features(hide)
            try:
                out.append((q.matvec(x), q.row_dot(5, x), q.qmat.rows_dot(3, 9, x)))
            finally:
                K._hide_cpu_features([])
    finally:
        K.set_isa(before)
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)
    assert_dot_close(out[0][0], d, x)
    np.testing.assert_array_equal(out[0][1], out[0][0][5])


def _at_guard_page(raw):
    """raw copied to the very end of a readable mapping whose next page is PROT_NONE (as
    a payload that ends a file mapping): a kernel that reads past it faults."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    n = -(-raw.size // page) * page
    mm = mmap.mmap(-1, n + page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if libc.mprotect(base + n, page, 0) != 0:
        pytest.skip("mprotect unavailable")
    view = np.frombuffer(mm, np.uint8, count=raw.size, offset=n - raw.size)
    view[:] = raw
    return view


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d not in ("vbit", "vbit_ro")])
@pytest.mark.parametrize("rows,cols", [(3, 128), (2, 4096), (5, 96), (1, 4128), (2, 9248)])
def test_payload_ending_at_a_guard_page(isa, dtype, rows, cols):
    """Kernels read no byte past a payload, on every path (row dots, wide rows, matmat,
    decode; 9248 columns take the chunked wide-q8 rows): the file mapping may end right
    after the last tensor."""
    if not _ok_shape(dtype, cols):
        pytest.skip("layout needs cols % 32 == 0")
    q, d = make(dtype, rows, cols, seed=rows + cols)
    g = QTensor(_at_guard_page(q.raw), dtype, (rows, cols))
    x = np.random.default_rng(cols).standard_normal(cols).astype(np.float32)
    np.testing.assert_array_equal(g.matvec(x), q.matvec(x))
    np.testing.assert_array_equal(g.row_dot(rows - 1, x), q.row_dot(rows - 1, x))
    X = np.random.default_rng(rows).standard_normal((5, cols)).astype(np.float32)
    np.testing.assert_array_equal(g.matmat(X), q.matmat(X))
    np.testing.assert_array_equal(g.dequantize(), d)
    assert_dot_close(g.matvec(x), d, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_threads_bit_identical(isa, threads, dtype):
    q, _ = make(dtype, 300, 512, seed=7)
    x = np.random.default_rng(8).standard_normal(512).astype(np.float32)
    X = np.random.default_rng(9).standard_normal((13, 512)).astype(np.float32)
    y, Y = q.matvec(x), q.matmat(X)
    cortiq.set_num_threads(1)
    np.testing.assert_array_equal(q.matvec(x), y)
    np.testing.assert_array_equal(q.matmat(X), Y)


@pytest.mark.parametrize("dtype", ["q8_row", "f16", "q4_block"])
def test_rows_claimed_in_pieces(isa, threads, dtype):
    """Threads claim rows in pieces of about 64 KiB of weights, their own share first,
    then each other's leftovers: with many short rows (many claims a thread, more
    threads than cores) every row is written once, by the same code, for any count."""
    rows = 20011
    q, d = make(dtype, rows, 64, seed=3)
    x = np.random.default_rng(4).standard_normal(64).astype(np.float32)
    y = np.full(rows, np.nan, np.float32)
    q.matvec(x, y)
    assert_dot_close(y, d, x)
    a, b = QTensor.matvec_many([q, q], x)
    np.testing.assert_array_equal(a, y)
    np.testing.assert_array_equal(b, y)
    many = QTensor.matvec_many([q] * 20, x)  # 20 matrices x threads shares: heap-held
    assert all(np.array_equal(o, y) for o in many)
    cortiq.set_num_threads(1)
    np.testing.assert_array_equal(q.matvec(x), y)


def test_matvec_many_bit_identical(isa, threads):
    cols = 256
    ts = [make(dt, r, cols, seed=i)[0] for i, (dt, r) in
          enumerate([("q8_row", 300), ("q8_2f", 40), ("q4_tiled", 64), ("f16", 8), ("q4tp", 130)])]
    x = np.random.default_rng(2).standard_normal(cols).astype(np.float32)
    outs = QTensor.matvec_many(ts, x)
    for t, o in zip(ts, outs):
        np.testing.assert_array_equal(o, t.matvec(x))
    given_outs = [np.empty(t.rows, np.float32) for t in ts]
    res = QTensor.matvec_many(ts, x, given_outs)
    assert all(a is b for a, b in zip(res, given_outs))
    assert QTensor.matvec_many([], x) == []
    with pytest.raises(ValueError, match="matvec_many"):
        QTensor.matvec_many([ts[0], make("f32", 3, 64)[0]], x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_extreme_and_misaligned(isa, dtype):
    rows, cols = 12, _whole(dtype, 128)
    rng = np.random.default_rng(11)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[0] = 0                          # an all-zero row
    w[1, :32] = 0                     # an all-zero group
    w[2] *= 1e4                       # large
    w[3] *= 1e-5                      # tiny (scales floored at 2**-14)
    w[4, 5] = 3e4                     # one outlier in a group
    if dtype in GGML:  # no encoder: blocks of mixed magnitude, row 0 all zero
        raw = make_ggml(dtype, rows, cols, rng, zero_rows=(0,), big=True)[0].raw
    else:
        raw = quant.quantize(w, dtype)
    d = quant.dequantize(raw, dtype, (rows, cols))
    q = QTensor(misaligned(raw), dtype, (rows, cols))
    x = misaligned(rng.standard_normal(cols).astype(np.float32))
    assert x.ctypes.data % 32 != 0
    np.testing.assert_array_equal(q.dequantize(), d)
    y = q.matvec(x)
    assert_dot_close(y, d, x)
    assert y[0] == 0
    Y = q.matmat(misaligned(np.stack([x, -x, 2 * x])))
    assert_dot_close(Y[1], d, -x)


def test_nan_in_x_propagates(isa):
    q, _ = make("q8_row", 4, 64)
    x = np.ones(64, np.float32)
    x[10] = np.nan
    assert np.isnan(q.matvec(x)).all()


@given(rows=st.integers(1, 300), cols=st.integers(1, 12).map(lambda k: 32 * k) | st.integers(1, 200),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31))
def test_hypothesis_shapes(isas, rows, cols, dtype, seed):
    if not _ok_shape(dtype, cols):
        cols = _cols_unit(dtype) * max(1, cols // _cols_unit(dtype))
    q, d = make(dtype, rows, cols, seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal(cols).astype(np.float32)
    X = np.random.default_rng(seed + 2).standard_normal((3, cols)).astype(np.float32)
    before = K.active_isa()
    try:
        for isa in isas:
            K.set_isa(isa)
            np.testing.assert_array_equal(q.dequantize(), d)
            assert_dot_close(q.matvec(x), d, x)
            Y = q.matmat(X)
            for i in range(3):
                assert_dot_close(Y[i], d, X[i])
    finally:
        K.set_isa(before)


def test_argument_errors():
    q, _ = make("q8_row", 4, 64)
    with pytest.raises(TypeError, match="matvec"):
        q.matvec(np.ones(64, np.float64))
    with pytest.raises(ValueError, match="matvec"):
        q.matvec(np.ones(63, np.float32))
    with pytest.raises(ValueError, match="matvec"):
        q.matvec(np.ones(64, np.float32), out=np.empty(3, np.float32))
    with pytest.raises(ValueError, match="matmat"):
        q.matmat(np.ones((2, 65), np.float32))
    with pytest.raises(IndexError):
        q.row(4)
    np.testing.assert_array_equal(q.row(-1), q.dequantize()[-1])
    with pytest.raises(FormatError, match="payload"):
        QTensor(np.zeros(10, np.uint8), "q8_row", (4, 64))
    with pytest.raises(FormatError, match="cols % 32"):
        QTensor(np.zeros(100, np.uint8), "q4tp", (2, 40))
    with pytest.raises(ValueError, match="dtype"):
        QTensor(np.zeros(10, np.uint8), "q1", (1, 32))
    good = quant.quantize(np.ones((2, 64), np.float32), "vbit_ro")
    for bad in (good[:-1], np.concatenate([[7], good[1:]]).astype(np.uint8)):
        with pytest.raises(FormatError, match="vbit_ro"):
            QTensor(bad, "vbit_ro", (2, 64))
    with pytest.raises(ValueError, match="2-D"):
        qtensor_from_f32(np.ones(5, np.float32), "f32")


def test_spec_example_q8_row():
    # docs/cmf-format.md §7.2: row [0.5, -1, 0.25, 0, 0.1, -0.3, 0.7, 0.05]
    raw = np.array([0x40, 0x81, 0x20, 0x00, 0x0d, 0xda, 0x59, 0x06, 0x08, 0x20], np.uint8)
    q = QTensor(raw, "q8_row", (1, 8))
    s = np.float32(0.00787353515625)
    want = np.array([64, -127, 32, 0, 13, -38, 89, 6], np.float32) * s
    np.testing.assert_array_equal(q.row(0), want)
    assert q.matvec(np.ones(8, np.float32))[0] == pytest.approx(float(want.astype(np.float64).sum()), rel=1e-6)


class _FakeCmf:
    def __init__(self, tensors):
        from types import SimpleNamespace
        self._arrays = tensors
        self.path = "fake.cmf"
        self.tensors = {n: SimpleNamespace(dtype=dt, shape=a.shape, nbytes=quant.quantize(a, dt).size)
                        for n, (dt, a) in tensors.items()}

    def resolve(self, name, skill=None):
        return name

    def raw(self, name):
        dt, a = self._arrays[name]
        return quant.quantize(a, dt)

    def tensor(self, name, skill=None):
        dt, a = self._arrays[name]
        return quant.dequantize(quant.quantize(a, dt), dt, a.shape)


def test_from_cmf():
    a = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    cf = _FakeCmf({"w": ("q4_tiled", a), "v": ("vbit", a), "n": ("f16", a[0]),
                   "o": ("q4_block", a[:, :40].copy())})
    q = QTensor.from_cmf(cf, "w")
    assert q.dtype == "q4_tiled" and q.shape == (8, 64) and q.name == "w"
    np.testing.assert_array_equal(q.dequantize(), cf.tensor("w"))
    v = QTensor.from_cmf(cf, "v")
    assert v.dtype == "vbit"
    np.testing.assert_array_equal(v.dequantize(), cf.tensor("v"))
    o = QTensor.from_cmf(cf, "o")
    assert o.dtype == "q4_block"  # cols % 32 != 0 still has a (scalar) kernel
    np.testing.assert_array_equal(o.dequantize(), cf.tensor("o"))
    with pytest.raises(FormatError, match="2-D"):
        QTensor.from_cmf(cf, "n")


@pytest.mark.parametrize("dtype", ["q8_row", "q8_2f", "f16", "q4_block"])
@pytest.mark.parametrize("cols", [9217, 11008 + 37, 16384])
def test_wide_rows_bit_identical(isa, threads, dtype, cols):
    """Rows whose x overflows L1 (the AVX-512 q8 kernel then walks panels of rows
    chunk by chunk, panels starting wherever a thread's share starts): every entry
    point and thread count gives the same bits, within rounding of the exact product."""
    rows = 70  # > two panels of 32, and a partial one
    if not _ok_shape(dtype, cols):
        pytest.skip("layout needs cols % 32 == 0")
    q, d = make(dtype, rows, cols, seed=cols)
    x = misaligned(np.random.default_rng(cols).standard_normal(cols).astype(np.float32))
    y = q.matvec(x)
    assert_dot_close(y, d, x)
    for i in (0, 31, 32, 33, 63, 64, rows - 1):
        assert q.row_dot(i, x) == y[i]
    np.testing.assert_array_equal(q.rows_dot(5, rows - 5, x), y[5:])
    np.testing.assert_array_equal(QTensor.matvec_many([q, q], x)[1], y)


@pytest.mark.parametrize("threads_", [1, 2, 3])
@pytest.mark.parametrize("streams", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [0, 5, 4096, 4096 * 7 + 13, 4096 * 33])
def test_read_probe_reads_every_byte_once(threads_, streams, n):
    """The benchmark's read probe: whatever the threads and streams, the sum of the
    64-bit words of the whole 4 KiB blocks plus the remaining bytes, each read once."""
    buf = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    whole = n // 4096 * 4096
    want = (int(buf[:whole].view(np.uint64).sum(dtype=np.uint64)) + int(buf[whole:].sum())) % 2**64
    assert K.read_sum(buf, threads_, streams) == want
    with pytest.raises(ValueError, match="streams"):
        K.read_sum(buf, 1, 9)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 9, 70])
def test_row_streams_bit_identical(isa, threads, dtype, rows):
    """The AVX2 drivers read rows as four far-apart streams side by side (lanes of a
    thread's share, matvec_drivers.h CQ_ROW_STREAMS): a row's bits do not depend on
    which rows it is read beside, so row_dot, rows_dot over any range, matvec and every
    thread count agree bit for bit (column counts with 64-, 16- and 8-column tails)."""
    for cols in (32, 200, 1000, 4160 + 24):
        if not _ok_shape(dtype, cols):
            continue
        q, d = make(dtype, rows, cols, seed=rows * cols)
        x = np.random.default_rng(cols).standard_normal(cols).astype(np.float32)
        y = q.matvec(x)
        assert_dot_close(y, d, x)
        np.testing.assert_array_equal([q.row_dot(i, x) for i in range(rows)], y)
        for a in range(min(rows, 4)):
            for b in (a + 1, rows):
                np.testing.assert_array_equal(q.rows_dot(a, b - a, x), y[a:b])


LANE_BYTES = 131072  # csrc/matvec/qmat.h CQ_LANE_BYTES: the bytes of one stream's lane


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_row", "q8_2f"])  # the lane dtypes
def test_row_streams_many_panels(isa, dtype):
    """Shares long enough for several full panels of four lanes and a shortened last
    panel (about nine lanes a thread at three threads): every row lands in its own
    place, and every thread count gives the bits of row_dot. (The grouped dtypes read
    rows in order: test_row_streams_bit_identical covers them.)"""
    cols = 64
    if not _ok_shape(dtype, cols):
        pytest.skip("layout needs other columns")
    probe, _ = make(dtype, 4, cols)
    lane = max(1, LANE_BYTES // (probe.nbytes // 4))
    rows = 3 * 9 * lane + 7
    q, d = make(dtype, rows, cols, seed=11)
    x = np.random.default_rng(5).standard_normal(cols).astype(np.float32)
    before = cortiq.get_num_threads()
    try:
        ys = []
        for th in (1, 2, 3):
            cortiq.set_num_threads(th)
            ys.append(q.matvec(x))
    finally:
        cortiq.set_num_threads(before)
    assert_dot_close(ys[0], d, x)
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])
    pick = np.random.default_rng(1).choice(rows, 64, replace=False)
    np.testing.assert_array_equal([q.row_dot(int(i), x) for i in pick], ys[0][pick])
