"""Kernel-level GPU measurements for bench_gpu.py (benchmark-only code):

  * the per-dispatch floor: one compute pass of N one-workgroup dispatches that each
    write the same buffer (so each waits for the one before, as a forward's do), timed
    at the submission's boundaries against a pass of one dispatch;
  * the decode matvec's streaming rate per variant (subgroupAdd or the shared-memory
    tree, 1 or 4 loads in flight a lane, rows a workgroup, float32 or int8 activations) on q8_row matrices of
    Llama-8B and bench-Dory shapes, each shape as enough distinct copies that the set
    exceeds the GPU's L2, as GB/s and % of the read bandwidth;
  * the matvec stream of one Llama-3-8B-shaped token (hidden 4096, 32 layers, FFN
    14336, 32/8 heads of 128, vocab 128256, q8_row: Q|K|V, O, gate|up, down per layer
    and the head, 7.5 GB): every product of a token in one pass, each layer's own
    buffers (one layer's matrices are uploaded and bound 32 times: each layer reads
    218 MB between two reads of the same bytes, more than any L2 holds);
  * the ceiling of a model's decode token on this device (`stream_ceiling`): its program
    with every product a pure read of its weights' bytes and every other pass empty.
The weights are random q8_row payloads (the streaming rate does not depend on values).
"""
import time
from types import SimpleNamespace

import numpy as np


_FENCE: dict = {}

#: copies of a program a timed pass holds at most on a software adapter (llvmpipe): a
#: pass of 64 copies of the tiny Dory's decode program (6400 dispatches) took 8.5 GB
#: and two minutes there
SOFTWARE_COPIES = 2


def copies(dev, k: int) -> int:
    """Copies of a program to time in one pass: k, at most SOFTWARE_COPIES on a
    software adapter."""
    return min(k, SOFTWARE_COPIES) if dev.software else k


def _finish(dev):
    """Wait for the work submitted so far: a 16-byte copy behind it, read back."""
    if dev not in _FENCE:
        _FENCE[dev] = (dev.buffer(16, copy_src=True), dev.staging(16))
    src, st = _FENCE[dev]
    enc = dev.dev.create_command_encoder()
    enc.copy_buffer_to_buffer(src, 0, st, 0, 16)
    dev.queue.submit([enc.finish()])
    dev.read(st, 4)


def _time_pass(dev, dispatches, rounds=5, t=1):
    """Best wall seconds of one submission of one compute pass over `dispatches` (at row
    count t)."""
    best = None
    for r in range(rounds + 1):
        cb = dev.record(dispatches, t).finish()
        t0 = time.perf_counter()
        dev.queue.submit([cb])
        _finish(dev)
        dt = time.perf_counter() - t0
        if r and (best is None or dt < best):
            best = dt
    return best


_BUSY: list = []


def busy(dev, seconds: float = 1.5) -> None:
    """Keep the GPU reading memory for `seconds` before a timed part: after seconds of host
    work (building a model) the card idles at low clocks, and measured on an H100 the
    first ~0.5-1 s of timings after that ran 2-4x slow whatever the kernel."""
    from cortiq.gpu.kernels import FIXED, Dispatch, ParamArena, fixed_pipeline, resolve, u32s
    if dev.software:    # a software adapter has no clocks to raise
        return
    if not _BUSY or _BUSY[0][0] is not dev:
        nbytes = min(64 << 20, dev.max_binding // 16 * 16)
        buf = dev.buffer(nbytes)
        out = dev.buffer(1 << 20, copy_src=True)
        words = nbytes // 16
        nwg = (words + 4095) // 4096
        arena = ParamArena(dev)
        p = arena.ref(u32s(words, 4096, 0, 0))
        arena.upload()
        d = Dispatch(fixed_pipeline(dev, "readbw"),
                     dev.bind(FIXED["readbw"], resolve([p, buf, out])),
                     (min(nwg, 65535), (nwg + 65534) // 65535, 1), "readbw")
        _BUSY[:] = [(dev, d, (buf, out, arena))]
    d = _BUSY[0][1]
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        dev.queue.submit([dev.record([d] * 16).finish()])
        _finish(dev)


def prefill_rate(g, st, prompt) -> float:
    """Tokens/s of feeding `prompt` into state st, its programs' pipelines compiled
    first (by an untimed feed into a state of its own), so that the rate is the
    device's and not the shader compiler's."""
    g.forward(g.new_state(), prompt, "last")
    t0 = time.perf_counter()
    g.forward(st, prompt, "last")
    return len(prompt) / (time.perf_counter() - t0)


def decode_rates(g, st, tok: int, tokens: int) -> dict:
    """tok/s of `tokens` tokens decoded three ways from state st after token tok: the
    session path (logits back each token), greedy on the device (the token back), and
    greedy chained on the device (one readback at the end)."""
    out = {}
    t0 = time.perf_counter()
    for _ in range(tokens):
        tok = int(np.argmax(g.forward(st, [tok])))
    out["session_tok_s"] = tokens / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(tokens):
        tok = g.forward_greedy(st, [tok])
    out["greedy_tok_s"] = tokens / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    g.decode_greedy(st, tok, tokens)
    out["chained_tok_s"] = tokens / (time.perf_counter() - t0)
    return out


def ms_by_kernel(prog, time_fn, shapes: bool = False) -> dict:
    """GPU ms of a program's dispatches grouped by kernel name (time_fn(dispatches) ->
    seconds of one pass over them); with `shapes`, products by name and shape
    (rows x cols) too."""
    kinds: dict = {}
    for d in prog:
        shape = getattr(d, "shape", None) if shapes else None
        kinds.setdefault(f"{d.name} {shape[0]}x{shape[1]}" if shape else d.name, []).append(d)
    return {name: {"dispatches": len(ds), "ms": time_fn(ds) * 1e3}
            for name, ds in sorted(kinds.items())}


def q8_row(rng, rows, cols, name="w"):
    """A random q8_row payload in the shape GpuMatrix takes (int8 plane, f16 row scales)."""
    plane = np.frombuffer(rng.bytes(rows * cols), np.uint8)
    scales = np.full(rows, 1.0 / 127, np.float16).view(np.uint8)
    return SimpleNamespace(dtype="q8_row", rows=rows, cols=cols, name=name,
                           raw=np.concatenate([plane, scales]))


def dispatch_floor(dev, n=2000):
    from cortiq.gpu.kernels import FIXED, Dispatch, ParamArena, fixed_pipeline, resolve, u32s
    buf = dev.buffer(4096)
    out = dev.buffer(4096, copy_src=True)
    arena = ParamArena(dev)
    p = arena.ref(u32s(16, 16, 0, 0))
    arena.upload()
    d = Dispatch(fixed_pipeline(dev, "readbw"), dev.bind(FIXED["readbw"], resolve([p, buf, out])),
                 (1, 1, 1), "readbw")
    one = _time_pass(dev, [d])
    many = _time_pass(dev, [d] * n)
    return {"dispatches": n, "pass_of_1_ms": one * 1e3, "pass_of_n_ms": many * 1e3,
            "us_per_dependent_dispatch": (many - one) / (n - 1) * 1e6}


class _Settings:
    """The decode matvec's module settings changed for one variant, restored after."""
    NAMES = ("MATVEC_SUBGROUPS", "MATVEC_UNROLL", "RPW1_SLOTS", "RPW1_ROWS",
             "MATVEC_STAGE_PLAIN", "STAGED_SLOTS")

    def __init__(self, **kw):
        from cortiq.gpu import kernels
        self.k, self.kw = kernels, kw

    def __enter__(self):
        self.saved = {n: getattr(self.k, n) for n in self.NAMES}
        for n, v in self.kw.items():
            setattr(self.k, n, v)

    def __exit__(self, *exc):
        for n, v in self.saved.items():
            setattr(self.k, n, v)


#: decode-matvec variants: name -> module settings (kernels.py)
VARIANTS = {
    "tree_unroll4_rows16 (the default)": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=4,
                                              RPW1_SLOTS=16, RPW1_ROWS=1),
    "tree_unroll4_rows4": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=4, RPW1_SLOTS=4,
                               RPW1_ROWS=1),
    "tree_unroll4_rows8": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=4, RPW1_SLOTS=8,
                               RPW1_ROWS=1),
    "tree_unroll4_rows32": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=4, RPW1_SLOTS=32,
                                RPW1_ROWS=1),
    "tree_unroll4_rows16x2": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=4, RPW1_SLOTS=16,
                                  RPW1_ROWS=2),
    "tree_unroll4_rows16_unstaged": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=4,
                                         RPW1_SLOTS=16, RPW1_ROWS=1, MATVEC_STAGE_PLAIN=False),
    "tree_unroll1_rows16": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=1, RPW1_SLOTS=16,
                                RPW1_ROWS=1),
    "sg_unroll4_rows16": dict(MATVEC_SUBGROUPS=True, MATVEC_UNROLL=4, RPW1_SLOTS=16,
                              RPW1_ROWS=1),
    "sg_unroll4_rows8": dict(MATVEC_SUBGROUPS=True, MATVEC_UNROLL=4, RPW1_SLOTS=8, RPW1_ROWS=1),
    "sg_unroll4_rows32": dict(MATVEC_SUBGROUPS=True, MATVEC_UNROLL=4, RPW1_SLOTS=32,
                              RPW1_ROWS=1),
    # int8 activations (precision "int8"): the input quantized in the workgroup, dot4I8Packed
    "int8_tree_rows16": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=4, RPW1_SLOTS=16,
                             RPW1_ROWS=1, int8=True),
    "int8_tree_rows8": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=4, RPW1_SLOTS=8,
                            RPW1_ROWS=1, int8=True),
    "int8_sg_rows8": dict(MATVEC_SUBGROUPS=True, MATVEC_UNROLL=4, RPW1_SLOTS=8,
                          RPW1_ROWS=1, int8=True),
    "int8_sg_rows16": dict(MATVEC_SUBGROUPS=True, MATVEC_UNROLL=4, RPW1_SLOTS=16,
                           RPW1_ROWS=1, int8=True),
    "int8_tree_rows16x2": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=4, RPW1_SLOTS=16,
                               RPW1_ROWS=2, int8=True),
    "int8_tree_rows16_unroll8": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=8, RPW1_SLOTS=16,
                                     RPW1_ROWS=1, int8=True),
    "int8_sg_rows16_unroll8": dict(MATVEC_SUBGROUPS=True, MATVEC_UNROLL=8, RPW1_SLOTS=16,
                                   RPW1_ROWS=1, int8=True),
    "int8_tree_rows8_unroll8": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=8, RPW1_SLOTS=8,
                                    RPW1_ROWS=1, int8=True),
    "int8_tree_rows32_unroll8": dict(MATVEC_SUBGROUPS=False, MATVEC_UNROLL=8, RPW1_SLOTS=32,
                                     RPW1_ROWS=1, int8=True),
}
#: VARIANTS' names holding one of these (bench_gpu.py --variants; empty: every variant)
ONLY: list = []


def _chosen(dev=None):
    """The VARIANTS measured: those ONLY names (all where it is empty), less those
    needing subgroups where the device has none."""
    from cortiq.gpu.device import Device
    subgroups = (dev or Device.get()).subgroups
    return [(n, kw) for n, kw in VARIANTS.items()
            if (not ONLY or any(o in n for o in ONLY))
            and (subgroups or not kw["MATVEC_SUBGROUPS"])]


def _variant(kw: dict):
    """(module settings, int8) of a VARIANTS entry."""
    kw = dict(kw)
    return kw, kw.pop("int8", False)

#: (label, rows, cols, input stage) of the measured products
SHAPES = [("llama8b_qkv 6144x4096", 6144, 4096, 0),
          ("llama8b_gate_up 28672x4096", 28672, 4096, 0),
          ("llama8b_down 4096x14336", 4096, 14336, 0),
          ("dory_down_swiglu 2048x5632", 2048, 5632, 2),
          ("dory_o 2048x2048", 2048, 2048, 0)]


def _ops(dev, mats_list, pro=0, rows=1):
    """One decode MatvecOp per matrix group (its own input and output buffers, `rows`
    input rows)."""
    from cortiq.gpu.kernels import MatvecOp, ParamArena
    arena = ParamArena(dev)
    ops = []
    for mats in mats_list:
        cols = mats[0].cols
        total = sum(m.rows for m in mats)
        xw = 2 * cols if pro == 2 else cols
        x = dev.upload(np.random.default_rng(1).standard_normal(xw * rows).astype(np.float32))
        v = dev.upload(np.ones(2 * cols + 8, np.float32))
        y = dev.buffer(total * 4 * rows)
        ops.append(MatvecOp(dev, mats, arena, x=x, x_off=0, x_stride=xw, y=y, y_off=0,
                            y_stride=total, vbuf=v, v_a=0 if pro == 2 else 0xFFFFFFFF,
                            v_b=cols if pro == 2 else 0xFFFFFFFF, x2_off=cols, pro=pro))
    arena.upload()
    return ops


def matvec_variants(dev, read_gb_s, l2_bytes=256 << 20):
    from cortiq.gpu.kernels import GpuMatrix, matvec1_subgroups
    rng = np.random.default_rng(0)
    step = dev.upload(np.array([1, 0, 0, 0], np.uint32), uniform=True)
    out = {"subgroups_offered": dev.subgroups, "shapes": {}}
    for label, rows, cols, pro in SHAPES:
        nbytes = rows * cols + 2 * rows
        copies = max(1, -(-l2_bytes // nbytes))
        mats = [[GpuMatrix(dev, q8_row(rng, rows, cols))] for _ in range(copies)]
        ops = _ops(dev, mats, pro)
        busy(dev, 1.0)
        res = {"copies": copies, "bytes_per_pass": nbytes * copies, "input_stage": pro}
        for name, kw in _chosen(dev):
            settings, int8 = _variant(kw)
            with _Settings(**settings):
                ds = [op.dispatch(step, 1, int8) for op in ops]
                dt = _time_pass(dev, ds * 8, rounds=3) / 8
                gbs = nbytes * copies / dt / 1e9
                res[name] = {"gb_s": gbs, "pct_of_read_bw": 100 * gbs / read_gb_s,
                             "us_per_product": dt / copies * 1e6,
                             "subgroups": matvec1_subgroups(dev)}
        out["shapes"][label] = res
        del mats, ops
    return out


def _llama8b_ops(dev, hidden, ffn, heads, kv_heads, head_dim, vocab, rows=1):
    """One Llama-8B-shaped layer's q8_row matrix groups, the head, and their MatvecOps
    (inputs of `rows` rows)."""
    from cortiq.gpu.kernels import GpuMatrix
    rng = np.random.default_rng(0)
    q = (heads + 2 * kv_heads) * head_dim
    layer = [[GpuMatrix(dev, q8_row(rng, q, hidden))],
             [GpuMatrix(dev, q8_row(rng, hidden, heads * head_dim))],
             [GpuMatrix(dev, q8_row(rng, ffn, hidden)), GpuMatrix(dev, q8_row(rng, ffn, hidden))],
             [GpuMatrix(dev, q8_row(rng, hidden, ffn))]]
    head = [GpuMatrix(dev, q8_row(rng, vocab, hidden))]
    return layer, head, _ops(dev, layer + [head], rows=rows)


def llama8b_rows_chain(dev, read_gb_s, t=8, tiles=(0, 2, 4, 8), layers=32, hidden=4096,
                       ffn=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256):
    """The int8 rows matvec stream of t Llama-3-8B-shaped decode rows (every product of a
    token for t sequences in one pass, each product's quantrows pass included), per
    ROWS_TILE (0: the one-row kernel): GPU ms, the weights' GB/s, and t times the same
    products' one-row stream (the int8 decode matvec) over it, the batching gain the
    products allow."""
    from cortiq.gpu import kernels
    from cortiq.gpu.kernels import rows_block_words
    layer, head, ops = _llama8b_ops(dev, hidden, ffn, heads, kv_heads, head_dim, vocab, rows=t)
    per_layer = sum(m.nbytes for g in layer for m in g)
    nbytes = layers * per_layer + head[0].nbytes
    one = dev.upload(np.array([1, 0, 0, 0], np.uint32), uniform=True)
    step = dev.upload(np.array([t, 0, 0, 0], np.uint32), uniform=True)
    xq = dev.buffer(t * 16 * rows_block_words(ffn))
    busy(dev)
    ds = [op.dispatch(one, 1, True) for op in ops]
    single = _time_pass(dev, ds[:4] * layers + ds[4:], rounds=3)
    out = {"rows": t, "one_row_ms": single * 1e3, "weight_gb_per_token": nbytes / 1e9}
    keep = kernels.ROWS_TILE
    try:
        for tile in tiles:
            kernels.ROWS_TILE = tile
            ds = [op.dispatch_rows(step, xq) for op in ops]
            prog = [d for g in ds[:4] for d in g] * layers + ds[4]
            dt = _time_pass(dev, prog, rounds=3, t=t)
            out[f"tile{tile}"] = {"gpu_ms": dt * 1e3, "weights_gb_s": nbytes / dt / 1e9,
                                  "pct_of_read_bw": 100 * nbytes / dt / 1e9 / read_gb_s,
                                  "rows_over_one_row": t * single / dt}
    finally:
        kernels.ROWS_TILE = keep
    return out


def llama8b_chain(dev, read_gb_s, layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8,
                  head_dim=128, vocab=128256):
    """The q8_row matvec stream of one Llama-3-8B-shaped token in one pass (see the
    module docstring): GPU ms, the tok/s it bounds and its % of the read bandwidth."""
    t0 = time.perf_counter()
    layer, head, ops = _llama8b_ops(dev, hidden, ffn, heads, kv_heads, head_dim, vocab)
    build_s = time.perf_counter() - t0
    step = dev.upload(np.array([1, 0, 0, 0], np.uint32), uniform=True)
    busy(dev)
    per_layer = sum(m.nbytes for g in layer for m in g)
    nbytes = layers * per_layer + head[0].nbytes
    out = {"shape": dict(hidden=hidden, layers=layers, ffn=ffn, heads=heads, kv_heads=kv_heads,
                         vocab=vocab, dtype="q8_row"),
           "weight_gb_per_token": nbytes / 1e9, "build_s": build_s,
           "dispatches_per_token": 4 * layers + 1}
    for name, kw in _chosen(dev):
        settings, int8 = _variant(kw)
        with _Settings(**settings):
            ds = [op.dispatch(step, 1, int8) for op in ops]
            prog = ds[:4] * layers + ds[4:]
            dt = _time_pass(dev, prog, rounds=3)
        out[name] = {"gpu_ms_per_token": dt * 1e3, "tok_s_bound": 1 / dt,
                     "gb_s": nbytes / dt / 1e9, "pct_of_read_bw": 100 * nbytes / dt / 1e9 / read_gb_s}
    # the int8 products reading an input staged once by a pass of its own (QIN), with
    # and without those passes (QOUT), as the models' decode rows run them, at the
    # default rows a workgroup and 16-byte loads a lane issues at once (STAGED_SLOTS,
    # MATVEC_UNROLL) and at others
    from cortiq.gpu import kernels
    from cortiq.gpu.kernels import stage_words
    xq = dev.buffer(16 * stage_words(ffn))
    for slots, unroll in ((kernels.STAGED_SLOTS, kernels.MATVEC_UNROLL), (16, 4), (4, 4),
                          (8, 8), (16, 8), (8, 1)):
        tag = "" if (slots, unroll) == (kernels.STAGED_SLOTS, kernels.MATVEC_UNROLL) \
            else f"_rows{slots}_unroll{unroll}"
        if tag and f"int8_staged_once{tag}" in out:
            continue
        with _Settings(STAGED_SLOTS=slots, MATVEC_UNROLL=unroll):
            ds = [op.staged(step, xq, True) for op in ops]
        for name, prog in ((f"int8_staged_once{tag}", [x for d in ds for x in (d.pre, d)]),
                           (f"int8_staged_once{tag}_products_only", ds)):
            prog = prog[:len(prog) // 5 * 4] * layers + prog[len(prog) // 5 * 4:]
            dt = _time_pass(dev, prog, rounds=3)
            out[name] = {"gpu_ms_per_token": dt * 1e3, "tok_s_bound": 1 / dt, "gb_s": nbytes / dt / 1e9,
                         "pct_of_read_bw": 100 * nbytes / dt / 1e9 / read_gb_s}
    return out


def stream_ceiling(dev, prog, read_gb_s, per_wg=(256, 512, 1024, 2048, 4096), rounds=3,
                   reps=16):
    """What a decode token of this dependency structure costs at best on this device:
    the program `prog` with each product replaced by a pure read (readbw.wgsl) of as
    many bytes as its weights, in one dependent dispatch, and every other pass by a
    one-workgroup dispatch of no work, all in one pass, each dispatch binding the same
    output read-write as the one before (so each waits for it, as in the forward). The
    products' bytes are fresh buffers (a token reads more than the L2 holds). Timed at
    each count of 16-byte words a workgroup in `per_wg`, `reps` tokens in one pass (so
    that the submission's own cost is spread); the best is the ceiling. Also each
    product size on its own: its dispatches, `reps` times, in one pass."""
    from cortiq.gpu.kernels import FIXED, Dispatch, ParamArena, fixed_pipeline, resolve, u32s
    reps = copies(dev, reps)
    pipe = fixed_pipeline(dev, "readbw")
    out = dev.buffer(1 << 20, copy_src=True)
    tiny = dev.buffer(4096)
    live = [d for d in prog if 0 not in (d.dims(1) if callable(d.dims) else d.dims)]
    sizes = [sum(b.size for b in d.op.res[4:]) if d.name == "matvec" and d.op is not None
             else 0 for d in live]
    bufs = {i: dev.buffer(n // 16 * 16) for i, n in enumerate(sizes) if n}
    total = sum(sizes)

    def reads(items, w):
        """A readbw dispatch for each (bytes, buffer) of items, w words a workgroup (an
        empty one-workgroup dispatch where bytes is 0)."""
        arena = ParamArena(dev)
        params = [arena.ref(u32s(n // 16, w, 0, 0) if n else u32s(16, 16, 0, 0))
                  for n, _b in items]
        arena.upload()
        ds = []
        for (n, b), p in zip(items, params):
            g = -(-(n // 16) // w) if n else 1
            ds.append(Dispatch(pipe, dev.bind(FIXED["readbw"], resolve([p, b, out])),
                               (min(g, 65535), -(-g // 65535), 1), "readbw"))
        return ds

    res = {"dispatches": len(live), "products": len(bufs), "product_bytes": total,
           "per_wg": {}}
    items = [(n, bufs.get(i, tiny)) for i, n in enumerate(sizes)]
    for w in per_wg:
        busy(dev, 0.5)
        sec = _time_pass(dev, reads(items, w) * reps, rounds=rounds) / reps
        res["per_wg"][w] = {"ms_per_token": sec * 1e3,
                            "pct_of_read_bw": 100 * total / sec / 1e9 / read_gb_s}
    best_w = min(res["per_wg"], key=lambda w: res["per_wg"][w]["ms_per_token"])
    res.update(res["per_wg"][best_w], best_per_wg=best_w)
    res["us_per_product"] = {}
    for n in sorted(set(sizes) - {0}):
        ds = reads([(m, bufs[i]) for i, m in enumerate(sizes) if m == n], best_w)
        sec = _time_pass(dev, ds * reps, rounds=rounds) / reps / len(ds)
        res["us_per_product"][n] = {"count": len(ds), "us": sec * 1e6, "gb_s": n / sec / 1e9}
    return res
