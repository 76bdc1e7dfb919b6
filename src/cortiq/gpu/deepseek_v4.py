"""DeepSeek-V4 on the GPU: the forward of src/cortiq/models/deepseek_v4.py as WebGPU
compute (docs/models/deepseek-v4.md section 3 says what each step computes).

A token is ONE submission: the embedding, both hyper-connection blocks of every layer,
the head and (greedy) the argmax are recorded into one command buffer and one readback
returns the logits or only the token. Prompts run token by token through the same
program (one submission a token, the logits read back only where asked), as the CPU
forward does. Per layer:

    hc step    dsv4_hc (one workgroup): the previous block's expand, the mixes
               fn . flatten(x), Sinkhorn, fold, RMSNorm. A large fn: dsv4_hc_post (the
               expand over many workgroups, each leaving its channels' Gram matrix of
               the hc copies), a matvec for the mixes, then dsv4_hc_fold (each
               workgroup takes pre from the mixes and the summed Gram -- both sums of
               squares come from it -- and folds + normalises its 256 channels;
               workgroup 0 also runs Sinkhorn for the next expand's post/comb)
    attention  matvec over wq_a | wkv | the compressors' projections | the indexer's
               weights (one dispatch); dsv4_rope: q_norm on qr, kv_norm + RoPE on kv
               and kv into the window ring (one dispatch); matvec wq_b | indexer wq_b;
               dsv4_rope: the per-head norm + RoPE of q and the RoPE of the index queries;
               dsv4_compress per compressor; dsv4_index_score + dsv4_index_select (the
               indexer's top-k on the device); dsv4_attend (sparse attention with the
               sink, inverse RoPE); dsv4_gather over wo_a (one block a group); matvec
               wo_b
    moe        hc step; matvec router; dsv4_route (scores, top-k or the hash table,
               weights); dsv4_gather over the stacked gate|up of the shared and chosen
               experts (ids read from the router's output); dsv4_gather over the stacked
               down projections with the clamped SwiGLU and the routing weight in its
               input stage (the next hc step sums the expert rows into the expand)

Position-dependent work (which compressor pools, how many compressed entries
attention and the indexer see) is decided on the device from the step's position,
so a state's recorded program is reused for every token; only workgroup counts are
computed per token on the host.

Routed experts of a layer are uploaded as one stacked matrix per projection in their
stored dtype (dtypes without a row-stackable layout -- q8_2f's shared column scales,
vbit -- are stacked as f32); the shared expert is one more block of the same stack
(its own dtype allowed). It implements the model protocol (`cortiq.models.base`) as
the CPU model does: no rollback (the compressors fold tokens as they arrive).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, CortiqError
from ..models.base import Capabilities, check_feed
from .device import Device
from .model import GpuModel
from .kernels import (CHUNK, DTYPE_IDS, MAX_PARTS, NONE, RPW1_SLOTS, Dispatch, GpuMatrix,
                      MatvecOp, ParamArena, WeightUpload, _decoder, _matvec_source, _part_tables,
                      _row_bytes_ranges, embed_kinds, embed_pipeline, fixed_pipeline,
                      matvec_kinds, resolve, u32s)


def token_by_token(run, ids: np.ndarray, want: str, vocab: int):
    """Feed `ids` one token at a time through run(token, need) -> that token's logits
    row when `need`, and return what `want` asks for: None ("none"), the last row
    ("last"; None for no ids) or [len(ids), vocab] ("all")."""
    rows = []
    for i, t in enumerate(ids):
        need = want == "all" or (want == "last" and i == ids.size - 1)
        out = run(int(t), need)
        if need:
            rows.append(out)
    if want == "all":
        return np.stack(rows) if rows else np.zeros((0, vocab), np.float32)
    if want == "last":
        return rows[-1] if rows else None
    return None


#: binding kinds of the DeepSeek-V4 kernels (shaders/dsv4_*.wgsl)
KINDS = {
    "dsv4_hc": ("uniform", "rw", "read", "read", "read", "rw", "rw"),
    "dsv4_hc_post": ("uniform", "rw", "read", "read", "rw"),
    "dsv4_hc_fold": ("uniform", "read", "read", "read", "read", "rw", "rw"),
    "dsv4_rope": ("uniform", "uniform", "rw", "read", "read", "rw"),
    "dsv4_compress": ("uniform", "uniform", "read", "read", "read", "rw", "rw"),
    "dsv4_index_score": ("uniform", "read", "read", "read", "rw"),
    "dsv4_index_select": ("uniform", "uniform", "read", "rw"),
    "dsv4_attend": ("uniform", "uniform", "read", "read", "read", "read", "read", "rw"),
    "dsv4_route": ("uniform", "read", "read", "read", "rw"),
}
#: the largest hyper-connection `fn` (bytes) the dsv4_hc kernel multiplies itself, in
#: one workgroup together with the previous block's expand (one dispatch a step instead
#: of three); larger ones run as dsv4_hc_post, a matvec and dsv4_hc_fold, each over many
#: workgroups. One workgroup streams fn slowly: on an H200 the bench model's 393 KB fn
#: took 187 us a step fused, where the three-dispatch path's expand and fold take about
#: 33 us besides the matvec (docs/PERFORMANCE.md, GPU section)
HC_FUSE_BYTES = 64 << 10
#: positions the compressed caches hold before their first growth
CAP0 = 1024
#: dtypes whose payload stacks row-wise (every section of the layout is per row)
STACKABLE = tuple(d for d in DTYPE_IDS if d != "q8_2f")


# ---- stacked matrices ----------------------------------------------------------------
@dataclass
class _Stack:
    """Equally wide matrices as one payload of their dtype (rows one after another)."""
    dtype: str
    rows: int
    cols: int
    raw: np.ndarray
    name: str


def _sections(dtype: str, R: int, C: int) -> list | None:
    """The byte ranges of a whole matrix's payload that stack section by section, or
    None when the layout does not stack (q4_block groups that straddle the matrix's
    end)."""
    if dtype == "q4_block":     # groups run over the flat payload, 32 weights each
        n = R * C
        return None if n % 32 else [(0, n // 2), (n // 2, n // 2 + n // 16)]
    return _row_bytes_ranges(dtype, R, C, 0, R)


def stack(qts: list, name: str) -> _Stack:
    cols = qts[0].cols
    if any(q.cols != cols for q in qts):
        raise ConfigError(f"GPU: {name}: the stacked matrices differ in width")
    dtype = qts[0].dtype
    rows = sum(q.rows for q in qts)
    if dtype in STACKABLE and all(q.dtype == dtype and _sections(dtype, q.rows, cols)
                                  for q in qts):
        sections = None
        for q in qts:
            raw = np.asarray(q.raw, np.uint8)
            parts = [raw[a:b] for a, b in _sections(dtype, q.rows, cols) or ()]
            sections = [[p] for p in parts] if sections is None else \
                [s + [p] for s, p in zip(sections, parts)]
        assert sections is not None
        return _Stack(dtype, rows, cols, np.concatenate([np.concatenate(s) for s in sections]),
                      name)
    dense = np.concatenate([np.asarray(q.dequantize(), np.float32).reshape(q.rows, cols)
                            for q in qts])
    return _Stack("f32", rows, cols, dense.view(np.uint8).reshape(-1), name)


def _pipeline(dev: Device, name: str):
    code = dev.source(f"{name}.wgsl").replace("$HC_SPLIT", dev.source("dsv4_hc_split.wgsl"))
    return dev.pipeline((name,), code, KINDS[name])


def gather_pipeline(dev: Device, dtypes: tuple, cols: int, pro: int):
    """shaders/dsv4_gather.wgsl over parts of the given dtypes (the decoders and the
    part dispatch of the matvec shaders)."""
    chunked = all(cols % CHUNK[d] == 0 for d in dtypes)
    xs = cols + cols // 32 + 4
    xs = 1 << max(8, (xs - 1).bit_length())
    if (xs + 256) * 4 > dev.max_workgroup_storage:
        xs = 0
    key = ("dsv4_gather", dtypes, pro, xs, chunked)
    if key in dev._pipelines:
        return dev._pipelines[key]
    part = dev.source("dsv4_gather_part.wgsl")
    fns = []
    for i, dt in enumerate(dtypes):
        fns.append(_decoder(dev, i, dt))
        fns.append(_decoder(dev, i, dt, "qchunk.wgsl"))
        fns.append(part.replace("$I", str(i)))
    code = (_matvec_source(dev, "dsv4_gather.wgsl", len(dtypes), fns, "lane")
            .replace("$RPWu", f"{RPW1_SLOTS}u").replace("$TPRu", f"{256 // RPW1_SLOTS}u")
            .replace("$PROu", f"{pro}u").replace("$XSu", f"{xs}u")
            .replace("$XSN", str(max(xs, 4))).replace("$CHUNKED", "true" if chunked else "false"))
    return dev.pipeline(key, code, matvec_kinds(len(dtypes)))


class GatherOp:
    """Slots j < slots: Y[y_off + j * y_stride + r] = W[id_j * rpe + r] . xin_j over the
    parts of `mats` (stacked blocks of rpe rows); ids from V[v_a + j] (NONE: id_j = j)."""

    def __init__(self, dev: Device, mats: list, arena: ParamArena, *, rpe: int, slots: int,
                 x, x_off: int, x_stride: int, y, y_off: int, y_stride: int, vbuf,
                 v_a: int = NONE, pro: int = 0, x2_off: int = 0, limit: float = 0.0):
        parts = [(m, buf, rows) for m in mats for (buf, _r0, rows) in m.parts]
        if len(parts) > min(MAX_PARTS, dev.max_storage_buffers - 4):
            raise ConfigError(f"GPU: {mats[0].name}: {len(parts)} pieces exceed one dispatch's "
                              "storage bindings")
        self.dtypes = tuple(m.dtype for m, _b, _r in parts)
        self.cols, self.rpe, self.slots, self.pro = mats[0].cols, rpe, slots, pro
        self.param = arena.ref(u32s(self.cols, x_off, x_stride, x2_off, slots, y_off, y_stride,
                                    v_a, rpe, NONE, 0, 0, sum(r for _m, _b, r in parts),
                                    float(limit), 0, 0)
                               + _part_tables([r for _m, _b, r in parts]))
        self.res = [x, x, vbuf, y] + [b for _m, b, _r in parts]
        self.dev = dev

    def dispatch(self, step_buf) -> Dispatch:
        dev = self.dev
        group = dev.bind(matvec_kinds(len(self.dtypes)), resolve([self.param, step_buf] + self.res))
        pipe = gather_pipeline(dev, self.dtypes, self.cols, self.pro)
        return Dispatch(pipe, group, ((self.rpe + RPW1_SLOTS - 1) // RPW1_SLOTS, self.slots, 1),
                        "gather")


def run_once(dev: Device, name: str, params: bytes, arrays: list, dims, pos: int = 0) -> list:
    """Run one dsv4_* kernel on its own (checks and tools): `arrays` are the bindings
    after the parameter block (and the step block, where the kernel has one), as float32
    or uint32 arrays; returns every read-write binding's contents as float32."""
    kinds = KINDS[name]
    bufs = [dev.upload(np.ascontiguousarray(a).view(np.uint8).reshape(-1), pad=64)
            for a in arrays]
    arena = ParamArena(dev)
    ref = arena.ref(params)
    arena.upload()
    res = [ref]
    if kinds[1] == "uniform":
        res.append(dev.upload(np.array([1, pos, 0, 0], np.uint32), uniform=True))
    res += bufs
    group = dev.bind(kinds, resolve(res))
    enc = dev.dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(_pipeline(dev, name))
    cp.set_bind_group(0, group)
    cp.dispatch_workgroups(*dims)
    cp.end()
    outs = []
    for kind, b, a in zip(kinds[len(res) - len(bufs):], bufs, arrays):
        if kind == "rw":
            stage = dev.staging(a.nbytes)
            enc.copy_buffer_to_buffer(b, 0, stage, 0, (a.nbytes + 3) // 4 * 4)
            outs.append(stage)
    dev.queue.submit([enc.finish()])
    return [dev.read(s, s.size).view(np.float32) for s in outs]


# ---- the model -----------------------------------------------------------------------
class GpuDsv4State:
    """One sequence on the device: position, the window ring + compressed cache of every
    layer, the compressors' pending windows, the indexer's cache, the recorded programs."""

    def __init__(self):
        self.pos = 0
        self.cap = CAP0           # positions the compressed caches hold
        self.layers: list = []    # per layer: dict of buffers
        self.programs: dict = {}


class GpuDeepSeekV4Model(GpuModel):
    """The host DeepseekV4Model's forward on the GPU (see the module docstring), one
    token of one sequence a submission."""

    arch = "deepseek_v4"

    def __init__(self, host, device: Device | None = None):
        cfg = self.cfg = host.cfg
        self.host = host
        self.dev = dev = device or Device.get()
        self.vocab = cfg.vocab
        self.file = host.file
        self.max_seq_len = host.capabilities.max_seq_len
        self.capabilities = Capabilities(rollback=False, batch_unit=1, greedy_chain=True,
                                         tasks=host.capabilities.tasks,
                                         max_seq_len=self.max_seq_len)
        self.options = host.options
        D, hc = cfg.dim, cfg.hc_mult
        hd, rd = cfg.head_dim, cfg.rope_head_dim
        if hd > 1024:
            raise ConfigError(f"device='gpu': deepseek_v4 head_dim {hd}: the attention "
                              "kernel takes up to 1024")
        if hc > 8:
            raise ConfigError(f"device='gpu': deepseek_v4 hc_mult {hc}: the hyper-connection "
                              "kernels take up to 8 copies")
        if cfg.n_routed_experts > 1024 or cfg.top_k + 1 > 64:
            raise ConfigError("device='gpu': deepseek_v4 routing takes up to 1024 experts and "
                              "top_k up to 63")
        t0 = time.perf_counter()
        upload = WeightUpload(dev)
        self.mats: list[GpuMatrix] = upload.mats
        vec, mat = upload.vec, upload.mat

        def dense(a, name) -> GpuMatrix:
            a = np.ascontiguousarray(a, np.float32)
            return mat(_Stack("f32", a.shape[0], a.shape[1], a.view(np.uint8).reshape(-1), name))

        for li, L in enumerate(host.layers):
            if L.indexer is not None and (L.comp is None or L.indexer.comp.ratio != L.comp.ratio):
                raise ConfigError(f"device='gpu': deepseek_v4 layer {li}: an indexer whose "
                                  "compression ratio differs from the layer's compressor")
        ratios = sorted({L.comp.ratio for L in host.layers if L.comp is not None})
        self.rope_at = {r: 2 * rd + i * rd for i, r in enumerate(ratios)}  # window-start tables
        self.rope_len = 2 * rd + len(ratios) * rd
        inter = cfg.moe_inter
        k1 = cfg.top_k + 1
        self.lw: list[dict] = []
        prj_w, qb_w = 0, 0
        for li, L in enumerate(host.layers):
            w: dict = {"L": L}
            for which, (fn, sc, base), norm in (("attn", L.hc_attn, L.attn_norm),
                                                ("ffn", L.hc_ffn, L.ffn_norm)):
                w[f"hc_{which}"] = (dense(fn, f"layers.{li}.hc_{which}_fn"), vec(sc), vec(base),
                                    vec(norm))
            first = [mat(q) for q in L.first]
            w["first"] = first
            w["first_off"] = np.cumsum([0] + [m.rows for m in first]).tolist()
            prj_w = max(prj_w, w["first_off"][-1])
            w["q_norm"], w["kv_norm"], w["sink"] = vec(L.q_norm), vec(L.kv_norm), vec(L.sink)
            qmats = [mat(L.wq_b)] + ([mat(L.indexer.wq_b)] if L.indexer else [])
            w["qb"] = qmats
            qb_w = max(qb_w, sum(m.rows for m in qmats))
            w["wo_a"], w["wo_b"] = mat(L.wo_a), mat(L.wo_b)
            for key, cp in (("comp", L.comp), ("ixc", L.indexer.comp if L.indexer else None)):
                if cp is not None:
                    w[key] = dict(cp=cp, ape=vec(cp.ape), norm=vec(cp.norm))
            if L.shared.w1.rows != inter or L.shared.w2.rows != D:
                raise ConfigError(f"device='gpu': deepseek_v4 layer {li}: the shared expert's "
                                  f"width {L.shared.w1.rows} differs from moe_intermediate_size "
                                  f"{inter} (the GPU stacks it with the routed experts)")
            w["router"] = mat(L.gate)
            w["gu"] = [mat(stack([m for e in L.experts for m in (e.w1, e.w3)],
                                 f"layers.{li}.experts.gate_up")),
                       mat(stack([L.shared.w1, L.shared.w3], f"layers.{li}.shared.gate_up"))]
            w["down"] = [mat(stack([e.w2 for e in L.experts], f"layers.{li}.experts.down")),
                         mat(stack([L.shared.w2], f"layers.{li}.shared.down"))]
            w["bias"] = vec(L.bias) if L.bias is not None else NONE
            w["mask"] = vec(np.asarray(L.mask, np.float32)) if L.mask is not None else NONE
            w["hash"] = vec(L.tid2eid.astype(np.float32)) if L.tid2eid is not None else NONE
            self.lw.append(w)
        self.embed = mat(host.embed)
        self.head = mat(host.head)
        self.hc_head = (dense(host.hc_head_fn, "hc_head_fn"),
                        vec(np.array([host.hc_head_scale, 0, 0], np.float32)),
                        vec(host.hc_head_base), vec(host.norm))
        self.vbuf = upload.vector_buffer()
        self.weight_bytes = sum(m.nbytes for m in self.mats)
        # ---- activations (one token)
        f4 = 4
        self.mix_w = (2 + hc) * hc
        self.x = dev.buffer(hc * D * f4)
        self.xin = dev.buffer(D * f4, copy_src=True)
        self.mix = dev.buffer(self.mix_w * f4)
        self.pc = dev.buffer((hc + hc * hc) * f4)
        self.gram = dev.buffer((D + 255) // 256 * 64 * f4)   # dsv4_hc_post's partials
        self.prj = dev.buffer(prj_w * f4)
        self.qb = dev.buffer(qb_w * f4)
        self.att = dev.buffer(cfg.n_heads * hd * f4)
        self.mid = dev.buffer(cfg.o_groups * cfg.o_lora_rank * f4)
        self.ao = dev.buffer(D * f4)
        self.rl = dev.buffer(cfg.n_routed_experts * f4)
        self.moe = dev.buffer(2 * k1 * f4)
        self.gu = dev.buffer(k1 * 2 * inter * f4)
        self.dn = dev.buffer(k1 * D * f4)
        self.logits = dev.buffer(self.vocab * f4, copy_src=True)
        self.ids = dev.buffer(16)
        self.res = dev.buffer(16, copy_src=True)
        self.step = dev.buffer(16, uniform=True)
        self.rope = dev.buffer(self.rope_len * f4)
        self.stage_logits = dev.staging(max(self.vocab, D) * f4)
        self.stage_ids = [dev.staging(16), dev.staging(16)]
        self._build_ops()
        self._lock = threading.Lock()   # one token on the shared activations at a time
        self.load_seconds = time.perf_counter() - t0
        self._decode_program: list | None = None

    # ---- parameters and products (state-independent) -----------------------------
    def _matvecs(self, mats, *, x, x_off, x_cols, y, y_off) -> list:
        """Products of matrices sharing one input, as few dispatches as the binding
        limit allows; outputs one after another from y_off."""
        ops: list = []
        group: list = []
        n = 0
        limit = min(MAX_PARTS, self.dev.max_storage_buffers - 4)

        def flush():
            nonlocal y_off
            if group:
                total = sum(m.rows for m in group)
                ops.append(MatvecOp(self.dev, list(group), self.arena, x=x, x_off=x_off,
                                    x_stride=x_cols, y=y, y_off=y_off, y_stride=total,
                                    vbuf=self.vbuf))
                y_off += total
                group.clear()
        for m in mats:
            if group and n + len(m.parts) > limit:
                flush()
                n = 0
            group.append(m)
            n += len(m.parts)
        flush()
        return ops

    def _build_ops(self):
        cfg, dev = self.cfg, self.dev
        a = self.arena = ParamArena(dev)
        D, hc, hd, rd = cfg.dim, cfg.hc_mult, cfg.head_dim, cfg.rope_head_dim
        eps, inter, k1 = float(cfg.norm_eps), cfg.moe_inter, cfg.top_k + 1

        fn0 = self.lw[0]["hc_attn"][0] if self.lw else self.hc_head[0]
        self.fuse_hc = fn0.nbytes <= HC_FUSE_BYTES and len(fn0.parts) == 1

        def hc_ops(h, post_rows=0, head=False):
            """(matvecs before the step, the step's parameters, fn's buffer). Fused
            (dsv4_hc), the step takes the previous block's expand (post_rows rows of
            output; 0 and the first layer: the embedding broadcast instead) and
            multiplies fn itself; otherwise (dsv4_hc_fold) a matvec computes the mixes
            and dsv4_hc_post has expanded before it."""
            fn, v_sc, v_base, v_w = h
            iters, hc_eps = cfg.hc_sinkhorn_iters, float(cfg.hc_eps)
            if not self.fuse_hc:
                mv = self._matvecs([fn], x=self.x, x_off=0, x_cols=hc * D, y=self.mix, y_off=0)
                step = a.ref(u32s(D, hc, int(head), iters, 0, 0, v_sc, v_base, v_w, 0,
                                  (D + 255) // 256, 0, eps, hc_eps, 0, 0))
                return mv, step, fn.parts[0][0]
            step = a.ref(u32s(D, hc, int(head), iters, 0, 0, v_sc, v_base, v_w, 0, 0,
                              post_rows, eps, hc_eps, 0, int(post_rows == 0 and not head)))
            return [], step, fn.parts[0][0]

        def post(rows, bcast=0):
            return a.ref(u32s(D, hc, rows, 0, 0, 0, bcast, 0))

        self.p_bcast = post(0, 1)

        for w in self.lw:
            L = w["L"]
            comp_layer = L.comp is not None
            w["hc_attn_ops"] = hc_ops(w["hc_attn"], 0 if w is self.lw[0] else k1)
            w["hc_ffn_ops"] = hc_ops(w["hc_ffn"], 1)
            w["first_ops"] = self._matvecs(w["first"], x=self.xin, x_off=0, x_cols=D, y=self.prj,
                                           y_off=0)
            off = dict(zip(L.first_names, w["first_off"]))
            w["off"] = off
            rope_pos = rd if comp_layer else 0          # this position's cos/sin rows
            ql = cfg.q_lora_rank
            # dsv4_rope jobs: q_norm on qr, then kv_norm + RoPE on kv into the ring
            w["p_qrkv"] = a.ref(u32s(ql, 1, off["qr"], w["q_norm"], 1, 0, 0, 0, NONE, 1, eps, 0)
                                + u32s(hd, 1, off["kv"], w["kv_norm"], 1, rd, rope_pos, 0, 0,
                                       cfg.window, eps, 0) + u32s(1, 0, 0, 0))
            w["qb_ops"] = self._matvecs(w["qb"], x=self.prj, x_off=off["qr"], x_cols=ql,
                                        y=self.qb, y_off=0)
            # ... and the per-head norm + RoPE of q, then the RoPE of the index queries
            q_job = u32s(hd, cfg.n_heads, 0, NONE, 1, rd, rope_pos, 0, NONE, 1, eps, 0)
            qi_off = cfg.n_heads * hd
            w["q_groups"] = cfg.n_heads
            qi_job = q_job
            if L.indexer is not None:
                ix = L.indexer
                qi_job = u32s(ix.head_dim, ix.n_heads, qi_off, NONE, 0, rd, rope_pos, 0, NONE, 1,
                              eps, 0)
                w["q_groups"] += ix.n_heads
                w["p_score"] = a.ref(u32s(ix.n_heads, ix.head_dim, qi_off, off["ix_weights"], 0,
                                          float(ix.head_dim ** -0.5 * ix.n_heads ** -0.5), 0, 0))
                w["p_select"] = a.ref(u32s(ix.comp.ratio, cfg.index_topk, 0, 0))
            w["p_q"] = a.ref(q_job + qi_job + u32s(cfg.n_heads, 0, 0, 0))
            for key, kv, g, row0 in (("comp", "comp_kv", "comp_gate", cfg.window),
                                     ("ixc", "ix_kv", "ix_gate", 0)):
                if key in w:
                    c = w[key]
                    cp = c["cp"]
                    c["param"] = a.ref(u32s(cp.width, cp.entry, cp.ratio, int(cp.overlap),
                                            off[kv], off[g], c["ape"], c["norm"], rd,
                                            self.rope_at[cp.ratio], 0, row0, eps, 0, 0, 0))
            w["p_att"] = a.ref(u32s(cfg.n_heads, hd, cfg.window,
                                    L.comp.ratio if comp_layer else 0, int(L.indexer is not None),
                                    0, 0, w["sink"], rd, rope_pos, float(hd ** -0.5), 0))
            w["wo_a_op"] = GatherOp(dev, [w["wo_a"]], a, rpe=cfg.o_lora_rank, slots=cfg.o_groups,
                                    x=self.att, x_off=0, x_stride=w["wo_a"].cols, y=self.mid,
                                    y_off=0, y_stride=cfg.o_lora_rank, vbuf=self.vbuf)
            w["wo_b_ops"] = self._matvecs([w["wo_b"]], x=self.mid, x_off=0,
                                          x_cols=w["wo_b"].cols, y=self.ao, y_off=0)
            w["p_post_attn"] = post(1)
            w["router_ops"] = self._matvecs([w["router"]], x=self.xin, x_off=0, x_cols=D,
                                            y=self.rl, y_off=0)
            hash_rows = L.tid2eid.shape[0] if L.tid2eid is not None else 0
            w["p_route"] = a.ref(u32s(cfg.n_routed_experts, cfg.top_k, 0, w["bias"], w["mask"],
                                      w["hash"], hash_rows, 0, float(cfg.route_scale), 0, 0, 0))
            w["gu_op"] = GatherOp(dev, w["gu"], a, rpe=2 * inter, slots=k1, x=self.xin, x_off=0,
                                  x_stride=0, y=self.gu, y_off=0, y_stride=2 * inter, vbuf=self.moe,
                                  v_a=0)
            w["down_op"] = GatherOp(dev, w["down"], a, rpe=D, slots=k1, x=self.gu, x_off=0,
                                    x_stride=2 * inter, y=self.dn, y_off=0, y_stride=D,
                                    vbuf=self.moe, v_a=0, pro=3, x2_off=inter,
                                    limit=float(cfg.swiglu_limit))
            w["p_post_ffn"] = post(k1)
        self.head_hc_ops = hc_ops(self.hc_head, k1 if self.lw else 0, head=True)
        self.head_ops = self._matvecs([self.head], x=self.xin, x_off=0, x_cols=D, y=self.logits,
                                      y_off=0)
        tables = _part_tables([r for _b, _r0, r in self.embed.parts])
        self.p_embed = a.ref(u32s(D, 0, len(self.embed.parts), 0) + tables)
        self.p_argmax = a.ref(u32s(self.vocab, 0, 0, 0))
        a.upload()
        self._static = {}

    # ---- sequences ----------------------------------------------------------------
    def new_state(self) -> GpuDsv4State:
        st = GpuDsv4State()
        self._alloc(st, st.cap)
        return st

    def _alloc(self, st: GpuDsv4State, cap: int, old: list | None = None) -> None:
        """The state's buffers for `cap` positions (copying what `old` held)."""
        dev, cfg = self.dev, self.cfg
        f4 = 4
        enc = dev.dev.create_command_encoder() if old else None
        layers = []
        for li, w in enumerate(self.lw):
            L = w["L"]
            s: dict = {}
            n_c = cap // L.comp.ratio + 1 if L.comp is not None else 0
            s["cache"] = dev.buffer((cfg.window + n_c) * cfg.head_dim * f4, copy_src=True)
            for key in ("comp", "ixc"):
                if key in w:
                    cp = w[key]["cp"]
                    s[key] = dev.buffer(2 * 2 * cp.ratio * cp.width * f4, copy_src=True)
            if L.indexer is not None:
                ix = L.indexer
                n_i = cap // ix.comp.ratio + 1
                s["ix"] = dev.buffer(n_i * ix.head_dim * f4, copy_src=True)
                s["score"] = dev.buffer(n_i * f4)
                s["sel"] = dev.buffer(n_i * f4)
            if old is not None and enc is not None:
                for key in ("cache", "comp", "ixc", "ix"):
                    if key in s:
                        enc.copy_buffer_to_buffer(old[li][key], 0, s[key], 0, old[li][key].size)
            layers.append(s)
        if enc is not None:
            dev.queue.submit([enc.finish()])
        st.layers = layers
        st.cap = cap
        st.programs.clear()

    def _grow(self, st: GpuDsv4State, need: int) -> None:
        if need <= st.cap:
            return
        self._alloc(st, self._grown_cap(st.cap, need), st.layers)

    def can_rollback(self, st: GpuDsv4State, n: int) -> bool:
        return n >= st.pos

    def rollback(self, st: GpuDsv4State, n: int) -> None:
        if n >= st.pos:
            return
        raise CortiqError("deepseek_v4: rollback is not supported (the compressor and "
                          "indexer caches fold tokens as they arrive); start a new session")

    def kv_bytes(self, st: GpuDsv4State) -> int:
        cfg = self.cfg
        total = 0
        for w in self.lw:
            L = w["L"]
            rows = min(st.pos, cfg.window)
            if L.comp is not None:
                rows += st.pos // L.comp.ratio
            total += rows * cfg.head_dim * 4
            if L.indexer is not None:
                total += st.pos // L.indexer.comp.ratio * L.indexer.head_dim * 4
        return total

    # ---- the forward ----------------------------------------------------------------
    def _check(self, ids, want):
        return check_feed(ids, want, self.vocab)

    def forward(self, st: GpuDsv4State, ids, want: str = "last", prompt: bool | None = None):
        """Run tokens `ids` from position st.pos, one submission a token. want: "none"
        -> None, "last" -> [vocab], "all" -> [len(ids), vocab] (float32). `prompt`:
        the protocol's flag; a prompt row and a generated token run the same program."""
        ids = self._check(ids, want)
        return token_by_token(lambda t, need: self._token(st, t, "last" if need else "none"),
                              ids, want, self.vocab)

    def forward_greedy(self, st: GpuDsv4State, ids) -> int:
        """Run `ids` and return the argmax of the last logits, computed on the device
        (one 4-byte readback)."""
        ids = self._check(ids, "last")
        if ids.size == 0:
            raise CortiqError("forward_greedy: no tokens")
        for t in ids[:-1]:
            self._token(st, int(t), "none")
        return self._token(st, int(ids[-1]), "greedy")

    def _greedy_pass(self, st: GpuDsv4State):
        self._grow(st, st.pos + 1)
        self._write_step(st.pos)
        enc = self._record(st, "greedy")
        st.pos += 1
        return enc

    def final_hidden(self, st: GpuDsv4State, ids) -> np.ndarray:
        """The folded final-norm hidden states [len(ids), dim] the head reads
        (`cortiq.runtime.embeddings` pools them)."""
        ids = self._check(ids, "all")
        return np.stack([self._token(st, int(t), "hidden") for t in ids]) if ids.size else \
            np.zeros((0, self.cfg.dim), np.float32)

    def _token(self, st, tok: int, want: str):
        dev = self.dev
        stage = self.stage_logits if want in ("last", "hidden") else self.stage_ids[0]
        with self._lock:
            dev.queue.write_buffer(self.ids, 0, np.array([tok], np.uint32))
            done = self._submit(st, want, stage)
            if want == "greedy":
                return self._greedy_token(stage, st.pos - 1, done)
            if want in ("last", "hidden"):
                n = self.vocab if want == "last" else self.cfg.dim
                return dev.read(stage, n * 4, after=done).view(np.float32)
        return None

    def _submit(self, st, want, stage) -> int | None:
        """Record and submit one token at st.pos (its id already in the ids buffer); the
        submission's index (`Device.submit`)."""
        dev = self.dev
        pos = st.pos
        self._grow(st, pos + 1)
        self._write_step(pos)
        copy = {"last": (self.logits, stage, self.vocab * 4),
                "hidden": (self.xin, stage, self.cfg.dim * 4),
                "greedy": (self.res, stage, 16)}.get(want)
        done = dev.run(self._program(st, want), pos, copy)
        st.pos += 1
        return done

    def _record(self, st, want: str):
        """A command encoder holding the token's dispatches at st.pos (workgroup counts
        of the position-dependent kernels evaluated here; empty ones left out)."""
        return self.dev.record(self._program(st, want), st.pos)

    def _write_step(self, pos: int) -> None:
        host = self.host
        q = self.dev.queue
        q.write_buffer(self.step, 0, np.array([1, pos, 0, 0], np.uint32))
        rows = [*host.rope_window.at(pos), *host.rope_compress.at(pos)]
        for r in self.rope_at:
            rows += host.rope_compress.at(max(pos + 1 - r, 0))
        q.write_buffer(self.rope, 0, np.concatenate(rows).astype(np.float32))

    # ---- programs -------------------------------------------------------------------
    def _program(self, st, want: str) -> list:
        prog = st.programs.get(want)
        if prog is None:
            prog = st.programs[want] = self._build_program(st, want)
            if want in ("last", "greedy"):
                self._decode_program = prog
        return prog

    def _mv(self, op) -> Dispatch:
        d = self._static.get(id(op))
        if d is None:
            d = op.dispatch(self.step) if isinstance(op, GatherOp) else op.dispatch(self.step, 1)
            if callable(d.dims):
                d = Dispatch(d.pipeline, d.group, d.dims(1), d.name)
            self._static[id(op)] = d
        return d

    def _k(self, name, params, res, dims) -> Dispatch:
        dev = self.dev
        return Dispatch(_pipeline(dev, name), dev.bind(KINDS[name], resolve([params] + res)),
                        dims, name)

    def _build_program(self, st, want: str) -> list:
        cfg, dev = self.cfg, self.dev
        D = cfg.dim
        prog: list = []
        e = self.embed
        prog.append(Dispatch(embed_pipeline(dev, e.dtype, len(e.parts)), dev.bind(
            embed_kinds(len(e.parts)), resolve([self.p_embed, self.step, self.ids, self.x]
                                               + [b for b, _r0, _r in e.parts])),
            (1, 1, 1), "embed"))
        groups = ((D + 255) // 256, 1, 1)

        def hc_pre(ops, y):
            """A hyper-connection step; fused, it also expands the block that wrote y."""
            mv, step, fn = ops
            if self.fuse_hc:
                prog.append(self._k("dsv4_hc", step, [self.x, fn, y, self.vbuf, self.xin,
                                                      self.pc], (1, 1, 1)))
                return
            prog.extend(self._mv(o) for o in mv)
            prog.append(self._k("dsv4_hc_fold", step, [self.x, self.mix, self.gram, self.vbuf,
                                                       self.xin, self.pc], groups))

        def hc_post(p, y):
            if not self.fuse_hc:
                prog.append(self._k("dsv4_hc_post", p, [self.x, y, self.pc, self.gram],
                                    groups))

        hc_post(self.p_bcast, self.dn)      # the embedding into the hc copies

        for w, s in zip(self.lw, st.layers):
            L = w["L"]
            cache = s["cache"]
            hc_pre(w["hc_attn_ops"], self.dn)
            prog.extend(self._mv(o) for o in w["first_ops"])
            prog.append(self._k("dsv4_rope", w["p_qrkv"], [self.step, self.prj, self.vbuf,
                                                           self.rope, cache], (2, 1, 1)))
            prog.extend(self._mv(o) for o in w["qb_ops"])
            prog.append(self._k("dsv4_rope", w["p_q"], [self.step, self.qb, self.vbuf,
                                                        self.rope, self.qb],
                                (w["q_groups"], 1, 1)))
            if "comp" in w:
                prog.append(self._k("dsv4_compress", w["comp"]["param"],
                                    [self.step, self.prj, self.vbuf, self.rope, s["comp"],
                                     cache], (1, 1, 1)))
            sel = cache      # bound but unread when the layer has no indexer
            if L.indexer is not None:
                ix = L.indexer
                r = ix.comp.ratio
                prog.append(self._k("dsv4_compress", w["ixc"]["param"],
                                    [self.step, self.prj, self.vbuf, self.rope, s["ixc"],
                                     s["ix"]], (1, 1, 1)))
                prog.append(self._k("dsv4_index_score", w["p_score"],
                                    [self.qb, self.prj, s["ix"], s["score"]],
                                    lambda pos, r=r: ((pos + 1) // r, 1, 1)))
                prog.append(self._k("dsv4_index_select", w["p_select"],
                                    [self.step, s["score"], s["sel"]],
                                    lambda pos, r=r: (((pos + 1) // r + 255) // 256, 1, 1)))
                sel = s["sel"]
            prog.append(self._k("dsv4_attend", w["p_att"],
                                [self.step, self.qb, cache, self.vbuf, sel, self.rope, self.att],
                                (cfg.n_heads, 1, 1)))
            prog.append(self._mv(w["wo_a_op"]))
            prog.extend(self._mv(o) for o in w["wo_b_ops"])
            hc_post(w["p_post_attn"], self.ao)
            hc_pre(w["hc_ffn_ops"], self.ao)
            prog.extend(self._mv(o) for o in w["router_ops"])
            prog.append(self._k("dsv4_route", w["p_route"], [self.rl, self.vbuf, self.ids,
                                                             self.moe], (1, 1, 1)))
            prog.append(self._mv(w["gu_op"]))
            prog.append(self._mv(w["down_op"]))
            hc_post(w["p_post_ffn"], self.dn)
        if want in ("last", "greedy", "hidden"):
            hc_pre(self.head_hc_ops, self.dn)
        if want in ("last", "greedy"):
            prog.extend(self._mv(o) for o in self.head_ops)
        if want == "greedy":
            prog.append(Dispatch(fixed_pipeline(dev, "argmax"), dev.bind(
                ("uniform", "read", "rw", "rw"),
                resolve([self.p_argmax, self.logits, self.ids, self.res])), (1, 1, 1), "argmax"))
        return prog
