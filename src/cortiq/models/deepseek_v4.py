"""DeepSeek-V4 on the CPU (port of the reference engine's ``dsv4.rs`` CPU path).

The hidden state is ``hc_mult`` copies of a ``dim`` vector. Every layer runs two
hyper-connection blocks (fold -> RMSNorm -> block -> expand; csrc/mix): attention
(q LoRA pair with both norms, interleaved RoPE on the tail, one-head-wide kv that is
both key and value, a sliding window kept as a ring, a KV compressor on compress
layers -- overlapping when its projection is two entries wide -- and on ratio-4
layers a Lightning indexer with its own compressor and top-k; sparse attention with a
per-head sink, the inverse RoPE on the output, and the grouped low-rank output
projection read straight from the stored ``wo_a`` rows) and the MoE (sqrt-softplus
scores, a selection-only bias, hash layers through ``tid2eid``, optional task masks,
the shared expert, the asymmetric ``swiglu_limit`` clamp). Only the chosen experts'
pages are touched: each is a separate ``QTensor`` over the mapped file.

The one forward is ``forward_batch`` (one sequence is a batch of one; ``forward``
comes from ``ModelBase``): a step takes the next token of every sequence that has one
through every layer, each dense matrix read once for the step's rows
(``batch_products``), each chosen expert once for the rows routed to it, the caches,
compressors, indexer and attention per row. Prompts run token by token through the
same products as generated tokens (the ``prompt`` flag changes nothing), so a row gets
the same arithmetic however its feed is cut or batched, and precision "auto" leaves q8
prompt rows exact here. No rollback: ``can_rollback`` is always False and
``rollback`` raises ``CortiqError``, since the compressor and indexer caches are
folded as tokens arrive and cannot be un-folded; start a new session instead.

Options (``cortiq.LLM(path, task="name")``): ``task`` selects an expert mask from the
file's masks section by name (``True`` = the section's ``default_task``; ``None`` or
``False`` = no mask); ``DeepseekV4Model(cmf_file, task=...)`` also takes a bool array
``[num_layers, num_experts]`` or a ``{layer: [bool]*E}`` dict. Masks restrict selection
on non-hash layers only and the weights renormalise over the survivors.

Header: the generic ``arch`` keys of docs/cmf-format.md §4.3, plus an optional
``arch.deepseek_v4`` object written by cortiq's converter with the constants upstream
pins (``hc_sinkhorn_iters``, ``hc_eps``, ``swiglu_limit``, ``index_topk``,
``rope_theta``, ``compress_rope_theta``, ``yarn`` {factor, original_max_position_embeddings,
beta_fast, beta_slow} or null). Absent keys take the release values.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernels import _kernels as K
from ..errors import ConfigError, CortiqError, FormatError
from ..kernels.tensor import QTensor, batch_products
from .base import Capabilities, ModelBase, check_feed
from .batch_rows import per_sequence
from .rope import RopeTable, inv_freq, yarn_inv_freq

ARCH_NAME = "deepseek_v4"

RELEASE: dict[str, Any] = {
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0, "index_topk": 512,
    "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "yarn": {"factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32.0,
             "beta_slow": 1.0},
}


def sqrt_softplus(x: np.ndarray) -> np.ndarray:
    # float32 throughout; exp sees at most 20, so nothing overflows (no errstate needed)
    x = np.asarray(x, np.float32)
    sp = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    return np.sqrt(sp)


def route(logits, bias=None, top_k=1, route_scale=1.0, forced=None, mask=None):
    """The reference engine's ``route``: (indices int64, weights float32). Scores are
    sqrt(softplus(logits)); ``bias`` shifts selection only; ``forced`` (the hash
    layers' table row) fixes the experts; ``mask`` (bool per expert) removes experts
    from selection; weights are the unbiased scores of the chosen, renormalised and
    scaled by ``route_scale``."""
    scores = sqrt_softplus(logits)
    if forced is not None:
        idx = np.asarray(forced, np.int64)
    else:
        shifted = scores + np.asarray(bias, np.float32) if bias is not None else scores.copy()
        if mask is not None:
            shifted = np.where(np.asarray(mask, bool), shifted, np.float32(-np.inf)).astype(np.float32)
        idx = K.topk(np.ascontiguousarray(shifted, np.float32), min(top_k, shifted.size))
    w = scores[idx]
    s = w.sum(dtype=np.float32)
    if s > 0:
        w = (w / s * np.float32(route_scale)).astype(np.float32)
    return idx, w


def hash_route(tid2eid: np.ndarray, tid: int) -> np.ndarray:
    """Row ``tid`` of the ``[vocab, top_k]`` table (ids past the end clamp to the last)."""
    row = min(max(int(tid), 0), tid2eid.shape[0] - 1)
    return tid2eid[row].astype(np.int64)


def compress_overlap(prev_kv, prev_score, cur_kv, cur_score, ratio: int, d: int):
    """The overlapping compressor's fold: 2*ratio slots of width d -- the previous
    window's first halves (or -inf votes when there is none) then the current
    window's second halves; per-dimension softmax pooling."""
    kv = np.zeros((2 * ratio, d), np.float32)
    sc = np.full((2 * ratio, d), -np.inf, np.float32)
    if prev_kv is not None:
        kv[:ratio] = prev_kv[:, :d]
        sc[:ratio] = prev_score[:, :d]
    kv[ratio:] = cur_kv[:, d:]
    sc[ratio:] = cur_score[:, d:]
    return K.pool_by_score(kv, sc)


def index_scores(q_heads, kv, head_weights, causal_limit: int) -> np.ndarray:
    """Per compressed entry t: sum_h relu(q_h . k_t) * w_h; entries >= causal_limit
    get -inf. q_heads [H, d], kv [n, d], head_weights [H]."""
    n = kv.shape[0]
    if n == 0:
        return np.zeros(0, np.float32)
    dots = np.maximum(kv @ q_heads.T, np.float32(0))          # [n, H]
    s = (dots @ head_weights).astype(np.float32)
    s[causal_limit:] = -np.inf
    return s


def top_k_positions(scores: np.ndarray, k: int) -> np.ndarray:
    """Top-k finite entries, ties to the lower index, returned sorted by position."""
    if scores.size == 0 or k == 0:
        return np.zeros(0, np.int64)
    idx = K.topk(np.ascontiguousarray(scores, np.float32), min(k, scores.size))
    return np.sort(idx)


# ------------------------------------------------------------------ config

@dataclass
class Dsv4Config:
    dim: int
    n_layers: int
    n_heads: int
    head_dim: int
    rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    norm_eps: float
    n_routed_experts: int
    top_k: int
    moe_inter: int
    route_scale: float
    swiglu_limit: float
    window: int
    index_topk: int
    vocab: int
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    yarn: dict | None = field(default_factory=lambda: dict(RELEASE["yarn"]))


def _need(arch, key):
    v = arch.get(key)
    if v is None:
        raise ConfigError(f"arch.{key}: missing (required for deepseek_v4)")
    return v


def config_from_file(cf) -> Dsv4Config:
    arch = cf.arch
    ext = dict(RELEASE)
    ext.update({k: v for k, v in (arch.get("deepseek_v4") or {}).items()})
    moe = arch.get("moe")
    if not isinstance(moe, dict):
        raise ConfigError("arch.moe: missing (mandatory for deepseek_v4)")
    dim = int(_need(arch, "hidden_size"))
    hd = int(_need(arch, "head_dim"))
    nh = int(_need(arch, "num_attention_heads"))
    prf = arch.get("partial_rotary_factor")
    rd = 64 if prf in (None, 1, 1.0) else round(float(prf) * hd)
    if rd % 2 or rd > hd:
        raise ConfigError(f"arch.partial_rotary_factor: rope dim {rd} must be even and <= {hd}")

    def shape(name):
        if name not in cf.tensors:
            raise FormatError(f"{cf.path}: tensor {name!r} missing")
        return tuple(cf.tensors[name].shape)
    q_lora = shape("model.layers.0.self_attn.wq_a.weight")[0]
    wo_a = shape("model.layers.0.self_attn.wo_a.weight")
    per_group = wo_a[1]
    if (nh * hd) % per_group:
        raise ConfigError(f"wo_a: {per_group} columns do not divide the attention width {nh * hd}")
    groups = (nh * hd) // per_group
    hc = shape("model.hc_head_fn")[0]
    vocab = int(arch.get("vocab_size") or shape("model.embed_tokens.weight")[0])
    return Dsv4Config(
        dim=dim, n_layers=int(_need(arch, "num_layers")), n_heads=nh, head_dim=hd,
        rope_head_dim=rd, q_lora_rank=q_lora, o_lora_rank=wo_a[0] // groups, o_groups=groups,
        hc_mult=hc, hc_sinkhorn_iters=int(ext["hc_sinkhorn_iters"]), hc_eps=float(ext["hc_eps"]),
        norm_eps=float(arch.get("rms_norm_eps") or 1e-6),
        n_routed_experts=int(moe["num_experts"]), top_k=int(moe["top_k"]),
        moe_inter=int(moe["moe_intermediate_size"]),
        route_scale=float(moe.get("routed_scaling_factor") or 1.0),
        swiglu_limit=float(ext["swiglu_limit"] or 0.0),
        window=int(arch.get("sliding_window") or 128), index_topk=int(ext["index_topk"]),
        vocab=vocab, rope_theta=float(ext["rope_theta"]),
        compress_rope_theta=float(ext["compress_rope_theta"]), yarn=ext.get("yarn"))


# ------------------------------------------------------------------ weights

@dataclass
class _Compressor:
    wkv: QTensor
    wgate: QTensor
    norm: np.ndarray
    ape: np.ndarray          # [ratio, width]
    ratio: int
    overlap: bool
    width: int               # projection rows
    entry: int               # entry width (width/2 when overlapping)


@dataclass
class _Indexer:
    wq_b: QTensor
    weights_proj: QTensor
    comp: _Compressor
    n_heads: int
    head_dim: int


@dataclass
class _Expert:
    w1: QTensor   # gate
    w3: QTensor   # up
    w2: QTensor   # down

    def __post_init__(self):  # the kernel handles a token's MoE pass lists
        self.gate_up = (self.w1.qmat, self.w3.qmat)
        self.down = self.w2.qmat


@dataclass
class _Layer:
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    wq_a: QTensor
    q_norm: np.ndarray
    wq_b: QTensor
    wkv: QTensor
    kv_norm: np.ndarray
    wo_a: QTensor
    wo_b: QTensor
    sink: np.ndarray
    comp: _Compressor | None
    indexer: _Indexer | None
    hc_attn: tuple
    hc_ffn: tuple
    gate: QTensor
    bias: np.ndarray | None
    tid2eid: np.ndarray | None
    experts: list
    shared: _Expert
    mask: np.ndarray | None = None
    #: the projections of the attention input, made in one pass: wq_a ("qr", the
    #: low-rank query), wkv ("kv", the entry), the compressor's wkv and wgate
    #: ("comp_kv", "comp_gate") and the indexer's compressor's and weights_proj
    #: ("ix_kv", "ix_gate", "ix_weights") where the layer has them
    first: list = field(default_factory=list)
    first_names: tuple = ()
    #: the products of the normed low-rank query: wq_b, then the indexer's wq_b
    queries: list = field(default_factory=list)


@dataclass
class _CompState:
    pk: list = field(default_factory=list)
    ps: list = field(default_factory=list)
    prev_kv: np.ndarray | None = None
    prev_score: np.ndarray | None = None


class _Growing:
    """Rows appended one at a time into a doubling buffer."""
    __slots__ = ("buf", "n", "off")

    def __init__(self, width: int, off: int = 0, cap: int = 16):
        self.buf = np.zeros((off + cap, width), np.float32)
        self.n = 0
        self.off = off

    def append(self, row):
        if self.off + self.n >= self.buf.shape[0]:
            nb = np.zeros((self.off + 2 * (self.buf.shape[0] - self.off), self.buf.shape[1]), np.float32)
            nb[: self.buf.shape[0]] = self.buf
            self.buf = nb
        self.buf[self.off + self.n] = row
        self.n += 1


class _LayerState:
    __slots__ = ("cache", "comp", "ix", "ix_kv", "win_n")

    def __init__(self, cfg: Dsv4Config, layer: _Layer):
        # rows [0, window): the sliding window ring (slot = pos % window);
        # rows [window, window + n): the compressed entries, in order.
        self.cache = _Growing(cfg.head_dim, off=cfg.window)
        self.win_n = 0
        self.comp = _CompState() if layer.comp else None
        self.ix = _CompState() if layer.indexer else None
        self.ix_kv = _Growing(layer.indexer.head_dim) if layer.indexer else None


class Dsv4State:
    """Per-sequence state: position and every layer's caches."""

    def __init__(self, model: DeepseekV4Model):
        self.pos = 0
        self.layers = [_LayerState(model.cfg, L) for L in model.layers]

    # reference-engine-style views (tests and debugging)
    def window_len(self, li):
        return self.layers[li].win_n

    def n_compressed(self, li):
        return self.layers[li].cache.n

    def n_index(self, li):
        s = self.layers[li]
        return s.ix_kv.n if s.ix_kv is not None else 0

    def has_prev(self, li):
        c = self.layers[li].comp
        return c is not None and c.prev_kv is not None


def _task_masks(cf, cfg: Dsv4Config, task):
    """[n_layers, E] bool or None."""
    if task is None or task is False:
        return None
    if task is True:
        m = getattr(cf, "masks", None)
        if not m or not len(m) or not getattr(m, "default_task", None) or m.default_task not in m:
            return None
        t = m[m.default_task]
        return None if t.experts is None else np.asarray(t.experts, bool)
    if isinstance(task, str):
        m = getattr(cf, "masks", None)
        if not m or task not in m:
            have = ", ".join(m.names()) if m else "none"
            raise ConfigError(f"task {task!r}: not in {cf.path}'s masks section (tasks: {have})")
        if m[task].experts is None:
            raise ConfigError(f"task {task!r}: the mask has no expert fields")
        return np.asarray(m[task].experts, bool)
    if isinstance(task, dict):
        out = np.ones((cfg.n_layers, cfg.n_routed_experts), bool)
        for li, row in task.items():
            out[int(li)] = np.asarray(row, bool)
        return out
    arr = np.asarray(task, bool)
    if arr.shape != (cfg.n_layers, cfg.n_routed_experts):
        raise ValueError(f"task: want a [{cfg.n_layers}, {cfg.n_routed_experts}] bool array, "
                         f"got shape {arr.shape}")
    return arr




class DeepseekV4Model(ModelBase):
    """A DeepSeek-V4 model read from an open CMF file (see the module docstring)."""

    arch = ARCH_NAME

    def __init__(self, cmf_file, *, task=None):
        cf = self.file = cmf_file
        name = cf.arch.get("arch_name")
        if name != ARCH_NAME:
            raise ConfigError(f"{cf.path}: arch_name {name!r} is not {ARCH_NAME!r}")
        cfg = self.cfg = config_from_file(cf)
        self.vocab = cfg.vocab

        def f(n):
            if n not in cf.tensors:
                raise FormatError(f"{cf.path}: tensor {n!r} missing")
            return np.ascontiguousarray(cf.tensor(n), np.float32)

        def q(n):
            if n not in cf.tensors:
                raise FormatError(f"{cf.path}: tensor {n!r} missing")
            return QTensor.from_cmf(cf, n)

        rd = cfg.rope_head_dim
        self.rope_window = RopeTable(inv_freq(rd, cfg.rope_theta))
        if cfg.yarn:
            y = cfg.yarn
            self.rope_compress = RopeTable(yarn_inv_freq(
                rd, cfg.compress_rope_theta, float(y["factor"]),
                int(y["original_max_position_embeddings"]), float(y.get("beta_fast") or 32.0),
                float(y.get("beta_slow") or 1.0)))
        else:
            self.rope_compress = RopeTable(inv_freq(rd, cfg.compress_rope_theta))
        self.embed = q("model.embed_tokens.weight")
        self._iota_buf = np.arange(0, dtype=np.int64)
        self.norm = f("model.norm.weight").ravel()
        self.head = q("lm_head.weight")
        self.hc_head_fn = f("model.hc_head_fn")
        self.hc_head_base = f("model.hc_head_base").ravel()
        self.hc_head_scale = float(f("model.hc_head_scale").ravel()[0])
        masks = _task_masks(cf, cfg, task)
        file_masks = getattr(cf, "masks", None)
        # prompts run token by token, so the scheduler feeds at most prefill_cap prompt
        # tokens of a sequence per step (each of them is a step for the decodes too)
        self.capabilities = Capabilities(
            rollback=False, batch_unit=1, prefill_cap=8,
            tasks=tuple(file_masks.names()) if file_masks else ())

        def compressor(p):
            wkv = q(f"{p}.wkv.weight")
            ape = f(f"{p}.ape")
            width = wkv.rows
            ape = ape.reshape(-1, width)
            ratio = ape.shape[0]
            norm = f(f"{p}.norm.weight").ravel()
            overlap = norm.size * 2 == width
            return _Compressor(wkv, q(f"{p}.wgate.weight"), norm, ape, ratio, overlap, width,
                               width // 2 if overlap else width)

        def hc(p, which):
            sc = f(f"{p}.hc_{which}_scale").ravel()
            if sc.size < 3:
                raise FormatError(f"{cf.path}: {p}.hc_{which}_scale: expected 3 scales, got {sc.size}")
            return (f(f"{p}.hc_{which}_fn"), np.ascontiguousarray(sc[:3]),
                    f(f"{p}.hc_{which}_base").ravel())

        self.layers: list[_Layer] = []
        for li in range(cfg.n_layers):
            p = f"model.layers.{li}"
            a = f"{p}.self_attn"
            comp = compressor(f"{a}.compressor") if f"{a}.compressor.wkv.weight" in cf.tensors else None
            ix = None
            if f"{a}.indexer.wq_b.weight" in cf.tensors:
                wp = q(f"{a}.indexer.weights_proj.weight")
                wqb = q(f"{a}.indexer.wq_b.weight")
                ix = _Indexer(wqb, wp, compressor(f"{a}.indexer.compressor"), wp.rows,
                              wqb.rows // max(wp.rows, 1))
            m = f"{p}.mlp"
            experts = [_Expert(q(f"{m}.experts.{e}.gate_proj.weight"),
                               q(f"{m}.experts.{e}.up_proj.weight"),
                               q(f"{m}.experts.{e}.down_proj.weight"))
                       for e in range(cfg.n_routed_experts)]
            tid = f"{m}.tid2eid"
            L = _Layer(
                attn_norm=f(f"{p}.input_layernorm.weight").ravel(),
                ffn_norm=f(f"{p}.post_attention_layernorm.weight").ravel(),
                wq_a=q(f"{a}.wq_a.weight"), q_norm=f(f"{a}.q_norm.weight").ravel(),
                wq_b=q(f"{a}.wq_b.weight"), wkv=q(f"{a}.wkv.weight"),
                kv_norm=f(f"{a}.kv_norm.weight").ravel(), wo_a=q(f"{a}.wo_a.weight"),
                wo_b=q(f"{a}.wo_b.weight"), sink=f(f"{a}.attn_sink").ravel(),
                comp=comp, indexer=ix, hc_attn=hc(p, "attn"), hc_ffn=hc(p, "ffn"),
                gate=q(f"{m}.gate.weight"),
                bias=f(f"{m}.expert_bias").ravel() if f"{m}.expert_bias" in cf.tensors else None,
                tid2eid=(np.rint(f(tid)).astype(np.int64).reshape(-1, cfg.top_k)
                         if tid in cf.tensors else None),
                experts=experts,
                shared=_Expert(q(f"{m}.shared_expert.gate_proj.weight"),
                               q(f"{m}.shared_expert.up_proj.weight"),
                               q(f"{m}.shared_expert.down_proj.weight")))
            if L.tid2eid is not None:
                if L.tid2eid.size and (L.tid2eid.min() < 0 or L.tid2eid.max() >= cfg.n_routed_experts):
                    raise FormatError(f"{cf.path}: {tid}: expert ids outside 0..{cfg.n_routed_experts - 1}")
            elif masks is not None:
                L.mask = masks[li]
            first = {"qr": L.wq_a, "kv": L.wkv}
            if comp:
                first.update(comp_kv=comp.wkv, comp_gate=comp.wgate)
            if ix:
                first.update(ix_kv=ix.comp.wkv, ix_gate=ix.comp.wgate, ix_weights=ix.weights_proj)
            L.first, L.first_names = list(first.values()), tuple(first)
            L.queries = [L.wq_b] + ([ix.wq_b] if ix else [])
            self.layers.append(L)

    # ---- protocol -------------------------------------------------------------------
    def new_state(self) -> Dsv4State:
        return Dsv4State(self)

    def rollback(self, state, n: int) -> None:
        raise CortiqError("deepseek_v4: rollback is not supported (the compressor and "
                          "indexer caches cannot be un-folded); start a new session instead")

    def matrices(self) -> list:
        """Every QTensor the forward multiplies by (the embedding is only read by row)."""
        def expert(e: _Expert) -> list:
            return [e.w1, e.w3, e.w2]
        mats = [self.head]
        for L in self.layers:
            mats += [L.wq_a, L.wq_b, L.wkv, L.wo_a, L.wo_b, L.gate, *expert(L.shared)]
            for e in L.experts:
                mats += expert(e)
            if L.comp is not None:
                mats += [L.comp.wkv, L.comp.wgate]
            if L.indexer is not None:
                ix = L.indexer
                mats += [ix.wq_b, ix.weights_proj, ix.comp.wkv, ix.comp.wgate]
        return mats

    def forward_batch(self, states, ids_list, wants, prompts=None):
        """The forward: the ids of several sequences (one sequence is a batch of one),
        one position per step, each step taking the next token of every sequence that
        has one. Each step reads every dense matrix once for all its rows and each chosen
        expert once for the rows routed to it; the compressors, the indexer and attention
        run per sequence. Every row takes the generated-token products, prompt rows
        included (`prompts` changes nothing), so a row's arithmetic does not depend on
        how its feed was cut or batched. Returns one result per sequence, shaped as
        `forward`'s for its want."""
        ids_list = [check_feed(ids, want, self.vocab) for ids, want in zip(ids_list, wants)]
        outs: list[list[np.ndarray]] = [[] for _ in states]
        step = 0
        while True:
            rows = [i for i, ids in enumerate(ids_list) if step < ids.size]
            if not rows:
                break
            xs = self._step([states[i] for i in rows], [int(ids_list[i][step]) for i in rows])
            # the head reads the rows whose logits are wanted
            read = [j for j, i in enumerate(rows) if wants[i] == "all"
                    or (wants[i] == "last" and step == ids_list[i].size - 1)]
            if read:
                logits = batch_products([self.head], self._final_norm([xs[j] for j in read]))[0]
                for r, j in enumerate(read):
                    outs[rows[j]].append(logits[r:r + 1])
            step += 1
        return per_sequence(outs, wants, self.vocab)

    def final_hidden(self, state: Dsv4State, ids) -> np.ndarray:
        """The folded final-norm hidden states [len(ids), dim] the head reads
        (`cortiq.runtime.embeddings` pools them)."""
        ids = check_feed(ids, "all", self.vocab)
        rows = [self._final_norm(self._step([state], [int(t)]))[0] for t in ids]
        return np.stack(rows) if rows else np.zeros((0, self.cfg.dim), np.float32)

    # ---- one step: a token of each sequence through every layer --------------------------
    def _step(self, sts: list[Dsv4State], tids: list[int]) -> list[np.ndarray]:
        """Token tids[b] of sequence sts[b] at its position, through every layer; the
        rows' residual streams [hc_mult, dim] after the last layer."""
        cfg = self.cfg
        it, hc_eps, eps = cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps
        # the embedding, copied into each of the hc_mult streams
        xs = [np.ascontiguousarray(np.broadcast_to(self.embed.row(t), (cfg.hc_mult, cfg.dim)),
                                   np.float32) for t in tids]
        poss = [st.pos for st in sts]
        # each row's rotary rows, shared by every layer of a kind
        rope_window = [self.rope_window.at(p) for p in poss]
        rope_compress = [self.rope_compress.at(p) for p in poss]
        for L, lss in zip(self.layers, zip(*(st.layers for st in sts))):
            # hyper-connection pre: the streams folded into one normed attention input a row
            fn, sc, base = L.hc_attn
            pre = [K.hc_pre(x, fn, sc, base, L.attn_norm, it, hc_eps, eps) for x in xs]
            out = self._attention_rows(L, lss, _stacked([p[0] for p in pre]), poss,
                                       rope_compress if L.comp is not None else rope_window)
            # hc post: the attention output expanded back into the streams
            xs = [K.hc_expand(o, x, p[1], p[2]) for o, x, p in zip(out, xs, pre)]
            # hyper-connection pre for the MoE
            fn, sc, base = L.hc_ffn
            pre = [K.hc_pre(x, fn, sc, base, L.ffn_norm, it, hc_eps, eps) for x in xs]
            out = self._moe_rows(L, _stacked([p[0] for p in pre]), tids)
            # hc post
            xs = [K.hc_expand(o, x, p[1], p[2]) for o, x, p in zip(out, xs, pre)]
        for st in sts:
            st.pos += 1
        return xs

    def _final_norm(self, xs: list[np.ndarray]) -> np.ndarray:
        """The head's input [len(xs), dim]: each row's streams folded by the head's
        hyper-connection, then the final RMSNorm."""
        eps = self.cfg.norm_eps
        hs = []
        for x in xs:
            mixes = K.hc_mixes(x, self.hc_head_fn, eps)
            pre = K.hc_head_pre(mixes, self.hc_head_scale, self.hc_head_base, self.cfg.hc_eps)
            hs.append(K.hc_fold(x, pre, self.norm, eps))
        return _stacked(hs)

    def _attention_rows(self, L: _Layer, lss: Sequence[_LayerState], X: np.ndarray,
                        poss: list[int], ropes: list) -> np.ndarray:
        """Attention for one row [dim] of each sequence (lss its layer state, poss its
        position, ropes its cos/sin rows): [B, dim]. The projections run once for all
        rows; the caches, the compressors, the indexer and attention per row."""
        cfg = self.cfg
        hd, rd, W, eps = cfg.head_dim, cfg.rope_head_dim, cfg.window, cfg.norm_eps
        table = self.rope_compress if L.comp is not None else self.rope_window
        # q/kv projections: the low-rank query, the kv entry, the compressor's and the
        # indexer's inputs, in one pass over the rows
        p = dict(zip(L.first_names, batch_products(L.first, X)))
        # norms: the low-rank query and the kv entry
        for qr, kv in zip(p["qr"], p["kv"]):
            K.rms_weighted(qr, L.q_norm, eps)
            K.rms_weighted(kv, L.kv_norm, eps)
        # the heads' queries (and the indexer's) from the normed low-rank query
        q_all, *ix_q = batch_products(L.queries, p["qr"])
        ix = L.indexer
        heads = np.empty((X.shape[0], cfg.n_heads * hd), np.float32)
        for b, (ls, pos, (c, s)) in enumerate(zip(lss, poss, ropes)):
            # rope on the kv entry's tail
            kv = p["kv"][b]
            K.rope_interleaved_tail(kv, c, s, rd)
            cache = ls.cache
            # compressor: every ratio entries fold into one compressed cache row
            if L.comp is not None:
                assert ls.comp is not None                  # made for a compressor layer
                e = self._compress(L.comp, ls.comp, p["comp_kv"][b], p["comp_gate"][b], pos,
                                   table)
                if e is not None:
                    cache.append(e)
            # indexer: its own compressor folds the keys it scores
            if ix is not None:
                assert ls.ix is not None and ls.ix_kv is not None   # made for an indexer layer
                e = self._compress(ix.comp, ls.ix, p["ix_kv"][b], p["ix_gate"][b], pos, table)
                if e is not None:
                    ls.ix_kv.append(e)
            # window: the entry goes into its ring slot
            cache.buf[pos % W] = kv
            ls.win_n = min(ls.win_n + 1, W)
            # the cache rows attention reads: the window, then every compressed entry
            # (an indexer layer: the compressed entries its top-k scores pick)
            n_comp = cache.n
            idx = self._iota(W + n_comp)[:ls.win_n]
            if n_comp:
                if ix is not None:
                    assert ls.ix_kv is not None
                    qi = ix_q[0][b].reshape(ix.n_heads, ix.head_dim)
                    K.rope_interleaved_tail(qi, c, s, rd)
                    w = (p["ix_weights"][b] * np.float32(ix.head_dim ** -0.5 * ix.n_heads ** -0.5)
                         ).astype(np.float32)
                    n_ix = min(ls.ix_kv.n, n_comp)
                    scores = index_scores(qi, ls.ix_kv.buf[:n_ix], w, n_ix)
                    picked = top_k_positions(scores, cfg.index_topk) + W
                else:
                    picked = self._iota(W + n_comp)[W:W + n_comp]
                idx = np.concatenate([idx, picked])
            # sparse attention: the queries normed and roped, a sink per head
            q = q_all[b].reshape(cfg.n_heads, hd)
            K.rmsnorm(q, None, eps, out=q)
            K.rope_interleaved_tail(q, c, s, rd)
            o = K.sparse_attend(q, cache.buf[: W + n_comp], idx, L.sink, hd ** -0.5)
            # inverse rope on the output's tail
            K.rope_interleaved_tail(o, c, s, rd, True)
            heads[b] = o.reshape(-1)
        # grouped output: wo_a read once for all rows (each row bit for bit its own
        # call's), then wo_b
        mids = K.grouped_rows(L.wo_a, heads, cfg.o_groups)
        return batch_products([L.wo_b], mids)[0]

    def _compress(self, cp: _Compressor, cs: _CompState, ckv, cg, pos: int,
                  rope: RopeTable):
        """Add one entry to a compressor; when it completes a window, the window's
        folded, normed and roped compressed entry (else None)."""
        if cp.overlap:
            cg = cg + cp.ape[pos % cp.ratio]
        cs.pk.append(ckv)
        cs.ps.append(cg)
        if len(cs.pk) < cp.ratio:
            return None
        kv = np.stack(cs.pk)
        sc = np.stack(cs.ps)
        cs.pk, cs.ps = [], []
        if cp.overlap:
            folded = compress_overlap(cs.prev_kv, cs.prev_score, kv, sc, cp.ratio, cp.entry)
            cs.prev_kv, cs.prev_score = kv, sc
        else:
            folded = K.pool_by_score(kv, np.ascontiguousarray(sc + cp.ape, np.float32))
        K.rms_weighted(folded, cp.norm, self.cfg.norm_eps)
        c, s = rope.at(pos + 1 - cp.ratio)
        K.rope_interleaved_tail(folded, c, s, self.cfg.rope_head_dim)
        return folded

    def _iota(self, n: int) -> np.ndarray:
        """0, 1, ... (int64), at least n long: the cache rows attention reads are slices."""
        a = self._iota_buf
        if a.size < n:
            a = self._iota_buf = np.arange(max(n, 2 * a.size), dtype=np.int64)
        return a

    def _moe_rows(self, L: _Layer, X: np.ndarray, tids: list[int]) -> np.ndarray:
        """The MoE for one row [dim] of each sequence (tids: the rows' tokens, which the
        hash layers route by): [B, dim]."""
        cfg = self.cfg
        # route: each row's experts and weights from the gate's scores (a hash layer:
        # the experts its table gives the token)
        logits = batch_products([L.gate], X)[0]
        routes = [route(lg, L.bias, cfg.top_k, cfg.route_scale,
                        hash_route(L.tid2eid, t) if L.tid2eid is not None else None, L.mask)
                  for lg, t in zip(logits, tids)]
        if len(routes) == 1:
            return self._experts_one(L, X[0], *routes[0])[None]
        return self._experts_rows(L, X, routes)

    def _experts_one(self, L: _Layer, x: np.ndarray, idx: np.ndarray, w: np.ndarray):
        """The shared and the routed experts of one row [dim]: every gate and up
        projection in one pass over x, the down projections summed in one pass (shared
        first, then the routed in routing order: the sum `_experts_rows` makes)."""
        chosen = [L.shared] + [L.experts[e] for e in idx.tolist()]
        weights = [1.0] + w.tolist()
        limit = self.cfg.swiglu_limit
        gu = K.matvec_many([m for e in chosen for m in e.gate_up], x)
        hs = [K.swiglu_clamp(gu[2 * j], gu[2 * j + 1], limit, wt) for j, wt in enumerate(weights)]
        return K.rows_sum([e.down for e in chosen], hs)

    def _experts_rows(self, L: _Layer, X: np.ndarray, routes: list) -> np.ndarray:
        """The shared and the routed experts of several rows: the shared expert once for
        all rows, each chosen expert once for the rows routed to it; each row's terms
        added shared first, then its experts in routing order."""
        limit = self.cfg.swiglu_limit
        by_expert: dict[int, list[tuple[int, float]]] = {}   # expert -> (row, weight)
        plan = []                                             # row -> (expert, its row)
        for b, (idx, w) in enumerate(routes):
            terms = []
            for e, wt in zip(idx.tolist(), w.tolist()):
                rows = by_expert.setdefault(e, [])
                terms.append((e, len(rows)))
                rows.append((b, wt))
            plan.append(terms)
        # experts: each chosen one over the rows routed to it, weighted
        ys = {}
        for e, rows in by_expert.items():
            ex = L.experts[e]
            g, u = batch_products((ex.w1, ex.w3), X[[b for b, _ in rows]])
            for j, (_, wt) in enumerate(rows):
                K.swiglu_clamp(g[j], u[j], limit, wt)
            ys[e] = batch_products((ex.w2,), g)[0]
        # shared expert: every row
        sh = L.shared
        g, u = batch_products((sh.w1, sh.w3), X)
        for b in range(X.shape[0]):
            K.swiglu_clamp(g[b], u[b], limit, 1.0)
        out = batch_products((sh.w2,), g)[0]
        for b, terms in enumerate(plan):
            for e, j in terms:
                out[b] += ys[e][j]
        return out


def _stacked(rows: list[np.ndarray]) -> np.ndarray:
    """Rows [n] as one [len(rows), n] array (one row: a view of it, no copy)."""
    return rows[0][None] if len(rows) == 1 else np.stack(rows)
