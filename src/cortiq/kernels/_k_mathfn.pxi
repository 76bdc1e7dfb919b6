# mathfn: exp, softmax, silu/gate activations, dot, axpy (csrc/mathfn).

# The checks below read the array struct directly (no dtype comparison, flags object
# or numpy call): every wrapper runs them on each call, and decode makes many calls.
cdef inline cnp.ndarray _f32(object a, str op, str arg):
    """`a` as a C-contiguous float32 array, or TypeError naming the argument."""
    if not isinstance(a, cnp.ndarray) or cnp.PyArray_TYPE(<cnp.ndarray>a) != cnp.NPY_FLOAT32 \
            or not cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a):
        raise TypeError(f"{op}: {arg} must be a float32 numpy array")
    if not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a):
        raise ValueError(f"{op}: {arg} must be C-contiguous")
    return <cnp.ndarray>a


cdef inline void _writable(cnp.ndarray a, str op, str arg) except *:
    if not cnp.PyArray_ISWRITEABLE(a):
        raise ValueError(f"{op}: {arg} is read-only")


cdef inline bint _shares(cnp.ndarray a, cnp.ndarray b) noexcept:
    """np.may_share_memory for two C-contiguous arrays: their byte ranges intersect."""
    cdef char *pa = <char *>cnp.PyArray_DATA(a)
    cdef char *pb = <char *>cnp.PyArray_DATA(b)
    cdef cnp.npy_intp na = cnp.PyArray_NBYTES(a), nb = cnp.PyArray_NBYTES(b)
    return na > 0 and nb > 0 and pa < pb + nb and pb < pa + na


cdef inline (size_t, size_t) _rows_cols(cnp.ndarray a, str op, str arg) except *:
    if a.ndim == 1:
        return 1, <size_t>a.shape[0]
    if a.ndim == 2:
        return <size_t>a.shape[0], <size_t>a.shape[1]
    raise ValueError(f"{op}: {arg} must be 1-D or 2-D, got {a.ndim}-D")


def exp_f32(x, out=None):
    """exp8 of every element (see cortiq.h for clamping and accuracy)."""
    cdef cnp.ndarray xa = _f32(x, "exp_f32", "x")
    cdef cnp.ndarray oa
    if out is None:
        oa = np.empty_like(xa)
    else:
        oa = _f32(out, "exp_f32", "out")
        _writable(oa, "exp_f32", "out")
        if oa.size != xa.size:
            raise ValueError(f"exp_f32: out has {oa.size} elements, x has {xa.size}")
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
    cdef float *po = <float *>cnp.PyArray_DATA(oa)
    cdef size_t n = xa.size
    with nogil:
        cq_active().mathfn.exp_f32(px, po, n)
    return oa


def softmax_rows(x):
    """Softmax of each row (last axis) of a 1-D or 2-D float32 array, in place."""
    cdef cnp.ndarray xa = _f32(x, "softmax_rows", "x")
    _writable(xa, "softmax_rows", "x")
    cdef size_t rows, cols
    rows, cols = _rows_cols(xa, "softmax_rows", "x")
    cdef float *p = <float *>cnp.PyArray_DATA(xa)
    with nogil:
        cq_active().mathfn.softmax_rows(p, rows, cols)
    return xa


def silu_mul(g, u, a, b):
    """In place, per row: g = silu(g*a) * (u*b); a, b have one entry per column."""
    cdef cnp.ndarray ga = _f32(g, "silu_mul", "g")
    cdef cnp.ndarray ua = _f32(u, "silu_mul", "u")
    cdef cnp.ndarray aa = _f32(a, "silu_mul", "a")
    cdef cnp.ndarray ba = _f32(b, "silu_mul", "b")
    _writable(ga, "silu_mul", "g")
    cdef size_t rows, cols
    rows, cols = _rows_cols(ga, "silu_mul", "g")
    if (<object>ua).shape != (<object>ga).shape:
        raise ValueError(f"silu_mul: u has shape {(<object>ua).shape}, g has {(<object>ga).shape}")
    if aa.ndim != 1 or ba.ndim != 1 or <size_t>aa.shape[0] != cols or <size_t>ba.shape[0] != cols:
        raise ValueError(f"silu_mul: a and b must be 1-D of length {cols}")
    if _shares(ga, ua) or _shares(ga, aa) or _shares(ga, ba):
        raise ValueError("silu_mul: g must not overlap u, a or b")
    cdef float *pg = <float *>cnp.PyArray_DATA(ga)
    cdef const float *pu = <const float *>cnp.PyArray_DATA(ua)
    cdef const float *pa = <const float *>cnp.PyArray_DATA(aa)
    cdef const float *pb = <const float *>cnp.PyArray_DATA(ba)
    with nogil:
        cq_active().mathfn.silu_mul(pg, pu, pa, pb, rows, cols)
    return ga


def gate_mul(y, g, s):
    """In place, per row: y = y * sigmoid(g*s); s has one entry per column."""
    cdef cnp.ndarray ya = _f32(y, "gate_mul", "y")
    cdef cnp.ndarray gaa = _f32(g, "gate_mul", "g")
    cdef cnp.ndarray sa = _f32(s, "gate_mul", "s")
    _writable(ya, "gate_mul", "y")
    cdef size_t rows, cols
    rows, cols = _rows_cols(ya, "gate_mul", "y")
    if (<object>gaa).shape != (<object>ya).shape:
        raise ValueError(f"gate_mul: g has shape {(<object>gaa).shape}, y has {(<object>ya).shape}")
    if sa.ndim != 1 or <size_t>sa.shape[0] != cols:
        raise ValueError(f"gate_mul: s must be 1-D of length {cols}")
    cdef float *py = <float *>cnp.PyArray_DATA(ya)
    cdef const float *pg = <const float *>cnp.PyArray_DATA(gaa)
    cdef const float *ps = <const float *>cnp.PyArray_DATA(sa)
    with nogil:
        cq_active().mathfn.gate_mul(py, pg, ps, rows, cols)
    return ya


def dot_f32(a, b):
    """sum(a*b) over two equal-length float32 vectors."""
    cdef cnp.ndarray aa = _f32(a, "dot_f32", "a")
    cdef cnp.ndarray ba = _f32(b, "dot_f32", "b")
    if aa.size != ba.size:
        raise ValueError(f"dot_f32: a has {aa.size} elements, b has {ba.size}")
    cdef const float *pa = <const float *>cnp.PyArray_DATA(aa)
    cdef const float *pb = <const float *>cnp.PyArray_DATA(ba)
    cdef size_t n = aa.size
    cdef float r
    with nogil:
        r = cq_active().mathfn.dot_f32(pa, pb, n)
    return r


def axpy_f32(y, float alpha, x):
    """In place: y += alpha * x."""
    cdef cnp.ndarray ya = _f32(y, "axpy_f32", "y")
    cdef cnp.ndarray xa = _f32(x, "axpy_f32", "x")
    _writable(ya, "axpy_f32", "y")
    if ya.size != xa.size:
        raise ValueError(f"axpy_f32: y has {ya.size} elements, x has {xa.size}")
    if _shares(ya, xa) and cnp.PyArray_DATA(ya) != cnp.PyArray_DATA(xa):
        raise ValueError("axpy_f32: y and x overlap partially")
    cdef float *py = <float *>cnp.PyArray_DATA(ya)
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
    cdef size_t n = ya.size
    with nogil:
        cq_active().mathfn.axpy_f32(py, alpha, px, n)
    return ya
