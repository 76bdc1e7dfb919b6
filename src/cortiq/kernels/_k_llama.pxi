# Llama-family decode rows: one whole sub-layer for one generated token in one call (GIL
# released once). The math is written once, readably, in src/cortiq/models/llama.py
# (`LlamaModel._stack`); each function here is the exact sequence of kernel calls that
# makes for one decode row (the products through matvec_batch with one input, the same
# call the general path makes), so the results are bit-identical to it
# (tests/test_llama_decode_row.py). What they save is the Python work between the ~10
# kernel calls of a sub-layer (argument checks, temporaries, slicing), which on a
# 2-thread decode step is serial time that no thread count shortens.

cdef inline const float *_opt_buf(cnp.ndarray a, size_t need, str op, str arg) except? NULL:
    """The float32 data of an optional vector (None -> NULL), `need` floats."""
    if a is None:
        return NULL
    return _row_buf(a, need, op, arg, False, True)


cdef inline void _add_to(float *y, const float *b, size_t n) noexcept nogil:
    """y += b elementwise (a bias, a residual): one float32 add per element, as numpy's
    in-place add."""
    cdef size_t i
    for i in range(n):
        y[i] = y[i] + b[i]


cdef inline void _qmats(list mats, size_t n, size_t cols, str op, cq_qmat *ms) except *:
    cdef QMat q
    cdef size_t i
    if len(mats) != n:
        raise ValueError(f"{op}: {n} matrices expected, got {len(mats)}")
    for i in range(n):
        q = mats[i]
        if q.cols != cols:
            raise ValueError(f"{op}: matrix {i} has {q.cols} cols, the input has {cols}")
        ms[i] = q._snapshot()


def llama_attn_scratch(size_t hidden, size_t q_size):
    """Floats of scratch llama_attn_row needs: the normed input, q, the attended heads
    and o's output."""
    return 2 * hidden + 2 * q_size


def llama_mlp_scratch(size_t hidden, size_t ffn):
    """Floats of scratch llama_mlp_row needs: the normed input, gate and up, and down's
    output."""
    return 2 * hidden + 2 * ffn


def llama_attn_row(list qkv, QMat wo, cnp.ndarray h, cnp.ndarray w_norm, list biases,
                   cnp.ndarray q_norm, cnp.ndarray k_norm, cnp.ndarray cos, cnp.ndarray sin,
                   bint interleaved, cnp.ndarray keys, cnp.ndarray vals, size_t row,
                   size_t first, size_t pos, size_t window, float scale,
                   cnp.ndarray scratch, float eps):
    """One Llama attention sub-layer for one generated token, in place on h [hidden]:
        a = rmsnorm(h) * w_norm
        q, k, v = Wq a (+ bq), Wk a (+ bk), Wv a (+ bv)   (one matvec_batch pass)
        q, k = rmsnorm_head(q) * q_norm, rmsnorm_head(k) * k_norm   (when given)
        q, k = rope(q), rope(k)     (adjacent pairs when `interleaved`, else halves)
        keys[row], vals[row] = k, v                      (the cache row of position pos)
        y = attn_gqa(q, keys[:row + 1], vals[:row + 1], pos, first, window, scale)
        h += Wo y (+ bo)
    qkv: [Wq, Wk, Wv]; biases: [bq, bk, bv, bo], each None or a vector. Heads: hd =
    2 * cos.size, nh = Wq.rows / hd, nk = Wk.rows / hd. keys/vals hold rows of Wk.rows
    floats (cache row j is position first + j). scratch: at least
    llama_attn_scratch(hidden, Wq.rows) floats. Bit-identical to the separate calls."""
    cdef str op = "llama_attn_row"
    cdef cq_qmat ms[3]
    cdef size_t hidden = wo.rows, half = <size_t>cnp.PyArray_SIZE(cos)
    _qmats(qkv, 3, hidden, op, ms)
    cdef size_t nq = ms[0].rows, nkv = ms[1].rows, hd = 2 * half
    if hd == 0 or nq % hd or nkv % hd or nkv == 0 or (nq // hd) % (nkv // hd):
        raise ValueError(f"{op}: head dim {hd} does not split q ({nq}) and k ({nkv}) into "
                         "grouped heads")
    if ms[2].rows != nkv or wo.cols != nq:
        raise ValueError(f"{op}: weight shapes do not fit hidden {hidden}, q {nq}, kv {nkv}")
    if pos < first or pos - first != row:
        raise ValueError(f"{op}: position {pos} is not cache row {row} (first position "
                         f"{first})")
    if len(biases) != 4:
        raise ValueError(f"{op}: 4 biases (q, k, v, o) expected, got {len(biases)}")
    cdef float *ph = _row_buf(h, hidden, op, "h", True, True)
    cdef const float *pw = _row_buf(w_norm, hidden, op, "w_norm", False, True)
    cdef const float *pbq = _opt_buf(biases[0], nq, op, "bq")
    cdef const float *pbk = _opt_buf(biases[1], nkv, op, "bk")
    cdef const float *pbv = _opt_buf(biases[2], nkv, op, "bv")
    cdef const float *pbo = _opt_buf(biases[3], hidden, op, "bo")
    cdef const float *pqn = _opt_buf(q_norm, hd, op, "q_norm")
    cdef const float *pkn = _opt_buf(k_norm, hd, op, "k_norm")
    cdef const float *pc = _row_buf(cos, half, op, "cos", False, True)
    cdef const float *ps = _row_buf(sin, half, op, "sin", False, True)
    cdef float *pk = _row_buf(keys, (row + 1) * nkv, op, "keys", True, False)
    cdef float *pv = _row_buf(vals, (row + 1) * nkv, op, "vals", True, False)
    cdef size_t nsc = 2 * hidden + 2 * nq, nkeys = (row + 1) * nkv
    cdef float *sc = _row_buf(scratch, nsc, op, "scratch", True, False)
    if not (_apart(ph, hidden, sc, nsc) and _apart(ph, hidden, pk, nkeys)
            and _apart(ph, hidden, pv, nkeys) and _apart(sc, nsc, pk, nkeys)
            and _apart(sc, nsc, pv, nkeys) and _apart(pk, nkeys, pv, nkeys)):
        raise ValueError(f"{op}: h, keys, vals and scratch must not overlap")
    cdef float *pa = sc
    cdef float *pq = sc + hidden
    cdef float *py = sc + hidden + nq
    cdef float *po = sc + hidden + 2 * nq
    cdef float *ys[3]
    ys[0] = pq
    ys[1] = pk + row * nkv
    ys[2] = pv + row * nkv
    cdef cq_qmat mo = wo._snapshot()
    cdef size_t nh = nq // hd, nk = nkv // hd
    cdef const cq_table *T = cq_active()
    cdef cq_status st
    with nogil:
        T.attn.rmsnorm(ph, pw, eps, pa, 1, hidden)
        st = T.matvec.matvec_batch(ms, 3, pa, 1, ys)
        if st == CQ_OK:
            if pbq != NULL:
                _add_to(pq, pbq, nq)
            if pbk != NULL:
                _add_to(ys[1], pbk, nkv)
            if pbv != NULL:
                _add_to(ys[2], pbv, nkv)
            if pqn != NULL:
                T.attn.rmsnorm(pq, pqn, eps, pq, nh, hd)
            if pkn != NULL:
                T.attn.rmsnorm(ys[1], pkn, eps, ys[1], nk, hd)
            if interleaved:
                T.attn.rope_interleaved(pq, pc, ps, nh, nh, hd, hd, 0)
                T.attn.rope_interleaved(ys[1], pc, ps, nk, nk, hd, hd, 0)
            else:
                T.attn.rope_halfsplit(pq, pc, ps, 1, nh, hd, 0)
                T.attn.rope_halfsplit(ys[1], pc, ps, 1, nk, hd, 0)
            st = T.attn.attn_gqa(pq, pk, pv, py, 1, nh, nk, hd, row + 1, pos, first, window,
                                 scale)
        if st == CQ_OK:
            st = T.matvec.matvec_batch(&mo, 1, py, 1, &po)
        if st == CQ_OK:
            if pbo != NULL:
                _add_to(po, pbo, hidden)
            _add_to(ph, po, hidden)
    check(st, op)


def llama_mlp_row(list gate_up, QMat wdown, cnp.ndarray h, cnp.ndarray w_norm, list biases,
                  cnp.ndarray ones, cnp.ndarray scratch, float eps):
    """One Llama MLP sub-layer for one generated token, in place on h [hidden]:
        m = rmsnorm(h) * w_norm
        g, u = Wgate m (+ bg), Wup m (+ bu)              (one matvec_batch pass)
        g = silu(g * ones) * (u * ones);  h += Wdown g (+ bd)
    gate_up: [Wgate, Wup]; biases: [bg, bu, bd], each None or a vector; ones: [ffn] of
    1.0 (silu_mul's column scales, as the general path passes them). scratch: at least
    llama_mlp_scratch(hidden, ffn) floats. Bit-identical to the separate calls."""
    cdef str op = "llama_mlp_row"
    cdef cq_qmat ms[2]
    cdef size_t hidden = wdown.rows, ffn = wdown.cols
    _qmats(gate_up, 2, hidden, op, ms)
    if ms[0].rows != ffn or ms[1].rows != ffn:
        raise ValueError(f"{op}: weight shapes do not fit hidden {hidden}, ffn {ffn}")
    if len(biases) != 3:
        raise ValueError(f"{op}: 3 biases (gate, up, down) expected, got {len(biases)}")
    cdef float *ph = _row_buf(h, hidden, op, "h", True, True)
    cdef const float *pw = _row_buf(w_norm, hidden, op, "w_norm", False, True)
    cdef const float *pbg = _opt_buf(biases[0], ffn, op, "bg")
    cdef const float *pbu = _opt_buf(biases[1], ffn, op, "bu")
    cdef const float *pbd = _opt_buf(biases[2], hidden, op, "bd")
    cdef const float *pone = _row_buf(ones, ffn, op, "ones", False, True)
    cdef size_t nsc = 2 * hidden + 2 * ffn
    cdef float *sc = _row_buf(scratch, nsc, op, "scratch", True, False)
    if not _apart(ph, hidden, sc, nsc):
        raise ValueError(f"{op}: h and scratch must not overlap")
    cdef float *pm = sc
    cdef float *ys[2]
    ys[0] = sc + hidden
    ys[1] = sc + hidden + ffn
    cdef float *po = sc + hidden + 2 * ffn
    cdef cq_qmat md = wdown._snapshot()
    cdef const cq_table *T = cq_active()
    cdef cq_status st
    with nogil:
        T.attn.rmsnorm(ph, pw, eps, pm, 1, hidden)
        st = T.matvec.matvec_batch(ms, 2, pm, 1, ys)
        if st == CQ_OK:
            if pbg != NULL:
                _add_to(ys[0], pbg, ffn)
            if pbu != NULL:
                _add_to(ys[1], pbu, ffn)
            T.mathfn.silu_mul(ys[0], ys[1], pone, pone, 1, ffn)
            st = T.matvec.matvec_batch(&md, 1, ys[0], 1, &po)
        if st == CQ_OK:
            if pbd != NULL:
                _add_to(po, pbd, hidden)
            _add_to(ph, po, hidden)
    check(st, op)
