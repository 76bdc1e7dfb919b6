# quant: the CMF quantizers (csrc/quant), bit-exact with src/cortiq/cmf/quant.py.

cdef inline void _quant_check(cq_status st, str op) except *:
    if st == CQ_ERR_ARG:
        raise KernelError(f"{op}: the tensor holds NaN/inf or values too large for f16 scales")
    check(st, op)


cdef inline cnp.ndarray _f32_any(object w, str op):
    if not isinstance(w, cnp.ndarray) or (<cnp.ndarray>w).dtype != np.float32:
        raise TypeError(f"{op}: w must be a float32 numpy array")
    if not (<cnp.ndarray>w).flags.c_contiguous:
        raise ValueError(f"{op}: w must be C-contiguous")
    return <cnp.ndarray>w


cdef inline cnp.ndarray _f32_2d(object w, str op):
    cdef cnp.ndarray a = _f32_any(w, op)
    if a.ndim != 2:
        raise ValueError(f"{op}: w must be 2-D, got {a.ndim}-D")
    return a


def quantize_q8_row(w):
    """[rows, cols] float32 -> q8_row payload bytes (uint8 array)."""
    cdef cnp.ndarray a = _f32_2d(w, "quantize_q8_row")
    cdef size_t rows = a.shape[0], cols = a.shape[1]
    cdef cnp.ndarray out = np.empty(rows * cols + 2 * rows, np.uint8)
    cdef const float *pw = <const float *>cnp.PyArray_DATA(a)
    cdef uint8_t *po = <uint8_t *>cnp.PyArray_DATA(out)
    cdef cq_status st
    with nogil:
        st = cq_active().quant.q8_row(pw, rows, cols, po)
    _quant_check(st, "quantize_q8_row")
    return out


def quantize_q8_2f(w):
    """[rows, cols] float32 -> q8_2f payload bytes (uint8 array)."""
    cdef cnp.ndarray a = _f32_2d(w, "quantize_q8_2f")
    cdef size_t rows = a.shape[0], cols = a.shape[1]
    cdef cnp.ndarray out = np.empty(rows * cols + 2 * rows + 2 * cols, np.uint8)
    cdef cnp.ndarray acc = np.empty(max(cols, 1), np.float64)
    cdef cnp.ndarray colv = np.empty(max(cols, 1), np.float32)
    cdef const float *pw = <const float *>cnp.PyArray_DATA(a)
    cdef uint8_t *po = <uint8_t *>cnp.PyArray_DATA(out)
    cdef double *pa = <double *>cnp.PyArray_DATA(acc)
    cdef float *pc = <float *>cnp.PyArray_DATA(colv)
    cdef cq_status st
    with nogil:
        st = cq_active().quant.q8_2f(pw, rows, cols, po, pa, pc)
    _quant_check(st, "quantize_q8_2f")
    return out


def quantize_q4_block(w):
    """float32 of any shape (flattened) -> q4_block payload bytes."""
    cdef cnp.ndarray a = _f32_any(w, "quantize_q4_block")
    cdef size_t n = a.size
    cdef cnp.ndarray out = np.empty(18 * ((n + 31) // 32), np.uint8)
    cdef const float *pw = <const float *>cnp.PyArray_DATA(a)
    cdef uint8_t *po = <uint8_t *>cnp.PyArray_DATA(out)
    cdef cq_status st
    with nogil:
        st = cq_active().quant.q4_block(pw, n, po)
    _quant_check(st, "quantize_q4_block")
    return out


def quantize_q4_tiled(w):
    """float32 of any shape (flattened) -> q4_tiled payload bytes."""
    cdef cnp.ndarray a = _f32_any(w, "quantize_q4_tiled")
    cdef size_t n = a.size
    cdef cnp.ndarray out = np.empty(18 * ((n + 31) // 32), np.uint8)
    cdef const float *pw = <const float *>cnp.PyArray_DATA(a)
    cdef uint8_t *po = <uint8_t *>cnp.PyArray_DATA(out)
    cdef cq_status st
    with nogil:
        st = cq_active().quant.q4_tiled(pw, n, po)
    _quant_check(st, "quantize_q4_tiled")
    return out


def f32_to_f16(x):
    """float32 array -> little-endian f16 bytes (uint8, 2 per element), ties to even."""
    cdef cnp.ndarray a = _f32_any(x, "f32_to_f16")
    cdef size_t n = a.size
    cdef cnp.ndarray out = np.empty(2 * n, np.uint8)
    cdef const float *pw = <const float *>cnp.PyArray_DATA(a)
    cdef uint8_t *po = <uint8_t *>cnp.PyArray_DATA(out)
    with nogil:
        cq_active().quant.f32_to_f16(pw, po, n)
    return out


def f16_to_f32(b):
    """Little-endian f16 bytes (uint8 array of even length) -> float32."""
    if not isinstance(b, np.ndarray) or b.dtype != np.uint8 or b.ndim != 1:
        raise TypeError("f16_to_f32: b must be a 1-D uint8 numpy array")
    if b.size % 2:
        raise ValueError(f"f16_to_f32: b has an odd length {b.size}")
    cdef cnp.ndarray a = np.ascontiguousarray(b)
    cdef size_t n = a.size // 2
    cdef cnp.ndarray out = np.empty(n, np.float32)
    cdef const uint8_t *pb = <const uint8_t *>cnp.PyArray_DATA(a)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    with nogil:
        cq_active().quant.f16_to_f32(pb, po, n)
    return out
