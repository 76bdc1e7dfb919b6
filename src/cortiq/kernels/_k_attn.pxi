# attn: norms, rotary, top-k and attention (csrc/attn). Signatures are
# documented in docs/ARCHITECTURE.md ("attn").

cdef inline (size_t, size_t) _last_axis(cnp.ndarray a, str op, str arg) except *:
    if a.ndim < 1:
        raise ValueError(f"{op}: {arg} must have at least 1 dimension")
    cdef size_t n = a.shape[a.ndim - 1]
    if n == 0:
        return 0, 0
    return <size_t>a.size // n, n


def rmsnorm(x, w=None, float eps=1e-6, out=None):
    """Per row (last axis): out = x / sqrt(mean(x^2) + eps) * w (w optional).
    out may be x itself (in place); returns out."""
    cdef cnp.ndarray xa = _f32(x, "rmsnorm", "x")
    cdef size_t rows, n
    rows, n = _last_axis(xa, "rmsnorm", "x")
    cdef cnp.ndarray wa = None, oa
    cdef const float *pw = NULL
    if w is not None:
        wa = _f32(w, "rmsnorm", "w")
        if wa.ndim != 1 or <size_t>wa.shape[0] != n:
            raise ValueError(f"rmsnorm: w must have shape ({n},), got {(<object>wa).shape}")
        pw = <const float *>cnp.PyArray_DATA(wa)
    if out is None:
        oa = np.empty_like(xa)
    else:
        oa = _f32(out, "rmsnorm", "out")
        _writable(oa, "rmsnorm", "out")
        if (<object>oa).shape != (<object>xa).shape:
            raise ValueError(f"rmsnorm: out has shape {(<object>oa).shape}, x has {(<object>xa).shape}")
        if _shares(oa, xa) and cnp.PyArray_DATA(oa) != cnp.PyArray_DATA(xa):
            raise ValueError("rmsnorm: out overlaps x partially")
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
    cdef float *po = <float *>cnp.PyArray_DATA(oa)
    if rows:
        with nogil:
            cq_active().attn.rmsnorm(px, pw, eps, po, rows, n)
    return oa


def justnorm(x, float eps=1e-6):
    """In place per row (last axis): x = x / sqrt(sum(x^2) + eps); returns x."""
    cdef cnp.ndarray xa = _f32(x, "justnorm", "x")
    _writable(xa, "justnorm", "x")
    cdef size_t rows, n
    rows, n = _last_axis(xa, "justnorm", "x")
    cdef float *px = <float *>cnp.PyArray_DATA(xa)
    if rows:
        with nogil:
            cq_active().attn.justnorm(px, eps, rows, n)
    return xa


def rope_halfsplit(x, cos, sin, bint inverse=False):
    """In place on x [t, heads, hd] (or [heads, hd] for t = 1): pairs (i, i + hd/2)
    rotated by cos/sin [t, hd/2]: a' = a*c - b*s, b' = a*s + b*c (s -> -s if inverse)."""
    cdef cnp.ndarray xa = _f32(x, "rope_halfsplit", "x")
    _writable(xa, "rope_halfsplit", "x")
    if xa.ndim == 2:
        t, heads, hd = 1, xa.shape[0], xa.shape[1]
    elif xa.ndim == 3:
        t, heads, hd = xa.shape[0], xa.shape[1], xa.shape[2]
    else:
        raise ValueError(f"rope_halfsplit: x must be [t, heads, hd] or [heads, hd], got {xa.ndim}-D")
    if hd % 2:
        raise ValueError(f"rope_halfsplit: head dim {hd} must be even")
    cdef cnp.ndarray ca = _f32(cos, "rope_halfsplit", "cos")
    cdef cnp.ndarray sa = _f32(sin, "rope_halfsplit", "sin")
    if ca.size != t * (hd // 2) or sa.size != t * (hd // 2):
        raise ValueError(f"rope_halfsplit: cos and sin must have shape ({t}, {hd // 2})")
    cdef float *px = <float *>cnp.PyArray_DATA(xa)
    cdef const float *pc = <const float *>cnp.PyArray_DATA(ca)
    cdef const float *ps = <const float *>cnp.PyArray_DATA(sa)
    cdef size_t tt = t, hh = heads, dd = hd
    cdef int inv = inverse
    with nogil:
        cq_active().attn.rope_halfsplit(px, pc, ps, tt, hh, dd, inv)
    return xa


def rope_interleaved_tail(x, cos, sin, size_t rope_dim, bint inverse=False):
    """In place on x [..., hd]: adjacent pairs (b+2i, b+2i+1) of the last rope_dim
    entries (b = hd - rope_dim) rotated like rope_halfsplit. cos/sin are [P, rope_dim/2]
    (or [rope_dim/2] for P = 1); the x vectors split evenly over the P positions in
    order (x [P, heads, hd] -> heads vectors per position)."""
    cdef cnp.ndarray xa = _f32(x, "rope_interleaved_tail", "x")
    _writable(xa, "rope_interleaved_tail", "x")
    if xa.ndim < 1:
        raise ValueError("rope_interleaved_tail: x must have at least 1 dimension")
    cdef size_t hd = xa.shape[xa.ndim - 1]
    if rope_dim % 2 or rope_dim > hd:
        raise ValueError(f"rope_interleaved_tail: rope_dim {rope_dim} must be even and <= {hd}")
    cdef cnp.ndarray ca = _f32(cos, "rope_interleaved_tail", "cos")
    cdef cnp.ndarray sa = _f32(sin, "rope_interleaved_tail", "sin")
    cdef size_t half = rope_dim // 2
    if half == 0 or hd == 0:
        return xa
    if ca.size != sa.size or ca.size % half or ca.size == 0:
        raise ValueError(f"rope_interleaved_tail: cos and sin must both have shape (P, {half})")
    cdef size_t npos = ca.size // half
    cdef size_t vecs = xa.size // hd
    if vecs % npos:
        raise ValueError(f"rope_interleaved_tail: {vecs} vectors do not split over {npos} positions")
    cdef size_t per = vecs // npos
    cdef float *px = <float *>cnp.PyArray_DATA(xa)
    cdef const float *pc = <const float *>cnp.PyArray_DATA(ca)
    cdef const float *ps = <const float *>cnp.PyArray_DATA(sa)
    cdef int inv = inverse
    if vecs:
        with nogil:
            cq_active().attn.rope_interleaved(px, pc, ps, vecs, per, hd, rope_dim, inv)
    return xa


def topk_rows(x, size_t k):
    """Per row of x [rows, n]: (idx int64 [rows, k], count int64 [rows]); idx lists the
    k largest finite values, descending, ties to the lower index; -1 pads rows with
    fewer than k finite values."""
    cdef cnp.ndarray xa = _f32(x, "topk", "x")
    cdef size_t rows, n
    if xa.ndim == 1:
        rows, n = 1, xa.shape[0]
    elif xa.ndim == 2:
        rows, n = xa.shape[0], xa.shape[1]
    else:
        raise ValueError(f"topk: x must be 1-D or 2-D, got {xa.ndim}-D")
    cdef cnp.ndarray ia = np.empty((rows, k), np.int64)
    cdef cnp.ndarray ca = np.empty(rows, np.int64)
    cdef const float *px = <const float *>cnp.PyArray_DATA(xa)
    cdef int64_t *pi = <int64_t *>cnp.PyArray_DATA(ia)
    cdef int64_t *pcnt = <int64_t *>cnp.PyArray_DATA(ca)
    cdef cq_status st = CQ_OK
    if rows:
        with nogil:
            st = cq_active().attn.topk(px, rows, n, k, pi, pcnt)
    check(st, "topk")
    return ia, ca


def topk(x, size_t k):
    """Indices (int64) of the k largest finite values of the 1-D x, in descending value
    order, ties to the lower index; fewer than k when x has fewer finite values."""
    cdef cnp.ndarray xa = _f32(x, "topk", "x")
    if xa.ndim != 1:
        raise ValueError(f"topk: x must be 1-D, got {xa.ndim}-D (use topk_rows)")
    idx, cnt = topk_rows(xa, k)
    return idx[0, :cnt[0]].copy()


def attn_gqa_window(q, keys, vals, size_t pos0, size_t window=0, size_t first=0,
                    scale=None, out=None):
    """Causal windowed grouped-query attention.
    q [t, nh, hd]; keys, vals [nkeys, nk, hd] where cache row j holds position first + j;
    query r is at position pos0 + r and attends positions max(first, p + 1 - window) .. p
    (window 0 = no window); heads h share kv head h // (nh // nk); scale defaults to
    hd ** -0.5. Returns out [t, nh, hd] (softmax(scale q.k) v per head)."""
    cdef cnp.ndarray qa = _f32(q, "attn_gqa_window", "q")
    cdef cnp.ndarray ka = _f32(keys, "attn_gqa_window", "keys")
    cdef cnp.ndarray va = _f32(vals, "attn_gqa_window", "vals")
    if qa.ndim != 3 or ka.ndim != 3:
        raise ValueError("attn_gqa_window: q must be [t, nh, hd] and keys [nkeys, nk, hd]")
    if (<object>va).shape != (<object>ka).shape:
        raise ValueError(f"attn_gqa_window: vals has shape {(<object>va).shape}, keys has {(<object>ka).shape}")
    cdef size_t t = qa.shape[0], nh = qa.shape[1], hd = qa.shape[2]
    cdef size_t nkeys = ka.shape[0], nk = ka.shape[1]
    if <size_t>ka.shape[2] != hd:
        raise ValueError(f"attn_gqa_window: keys head dim {ka.shape[2]} != q head dim {hd}")
    if nk == 0 or nh % nk:
        raise ValueError(f"attn_gqa_window: {nh} query heads do not group over {nk} kv heads")
    if pos0 < first or pos0 + t - first > nkeys:
        raise ValueError(f"attn_gqa_window: positions {pos0}..{pos0 + t - 1} not in the cache "
                         f"(positions {first}..{first + nkeys - 1})")
    cdef float sc = (hd ** -0.5) if scale is None else float(scale)
    cdef cnp.ndarray oa
    if out is None:
        oa = np.empty((t, nh, hd), np.float32)
    else:
        oa = _f32(out, "attn_gqa_window", "out")
        _writable(oa, "attn_gqa_window", "out")
        if oa.size != t * nh * hd:
            raise ValueError(f"attn_gqa_window: out must hold {t * nh * hd} floats")
        if _shares(oa, qa) or _shares(oa, ka) or _shares(oa, va):
            raise ValueError("attn_gqa_window: out must not overlap q, keys or vals")
    cdef const float *pq = <const float *>cnp.PyArray_DATA(qa)
    cdef const float *pk = <const float *>cnp.PyArray_DATA(ka)
    cdef const float *pv = <const float *>cnp.PyArray_DATA(va)
    cdef float *po = <float *>cnp.PyArray_DATA(oa)
    cdef cq_status st
    with nogil:
        st = cq_active().attn.attn_gqa(pq, pk, pv, po, t, nh, nk, hd, nkeys, pos0, first, window, sc)
    check(st, "attn_gqa_window")
    return oa


def sparse_attend(q, kv, idx, sink=None, scale=None, out=None):
    """Attention over a position list with a sink logit (DeepSeek-V4), per head h:
    q [nh, hd] (or [hd]); kv [nkv, hd] is both key and value; idx int64 [m] rows of kv
    (negative = masked); sink [nh] float32 logits (None = no sink) that enter the softmax
    denominator only; scale defaults to hd ** -0.5. Returns out [nh, hd] (shape of q).
    A head with nothing to attend and no sink gets zeros."""
    cdef cnp.ndarray qa = _f32(q, "sparse_attend", "q")
    cdef cnp.ndarray ka = _f32(kv, "sparse_attend", "kv")
    if not isinstance(idx, cnp.ndarray) or (<cnp.ndarray>idx).dtype != np.int64:
        raise TypeError("sparse_attend: idx must be an int64 numpy array")
    cdef cnp.ndarray ia = np.ascontiguousarray(idx).reshape(-1)
    if qa.ndim not in (1, 2) or ka.ndim != 2:
        raise ValueError("sparse_attend: q must be [nh, hd] or [hd] and kv [nkv, hd]")
    cdef size_t hd = qa.shape[qa.ndim - 1]
    cdef size_t nh = 1 if qa.ndim == 1 else qa.shape[0]
    cdef size_t nkv = ka.shape[0], m = ia.shape[0]
    if <size_t>ka.shape[1] != hd:
        raise ValueError(f"sparse_attend: kv head dim {ka.shape[1]} != q head dim {hd}")
    if m and int(ia.max()) >= <long long>nkv:
        raise ValueError(f"sparse_attend: idx has entries >= {nkv} (rows of kv)")
    cdef cnp.ndarray sa = None
    cdef const float *psk = NULL
    if sink is not None:
        sa = _f32(sink, "sparse_attend", "sink")
        if <size_t>sa.size != nh:
            raise ValueError(f"sparse_attend: sink must have {nh} entries, got {sa.size}")
        psk = <const float *>cnp.PyArray_DATA(sa)
    cdef float sc = (hd ** -0.5) if scale is None else float(scale)
    cdef cnp.ndarray oa
    if out is None:
        oa = np.empty_like(qa)
    else:
        oa = _f32(out, "sparse_attend", "out")
        _writable(oa, "sparse_attend", "out")
        if oa.size != nh * hd:
            raise ValueError(f"sparse_attend: out must hold {nh * hd} floats")
        if _shares(oa, qa) or _shares(oa, ka):
            raise ValueError("sparse_attend: out must not overlap q or kv")
    cdef const float *pq = <const float *>cnp.PyArray_DATA(qa)
    cdef const float *pk = <const float *>cnp.PyArray_DATA(ka)
    cdef const int64_t *pi = <const int64_t *>cnp.PyArray_DATA(ia)
    cdef float *po = <float *>cnp.PyArray_DATA(oa)
    cdef cq_status st
    with nogil:
        st = cq_active().attn.sparse_attend(pq, pk, nkv, pi, m, psk, sc, nh, hd, po)
    check(st, "sparse_attend")
    return oa


# ---- fused Dory sub-layer steps (one call instead of several) -----------------------
def qk_prep(x, cos, sin, scale=None, float eps=1e-6):
    """In place on x [t, heads, hd]: half-split rotary by cos/sin [t, hd/2], justnorm of
    each head, then * scale [heads*hd] when given. Equals rope_halfsplit, justnorm and
    the multiply done separately, bit for bit. Returns x."""
    cdef cnp.ndarray xa = _f32(x, "qk_prep", "x")
    _writable(xa, "qk_prep", "x")
    if xa.ndim != 3:
        raise ValueError(f"qk_prep: x must be [t, heads, hd], got {xa.ndim}-D")
    cdef size_t t = xa.shape[0], heads = xa.shape[1], hd = xa.shape[2]
    if hd % 2:
        raise ValueError(f"qk_prep: head dim {hd} must be even")
    cdef cnp.ndarray ca = _f32(cos, "qk_prep", "cos")
    cdef cnp.ndarray sa = _f32(sin, "qk_prep", "sin")
    if <size_t>ca.size != t * (hd // 2) or <size_t>sa.size != t * (hd // 2):
        raise ValueError(f"qk_prep: cos and sin must hold [t={t}, {hd // 2}] values")
    cdef cnp.ndarray wa
    cdef const float *pw = NULL
    if scale is not None:
        wa = _f32(scale, "qk_prep", "scale")
        if <size_t>wa.size != heads * hd:
            raise ValueError(f"qk_prep: scale must hold heads*hd = {heads * hd} values")
        pw = <const float *>cnp.PyArray_DATA(wa)
    cdef float *px = <float *>cnp.PyArray_DATA(xa)
    cdef const float *pc = <const float *>cnp.PyArray_DATA(ca)
    cdef const float *ps = <const float *>cnp.PyArray_DATA(sa)
    with nogil:
        cq_active().attn.qk_prep(px, pc, ps, pw, t, heads, hd, eps)
    return xa


def slerp(x, out, alpha, float eps=1e-6):
    """The nGPT residual in place, per row: x = justnorm(x^ + alpha*(out^ - x^)), ^ being
    justnorm; `out` is used as scratch. x, out [rows, n] (or [n]); alpha [n]. Returns x."""
    cdef cnp.ndarray xa = _f32(x, "slerp", "x")
    cdef cnp.ndarray oa = _f32(out, "slerp", "out")
    cdef cnp.ndarray aa = _f32(alpha, "slerp", "alpha")
    _writable(xa, "slerp", "x")
    _writable(oa, "slerp", "out")
    cdef size_t rows, n
    rows, n = _last_axis(xa, "slerp", "x")
    if (<object>oa).shape != (<object>xa).shape:
        raise ValueError(f"slerp: out has shape {(<object>oa).shape}, x has {(<object>xa).shape}")
    if <size_t>aa.size != n:
        raise ValueError(f"slerp: alpha must hold {n} values")
    if _shares(xa, oa):
        raise ValueError("slerp: x and out must not overlap")
    cdef float *px = <float *>cnp.PyArray_DATA(xa)
    cdef float *po = <float *>cnp.PyArray_DATA(oa)
    cdef const float *pa = <const float *>cnp.PyArray_DATA(aa)
    if rows:
        with nogil:
            cq_active().attn.slerp(px, po, pa, rows, n, eps)
    return xa


def gate_norm(y, g, s, float eps=1e-6):
    """In place per row: y = justnorm(y * sigmoid(g*s)); s [n]. Returns y."""
    cdef cnp.ndarray ya = _f32(y, "gate_norm", "y")
    cdef cnp.ndarray ga = _f32(g, "gate_norm", "g")
    cdef cnp.ndarray sa = _f32(s, "gate_norm", "s")
    _writable(ya, "gate_norm", "y")
    cdef size_t rows, n
    rows, n = _last_axis(ya, "gate_norm", "y")
    if <size_t>ga.size != <size_t>ya.size:
        raise ValueError(f"gate_norm: g has {ga.size} values, y has {ya.size}")
    if <size_t>sa.size != n:
        raise ValueError(f"gate_norm: s must hold {n} values")
    cdef float *py = <float *>cnp.PyArray_DATA(ya)
    cdef const float *pg = <const float *>cnp.PyArray_DATA(ga)
    cdef const float *ps = <const float *>cnp.PyArray_DATA(sa)
    if rows:
        with nogil:
            cq_active().attn.gate_norm(py, pg, ps, rows, n, eps)
    return ya
