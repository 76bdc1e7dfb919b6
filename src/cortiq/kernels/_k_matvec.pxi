# matvec: stored CMF matrices times float32 activations (csrc/matvec).
# QMat is the low-level handle cortiq.kernels.tensor.QTensor wraps; see docs/ARCHITECTURE.md.
from libc.stdlib cimport malloc, free

_MV_DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "q8_row": 3, "q4_block": 4, "vbit": 8,
              "q8_2f": 9, "vbit_ro": 10, "q4_tiled": 11, "q4tp": 15, "q2tp": 16,
              "q2_k": 74, "q3_k": 75, "q4_k": 76, "q5_k": 77, "q6_k": 78, "iq4_xs": 87}
_MV_VARIABLE = ("vbit", "vbit_ro")  # payload size depends on the data
# dtypes with integer kernels for int8 activations; "auto" takes the 4-bit-and-below ones
# in every product, and all of them in the matmat of a prompt chunk (matmat(prompt=True))
# The ggml block formats (docs/cmf-format.md §7.9), name -> CMF id (64 + ggml type): the
# same table as cortiq.cmf.ggml_blocks.FORMATS, a layer above (tests/test_ggml_blocks.py
# checks the two agree). The C side decides which have kernels (a nonzero payload size);
# those are matvec dtypes and take int8 activations under "int8" and "auto" alike, as
# llama.cpp quantizes x for them; the rest are read dequantized (QTensor.from_cmf).
_GGML_IDS = {"q4_0": 66, "q4_1": 67, "q5_0": 70, "q5_1": 71, "q8_0": 72, "q2_k": 74, "q3_k": 75,
             "q4_k": 76, "q5_k": 77, "q6_k": 78, "iq4_nl": 84, "iq4_xs": 87}
GGML_DTYPES = tuple(n for n, i in _GGML_IDS.items() if cq_qmat_nbytes(i, 1, 256) != 0)
_MV_DTYPES.update({n: _GGML_IDS[n] for n in GGML_DTYPES})
I8_DTYPES = ("q8_row", "q8_2f", "q4_block", "q4_tiled", "q4tp", "q2tp") + GGML_DTYPES
AUTO_I8_DTYPES = ("q4_block", "q4_tiled", "q4tp", "q2tp") + GGML_DTYPES


def qmat_nbytes(str dtype, size_t rows, size_t cols):
    """Payload bytes of a [rows, cols] matrix of `dtype` (0 = unsupported shape or
    data-dependent size: vbit, vbit_ro)."""
    if dtype not in _MV_DTYPES:
        raise ValueError(f"qmat_nbytes: dtype {dtype!r} not supported; one of {', '.join(_MV_DTYPES)}")
    return cq_qmat_nbytes(_MV_DTYPES[dtype], rows, cols)


def prompt_int8_dtypes(isa=None):
    """The dtypes (of I8_DTYPES) whose prompt-chunk matmat takes int8 activations in
    kernel table `isa` (default: the active one) on this CPU, where the precision asks
    for them. The x86 tables do for the CMF dtypes only where the CPU has a vpdpbusd
    (AVX-VNNI or AVX-512 VNNI): without it their float32 matmat is faster and does the
    work under every precision. Decode's products (matvec, batched rows) are not
    affected: they take int8 wherever the precision says."""
    cdef const cq_table *t
    if isa is None:
        t = cq_active()
    elif isa in _ISA_BY_NAME:
        t = cq_table_for(_ISA_BY_NAME[isa])
    else:
        raise ValueError(f"prompt_int8_dtypes: unknown ISA {isa!r}; one of {', '.join(_ISA_BY_NAME)}")
    if t == NULL:
        raise ValueError(f"prompt_int8_dtypes: ISA {isa!r} is not compiled into this build")
    return tuple(d for d in I8_DTYPES if t.matvec.matmat_int8(_MV_DTYPES[d]))


cdef class QMat:
    """One 2-D CMF payload (uint8, read in place) with its decoded side table."""
    cdef cq_qmat m
    cdef readonly object raw
    cdef readonly object aux
    cdef readonly object rowoff
    cdef readonly str dtype
    cdef readonly size_t rows, cols
    cdef int prec        # -1: the process default; else an index into PRECISIONS
    cdef int i8_exact    # act under "int8", under "auto", and under "auto" in a prompt
    cdef int i8_auto     # chunk's matmat, for this dtype
    cdef int i8_prompt

    def __init__(self, raw, str dtype, size_t rows, size_t cols, precision="exact"):
        if dtype not in _MV_DTYPES:
            raise ValueError(f"QMat: dtype {dtype!r} not supported; one of {', '.join(_MV_DTYPES)}")
        if not isinstance(raw, cnp.ndarray) or (<cnp.ndarray>raw).dtype != np.uint8:
            raise TypeError("QMat: raw must be a uint8 numpy array")
        if not (<cnp.ndarray>raw).flags.c_contiguous:
            raise ValueError("QMat: raw must be C-contiguous")
        cdef int dt = _MV_DTYPES[dtype]
        cdef size_t need = cq_qmat_nbytes(dt, rows, cols)
        if dtype in _MV_VARIABLE:
            need = (<cnp.ndarray>raw).size
        elif need == 0 and rows * cols != 0:
            raise ValueError(f"QMat: {dtype} cannot hold shape ({rows}, {cols}) (cols % 32 != 0?)")
        if <size_t>(<cnp.ndarray>raw).size != need:
            raise ValueError(f"QMat: {dtype} ({rows}, {cols}) payload must be {need} bytes, got {(<cnp.ndarray>raw).size}")
        self.raw = raw
        self.dtype = dtype
        self.rows = rows
        self.cols = cols
        self.m.data = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>raw)
        self.m.nbytes = need
        self.m.rows = rows
        self.m.cols = cols
        self.m.dtype = dt
        self.m.aux = NULL
        self.m.rowoff = NULL
        self.i8_exact = CQ_ACT_INT8 if dtype in I8_DTYPES else CQ_ACT_EXACT
        self.i8_auto = CQ_ACT_INT8 if dtype in AUTO_I8_DTYPES else CQ_ACT_EXACT
        self.i8_prompt = self.i8_exact
        self.precision = precision
        cdef size_t naux = cq_qmat_aux_len(dt, rows, cols)
        cdef cnp.ndarray a
        cdef cq_status st
        if dtype in _MV_VARIABLE:
            a = np.empty(rows + 1, np.uint64)
            st = cq_qmat_prepare_rows(&self.m, <uint64_t *>cnp.PyArray_DATA(a))
            if st != CQ_OK:
                raise ValueError(f"QMat: invalid {dtype} payload for shape ({rows}, {cols}): "
                                 f"{cq_status_str(st).decode()} (widths, offsets or length)")
            self.rowoff = a
            self.m.rowoff = <const uint64_t *>cnp.PyArray_DATA(a)
        if naux:
            a = np.empty(naux, np.float32)
            check(cq_qmat_prepare(&self.m, <float *>cnp.PyArray_DATA(a)), "QMat")
            self.aux = a
            self.m.aux = <const float *>cnp.PyArray_DATA(a)

    @property
    def nbytes(self):
        return self.m.nbytes

    @property
    def precision(self):
        """"exact", "int8", "auto", or None (follow the process default)."""
        return None if self.prec < 0 else PRECISIONS[self.prec]

    @precision.setter
    def precision(self, p):
        if p is not None and p not in PRECISIONS:
            raise ValueError(f"precision must be None or one of {', '.join(PRECISIONS)}, got {p!r}")
        self.prec = -1 if p is None else PRECISIONS.index(p)
        self._sync()

    @property
    def int8(self):
        """Whether products read x quantized to int8 now (precision resolved)."""
        self._sync()
        return self.m.act == CQ_ACT_INT8

    @property
    def int8_prompt(self):
        """Whether a prompt chunk's matmat (matmat(prompt=True)) reads x as int8 now."""
        return self._act(True) == CQ_ACT_INT8

    cdef inline cq_qmat _snapshot(self, bint prompt=False):
        """The matrix as the next call sees it: precision resolved (for a prompt chunk
        when `prompt`), copied so that a precision set from another thread cannot change
        a call that is running."""
        cdef cq_qmat mm = self.m
        mm.act = self._act(prompt)
        return mm

    cdef inline int _act(self, bint prompt):
        cdef int p = self.prec if self.prec >= 0 else _PREC_DEFAULT
        if p == 1:
            return self.i8_exact
        if p == 2:
            return self.i8_prompt if prompt else self.i8_auto
        return CQ_ACT_EXACT

    cdef inline void _sync(self):
        self.m.act = self._act(False)

    cdef cnp.ndarray _x(self, x, str op):
        cdef cnp.ndarray xa = _f32(x, op, "x")
        if xa.ndim != 1 or <size_t>xa.shape[0] != self.cols:
            raise ValueError(f"{op}: x must have shape ({self.cols},), got {(<object>xa).shape}")
        return xa

    def matvec(self, x, out=None):
        """out[r] = sum_c W[r, c] x[c]; returns out ([rows] float32)."""
        cdef cnp.ndarray xa = self._x(x, "matvec")
        cdef cnp.ndarray oa
        if out is None:
            oa = np.empty(self.rows, np.float32)
        else:
            oa = _f32(out, "matvec", "out")
            _writable(oa, "matvec", "out")
            if oa.ndim != 1 or <size_t>oa.shape[0] != self.rows:
                raise ValueError(f"matvec: out must have shape ({self.rows},), got {(<object>oa).shape}")
            if _shares(oa, xa):
                raise ValueError("matvec: out must not overlap x")
        cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
        cdef float *po = <float *>cnp.PyArray_DATA(oa)
        cdef cq_status st
        cdef cq_qmat mm = self._snapshot()
        with nogil:
            st = cq_active().matvec.matvec(&mm, px, po)
        check(st, "matvec")
        return oa

    def matmat(self, X, out=None, bint prompt=False):
        """Y[t, rows] = X[t, cols] W^T (decodes each block of rows once for all t).
        prompt: the rows are a chunk of one sequence's prompt (prefill), which "auto"
        multiplies with int8 activations for the q8 dtypes too; decode rows, batched or
        not, leave it False and keep the arithmetic of matvec."""
        cdef cnp.ndarray xa = _f32(X, "matmat", "X")
        if xa.ndim != 2 or <size_t>xa.shape[1] != self.cols:
            raise ValueError(f"matmat: X must have shape (t, {self.cols}), got {(<object>xa).shape}")
        cdef size_t t = xa.shape[0]
        cdef cnp.ndarray oa
        if out is None:
            oa = np.empty((t, self.rows), np.float32)
        else:
            oa = _f32(out, "matmat", "out")
            _writable(oa, "matmat", "out")
            if (<object>oa).shape != (t, self.rows):
                raise ValueError(f"matmat: out must have shape ({t}, {self.rows}), got {(<object>oa).shape}")
            if _shares(oa, xa):
                raise ValueError("matmat: out must not overlap X")
        cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
        cdef float *po = <float *>cnp.PyArray_DATA(oa)
        cdef cq_status st
        cdef cq_qmat mm = self._snapshot(prompt)
        with nogil:
            st = cq_active().matvec.matmat(&mm, px, t, po)
        check(st, "matmat")
        return oa

    def dequant_rows(self, size_t r0, size_t nr, out=None):
        """Rows r0 .. r0+nr-1 decoded to float32, shape [nr, cols]."""
        if r0 > self.rows or nr > self.rows - r0:
            raise ValueError(f"dequant_rows: rows {r0}..{r0 + nr} outside 0..{self.rows}")
        cdef cnp.ndarray oa
        if out is None:
            oa = np.empty((nr, self.cols), np.float32)
        else:
            oa = _f32(out, "dequant_rows", "out")
            _writable(oa, "dequant_rows", "out")
            if <size_t>oa.size != nr * self.cols:
                raise ValueError(f"dequant_rows: out must hold {nr * self.cols} floats, has {oa.size}")
        cdef float *po = <float *>cnp.PyArray_DATA(oa)
        cdef cq_status st
        with nogil:
            st = cq_active().matvec.dequant_rows(&self.m, r0, nr, po)
        check(st, "dequant_rows")
        return oa

    def rows_dot(self, size_t r0, size_t nr, x, out=None):
        """[row r0 + j . x for j < nr] (float32 [nr]) on the calling thread; x prepared
        once; bit-identical to matvec(x)[r0:r0 + nr]."""
        if r0 > self.rows or nr > self.rows - r0:
            raise ValueError(f"rows_dot: rows {r0}..{r0 + nr} outside 0..{self.rows}")
        cdef cnp.ndarray xa = self._x(x, "rows_dot")
        cdef cnp.ndarray oa
        if out is None:
            oa = np.empty(nr, np.float32)
        else:
            oa = _f32(out, "rows_dot", "out")
            _writable(oa, "rows_dot", "out")
            if oa.ndim != 1 or <size_t>oa.shape[0] != nr:
                raise ValueError(f"rows_dot: out must have shape ({nr},)")
        cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
        cdef float *po = <float *>cnp.PyArray_DATA(oa)
        cdef cq_status st
        cdef cq_qmat mm = self._snapshot()
        with nogil:
            st = cq_active().matvec.rows_dot(&mm, r0, nr, px, po)
        check(st, "rows_dot")
        return oa

    def row_dot(self, size_t r, x):
        """sum_c W[r, c] x[c] (bit-identical to matvec(x)[r])."""
        if r >= self.rows:
            raise IndexError(f"row_dot: row {r} outside 0..{self.rows - 1}")
        cdef cnp.ndarray xa = self._x(x, "row_dot")
        cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
        cdef float res = 0
        cdef cq_status st
        cdef cq_qmat mm = self._snapshot()
        with nogil:
            st = cq_active().matvec.row_dot(&mm, r, px, &res)
        check(st, "row_dot")
        return res


def matvec_many(list mats, x, outs=None):
    """[M.matvec(x) for M in mats] in one parallel region (shared x, same cols);
    bit-identical to separate matvec calls. Returns the list of outputs."""
    cdef size_t n = len(mats), i
    if n == 0:
        return []
    cdef QMat q0 = mats[0]
    cdef cnp.ndarray xa = _f32(x, "matvec_many", "x")
    if xa.ndim != 1 or <size_t>xa.shape[0] != q0.cols:
        raise ValueError(f"matvec_many: x must have shape ({q0.cols},), got {(<object>xa).shape}")
    if outs is not None and len(outs) != n:
        raise ValueError(f"matvec_many: {len(outs)} outputs for {n} matrices")
    cdef QMat q
    cdef cnp.ndarray oa
    res = []
    for i in range(n):
        q = mats[i]
        if q.cols != q0.cols:
            raise ValueError(f"matvec_many: matrix {i} has {q.cols} cols, matrix 0 has {q0.cols}")
        if outs is None or outs[i] is None:
            oa = np.empty(q.rows, np.float32)
        else:
            oa = _f32(outs[i], "matvec_many", f"outs[{i}]")
            _writable(oa, "matvec_many", f"outs[{i}]")
            if oa.ndim != 1 or <size_t>oa.shape[0] != q.rows:
                raise ValueError(f"matvec_many: outs[{i}] must have shape ({q.rows},)")
            if _shares(oa, xa):
                raise ValueError(f"matvec_many: outs[{i}] must not overlap x")
        res.append(oa)
    cdef cq_qmat *ms = <cq_qmat *>malloc(n * sizeof(cq_qmat))
    cdef float **ys = <float **>malloc(n * sizeof(float *))
    if ms == NULL or ys == NULL:
        free(ms)
        free(ys)
        raise MemoryError("matvec_many")
    for i in range(n):
        q = mats[i]
        q._sync()
        ms[i] = q.m
        ys[i] = <float *>cnp.PyArray_DATA(<cnp.ndarray>res[i])
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
    cdef cq_status st
    with nogil:
        st = cq_active().matvec.matvec_many(ms, n, px, ys)
    free(ms)
    free(ys)
    check(st, "matvec_many")
    return res


def matvec_batch(list mats, X, outs=None):
    """[stack([M.matvec(x) for x in X]) for M in mats]: every row of X [t, cols] against
    every matrix (same cols), with each matrix's weights streamed once for all t rows
    (the decode rows of several sequences). Integer (int8-activation) rows and the
    dtypes without multi-input float tiles are bit-identical to the matvecs; the f32 and
    q8_row float tiles (x86) equal them within float32 rounding. Returns the list of
    outputs, [t, M.rows] each."""
    cdef size_t n = len(mats), i
    if n == 0:
        return []
    cdef QMat q0 = mats[0]
    cdef cnp.ndarray xa = _f32(X, "matvec_batch", "X")
    if xa.ndim != 2 or <size_t>xa.shape[1] != q0.cols:
        raise ValueError(f"matvec_batch: X must have shape (t, {q0.cols}), got {(<object>xa).shape}")
    cdef size_t t = xa.shape[0]
    if outs is not None and len(outs) != n:
        raise ValueError(f"matvec_batch: {len(outs)} outputs for {n} matrices")
    cdef QMat q
    cdef cnp.ndarray oa
    res = []
    for i in range(n):
        q = mats[i]
        if q.cols != q0.cols:
            raise ValueError(f"matvec_batch: matrix {i} has {q.cols} cols, matrix 0 has {q0.cols}")
        if outs is None or outs[i] is None:
            oa = np.empty((t, q.rows), np.float32)
        else:
            oa = _f32(outs[i], "matvec_batch", f"outs[{i}]")
            _writable(oa, "matvec_batch", f"outs[{i}]")
            if (<object>oa).shape != (t, q.rows):
                raise ValueError(f"matvec_batch: outs[{i}] must have shape ({t}, {q.rows})")
            if _shares(oa, xa):
                raise ValueError(f"matvec_batch: outs[{i}] must not overlap X")
        res.append(oa)
    cdef cq_qmat *ms = <cq_qmat *>malloc(n * sizeof(cq_qmat))
    cdef float **ys = <float **>malloc(n * sizeof(float *))
    if ms == NULL or ys == NULL:
        free(ms)
        free(ys)
        raise MemoryError("matvec_batch")
    for i in range(n):
        q = mats[i]
        q._sync()
        ms[i] = q.m
        ys[i] = <float *>cnp.PyArray_DATA(<cnp.ndarray>res[i])
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
    cdef cq_status st
    with nogil:
        st = cq_active().matvec.matvec_batch(ms, n, px, t, ys)
    free(ms)
    free(ys)
    check(st, "matvec_batch")
    return res


def read_sum(buf, int threads=1, int streams=1):
    """Benchmark probe: sum of the uint64 words of a uint8 buffer on `threads` threads,
    each reading its part as `streams` (1..8) streams side by side (reads every byte
    once; see benchmarks/bench_matvec.py)."""
    if not 1 <= streams <= 8:
        raise ValueError(f"read_sum: streams must be 1..8, not {streams}")
    if not isinstance(buf, cnp.ndarray) or (<cnp.ndarray>buf).dtype != np.uint8 \
            or not (<cnp.ndarray>buf).flags.c_contiguous:
        raise TypeError("read_sum: buf must be a C-contiguous uint8 numpy array")
    cdef const uint8_t *p = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>buf)
    cdef size_t n = (<cnp.ndarray>buf).size
    cdef uint64_t r
    with nogil:
        r = cq_read_sum(p, n, threads, streams)
    return r

