# linalg: small dense f64 solves of the far field's seal (csrc/linalg).

def ridge_pinv(A):
    """(M, attempts): M = (A^T A + lam I)^-1 A^T by Cholesky with ridge retries
    (docs/nystrom.md §1.4); attempts 0 means the I/mean(diag) fallback."""
    if not isinstance(A, cnp.ndarray) or (<cnp.ndarray>A).dtype != np.float64:
        raise TypeError("ridge_pinv: A must be a float64 numpy array")
    cdef cnp.ndarray aa = np.ascontiguousarray(A)
    if aa.ndim != 2 or aa.shape[0] != aa.shape[1] or aa.shape[0] == 0:
        raise ValueError(f"ridge_pinv: A must be square and non-empty, got {(<object>A).shape}")
    cdef size_t m = <size_t>aa.shape[0]
    cdef cnp.ndarray M = np.empty((m, m), np.float64)
    cdef cnp.ndarray work = np.empty(2 * m * m + m, np.float64)
    cdef const double *pa = <const double *>cnp.PyArray_DATA(aa)
    cdef double *pm = <double *>cnp.PyArray_DATA(M)
    cdef double *pw = <double *>cnp.PyArray_DATA(work)
    cdef int n
    with nogil:
        n = cq_active().linalg.ridge_pinv(pa, m, pm, pw)
    return M, n


def key_residuals(k, size_t m, size_t col0=0, hd=None):
    """Per row of float32 k[rows, ld] (columns col0..col0+hd): the part of the key outside
    the span of m segment-mean landmarks (the reference engine's key_residuals,
    f64, ridge 1e-4)."""
    cdef cnp.ndarray ka = _f32(k, "key_residuals", "k")
    if ka.ndim != 2:
        raise ValueError(f"key_residuals: k must be 2-D, got {ka.ndim}-D")
    cdef size_t rows = <size_t>ka.shape[0], ld = <size_t>ka.shape[1]
    cdef size_t h = ld - col0 if hd is None else <size_t>hd
    if col0 + h > ld or h == 0:
        raise ValueError(f"key_residuals: columns {col0}..{col0 + h} out of 0..{ld}")
    if m == 0 or rows == 0:
        raise ValueError(f"key_residuals: m = {m}, rows = {rows}; both must be >= 1")
    cdef cnp.ndarray out = np.empty(rows, np.float32)
    cdef cnp.ndarray work = np.empty(m * h + m * m + 2 * m, np.float64)
    cdef const float *pk = <const float *>cnp.PyArray_DATA(ka) + col0
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    cdef double *pw = <double *>cnp.PyArray_DATA(work)
    cdef cq_status st
    with nogil:
        st = cq_active().linalg.key_residuals(pk, rows, ld, h, m, po, pw)
    check(st, "key_residuals")
    return out
