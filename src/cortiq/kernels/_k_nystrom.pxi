# nystrom: the O(1) far field's kernels (csrc/nystrom, docs/nystrom.md).
# NysGroup binds a group's buffers (owned by cortiq.models.dory.nystrom.NystromState) to a
# C view once, so a decode step checks only its own row arguments.

cdef inline float *_nys_buf(object a, str arg, size_t need) except NULL:
    cdef cnp.ndarray x = _f32(a, "NysGroup", arg)
    _writable(x, "NysGroup", arg)
    if <size_t>x.size < need:
        raise ValueError(f"NysGroup: {arg} has {x.size} elements, needs {need}")
    if x.size == 0:
        return <float *>&_NYS_EMPTY[0]
    return <float *>cnp.PyArray_DATA(x)

cdef float _NYS_EMPTY[1]


cdef class NysGroup:
    """A C view over one group's buffers (see cq_nys_view in csrc/cortiq.h)."""
    cdef cq_nys_view v
    cdef object _keep
    cdef readonly size_t cap

    def __init__(self, *, sink_k, sink_v, win_k, win_v, k_tilde, q_tilde, mu, t_hat, z_hat,
                 m_max, scratch, size_t d, size_t dv, size_t m, size_t rep, size_t sink_len,
                 size_t w, bint exact_only, bint rect_fm, float scale, size_t win_len=0,
                 size_t win_head=0, size_t far_len=0):
        if d == 0 or dv == 0 or rep == 0 or w == 0:
            raise ValueError("NysGroup: d, dv, rep and w must be >= 1")
        if win_len > w or win_head >= w:
            raise ValueError(f"NysGroup: win_len {win_len} / win_head {win_head} out of range for w {w}")
        self.v.d, self.v.dv, self.v.m, self.v.rep = d, dv, m, rep
        self.v.sink_len, self.v.w, self.v.win_len, self.v.win_head = sink_len, w, win_len, win_head
        self.v.far_len, self.v.exact_only, self.v.rect_fm, self.v.scale = far_len, exact_only, rect_fm, scale
        self.v.sink_k = _nys_buf(sink_k, "sink_k", sink_len * d)
        self.v.sink_v = _nys_buf(sink_v, "sink_v", sink_len * dv)
        self.v.win_k = _nys_buf(win_k, "win_k", w * d)
        self.v.win_v = _nys_buf(win_v, "win_v", w * dv)
        self.v.k_tilde = _nys_buf(k_tilde, "k_tilde", m * d)
        self.v.q_tilde = _nys_buf(q_tilde, "q_tilde", rep * m * d)
        self.v.mu = _nys_buf(mu, "mu", rep * m * m)
        self.v.t_hat = _nys_buf(t_hat, "t_hat", rep * m * dv)
        self.v.z_hat = _nys_buf(z_hat, "z_hat", rep * m)
        self.v.m_max = _nys_buf(m_max, "m_max", rep * m)
        self.v.scratch = _nys_buf(scratch, "scratch", sink_len + w + 3 * m)
        self.cap = w
        self._keep = (sink_k, sink_v, win_k, win_v, k_tilde, q_tilde, mu, t_hat, z_hat, m_max,
                      scratch)

    @property
    def win_len(self):
        return self.v.win_len

    @win_len.setter
    def win_len(self, size_t n):
        if n > self.v.w:
            raise ValueError(f"NysGroup: win_len {n} > w {self.v.w}")
        self.v.win_len = n

    @property
    def win_head(self):
        return self.v.win_head

    @win_head.setter
    def win_head(self, size_t n):
        if n >= self.v.w:
            raise ValueError(f"NysGroup: win_head {n} >= w {self.v.w}")
        self.v.win_head = n

    @property
    def far_len(self):
        return self.v.far_len

    @far_len.setter
    def far_len(self, size_t n):
        self.v.far_len = n

    def absorb(self, k, v):
        """Rows k[n, d], v[n, dv], in order, into every head's far accumulators."""
        cdef cnp.ndarray ka = _f32(k, "nystrom.absorb", "k")
        cdef cnp.ndarray va = _f32(v, "nystrom.absorb", "v")
        cdef size_t n = <size_t>ka.size // self.v.d
        if <size_t>ka.size != n * self.v.d or <size_t>va.size != n * self.v.dv:
            raise ValueError(f"nystrom.absorb: k has {ka.size} and v {va.size} elements, "
                             f"want n*{self.v.d} and n*{self.v.dv}")
        if self.v.m == 0 or self.v.exact_only:
            raise ValueError("nystrom.absorb: an exact-only group has no far field")
        cdef const float *pk = <const float *>cnp.PyArray_DATA(ka)
        cdef const float *pv = <const float *>cnp.PyArray_DATA(va)
        with nogil:
            cq_active().nystrom.absorb(&self.v, pk, pv, n)

    def step(self, q, k, v, out=None, bint restep=False):
        """Push (or, with restep, overwrite the newest row) and read out: out[rep, dv]."""
        cdef str op = "nystrom.restep" if restep else "nystrom.step"
        cdef cnp.ndarray qa = _f32(q, op, "q")
        cdef cnp.ndarray ka = _f32(k, op, "k")
        cdef cnp.ndarray va = _f32(v, op, "v")
        if <size_t>qa.size != self.v.rep * self.v.d:
            raise ValueError(f"{op}: q has {qa.size} elements, want rep*d = {self.v.rep * self.v.d}")
        if <size_t>ka.size != self.v.d:
            raise ValueError(f"{op}: k has {ka.size} elements, want d = {self.v.d}")
        if <size_t>va.size != self.v.dv:
            raise ValueError(f"{op}: v has {va.size} elements, want dv = {self.v.dv}")
        cdef cnp.ndarray oa
        if out is None:
            oa = np.empty((self.v.rep, self.v.dv), np.float32)
        else:
            oa = _f32(out, op, "out")
            _writable(oa, op, "out")
            if <size_t>oa.size != self.v.rep * self.v.dv:
                raise ValueError(f"{op}: out has {oa.size} elements, want rep*dv = {self.v.rep * self.v.dv}")
        cdef const float *pq = <const float *>cnp.PyArray_DATA(qa)
        cdef const float *pk = <const float *>cnp.PyArray_DATA(ka)
        cdef const float *pv = <const float *>cnp.PyArray_DATA(va)
        cdef float *po = <float *>cnp.PyArray_DATA(oa)
        cdef cq_status st
        cdef int rs = restep
        with nogil:
            st = cq_active().nystrom.step(&self.v, pq, pk, pv, po, rs)
        if st != CQ_OK:
            raise KernelError(f"{op}: " + ("no row to rewrite" if restep else "exact buffer full"))
        return oa

    def step_rows(self, q, k, v, out, size_t q_col=0, size_t k_col=0, size_t v_col=0,
                  size_t out_col=0, bint restep=False):
        """Rows of a chunk, one step each (or, with restep, the one-row rewrite): 2-D
        float32 q [t, *], k [t, *], v [t, *], out [t, *], this group's columns starting at
        q_col (rep*d wide), k_col (d), v_col (dv), out_col (rep*dv)."""
        cdef str op = "nystrom.step_rows"
        cdef cnp.ndarray qa = _f32(q, op, "q")
        cdef cnp.ndarray ka = _f32(k, op, "k")
        cdef cnp.ndarray va = _f32(v, op, "v")
        cdef cnp.ndarray oa = _f32(out, op, "out")
        _writable(oa, op, "out")
        if qa.ndim != 2 or ka.ndim != 2 or va.ndim != 2 or oa.ndim != 2:
            raise ValueError(f"{op}: q, k, v and out must be 2-D")
        cdef size_t t = <size_t>qa.shape[0]
        if <size_t>ka.shape[0] != t or <size_t>va.shape[0] != t or <size_t>oa.shape[0] != t:
            raise ValueError(f"{op}: q, k, v and out must have the same rows")
        cdef size_t rep = self.v.rep, d = self.v.d, dv = self.v.dv
        if q_col + rep * d > <size_t>qa.shape[1] or k_col + d > <size_t>ka.shape[1] \
                or v_col + dv > <size_t>va.shape[1] or out_col + rep * dv > <size_t>oa.shape[1]:
            raise ValueError(f"{op}: a column range runs past its array")
        if restep and t != 1:
            raise ValueError(f"{op}: restep rewrites one row, got {t}")
        if self.v.exact_only and self.v.win_len + t > self.v.w and not restep:
            raise ValueError(f"{op}: the exact buffer holds {self.v.w - self.v.win_len} more rows")
        cdef size_t lq = qa.shape[1], lk = ka.shape[1], lv = va.shape[1], lo = oa.shape[1]
        cdef const float *pq = <const float *>cnp.PyArray_DATA(qa) + q_col
        cdef const float *pk = <const float *>cnp.PyArray_DATA(ka) + k_col
        cdef const float *pv = <const float *>cnp.PyArray_DATA(va) + v_col
        cdef float *po = <float *>cnp.PyArray_DATA(oa) + out_col
        cdef size_t r
        cdef cq_status st = CQ_OK
        cdef int rs = restep
        with nogil:
            for r in range(t):
                st = cq_active().nystrom.step(&self.v, pq + r * lq, pk + r * lk, pv + r * lv,
                                              po + r * lo, rs)
                if st != CQ_OK:
                    break
        if st != CQ_OK:
            raise KernelError(f"{op}: " + ("no row to rewrite" if restep else "exact buffer full"))

    def readout(self, q, out=None):
        """Read out without pushing: out[rep, dv]."""
        cdef cnp.ndarray qa = _f32(q, "nystrom.readout", "q")
        if <size_t>qa.size != self.v.rep * self.v.d:
            raise ValueError(f"nystrom.readout: q has {qa.size} elements, want {self.v.rep * self.v.d}")
        cdef cnp.ndarray oa = np.empty((self.v.rep, self.v.dv), np.float32) if out is None else _f32(out, "nystrom.readout", "out")
        if <size_t>oa.size != self.v.rep * self.v.dv:
            raise ValueError(f"nystrom.readout: out has {oa.size} elements, want {self.v.rep * self.v.dv}")
        _writable(oa, "nystrom.readout", "out")
        cdef const float *pq = <const float *>cnp.PyArray_DATA(qa)
        cdef float *po = <float *>cnp.PyArray_DATA(oa)
        with nogil:
            cq_active().nystrom.readout(&self.v, pq, po)
        return oa


def nys_seg_means(x, size_t m, index=None, size_t col0=0, d=None):
    """f64 segment means [m, d] of the rows of float32 x[n, ld] (columns col0..col0+d),
    taken in the order of `index` (uint32 row numbers) when given."""
    cdef cnp.ndarray xa = _f32(x, "nys_seg_means", "x")
    if xa.ndim != 2:
        raise ValueError(f"nys_seg_means: x must be 2-D, got {xa.ndim}-D")
    cdef size_t n = <size_t>xa.shape[0], ld = <size_t>xa.shape[1]
    cdef size_t dd = ld - col0 if d is None else <size_t>d
    if col0 + dd > ld or dd == 0:
        raise ValueError(f"nys_seg_means: columns {col0}..{col0 + dd} out of 0..{ld}")
    cdef cnp.ndarray ia
    cdef const uint32_t *pi = NULL
    cdef size_t rows = n
    if index is not None:
        if not isinstance(index, cnp.ndarray) or (<cnp.ndarray>index).dtype != np.uint32 \
                or not (<cnp.ndarray>index).flags.c_contiguous or (<cnp.ndarray>index).ndim != 1:
            raise TypeError("nys_seg_means: index must be a 1-D C-contiguous uint32 array")
        ia = <cnp.ndarray>index
        rows = <size_t>ia.shape[0]
        if rows and <size_t>ia.max() >= n:
            raise ValueError(f"nys_seg_means: index holds {ia.max()}, x has {n} rows")
        pi = <const uint32_t *>cnp.PyArray_DATA(ia)
    if m == 0 or rows < m:
        raise ValueError(f"nys_seg_means: m = {m} needs 1 <= m <= rows ({rows})")
    cdef cnp.ndarray out = np.empty((m, dd), np.float64)
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa) + col0
    cdef double *po = <double *>cnp.PyArray_DATA(out)
    cdef cq_status st
    with nogil:
        st = cq_active().nystrom.seg_means(px, ld, dd, pi, rows, m, po)
    check(st, "nys_seg_means")
    return out
