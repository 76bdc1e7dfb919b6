# Dory decode rows: one whole sub-layer for one token in one call (GIL released once).
# Dory's math is written once, readably, in src/cortiq/models/dory/model.py (`_attn`,
# `_mlp`); each function here is the exact sequence of kernel calls those make for a
# chunk of one row, so the results are bit-identical to them
# (tests/test_dory_model.py::test_fused_decode_rows_equal_the_general_path, over KV modes,
# windows, gates, dtypes and precisions). What they save is the Python work between the
# calls (argument checks, temporaries, may_share_memory), which on a decode step costs
# more than the small kernels themselves.

cdef inline float *_row_buf(cnp.ndarray a, size_t need, str op, str arg, bint write,
                            bint exact) except NULL:
    """The float32 data of `a` (C-contiguous; `need` floats, or at least that many when
    not `exact`), checked without numpy calls."""
    if a is None or cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or not cnp.PyArray_ISNOTSWAPPED(a):
        raise TypeError(f"{op}: {arg} must be a float32 numpy array")
    if not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError(f"{op}: {arg} must be C-contiguous")
    if write and not cnp.PyArray_ISWRITEABLE(a):
        raise ValueError(f"{op}: {arg} is read-only")
    cdef size_t n = <size_t>cnp.PyArray_SIZE(a)
    if n < need or (exact and n != need):
        raise ValueError(f"{op}: {arg} must hold {'' if exact else 'at least '}{need} floats, "
                         f"has {n}")
    return <float *>cnp.PyArray_DATA(a)


cdef inline bint _apart(const float *a, size_t na, const float *b, size_t nb) noexcept:
    return a + na <= b or b + nb <= a


def dory_attn_scratch(size_t hidden, size_t q_size):
    """Floats of scratch dory_attn_row needs: q, g and the attended heads, then o's output."""
    return 3 * q_size + hidden


def dory_mlp_scratch(size_t hidden, size_t ffn):
    """Floats of scratch dory_mlp_row needs: gate and up, then down's output."""
    return 2 * ffn + hidden


def dory_attn_row(QMat wq, QMat wk, QMat wv, QMat wg, QMat wo, cnp.ndarray h,
                  cnp.ndarray sq, cnp.ndarray sg, cnp.ndarray alpha, cnp.ndarray cos,
                  cnp.ndarray sin, cnp.ndarray keys, cnp.ndarray vals, size_t row,
                  size_t first, size_t pos, size_t window, float scale,
                  cnp.ndarray scratch, float eps=1e-6):
    """One Dory attention sub-layer for one token, in place on h [hidden]:
        q, k, v, g = Wq h, Wk h, Wv h, Wg h            (one matvec_many pass)
        q = qk_prep(q, cos, sin, sq); k = qk_prep(k, cos, sin)
        keys[row], vals[row] = k, v                      (the cache row of position pos)
        y = attn_gqa(q, keys[:row + 1], vals[:row + 1], pos, first, window, scale)
        y = gate_norm(y, g, sg); out = Wo y; h = slerp(h, out, alpha)
    Heads: nh = Wq.rows / hd, nk = Wk.rows / hd with hd = cos.size * 2. keys/vals hold
    rows of Wk.rows floats (cache row j is position first + j). scratch: at least
    dory_attn_scratch(hidden, Wq.rows) floats. Bit-identical to the separate calls."""
    cdef str op = "dory_attn_row"
    cdef size_t hidden = wq.cols, nq = wq.rows, nkv = wk.rows, half = <size_t>cnp.PyArray_SIZE(cos)
    cdef size_t hd = 2 * half
    if hd == 0 or nq % hd or nkv % hd or nkv == 0 or (nq // hd) % (nkv // hd):
        raise ValueError(f"{op}: head dim {hd} does not split q ({nq}) and k ({nkv}) into "
                         "grouped heads")
    if wk.cols != hidden or wv.cols != hidden or wg.cols != hidden or wv.rows != nkv \
            or wg.rows != nq or wo.cols != nq or wo.rows != hidden:
        raise ValueError(f"{op}: weight shapes do not fit hidden {hidden}, q {nq}, kv {nkv}")
    if pos < first or pos - first > row:
        raise ValueError(f"{op}: position {pos} is not in the cache (positions {first}.."
                         f"{first + row})")
    cdef float *ph = _row_buf(h, hidden, op, "h", True, True)
    cdef const float *psq = _row_buf(sq, nq, op, "sq", False, True)
    cdef const float *psg = _row_buf(sg, nq, op, "sg", False, True)
    cdef const float *pal = _row_buf(alpha, hidden, op, "alpha", False, True)
    cdef const float *pc = _row_buf(cos, half, op, "cos", False, True)
    cdef const float *ps = _row_buf(sin, half, op, "sin", False, True)
    cdef float *pk = _row_buf(keys, (row + 1) * nkv, op, "keys", True, False)
    cdef float *pv = _row_buf(vals, (row + 1) * nkv, op, "vals", True, False)
    cdef float *sc = _row_buf(scratch, 3 * nq + hidden, op, "scratch", True, False)
    cdef size_t nsc = 3 * nq + hidden, nkeys = (row + 1) * nkv
    if not (_apart(ph, hidden, sc, nsc) and _apart(ph, hidden, pk, nkeys)
            and _apart(ph, hidden, pv, nkeys) and _apart(sc, nsc, pk, nkeys)
            and _apart(sc, nsc, pv, nkeys) and _apart(pk, nkeys, pv, nkeys)):
        raise ValueError(f"{op}: h, keys, vals and scratch must not overlap")
    cdef float *pq = sc
    cdef float *pg = sc + nq
    cdef float *py = sc + 2 * nq
    cdef float *po = sc + 3 * nq
    cdef cq_qmat ms[4]
    cdef float *ys[4]
    ms[0] = wq._snapshot()      # precision resolved now (a process default may have moved)
    ms[1] = wk._snapshot()
    ms[2] = wv._snapshot()
    ms[3] = wg._snapshot()
    cdef cq_qmat mo = wo._snapshot()
    ys[0] = pq
    ys[1] = pk + row * nkv
    ys[2] = pv + row * nkv
    ys[3] = pg
    cdef const cq_table *T = cq_active()
    cdef cq_status st
    with nogil:
        st = T.matvec.matvec_many(ms, 4, ph, ys)
        if st == CQ_OK:
            T.attn.qk_prep(pq, pc, ps, psq, 1, nq // hd, hd, eps)
            T.attn.qk_prep(ys[1], pc, ps, NULL, 1, nkv // hd, hd, eps)
            st = T.attn.attn_gqa(pq, pk, pv, py, 1, nq // hd, nkv // hd, hd, row + 1, pos,
                                 first, window, scale)
        if st == CQ_OK:
            T.attn.gate_norm(py, pg, psg, 1, nq, eps)
            st = T.matvec.matvec(&mo, py, po)
        if st == CQ_OK:
            T.attn.slerp(ph, po, pal, 1, hidden, eps)
    check(st, op)


def dory_mlp_row(QMat wgate, QMat wup, QMat wdown, cnp.ndarray h, cnp.ndarray sg,
                 cnp.ndarray su, cnp.ndarray alpha, cnp.ndarray scratch, float eps=1e-6):
    """One Dory MLP sub-layer for one token, in place on h [hidden]:
        g, u = Wgate h, Wup h                            (one matvec_many pass)
        g = justnorm(silu_mul(g, u, sg, su)); out = Wdown g; h = slerp(h, out, alpha)
    scratch: at least dory_mlp_scratch(hidden, ffn) floats. Bit-identical to the
    separate calls."""
    cdef str op = "dory_mlp_row"
    cdef size_t hidden = wgate.cols, ffn = wgate.rows
    if wup.cols != hidden or wup.rows != ffn or wdown.cols != ffn or wdown.rows != hidden:
        raise ValueError(f"{op}: weight shapes do not fit hidden {hidden}, ffn {ffn}")
    cdef float *ph = _row_buf(h, hidden, op, "h", True, True)
    cdef const float *psg = _row_buf(sg, ffn, op, "sg", False, True)
    cdef const float *psu = _row_buf(su, ffn, op, "su", False, True)
    cdef const float *pal = _row_buf(alpha, hidden, op, "alpha", False, True)
    cdef float *sc = _row_buf(scratch, 2 * ffn + hidden, op, "scratch", True, False)
    if not _apart(ph, hidden, sc, 2 * ffn + hidden):
        raise ValueError(f"{op}: h and scratch must not overlap")
    cdef cq_qmat ms[2]
    cdef float *ys[2]
    ms[0] = wgate._snapshot()   # precision resolved now (a process default may have moved)
    ms[1] = wup._snapshot()
    cdef cq_qmat md = wdown._snapshot()
    ys[0] = sc
    ys[1] = sc + ffn
    cdef float *po = sc + 2 * ffn
    cdef const cq_table *T = cq_active()
    cdef cq_status st
    with nogil:
        st = T.matvec.matvec_many(ms, 2, ph, ys)
        if st == CQ_OK:
            T.mathfn.silu_mul(ys[0], ys[1], psg, psu, 1, ffn)
            T.attn.justnorm(ys[0], eps, 1, ffn)
            st = T.matvec.matvec(&md, ys[0], po)
        if st == CQ_OK:
            T.attn.slerp(ph, po, pal, 1, hidden, eps)
    check(st, op)
