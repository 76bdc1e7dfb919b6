# mix: DeepSeek-V4 hyper-connections and small per-token helpers (csrc/mix).
# The hyper-connection state is hc copies of a dim vector: x [hc, dim] float32.

cdef inline cnp.ndarray _mix_out(object out, tuple shape, str op):
    cdef cnp.ndarray oa
    if out is None:
        return np.empty(shape, np.float32)
    oa = _f32(out, op, "out")
    _writable(oa, op, "out")
    if oa.size != int(np.prod(shape)):
        raise ValueError(f"{op}: out must hold {int(np.prod(shape))} floats, got {oa.size}")
    return oa


cdef inline (size_t, size_t) _mix_state(cnp.ndarray xa, str op) except *:
    if xa.ndim != 2:
        raise ValueError(f"{op}: x must be [hc, dim], got {xa.ndim}-D")
    return <size_t>xa.shape[0], <size_t>xa.shape[1]


def hc_mixes(x, fn, float eps, out=None):
    """out[m] = rsqrt(mean(x^2) + eps) * (fn[m] . x.ravel()); fn [mix, x.size]."""
    cdef cnp.ndarray xa = _f32(x, "hc_mixes", "x")
    cdef cnp.ndarray fa = _f32(fn, "hc_mixes", "fn")
    cdef size_t n = xa.size
    if fa.ndim != 2 or <size_t>fa.shape[1] != n:
        raise ValueError(f"hc_mixes: fn must be [mix, {n}], got {(<object>fa).shape}")
    cdef size_t m = fa.shape[0]
    cdef cnp.ndarray oa = _mix_out(out, (m,), "hc_mixes")
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *pf = <const float *>cnp.PyArray_DATA(fa)
    cdef float *po = <float *>cnp.PyArray_DATA(oa)
    if n == 0:
        raise ValueError("hc_mixes: x is empty")
    with nogil:
        cq_active().mix.hc_mixes(px, n, pf, m, eps, po)
    return oa


def hc_split_sinkhorn(mixes, scale3, base, size_t hc, size_t iters, float eps):
    """(pre [hc], post [hc], comb [hc, hc]) from a (2+hc)*hc mix vector (see cortiq.h)."""
    cdef cnp.ndarray ma = _f32(mixes, "hc_split_sinkhorn", "mixes")
    cdef cnp.ndarray sa = _f32(scale3, "hc_split_sinkhorn", "scale3")
    cdef cnp.ndarray ba = _f32(base, "hc_split_sinkhorn", "base")
    cdef size_t need = (2 + hc) * hc
    if hc == 0:
        raise ValueError("hc_split_sinkhorn: hc must be positive")
    if <size_t>ma.size != need or <size_t>ba.size != need:
        raise ValueError(f"hc_split_sinkhorn: mixes and base need {need} entries, got "
                         f"{ma.size} and {ba.size}")
    if sa.size != 3:
        raise ValueError(f"hc_split_sinkhorn: scale3 needs 3 entries, got {sa.size}")
    cdef cnp.ndarray pre = np.empty(hc, np.float32)
    cdef cnp.ndarray post = np.empty(hc, np.float32)
    cdef cnp.ndarray comb = np.empty((hc, hc), np.float32)
    with nogil:
        cq_active().mix.hc_split_sinkhorn(<const float *>cnp.PyArray_DATA(ma),
                                          <const float *>cnp.PyArray_DATA(sa),
                                          <const float *>cnp.PyArray_DATA(ba), hc, iters, eps,
                                          <float *>cnp.PyArray_DATA(pre),
                                          <float *>cnp.PyArray_DATA(post),
                                          <float *>cnp.PyArray_DATA(comb))
    return pre, post, comb


def hc_head_pre(mixes, float scale, base, float eps):
    """pre[j] = sigmoid(mixes[j]*scale + base[j]) + eps (the head fold's gate)."""
    cdef cnp.ndarray ma = _f32(mixes, "hc_head_pre", "mixes")
    cdef cnp.ndarray ba = _f32(base, "hc_head_pre", "base")
    cdef size_t hc = ma.size
    if <size_t>ba.size != hc:
        raise ValueError(f"hc_head_pre: base needs {hc} entries, got {ba.size}")
    cdef cnp.ndarray pre = np.empty(hc, np.float32)
    with nogil:
        cq_active().mix.hc_head_pre(<const float *>cnp.PyArray_DATA(ma), scale,
                                    <const float *>cnp.PyArray_DATA(ba), hc, eps,
                                    <float *>cnp.PyArray_DATA(pre))
    return pre


def hc_fold(x, pre, w=None, eps=None, out=None):
    """out[d] = sum_j pre[j] x[j, d]; with eps given, then RMSNorm (weight w or none)."""
    cdef cnp.ndarray xa = _f32(x, "hc_fold", "x")
    cdef size_t hc, dim
    hc, dim = _mix_state(xa, "hc_fold")
    cdef cnp.ndarray pa = _f32(pre, "hc_fold", "pre")
    if <size_t>pa.size != hc:
        raise ValueError(f"hc_fold: pre needs {hc} entries, got {pa.size}")
    cdef cnp.ndarray wa = None
    cdef const float *pw = NULL
    if w is not None:
        wa = _f32(w, "hc_fold", "w")
        if <size_t>wa.size != dim:
            raise ValueError(f"hc_fold: w needs {dim} entries, got {wa.size}")
        pw = <const float *>cnp.PyArray_DATA(wa)
        if eps is None:
            raise ValueError("hc_fold: w given without eps")
    cdef cnp.ndarray oa = _mix_out(out, (dim,), "hc_fold")
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *pp = <const float *>cnp.PyArray_DATA(pa)
    cdef float *po = <float *>cnp.PyArray_DATA(oa)
    cdef float e = 0.0
    cdef bint norm = eps is not None
    if norm:
        e = float(eps)
    with nogil:
        if norm:
            cq_active().mix.hc_fold_norm(px, pp, hc, dim, pw, e, po)
        else:
            cq_active().mix.hc_fold(px, pp, hc, dim, po)
    return oa


def hc_expand(blk, res, post, comb, out=None):
    """out[j, d] = post[j] blk[d] + sum_k comb[k, j] res[k, d]; out [hc, dim] must not
    overlap res or blk."""
    cdef cnp.ndarray ra = _f32(res, "hc_expand", "res")
    cdef size_t hc, dim
    hc, dim = _mix_state(ra, "hc_expand")
    cdef cnp.ndarray ba = _f32(blk, "hc_expand", "blk")
    cdef cnp.ndarray pa = _f32(post, "hc_expand", "post")
    cdef cnp.ndarray ca = _f32(comb, "hc_expand", "comb")
    if <size_t>ba.size != dim or <size_t>pa.size != hc or <size_t>ca.size != hc * hc:
        raise ValueError(f"hc_expand: want blk [{dim}], post [{hc}], comb [{hc}, {hc}]")
    cdef cnp.ndarray oa = _mix_out(out, (hc, dim), "hc_expand")
    if _shares(oa, ra) or _shares(oa, ba):
        raise ValueError("hc_expand: out must not overlap res or blk")
    with nogil:
        cq_active().mix.hc_expand(<const float *>cnp.PyArray_DATA(ba),
                                  <const float *>cnp.PyArray_DATA(ra),
                                  <const float *>cnp.PyArray_DATA(pa),
                                  <const float *>cnp.PyArray_DATA(ca), hc, dim,
                                  <float *>cnp.PyArray_DATA(oa))
    return oa


def hc_pre(x, fn, scale3, base, norm_w, size_t iters, float hc_eps, float norm_eps):
    """One hyper-connection block's opening, in one call: mixes, split + Sinkhorn, fold,
    RMSNorm with norm_w. Returns (folded [dim], post [hc], comb [hc, hc]). The same
    kernels as hc_mixes, hc_split_sinkhorn and hc_fold in turn, with the GIL released
    once (this runs twice per layer per token)."""
    cdef str op = "hc_pre"
    cdef cnp.ndarray xa = _f32(x, op, "x")
    cdef size_t hc, dim
    hc, dim = _mix_state(xa, op)
    cdef cnp.ndarray fa = _f32(fn, op, "fn")
    cdef cnp.ndarray sa = _f32(scale3, op, "scale3")
    cdef cnp.ndarray ba = _f32(base, op, "base")
    cdef cnp.ndarray wa = None if norm_w is None else _f32(norm_w, op, "norm_w")
    cdef size_t n = hc * dim, mix = (2 + hc) * hc
    if n == 0:
        raise ValueError(f"{op}: x is empty")
    if fa.ndim != 2 or <size_t>fa.shape[0] != mix or <size_t>fa.shape[1] != n:
        raise ValueError(f"{op}: fn must be [{mix}, {n}], got {(<object>fa).shape}")
    if <size_t>ba.size != mix or sa.size != 3 or (wa is not None and <size_t>wa.size != dim):
        raise ValueError(f"{op}: want base [{mix}], scale3 [3], norm_w [{dim}]")
    cdef float mix_stack[64]
    cdef cnp.ndarray mix_heap = None
    cdef float *mixes = mix_stack
    if mix > 64:  # hc > 7
        mix_heap = np.empty(mix, np.float32)
        mixes = <float *>cnp.PyArray_DATA(mix_heap)
    cdef cnp.ndarray pre = np.empty(hc, np.float32)
    cdef cnp.ndarray post = np.empty(hc, np.float32)
    cdef cnp.ndarray comb = np.empty((hc, hc), np.float32)
    cdef cnp.ndarray out = np.empty(dim, np.float32)
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *pf = <const float *>cnp.PyArray_DATA(fa)
    cdef const float *ps = <const float *>cnp.PyArray_DATA(sa)
    cdef const float *pb = <const float *>cnp.PyArray_DATA(ba)
    cdef const float *pw = NULL if wa is None else <const float *>cnp.PyArray_DATA(wa)
    cdef float *ppre = <float *>cnp.PyArray_DATA(pre)
    cdef float *ppost = <float *>cnp.PyArray_DATA(post)
    cdef float *pcomb = <float *>cnp.PyArray_DATA(comb)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    cdef const cq_mix_ops *M = cq_active().mix
    with nogil:
        M.hc_mixes(px, n, pf, mix, norm_eps, mixes)
        M.hc_split_sinkhorn(mixes, ps, pb, hc, iters, hc_eps, ppre, ppost, pcomb)
        M.hc_fold_norm(px, ppre, hc, dim, pw, norm_eps, po)
    return out, post, comb


def rms_weighted(v, w=None, float eps=1e-6):
    """In place on the 1-D v: v = v * rsqrt(mean(v^2) + eps) * w; returns v."""
    cdef cnp.ndarray va = _f32(v, "rms_weighted", "v")
    _writable(va, "rms_weighted", "v")
    cdef size_t n = va.size
    cdef cnp.ndarray wa = None
    cdef const float *pw = NULL
    if w is not None:
        wa = _f32(w, "rms_weighted", "w")
        if <size_t>wa.size != n:
            raise ValueError(f"rms_weighted: w needs {n} entries, got {wa.size}")
        pw = <const float *>cnp.PyArray_DATA(wa)
    if n == 0:
        return va
    with nogil:
        cq_active().mix.rms_weighted(<float *>cnp.PyArray_DATA(va), pw, n, eps)
    return va


def swiglu_clamp(g, u, float limit, float weight=1.0):
    """In place on g: g = silu(min(g, limit)) * clip(u, -limit, limit) * weight (limit
    <= 0: no clamp); returns g."""
    cdef cnp.ndarray ga = _f32(g, "swiglu_clamp", "g")
    cdef cnp.ndarray ua = _f32(u, "swiglu_clamp", "u")
    _writable(ga, "swiglu_clamp", "g")
    if ga.size != ua.size:
        raise ValueError(f"swiglu_clamp: g has {ga.size} entries, u has {ua.size}")
    cdef size_t n = ga.size
    with nogil:
        cq_active().mix.swiglu(<float *>cnp.PyArray_DATA(ga),
                               <const float *>cnp.PyArray_DATA(ua), n, limit, weight)
    return ga


def pool_by_score(kv, score, out=None):
    """kv, score [slots, width]: per column softmax over slots, weighted sum -> [width];
    an all -inf column gives 0."""
    cdef cnp.ndarray ka = _f32(kv, "pool_by_score", "kv")
    cdef cnp.ndarray sa = _f32(score, "pool_by_score", "score")
    if ka.ndim != 2 or (<object>ka).shape != (<object>sa).shape:
        raise ValueError("pool_by_score: kv and score must both be [slots, width]")
    cdef size_t slots = ka.shape[0], width = ka.shape[1]
    cdef cnp.ndarray oa = _mix_out(out, (width,), "pool_by_score")
    with nogil:
        cq_active().mix.pool_by_score(<const float *>cnp.PyArray_DATA(ka),
                                      <const float *>cnp.PyArray_DATA(sa), slots, width,
                                      <float *>cnp.PyArray_DATA(oa))
    return oa


def grouped_rows(qt, x, size_t groups, out=None):
    """DeepSeek-V4's grouped low-rank projection from the stored rows of `qt` (a
    QTensor or QMat of groups*lora rows, per = cols): out[r] = W[r] . x[g*per:(g+1)*per]
    with g = r // lora. x has groups*per floats -> out [rows]; or x [n, groups*per]
    (the rows of several sequences) -> out [n, rows], each row bit for bit its call
    alone, the matrix read once for all of them. No dequantized copy is made."""
    cdef QMat qm = qt.qmat if not isinstance(qt, QMat) else qt
    cdef cnp.ndarray xa = _f32(x, "grouped_rows", "x")
    if groups == 0 or qm.rows % groups:
        raise ValueError(f"grouped_rows: {qm.rows} rows do not split into {groups} groups")
    if xa.ndim > 2:
        raise ValueError(f"grouped_rows: x must be 1-D or 2-D, got {xa.ndim}-D")
    cdef size_t n = <size_t>xa.shape[0] if xa.ndim == 2 else 1
    cdef size_t width = <size_t>xa.shape[xa.ndim - 1] if xa.ndim else 1
    if width != groups * qm.cols:
        raise ValueError(f"grouped_rows: x needs {groups * qm.cols} floats a row, got {width}")
    shape = (int(n), int(qm.rows)) if xa.ndim == 2 else (int(qm.rows),)
    cdef cnp.ndarray oa = _mix_out(out, shape, "grouped_rows")
    cdef cq_status st
    cdef cq_qmat mm = qm._snapshot()
    with nogil:
        st = cq_active().mix.grouped_rows(&mm, <const float *>cnp.PyArray_DATA(xa), n, groups,
                                          <float *>cnp.PyArray_DATA(oa))
    check(st, "grouped_rows")
    return oa


def rows_sum(tensors, xs, out=None):
    """sum_j tensors[j] @ xs[j] in one pass over rows (the MoE's down projections):
    every tensor (QTensor or QMat) has the same rows; xs[j] has tensors[j].cols floats.
    Terms are added in list order; identical for any thread count."""
    cdef size_t n = len(tensors)
    if n == 0 or len(xs) != n:
        raise ValueError("rows_sum: need as many inputs as tensors (at least one)")
    mats = [t if isinstance(t, QMat) else t.qmat for t in tensors]
    arrs = []
    cdef QMat qm
    cdef size_t rows = (<QMat>mats[0]).rows
    for j in range(n):
        qm = mats[j]
        if qm.rows != rows:
            raise ValueError(f"rows_sum: tensor {j} has {qm.rows} rows, tensor 0 has {rows}")
        xa = _f32(xs[j], "rows_sum", f"xs[{j}]")
        if <size_t>xa.size != qm.cols:
            raise ValueError(f"rows_sum: xs[{j}] needs {qm.cols} floats, got {xa.size}")
        arrs.append(xa)
    cdef cnp.ndarray oa = _mix_out(out, (rows,), "rows_sum")
    cdef cq_qmat *ms = <cq_qmat *>malloc(n * sizeof(cq_qmat))
    cdef const float **px = <const float **>malloc(n * sizeof(float *))
    if ms == NULL or px == NULL:
        free(ms)
        free(px)
        raise MemoryError("rows_sum")
    for j in range(n):
        ms[j] = (<QMat>mats[j])._snapshot()
        px[j] = <const float *>cnp.PyArray_DATA(<cnp.ndarray>arrs[j])
    cdef cq_status st
    with nogil:
        st = cq_active().mix.rows_sum(ms, n, px, <float *>cnp.PyArray_DATA(oa))
    free(ms)
    free(px)
    check(st, "rows_sum")
    return oa
