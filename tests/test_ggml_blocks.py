"""The ggml block formats as CMF dtypes (docs/cmf-format.md §7.9) and their kernels.

References that are not cortiq's code: the ``gguf`` package's dequantizers (what every
decoder must equal bit for bit), a float64 dot of the decoded weights (the products'
bound), and a NumPy model of the int8-activation algorithm (csrc/matvec/qmat.h,
CQ_XQ_G32: x quantized per 32 columns, exact integer sums per block, then the block's
scales). The kernel tests run over the formats the C side has kernels for
(``GGML_DTYPES``); the decode and file tests over all twelve.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import cortiq
import cortiq.cmf as C
import optional
from cortiq.cmf import ggml_dequant
from cortiq.cmf import quant as Q
from cortiq.cmf.ggml_blocks import FORMATS
from cortiq.cmf.reader import FEAT_GGML_BLOCKS
from cortiq.cmf.testing import tiny_arch
from cortiq.errors import FormatError
from cortiq.kernels import _kernels as K
from cortiq.kernels.tensor import QTensor

#: the 32-weight formats with kernels (the K-quants' kernels: tests/test_ggml_kquants.py)
KERNEL = tuple(n for n in K.GGML_DTYPES if FORMATS[n].block_elems == 32)
ALL = tuple(FORMATS)
U = 2.0 ** -24
#: byte offsets of each format's f16 fields (scale d, and the min/dmin where there is one)
F16_AT = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,),
          "q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,),
          "iq4_nl": (0,), "iq4_xs": (0,)}
SPECIAL_F16 = {"zero": 0x0000, "negzero": 0x8000, "subnormal": 0x0001, "subnormal_max": 0x03FF,
               "inf": 0x7C00, "neginf": 0xFC00, "nan": 0x7E00, "snan": 0x7C01}


def gguf_dequant(raw: np.ndarray, name: str, rows: int) -> np.ndarray:
    gguf = optional.need("extras", "gguf")
    from gguf.quants import dequantize
    with np.errstate(all="ignore"):
        return dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[name.upper()]).astype(np.float32)


def random_payload(rng, name: str, rows: int, cols: int, special: str | None = None,
                   scale: float = 0.01) -> np.ndarray:
    """Random code bytes with finite f16 scales drawn from a normal (mins too); `special`
    puts that f16 value into the first field of about one block in five."""
    f = FORMATS[name]
    nblk = rows * cols // f.block_elems
    raw = rng.integers(0, 256, nblk * f.block_bytes, dtype=np.uint8).reshape(nblk, f.block_bytes)
    for i, at in enumerate(F16_AT[name]):
        v = (rng.standard_normal(nblk) * (scale if i == 0 else scale * 4)).astype("<f2")
        raw[:, at:at + 2] = v.view(np.uint8).reshape(nblk, 2)
    if special is not None:
        hit = rng.random(nblk) < 0.2
        at = F16_AT[name][0]
        raw[hit, at:at + 2] = np.array([SPECIAL_F16[special]], "<u2").view(np.uint8)
    return raw.reshape(-1)


def same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, NaN for NaN (a NaN's payload may be quieted differently)."""
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    nan = np.isnan(a)
    return bool((nan == np.isnan(b)).all() and (a.view(np.uint32)[~nan] == b.view(np.uint32)[~nan]).all())


# ---- the tables ---------------------------------------------------------------------
def test_dtype_tables_agree():
    assert K._GGML_IDS == {n: f.cmf_id for n, f in FORMATS.items()}
    for n, f in FORMATS.items():
        assert Q.DTYPES[n] == 64 + f.ggml_type and Q.DTYPE_NAMES[f.cmf_id] == n
    # the 32-weight formats have kernels on this branch; whatever has one is a QTensor dtype
    assert {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"} <= set(KERNEL)
    assert set(KERNEL) <= set(cortiq.kernels.tensor.DTYPES)
    assert set(KERNEL) <= set(K.AUTO_I8_DTYPES) and set(KERNEL) <= set(K.I8_DTYPES)


@pytest.mark.parametrize("name", KERNEL)
def test_payload_size_rule(name):
    f = FORMATS[name]
    for rows, blocks in ((1, 1), (3, 5), (7, 2)):
        cols = blocks * f.block_elems
        assert K.qmat_nbytes(name, rows, cols) == f.nbytes(rows, cols) == Q.expected_nbytes(name, (rows, cols))
        assert K.qmat_nbytes(name, rows, cols + 16) == 0   # not whole blocks
    with pytest.raises(FormatError, match="payload must be"):
        QTensor(np.zeros(f.block_bytes - 1, np.uint8), name, (1, f.block_elems))
    with pytest.raises(FormatError, match="cannot hold shape"):
        QTensor(np.zeros(f.block_bytes, np.uint8), name, (1, f.block_elems + 1))


# ---- decode: equal to gguf's dequantizers ------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ALL), st.integers(1, 5), st.integers(1, 3),
       st.sampled_from([None, *SPECIAL_F16]), st.integers(0, 2**31))
def test_numpy_decode_equals_gguf(name, rows, blocks, special, seed):
    rng = np.random.default_rng(seed)
    cols = blocks * FORMATS[name].block_elems
    raw = random_payload(rng, name, rows, cols, special)
    want = gguf_dequant(raw, name, rows)
    got = Q.dequantize(raw, name, (rows, cols))
    assert got.shape == (rows, cols) and same_floats(got, want.reshape(rows, cols))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(KERNEL), st.integers(1, 9), st.integers(1, 12),
       st.sampled_from([None, *SPECIAL_F16]), st.integers(0, 2**31))
def test_c_decode_equals_gguf(isas, name, rows, blocks, special, seed):
    rng = np.random.default_rng(seed)
    cols = 32 * blocks
    raw = random_payload(rng, name, rows, cols, special)
    want = gguf_dequant(raw, name, rows).reshape(rows, cols)
    before = K.active_isa()
    try:
        for isa in isas:
            K.set_isa(isa)
            q = QTensor(raw, name, (rows, cols))
            assert same_floats(q.dequantize(), want), isa
            r = int(rng.integers(rows))
            assert same_floats(q.row(r), want[r]), isa
    finally:
        K.set_isa(before)


# ---- products ----------------------------------------------------------------------
def exact_bound(w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 W @ x, the float32 allowance (cols/8 + 40) * 2^-23 * sum|w x|)."""
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    return w64 @ x64, (w.shape[1] / 8 + 40) * 2.0 ** -23 * (np.abs(w64) @ np.abs(x64)) + 1e-30


def quantize_x(x: np.ndarray):
    """xq [groups, 32] and d [groups] as qmat.h's cq_xq_quant32 defines them."""
    xg = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xg).max(axis=1)
    with np.errstate(all="ignore"):
        idv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
        xq = np.rint((xg * idv[:, None]).astype(np.float32))
        d = (amax / np.float32(127.0)).astype(np.float64)
    return xq.astype(np.float64), d


def int8_model(q: QTensor, x: np.ndarray):
    """(y, allowance, quantization bound) of the int8 algorithm: per block of 32 the
    weights times xq summed exactly, times d; the allowance covers the float32
    combination (and, for q4_1/q5_1, the rounding of (d * q) + m in the decoded w)."""
    rows, cols = q.rows, q.cols
    w = q.dequantize().astype(np.float64).reshape(rows, cols // 32, 32)
    xq, d = quantize_x(x)
    y = (np.einsum("rgk,gk->rg", w, xq) * d).sum(axis=1)
    mags = (np.einsum("rgk,gk->rg", np.abs(w), np.abs(xq)) * d).sum(axis=1)
    allow = (4 * (cols // 32) + 8) * U * mags + 1e-30
    qbound = (np.abs(w).sum(axis=2) * d * (0.5 + 1e-4)).sum(axis=1)
    return y, allow, qbound


def entry_points_agree(q: QTensor, x: np.ndarray, y: np.ndarray) -> None:
    """matvec, row_dot, rows_dot and matvec_many give the same bits."""
    for i in range(q.rows):
        assert q.row_dot(i, x) == y[i] or (np.isnan(y[i]) and np.isnan(q.row_dot(i, x)))
    h = q.rows // 2
    np.testing.assert_array_equal(q.rows_dot(h, q.rows - h, x), y[h:])
    np.testing.assert_array_equal(QTensor.matvec_many([q, q], x)[1], y)


@pytest.mark.parametrize("name", KERNEL)
@pytest.mark.parametrize("shape", [(1, 32), (3, 64), (5, 96), (17, 160), (33, 4128), (7, 288)])
def test_exact_products_within_bound(isa, name, shape):
    rows, cols = shape
    rng = np.random.default_rng(rows * 131 + cols)
    q = QTensor(random_payload(rng, name, rows, cols), name, shape, precision="exact")
    x = rng.standard_normal(cols).astype(np.float32)
    y = q.matvec(x)
    exact, bound = exact_bound(q.dequantize(), x)
    assert (np.abs(y - exact) <= bound).all()
    entry_points_agree(q, x, y)
    X = rng.standard_normal((5, cols)).astype(np.float32)
    Y = q.matmat(X)
    for i in range(5):
        e, b = exact_bound(q.dequantize(), X[i])
        assert (np.abs(Y[i] - e) <= b).all()


@pytest.mark.parametrize("name", KERNEL)
@pytest.mark.parametrize("shape", [(1, 32), (3, 64), (5, 96), (17, 160), (33, 4128), (7, 288), (64, 320)])
def test_int8_products_match_model_and_bound(isa, name, shape):
    rows, cols = shape
    rng = np.random.default_rng(rows * 7919 + cols)
    q = QTensor(random_payload(rng, name, rows, cols), name, shape, precision="int8")
    assert q.int8
    x = rng.standard_normal(cols).astype(np.float32)
    x[:32] *= 1000.0   # groups of very different magnitude
    y = q.matvec(x)
    model, allow, qbound = int8_model(q, x)
    assert (np.abs(y - model) <= allow).all(), np.max(np.abs(y - model) / allow)
    exact, bound = exact_bound(q.dequantize(), x)
    assert (np.abs(y - exact) <= qbound + allow + bound).all()
    entry_points_agree(q, x, y)
    # matvec_batch with int8 x: each input's rows are its int8 matvec's; matmat: the
    # same integers (the SIMD tables' tiles combine them in another order)
    X = rng.standard_normal((3, cols)).astype(np.float32)
    Y = q.matmat(X)
    B = q.matvec_batch(X)
    for i in range(3):
        np.testing.assert_array_equal(B[i], q.matvec(X[i]))
        model, allow, _ = int8_model(q, X[i])
        assert (np.abs(Y[i] - model) <= allow).all()
        if isa == "ref" or name in ("q4_1", "q5_1"):   # t int8 matvecs
            np.testing.assert_array_equal(Y[i], q.matvec(X[i]))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(KERNEL), st.integers(1, 40), st.integers(1, 30), st.integers(0, 2**31))
def test_hypothesis_shapes_isas_and_misaligned_x(isas, name, rows, groups, seed):
    rng = np.random.default_rng(seed)
    cols = 32 * groups
    raw = random_payload(rng, name, rows, cols, scale=float(10.0 ** rng.integers(-4, 1)))
    # a payload off a 64-byte boundary, and x off one
    pbuf = np.empty(raw.size + 64, np.uint8)
    po = int(rng.integers(1, 63))
    pbuf[po:po + raw.size] = raw
    praw = pbuf[po:po + raw.size]
    x = (rng.standard_normal(cols) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
    x[rng.random(cols) < 0.1] = 0.0
    xbuf = np.empty(cols * 4 + 128, np.uint8)
    xo = (-xbuf.ctypes.data) % 64 + 4 * int(rng.integers(1, 15))
    xm = xbuf[xo:xo + cols * 4].view(np.float32)
    xm[:] = x
    before = K.active_isa()
    try:
        for isa in isas:
            K.set_isa(isa)
            qe = QTensor(praw, name, (rows, cols), precision="exact")
            exact, bound = exact_bound(qe.dequantize(), x)
            assert (np.abs(qe.matvec(xm) - exact) <= bound).all(), isa
            qi = QTensor(praw, name, (rows, cols), precision="int8")
            y = qi.matvec(xm)
            model, allow, _ = int8_model(qi, x)
            assert (np.abs(y - model) <= allow).all(), isa
            np.testing.assert_array_equal(qi.matvec(x), y)
    finally:
        K.set_isa(before)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(KERNEL), st.integers(1, 20), st.integers(1, 40), st.integers(0, 2**31))
def test_avx2_int8_rows_same_bits_with_and_without_vpdpbusd(name, rows, groups, seed):
    """The AVX2 table's int8 rows by 256-bit vpdpbusd (AVX-512 VNNI + VL, or AVX-VNNI)
    and by maddubs + madd (the features hidden) sum the same integers in the same float
    order: the same bits, for every row count, whole and partial steps of eight blocks,
    a payload off a 64-byte boundary, one x and several."""
    if "avx2" not in K.usable_isas():
        pytest.skip("no AVX2 table on this CPU")
    if not {"avx512vnni", "avxvnni"} & set(K.cpu_features()):
        pytest.skip("no vpdpbusd on this CPU: one variant only")
    rng = np.random.default_rng(seed)
    cols = 32 * groups
    raw = random_payload(rng, name, rows, cols, scale=float(10.0 ** rng.integers(-4, 1)))
    pbuf = np.empty(raw.size + 64, np.uint8)
    po = int(rng.integers(1, 63))
    pbuf[po:po + raw.size] = raw
    q = QTensor(pbuf[po:po + raw.size], name, (rows, cols), precision="int8")
    X = (rng.standard_normal((3, cols)) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
    X[:, :32] *= 1000.0
    before = K.active_isa()
    try:
        K.set_isa("avx2")
        ys = [q.matvec(X[0]), q.matvec_batch(X)]
        K._hide_cpu_features(["avx512vnni", "avxvnni"])
        plain = [q.matvec(X[0]), q.matvec_batch(X)]
    finally:
        K._hide_cpu_features([])
        K.set_isa(before)
    for a, b in zip(ys, plain):
        np.testing.assert_array_equal(a, b)
    model, allow, _ = int8_model(q, X[0])
    assert (np.abs(ys[0] - model) <= allow).all()


@pytest.mark.parametrize("name", KERNEL)
def test_threads_bit_identical(isa, threads, name):
    rng = np.random.default_rng(3)
    rows, cols = 301, 1024
    raw = random_payload(rng, name, rows, cols)
    x = rng.standard_normal(cols).astype(np.float32)
    for prec in ("exact", "int8"):
        q = QTensor(raw, name, (rows, cols), precision=prec)
        y = q.matvec(x)
        before = cortiq.get_num_threads()
        try:
            cortiq.set_num_threads(1)
            np.testing.assert_array_equal(q.matvec(x), y)
        finally:
            cortiq.set_num_threads(before)


@pytest.mark.parametrize("name", KERNEL)
@pytest.mark.parametrize("special", ["inf", "nan", "zero", "subnormal"])
def test_special_scales(isa, name, special):
    """A block whose scale is inf or NaN makes its row's products non-finite in both
    precisions (never a silent finite value); zero and subnormal scales are ordinary."""
    rng = np.random.default_rng(11)
    rows, cols = 40, 256
    raw = random_payload(rng, name, rows, cols, special)
    x = rng.standard_normal(cols).astype(np.float32)
    w = gguf_dequant(raw, name, rows).reshape(rows, cols)
    bad = ~np.isfinite(w).all(axis=1)
    for prec in ("exact", "int8"):
        y = QTensor(raw, name, (rows, cols), precision=prec).matvec(x)
        assert (~np.isfinite(y) == bad).all() if special in ("inf", "nan") else np.isfinite(y).all()
    if special in ("inf", "nan"):
        assert bad.any()


def test_auto_takes_ggml_formats_to_int8():
    for name in KERNEL:
        f = FORMATS[name]
        q = QTensor(np.zeros(f.block_bytes, np.uint8), name, (1, f.block_elems), precision="auto")
        assert q.int8 and q.int8_prompt


# ---- the file format ---------------------------------------------------------------
def test_cmf_round_trip(tmp_path):
    rng = np.random.default_rng(5)
    payloads = {}
    with C.Writer(tmp_path / "g.cmf", arch=tiny_arch(), progress=False) as w:
        for name, f in FORMATS.items():
            shape = (3, 2 * f.block_elems)
            payloads[name] = (random_payload(rng, name, *shape), shape)
            w.add_encoded(f"t.{name}", payloads[name][0], name, shape)
        w.add("t.plain", np.ones((4, 32), np.float32), dtype="f32")
    cf = C.open(tmp_path / "g.cmf")
    assert cf.features & FEAT_GGML_BLOCKS
    for name, (raw, shape) in payloads.items():
        info = cf.tensors[f"t.{name}"]
        assert info.dtype == name and tuple(info.shape) == shape
        assert np.array_equal(np.asarray(cf.raw(f"t.{name}")), raw)
        assert same_floats(cf.tensor(f"t.{name}"), ggml_dequant.dequantize(raw, name, raw.size // FORMATS[name].block_bytes * FORMATS[name].block_elems).reshape(shape))
        q = QTensor.from_cmf(cf, f"t.{name}")
        # with a kernel: the file's own bytes; without: decoded once to f32
        assert q.dtype == (name if name in K.GGML_DTYPES else "f32")
        assert same_floats(q.dequantize(), cf.tensor(f"t.{name}"))
    assert cf.verify() == []


def test_standard_files_keep_their_features(tmp_path):
    with C.Writer(tmp_path / "s.cmf", arch=tiny_arch(), progress=False) as w:
        w.add("t", np.ones((4, 32), np.float32), dtype="f32")
    assert not C.open(tmp_path / "s.cmf").features & FEAT_GGML_BLOCKS


def test_writer_and_decoder_refuse_partial_blocks(tmp_path):
    f = FORMATS["q4_k"]
    with pytest.raises(ValueError, match="multiple of 256"), \
            C.Writer(tmp_path / "a.cmf", arch=tiny_arch(), progress=False) as w:
        w.add_encoded("t", np.zeros(f.block_bytes, np.uint8), "q4_k", (1, 128))
    with pytest.raises(ValueError, match="needs 144"), \
            C.Writer(tmp_path / "b.cmf", arch=tiny_arch(), progress=False) as w:
        w.add_encoded("t", np.zeros(10, np.uint8), "q4_k", (1, 256))
    with pytest.raises(FormatError, match="multiple of 32"):
        Q.dequantize(np.zeros(18, np.uint8), "q4_0", (1, 16))
