"""int8 activations (precision "int8" / "auto") for q8_row, q8_2f, q4_block, q4_tiled,
q4tp, q2tp and the 32-weight ggml block formats with kernels (q8_0, q4_0, ...: random
blocks, having no encoder), and the `precision` setting that chooses them.

The reference here is an independent NumPy model of the algorithm the C code promises
(csrc/matvec/qmat.h and ref_i8_row): per group of 32, d = max|x| / 127 and
xq = rint(x * (127 / max|x|)) in float32 (ties to even), an exact integer sum of the
weights' integers times xq, then the group's scale * d (q8: d, the row scale at the
end; q8_2f quantizes col * x). Every ISA must match it within float32 rounding of the
final combination (the integers are exact) and agree bit for bit between matvec,
matvec_many, row_dot, rows_dot and any thread count. Separately the error against the
exact float32 product stays inside the analytic quantization bound.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

import cortiq
from cortiq.kernels import _kernels as K
import optional
from cortiq.errors import ConfigError
from cortiq.kernels.tensor import QTensor
from cortiq.cmf.ggml_blocks import FORMATS as GGML
from cortiq.cmf.testing import ggml_random_payload, qtensor_from_f32

OWN = ("q8_row", "q8_2f", "q4_block", "q4_tiled", "q4tp", "q2tp")
# the ggml block formats with kernels (tests/test_ggml_blocks.py has their own tests too)
GGML_I8 = tuple(d for d in K.GGML_DTYPES if GGML[d].block_elems == 32)
I8 = OWN + GGML_I8
LOW = ("q4_block", "q4_tiled", "q4tp", "q2tp")
U = 2.0 ** -24
CWD = os.path.dirname(os.path.dirname(os.path.abspath(cortiq.__file__)))


def q8_parts(q):
    """q8_row / q8_2f: the stored int8 weights, row scales and (q8_2f) column scales."""
    rows, cols, raw = q.rows, q.cols, q.raw
    n = rows * cols
    w = raw[:n].view(np.int8).reshape(rows, cols).astype(np.float64)
    rs = raw[n:n + 2 * rows].view(np.float16).astype(np.float64)
    col = raw[n + 2 * rows:n + 2 * rows + 2 * cols].view(np.float16).astype(np.float32) \
        if q.dtype == "q8_2f" else None
    return w, rs, col


def quantize_x(x):
    """(xq [groups, 32] float64 integers, d [groups] float64) as the spec says."""
    xg = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xg).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        finite = np.isfinite(amax)
        idv = np.where(finite & (amax > 0), np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
        xq = np.where(idv[:, None] != 0, np.rint((xg * idv[:, None]).astype(np.float32)), 0.0)
        d = np.where(finite, amax / np.float32(127.0), amax).astype(np.float64)
    return xq.astype(np.float64), d


def model(q, x):
    """(y, bound): the int8 algorithm in float64 and the float32 rounding allowance of
    its final combination."""
    rows, cols = q.rows, q.cols
    if q.dtype in ("q8_row", "q8_2f"):
        w, rs, col = q8_parts(q)
        xq, d = quantize_x(x if col is None else (col * x.astype(np.float32)).astype(np.float32))
        isum = np.einsum("rgk,gk->rg", w.reshape(rows, -1, 32), xq)   # exact integers
        mags = np.einsum("rgk,gk->rg", np.abs(w).reshape(rows, -1, 32), np.abs(xq)) * d
        y = (isum * d[None, :]).sum(axis=1) * rs
        bound = (4 * (cols // 32) + 8) * U * mags.sum(axis=1) * np.abs(rs) + 1e-30
        return y, bound
    # q4/q2: w = q * scale (decoded), so w @ xq per group is scale * isum
    w = q.dequantize().astype(np.float64).reshape(rows, cols // 32, 32)
    xq, d = quantize_x(x)
    terms = np.einsum("rgk,gk->rg", w, xq) * d[None, :]
    mags = np.einsum("rgk,gk->rg", np.abs(w), np.abs(xq)) * d[None, :]
    return terms.sum(axis=1), (4 * (cols // 32) + 8) * U * mags.sum(axis=1) + 1e-30


def quantization_bound(q, x):
    """|y_int8 - W @ x| <= sum_c |w_c| * d_g / 2 (+ rounding): the int8 error budget."""
    rows, cols = q.rows, q.cols
    xs = x.astype(np.float64)
    w = np.abs(q.dequantize().astype(np.float64))
    if q.dtype == "q8_2f":   # x' = col * x is what is quantized
        _, _, col = q8_parts(q)
        xs = (col * x.astype(np.float32)).astype(np.float64)
        w = w / np.abs(col.astype(np.float64))[None, :]
    d = np.abs(xs.reshape(cols // 32, 32)).max(axis=1) / 127.0
    return (w.reshape(rows, cols // 32, 32).sum(axis=2) * d[None, :] * (0.5 + 1e-4)).sum(axis=1)


def check(q, x):
    y = q.matvec(x)
    exp, b = model(q, x)
    err = np.abs(y.astype(np.float64) - exp)
    assert (err <= b).all(), f"{q.dtype}: max err/bound {np.max(err / b):.3g}"
    exact = q.dequantize().astype(np.float64) @ x.astype(np.float64)
    assert (np.abs(y - exact) <= quantization_bound(q, x) + b + 1e-6 * np.abs(exact)).all()
    return y


def make(rng, shape, dtype, precision="int8"):
    if dtype in GGML:  # no encoder: random blocks with normal scales
        return QTensor(ggml_random_payload(rng, dtype, *shape), dtype, shape, precision=precision)
    return qtensor_from_f32(rng.standard_normal(shape).astype(np.float32), dtype, precision=precision)


@pytest.mark.parametrize("dtype", I8)
@pytest.mark.parametrize("shape", [(1, 32), (3, 64), (5, 96), (9, 128), (17, 160), (33, 4128),
                                   (64, 320), (7, 288), (13, 1024)])
def test_matches_model_and_bound(isa, dtype, shape):
    rows, cols = shape
    rng = np.random.default_rng(rows * 7919 + cols)
    q = make(rng, shape, dtype)
    x = rng.standard_normal(cols).astype(np.float32)
    x[:32] *= 1000.0  # groups of very different magnitude
    y = check(q, x)
    # the same rows through every entry point, bit for bit
    for i in range(rows):
        assert q.row_dot(i, x) == y[i]
    np.testing.assert_array_equal(q.rows_dot(rows // 2, rows - rows // 2, x), y[rows // 2:])
    np.testing.assert_array_equal(QTensor.matvec_many([q, q], x)[1], y)


@given(st.integers(1, 70), st.integers(1, 40), st.sampled_from(I8), st.integers(0, 2**31))
def test_hypothesis_shapes(isas, rows, groups, dtype, seed):
    rng = np.random.default_rng(seed)
    cols = 32 * groups
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w *= np.float32(10.0) ** rng.integers(-3, 3, size=(rows, 1)).astype(np.float32)
    q = make(rng, (rows, cols), dtype) if dtype in GGML else qtensor_from_f32(w, dtype, precision="int8")
    x = (rng.standard_normal(cols) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
    x[rng.random(cols) < 0.1] = 0.0
    # misaligned x (off a 64-byte line)
    buf = np.empty(cols * 4 + 128, np.uint8)
    off = (-buf.ctypes.data) % 64 + 4 * int(rng.integers(1, 15))
    xm = buf[off:off + cols * 4].view(np.float32)
    xm[:] = x
    before = K.active_isa()
    try:
        for isa in isas:
            K.set_isa(isa)
            y = check(q, xm)
            np.testing.assert_array_equal(q.matvec(x), y)
    finally:
        K.set_isa(before)


@pytest.mark.parametrize("dtype", I8)
def test_ties_round_to_even_and_zero_groups(isa, dtype):
    cols = 128
    x = np.zeros(cols, np.float32)
    x[:32] = np.arange(32, dtype=np.float32) - 15.5  # amax 15.5 -> id 127/15.5: no ties
    x[32] = 127.0
    x[33:64] = np.float32(0.5) + np.arange(31, dtype=np.float32) % 7  # x * 1 = k + 0.5: ties
    # group 2 stays all zero; group 3: one tiny value
    x[100] = 1e-30
    rng = np.random.default_rng(5)
    check(make(rng, (20, cols), dtype), x)  # (q8_2f quantizes col * x: the model does too)


def test_simd_twins_agree_with_reference():
    """Every usable ISA (and AVX-512 without VNNI or VBMI) against the scalar reference
    table; odd group counts exercise the partial last blocks."""
    rng = np.random.default_rng(11)
    before = K.active_isa()
    try:
        for dtype in I8:
            for cols in (4128 + 64, 4128 + 32 * 3):
                q = make(rng, (37, cols), dtype)
                x = rng.standard_normal(cols).astype(np.float32)
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
                        assert (np.abs(y.astype(np.float64) - exp) <= b).all(), (dtype, isa, hide)
                        assert (np.abs(y.astype(np.float64) - y_ref) <= 2 * b).all(), (dtype, isa, hide)
                        variants.append(y)
                    # VNNI, maddubs and the VBMI tile loader compute the same integers and
                    # combine them in the same order: the same bits
                    for y in variants[1:]:
                        np.testing.assert_array_equal(y, variants[0])
    finally:
        K.set_isa(before)


@pytest.mark.parametrize("dtype", I8)
def test_threads_bit_identical(isa, threads, dtype):
    rng = np.random.default_rng(3)
    q = make(rng, (301, 512), dtype)
    x = rng.standard_normal(512).astype(np.float32)
    X = rng.standard_normal((37, 512)).astype(np.float32)
    y, Y = q.matvec(x), q.matmat(X)
    cortiq.set_num_threads(1)
    np.testing.assert_array_equal(q.matvec(x), y)
    np.testing.assert_array_equal(q.matmat(X), Y)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", I8)
@pytest.mark.parametrize("cols", [96, 1056])  # (1056: the ggml rows' sixteen-block steps, then a tail)
def test_non_finite_input_is_not_hidden(isa, dtype, bad, cols):
    rng = np.random.default_rng(1)
    q = make(rng, (6, cols), dtype)
    x = rng.standard_normal(cols).astype(np.float32)
    x[40] = bad
    assert not np.isfinite(q.matvec(x)).any()  # as the float32 path (inf * 0 terms -> NaN)
    X = np.stack([x, rng.standard_normal(cols).astype(np.float32)])
    Y = q.matmat(X)
    assert not np.isfinite(Y[0]).any() and np.isfinite(Y[1]).all()


def integer_matmat(isa):
    """Whether a SIMD table's matmat takes int8 activations on this CPU."""
    f = K.cpu_features()
    if isa == "avx512":
        return "avx512vnni" in f
    return "avxvnni" in f or {"avx512vnni", "avx512vl", "os-zmm"} <= set(f)


@pytest.mark.parametrize("dtype", I8)
@pytest.mark.parametrize("t", [1, 2, 15, 16, 17, 24, 25, 64, 65, 130])
def test_matmat_matches_model(isa, dtype, t):
    """matmat with int8 activations: each input within the model's bound (tables with an
    integer matmat) or the exact float32 matmat (the SIMD tables on a CPU without a
    vpdpbusd keep float32 there); the reference equals its int8 matvec bit for bit."""
    rng = np.random.default_rng(t * 31 + len(dtype))
    rows, cols = 53, 320
    q = make(rng, (rows, cols), dtype)
    X = rng.standard_normal((t, cols)).astype(np.float32)
    X[0, :32] *= 300.0
    Y = q.matmat(X)
    integer = isa == "ref" or dtype in GGML or integer_matmat(isa)
    if not integer:
        q.precision = "exact"
        np.testing.assert_array_equal(Y, q.matmat(X))
        return
    for i in range(t):
        exp, b = model(q, X[i])
        assert (np.abs(Y[i].astype(np.float64) - exp) <= b).all(), i
    if isa == "ref" or dtype in ("q4_1", "q5_1"):  # (these two: t int8 matvecs everywhere)
        np.testing.assert_array_equal(Y, np.stack([q.matvec(x) for x in X]))


@pytest.mark.parametrize("simd", ["avx2", "avx512"])
def test_matmat_without_vpdpbusd_takes_float32(simd):
    optional.need_that("isa", simd in K.usable_isas() and integer_matmat(simd),
                       f"no {simd} with a vpdpbusd")
    rng = np.random.default_rng(4)
    q = make(rng, (30, 256), "q8_row")
    e = QTensor(q.raw, "q8_row", q.shape, precision="exact")
    X = rng.standard_normal((9, 256)).astype(np.float32)
    before = K.active_isa()
    try:
        K.set_isa(simd)
        assert not np.array_equal(q.matmat(X), e.matmat(X))
        K._hide_cpu_features(["avx512vnni", "avxvnni"])
        np.testing.assert_array_equal(q.matmat(X), e.matmat(X))
    finally:
        K._hide_cpu_features([])
        K.set_isa(before)


def test_avx2_matmat_vex_and_evex_agree():
    """The AVX2 table's int8 matmat as AVX-VNNI (VEX) and as AVX-512 VNNI on 256 bits
    (EVEX): one source, the same bits. Runs where the CPU has both (Sapphire Rapids and
    later); elsewhere the EVEX build is the one tested above."""
    f = set(K.cpu_features())
    optional.need_that("isa", "avx2" in K.usable_isas()
                       and {"avxvnni", "avx512vnni", "avx512vl"} <= f,
                       "no CPU with both AVX-VNNI and AVX-512 VNNI")
    rng = np.random.default_rng(6)
    X = rng.standard_normal((40, 320)).astype(np.float32)
    before = K.active_isa()
    try:
        K.set_isa("avx2")
        for dtype in I8:
            q = make(rng, (50, 320), dtype)
            vex = q.matmat(X)
            K._hide_cpu_features(["avxvnni"])
            try:
                np.testing.assert_array_equal(q.matmat(X), vex)
            finally:
                K._hide_cpu_features([])
    finally:
        K.set_isa(before)


def test_error_is_small_for_gaussian_data(isa):
    """The relative error of y against the exact product, per dtype (documented in
    docs/PERFORMANCE.md): a few 1e-3, well under the weights' own quantization error."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((256, 1024)).astype(np.float32)
    x = rng.standard_normal(1024).astype(np.float32)
    for dtype in OWN:  # (the ggml formats have no encoder: bench_matvec's (e) reports theirs)
        qe = qtensor_from_f32(w, dtype)
        qi = QTensor(qe.raw, dtype, qe.shape, precision="int8")
        ye, yi = qe.matvec(x), qi.matvec(x)
        rel = np.linalg.norm(yi - ye) / np.linalg.norm(ye)
        assert rel < 0.015, (dtype, rel)
        wq = np.linalg.norm(ye - w @ x) / np.linalg.norm(w @ x)  # the weights' own error
        if dtype in LOW:
            assert rel < wq, (dtype, rel, wq)


# ---- the precision setting ----------------------------------------------------------

def test_qtensor_precision_resolves_per_dtype():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    before = cortiq.get_precision()
    try:
        for dtype in ("f32", "f16", "bf16") + I8:
            q = make(rng, w.shape, dtype, "exact") if dtype in GGML else qtensor_from_f32(w, dtype)
            assert q.precision == "exact" and not q.int8 and not q.int8_prompt  # by hand: exact
            q.precision = "int8"
            assert q.int8 == (dtype in I8)
            assert q.int8_prompt == q.int8
            q.precision = "auto"
            assert q.int8 == (dtype in LOW + GGML_I8)         # ggml formats: int8 throughout
            assert q.int8_prompt == (dtype in I8)             # prompt chunks: q8 too
            q.precision = None                                # the process default
            for p in ("exact", "int8", "auto"):
                cortiq.set_precision(p)
                assert q.int8 == (dtype in {"exact": (), "int8": I8, "auto": LOW + GGML_I8}[p])
                assert q.int8_prompt == (dtype in {"exact": (), "int8": I8, "auto": I8}[p])
        for bad in ("fast", 8, True):
            with pytest.raises(ConfigError):
                q.precision = bad
            with pytest.raises(ConfigError):
                cortiq.set_precision(bad)
    finally:
        cortiq.set_precision(before)


def test_exact_is_untouched_by_the_setting(isa):
    """precision "exact" gives exactly the float32 kernels, whatever the default."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(256).astype(np.float32)
    before = cortiq.get_precision()
    try:
        for dtype in I8:
            q = make(rng, (24, 256), dtype, precision="exact")
            ys = []
            for p in ("exact", "int8", "auto"):
                cortiq.set_precision(p)
                ys.append((q.matvec(x), q.matmat(np.stack([x, x]))))
            for y, m in ys[1:]:
                np.testing.assert_array_equal(y, ys[0][0])
                np.testing.assert_array_equal(m, ys[0][1])
            q.precision = "int8"
            assert not np.array_equal(q.matvec(x), ys[0][0])   # the setting reaches the kernel
    finally:
        cortiq.set_precision(before)


@pytest.mark.parametrize("dtype", I8)
def test_auto_takes_prompt_chunks_to_int8(isa, dtype):
    """Under "auto" a prompt chunk's matmat (prompt=True) is the int8 product for every
    integer dtype, while matvec and a plain matmat (decode rows, batched or not) are
    what "auto" gives without it: exact for q8, int8 for 4-bit and below."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((5, 160)).astype(np.float32)
    q = make(rng, (40, 160), dtype, precision="exact")
    ex_mv, ex_mm = q.matvec(X[0]), q.matmat(X)
    np.testing.assert_array_equal(q.matmat(X, prompt=True), ex_mm)   # exact stays exact
    q.precision = "int8"
    i8_mv, i8_mm = q.matvec(X[0]), q.matmat(X)
    np.testing.assert_array_equal(q.matmat(X, prompt=True), i8_mm)
    if optional.int8_prompt_products(isa, dtype):
        assert not np.array_equal(i8_mm, ex_mm)
    else:       # this table's float32 matmat, under every precision
        np.testing.assert_array_equal(i8_mm, ex_mm)
    q.precision = "auto"
    np.testing.assert_array_equal(q.matmat(X, prompt=True), i8_mm)
    low = dtype in LOW + GGML_I8  # "auto" takes these to int8 in every product
    np.testing.assert_array_equal(q.matmat(X), i8_mm if low else ex_mm)
    np.testing.assert_array_equal(q.matvec(X[0]), i8_mv if low else ex_mv)


def test_prompt_int8_dtypes_follow_the_cpu(isa):
    """The rule the extension reports (prompt_int8_dtypes) is the documented one and
    what its matmat does: every integer dtype in the reference and Arm tables; on x86
    the ggml formats always and the CMF dtypes where the CPU has a vpdpbusd, so hiding
    VNNI takes them out and a q8_row prompt matmat becomes the float32 one."""
    have = K.prompt_int8_dtypes()
    assert have == K.prompt_int8_dtypes(isa)
    assert set(K.GGML_DTYPES) <= set(have) <= set(K.I8_DTYPES)
    if not isa.startswith(("avx2", "avx512")):
        assert set(have) == set(K.I8_DTYPES)
        return
    feats = set(K.cpu_features())
    reported = set(OWN) <= set(have)
    assert reported or not set(OWN) & set(have)
    if "avxvnni" in feats or {"avx512f", "avx512vl", "avx512vnni", "os-zmm"} <= feats:
        assert reported
    rng = np.random.default_rng(3)
    X = rng.standard_normal((6, 256)).astype(np.float32)
    q = make(rng, (24, 256), "q8_row", precision="int8")
    try:
        K._hide_cpu_features(["avx512vnni", "avxvnni"])
        hidden = K.prompt_int8_dtypes()
        assert not set(OWN) & set(hidden) and set(K.GGML_DTYPES) <= set(hidden)
        y_int8 = q.matmat(X, prompt=True)
        q.precision = "exact"
        np.testing.assert_array_equal(y_int8, q.matmat(X, prompt=True))
    finally:
        K._hide_cpu_features([])
    q.precision = "int8"
    assert np.array_equal(q.matmat(X, prompt=True), y_int8) != reported


def test_auto_prefill_is_int8_and_decode_exact_on_q8():
    """The shipped demo (q8_row) under "auto": a prompt fed whole is the int8 model's,
    a one-token step the exact model's, bit for bit."""
    from cortiq.demo import demo_path
    ids = list(range(5, 45))
    with cortiq.LLM(demo_path(), precision="exact") as ex, \
            cortiq.LLM(demo_path(), precision="int8") as i8, \
            cortiq.LLM(demo_path(), precision="auto") as au:
        pe, pi, pa = (m.session().feed(ids, want="all") for m in (ex, i8, au))
        np.testing.assert_array_equal(pa, pi)
        if optional.int8_prompt_products():
            assert not np.array_equal(pa, pe)
        else:   # the float32 matmat does the prompt's products on this CPU
            np.testing.assert_array_equal(pa, pe)
        assert np.linalg.norm(pa - pe) / np.linalg.norm(pe) < 0.02
        se, sa = (m.session().feed(ids[:1], want="last") for m in (ex, au))
        np.testing.assert_array_equal(sa, se)


def test_deprecated_switch_is_an_alias():
    before = cortiq.get_precision()
    try:
        for bad in (1, "yes", None):
            with pytest.raises(ConfigError):
                cortiq.set_int8_activations(bad)
        cortiq.set_int8_activations(True)
        assert cortiq.get_precision() == "int8" and cortiq.config()["precision"] == "int8"
        assert cortiq.get_int8_activations() is True
        cortiq.set_int8_activations(False)
        assert cortiq.get_precision() == "exact"
    finally:
        cortiq.set_precision(before)


def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("CORTIQ_PRECISION", "CORTIQ_INT8_ACT")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          cwd=CWD, check=False)


def test_env_vars():
    code = "import cortiq; print(cortiq.get_precision())"
    assert _run(code).stdout.strip() == "auto"          # the default
    assert _run(code, CORTIQ_PRECISION="int8").stdout.strip() == "int8"
    assert _run(code, CORTIQ_PRECISION="Exact").stdout.strip() == "exact"
    assert _run(code, CORTIQ_INT8_ACT="1").stdout.strip() == "int8"
    assert _run(code, CORTIQ_INT8_ACT="0").stdout.strip() == "exact"
    for env in ({"CORTIQ_PRECISION": "fast"}, {"CORTIQ_INT8_ACT": "maybe"},
                {"CORTIQ_PRECISION": "exact", "CORTIQ_INT8_ACT": "1"}):
        out = _run(code, **env)
        assert out.returncode != 0 and "CORTIQ_" in out.stderr, env
    out = _run("import cortiq; cortiq.show_config()", CORTIQ_PRECISION="int8")
    assert "precision:    int8" in out.stdout


@pytest.fixture(scope="module")
def q4_demo(tmp_path_factory):
    """The bundled demo requantized to q4_block (the writer's dtype rules)."""
    from cortiq import cmf
    from cortiq.demo import demo_path
    path = str(tmp_path_factory.mktemp("q4") / "demo_q4.cmf")
    with cmf.open(demo_path()) as cf:
        cmf.write(path, {n: cf.tensor(n) for n in cf.names()}, arch=cf.arch, quant="q4_block",
                  tokenizer_json=cf.tokenizer_json(), tokenizer_config=cf.tokenizer_config,
                  progress=False)
    return path


def test_llm_precision_per_model(q4_demo):
    """Two LLMs with different precision in one process: each keeps its own; None
    follows the process default, live."""
    ids = list(range(5, 40))
    before = cortiq.get_precision()
    try:
        cortiq.set_precision("auto")
        ex = cortiq.LLM(q4_demo, precision="exact")
        i8 = cortiq.LLM(q4_demo, precision="int8")
        dflt = cortiq.LLM(q4_demo)
        dtypes = {t.dtype for t in ex.model.matrices()}
        assert "q4_block" in dtypes
        assert all(not t.int8 for t in ex.model.matrices())
        assert all(t.int8 == (t.dtype in I8) for t in i8.model.matrices())
        assert dflt.precision is None and dflt.precision_in_force == "auto"
        le, li, ld = (m.session().feed(ids, want="all") for m in (ex, i8, dflt))
        assert np.array_equal(le, li) != optional.int8_prompt_products(dtype="q4_block")
        np.testing.assert_array_equal(li, ld)           # auto = int8 for q4 weights
        rel = np.linalg.norm(li - le) / np.linalg.norm(le)
        assert rel < 0.05, rel
        # the exact model, fed in pieces or whole, and beside the others: the same bits
        s = ex.session()
        s.feed(ids[:20], want="none")
        np.testing.assert_array_equal(s.feed(ids[20:], want="all"), le[20:])
        cortiq.set_precision("exact")                    # the default model follows it
        np.testing.assert_array_equal(dflt.session().feed(ids, want="all"), le)
        np.testing.assert_array_equal(i8.session().feed(ids, want="all"), li)
        dflt.precision = "int8"                          # and can be set on the model
        assert dflt.precision_in_force == "int8"
        np.testing.assert_array_equal(dflt.session().feed(ids, want="all"), li)
        with pytest.raises(ConfigError):
            cortiq.LLM(q4_demo, precision="fp8")
        for m in (ex, i8, dflt):
            m.close()
    finally:
        cortiq.set_precision(before)


def test_cli_precision(q4_demo):
    out = subprocess.run([sys.executable, "-m", "cortiq", "bench", q4_demo, "--precision", "int8",
                          "--tokens", "2", "--prompt-tokens", "8", "--turn-tokens", "2", "--json"],
                         capture_output=True, text=True, cwd=CWD, check=False)
    assert out.returncode == 0, out.stderr
    assert '"precision": "int8"' in out.stdout
    out = subprocess.run([sys.executable, "-m", "cortiq", "run", q4_demo, "--precision", "fp8",
                          "-p", "x"], capture_output=True, text=True, cwd=CWD, check=False)
    assert out.returncode != 0 and "precision" in out.stderr
    out = subprocess.run([sys.executable, "-m", "cortiq", "info", q4_demo], capture_output=True,
                         text=True, cwd=CWD, env=dict(os.environ, CORTIQ_PRECISION="auto"),
                         check=False)
    assert "precision:   auto" in out.stdout and "q4_block" in out.stdout.split("precision:")[1]
    from cortiq.demo import demo_path       # q8_row: int8 in prompts only where the CPU has it
    out = subprocess.run([sys.executable, "-m", "cortiq", "info", str(demo_path())],
                         capture_output=True, text=True, cwd=CWD,
                         env=dict(os.environ, CORTIQ_PRECISION="auto"), check=False)
    line = out.stdout.split("precision:")[1].splitlines()[0]
    assert ("in prompts int8 for q8_row" in line) == optional.int8_prompt_products(), line


def test_serve_passes_precision(monkeypatch):
    """`cortiq serve --precision` reaches the LLM the server runs."""
    from cortiq.serve import commands as _cli_llm, cli
    seen = {}

    class Stop(Exception):
        pass

    def fake_llm(*a, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr("cortiq.runtime.llm.LLM", fake_llm)
    from cortiq.demo import demo_path
    with pytest.raises(Stop):
        cli.main(["serve", str(demo_path()), "--precision", "exact"])
    assert seen["precision"] == "exact"
    assert _cli_llm is not None


@pytest.mark.parametrize("dtype", I8)
def test_mix_kernels_read_the_matrix_precision(isa, threads, dtype):
    """DeepSeek-V4's grouped projection and MoE row sums go through rows_dot with the
    matrix's own precision: each row is its int8 row_dot, the sum the sum of matvecs."""
    groups, lora, per = 3, 129, 64
    rng = np.random.default_rng(17)
    T = make(rng, (groups * lora, per), dtype)
    x = rng.standard_normal(groups * per).astype(np.float32)
    got = K.grouped_rows(T, x, groups)
    want = np.array([T.row_dot(r, x[(r // lora) * per:(r // lora + 1) * per])
                     for r in range(groups * lora)], np.float32)
    np.testing.assert_array_equal(got, want)
    Ts = [make(rng, (130, 64), dtype) for _ in range(3)]
    xs = [rng.standard_normal(64).astype(np.float32) for _ in range(3)]
    seq = Ts[0].matvec(xs[0])
    for t, xx in zip(Ts[1:], xs[1:]):
        seq = seq + t.matvec(xx)
    np.testing.assert_array_equal(K.rows_sum(Ts, xs), seq)
    exact = QTensor(T.raw, dtype, T.shape)
    assert not np.array_equal(K.grouped_rows(exact, x, groups), got)
