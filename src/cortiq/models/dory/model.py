"""NVIDIA Nemotron Labs Dory: a looped normalized GPT, on the host.

The stack is three blocks, input, recurrent and output; the recurrent block runs
`loops` times per token with the input block's output mixed back in before each
pass. A physical layer is one sub-layer (attention or a SwiGLU MLP) and every
hidden state lives on the unit sphere (nGPT):

    attention  q,k,v,g = W x; rotate q,k; q = s_q * q^, k = k^     (per head)
               a = softmax(q.k / sqrt(hd)) over the window; y = sum a v  (GQA)
               y = (y * sigmoid(g * s_g))^ ; out = O y
    mlp        g,u = W x; y = (silu(g * s_g) * (u * s_u))^ ; out = D y
    residual   x = (x^ + |alpha| (out^ - x^))^
    loop       state = input; h = (state + input)^; h = R(h); state = h^
    logits     H h * logit_scale / sigma0

`x^` is justnorm: x / sqrt(sum x^2 + 1e-6). The behaviour is pinned to the reference
engine (cortiq-engine 0.8.64: its `stack`, `attn_layer`, `mlp_layer`, `head`,
`forward_host`; the spec is docs/models/dory.md); names below follow it.

KV caches (`kv_mode`): `per_loop` keeps one cache per (recurrent attention layer,
loop); `last_loop` keeps one per attention layer and each later pass over a chunk
rewrites that chunk's rows in place, so earlier rows hold their last loop's keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ... import _kernels as K
from ...errors import ConfigError, CortiqError
from ...tensor import QGroup, QTensor, batch_products
from .config import DoryConfig, DoryOptions
from ..batch_rows import head_decode, head_rows, per_sequence, prompt_flags
from ..base import Capabilities, ModelBase
from ..kv_cache import KvSlot
from ..rope import RopeTable, inv_freq
from .far_field import EXACT_TAIL, O1Runtime, host_kv_bytes  # o1

EPS = 1e-6
#: rows of a prompt run through the stack together
HOST_CHUNK = 64
#: positions per cached block of rotary cos/sin rows (RopeTable's block)
ROPE_BLOCK = 64


# ---- small math, all float32 -----------------------------------------------------
def justnorm(x: np.ndarray) -> np.ndarray:
    """In place over the last axis: x / sqrt(sum x^2 + eps)."""
    K.justnorm(x, EPS)
    return x


def top_prob(logits: np.ndarray) -> float:
    """The top probability of a row of logits (terms more than 20 below the top skipped)."""
    top = float(np.max(logits))
    d = logits.astype(np.float64) - top
    return float(1.0 / np.exp(d[d > -20.0]).sum())


def slerp(x: np.ndarray, out: np.ndarray, alpha: np.ndarray) -> None:
    """The nGPT residual, written into x: x = (x^ + alpha (out^ - x^))^ (rows; out is
    scratch)."""
    K.slerp(x, out, alpha, EPS)


# ---- weights ---------------------------------------------------------------------
@dataclass
class AttnWeights:
    q: QTensor
    k: QTensor
    v: QTensor
    g: QTensor
    o: QTensor
    sq: np.ndarray      # (sqk * sqrt(hd) / sigma0)^2, [nh*hd]
    sg: np.ndarray      # (s_gate * sqrt(g0) / sigma0)^2, [nh*hd]
    alpha: np.ndarray   # |attn_alpha * alpha0 / sigma0|, [hidden]
    sliding: bool
    ordinal: int        # position among the attention layers: the KV slot table's row

    def __post_init__(self):
        self.qkvg = QGroup([self.q, self.k, self.v, self.g])  # one pass over x per token


@dataclass
class MlpWeights:
    gate: QTensor
    up: QTensor
    down: QTensor
    sg: np.ndarray      # suv_gate * sqrt(hidden), [ffn]
    su: np.ndarray      # suv_up * sqrt(hidden), [ffn]
    alpha: np.ndarray   # |mlp_alpha * alpha0 / sigma0|, [hidden]

    def __post_init__(self):
        self.gate_up = QGroup([self.gate, self.up])


class Topologies:
    """The reconstruction router of `gate="recon:..."`: two affine subspaces (easy and
    hard tokens); a state the easy one reconstructs better leaves after one pass."""

    def __init__(self, me, be, mh, bh):
        dim = me.size
        if mh.size != dim or be.size == 0 or be.size % dim or bh.size != be.size:
            raise ConfigError("dory.router: inconsistent shapes of the easy/hard subspaces")
        self.me, self.mh = me.astype(np.float32), mh.astype(np.float32)
        self.be = be.astype(np.float32).reshape(-1, dim)
        self.bh = bh.astype(np.float32).reshape(-1, dim)

    @classmethod
    def from_file(cls, path: str, dim: int) -> Topologies:
        try:
            w = np.fromfile(path, dtype="<f4")
        except OSError as e:
            raise ConfigError(f"gate recon: cannot read {path}: {e.strerror}") from None
        if w.size < 2:
            raise ConfigError(f"gate recon: {path} is too short")
        rank, d = int(w[0]), int(w[1])
        need = 2 + 2 * d + 2 * rank * d
        if d != dim or rank < 1 or w.size < need:
            raise ConfigError(f"gate recon: {path} holds rank {rank} dim {d}; the model "
                              f"needs dim {dim} and {need} floats")
        at = 2
        parts = []
        for n in (d, rank * d, d, rank * d):
            parts.append(w[at:at + n])
            at += n
        return cls(*parts)

    @staticmethod
    def _err(x, mu, basis):
        y = x - mu
        d = basis @ y
        return float(y @ y - d @ d)

    def score(self, x: np.ndarray) -> float:
        """Positive: the easy class reconstructs x better."""
        return self._err(x, self.mh, self.bh) - self._err(x, self.me, self.be)


@dataclass
class Gate:
    """How a token leaves the loop early (decode only, one row at a time)."""
    kind: str                       # "conf" or "recon"
    threshold: float = 0.7          # conf: the top probability that ends a token
    router: Topologies | None = None
    bias: float = 0.0               # recon: exit when score >= bias


class ExitRate:
    """Below this rate of early exits a token goes straight to the second pass, and
    one in eight still reads out, to notice when the text turns easy."""

    def __init__(self):
        self.rate = 1.0
        self.tokens = 0

    def probe(self) -> bool:
        self.tokens = (self.tokens + 1) & 0xFFFFFFFF
        return self.rate >= 0.35 or self.tokens % 8 == 0

    def note(self, exited: bool) -> None:
        self.rate += np.float32(0.1) * (float(exited) - self.rate)


# ---- per-sequence state ------------------------------------------------------------
@dataclass
class DoryState:
    """One sequence: KV slots[attention ordinal][loop], the position, the exit rate."""
    slots: list = field(default_factory=list)
    pos: int = 0
    exits: ExitRate = field(default_factory=ExitRate)
    exit_logits: np.ndarray | None = None
    gate_tokens: int = 0
    gate_one: int = 0
    scratch: np.ndarray | None = None   # a decode row's temporaries (DoryModel.new_state)

    def clear(self) -> None:
        self.slots = []
        self.pos = 0
        self.exit_logits = None


# ---- the model ---------------------------------------------------------------------
class DoryModel(ModelBase):
    """Dory's weights and forward. One instance serves many sequences (DoryState)."""

    arch = "dory"
    supports_rollback = True
    takes_prompt = True         # forward / forward_batch take the prompt flag
    #: one-row chunks run each sub-layer as one fused kernel call (bit-identical to the
    #: general path, which tests compare it with by switching this off)
    fused_rows = True

    @property
    def batch_unit(self):
        """The batch scheduler feeds a prompt in pieces of this many rows (forward's
        chunks); None with the far field, whose exact tail is placed from the end of a
        feed, so a prompt there goes in one piece."""
        return None if self.o1rt is not None else HOST_CHUNK

    def __init__(self, cmf, *, loops=None, kv_mode=None, gate=None, prompt_loops=None,
                 full_window=None, o1=None, spill=None):
        self.file = cmf
        cfg = DoryConfig.from_header(cmf.header)
        if loops == "auto":  # the loop count decided per token: an early-exit gate
            loops, gate = None, gate or "auto"
        opts = DoryOptions(loops=loops, kv_mode=kv_mode, gate=gate, prompt_loops=prompt_loops,
                           full_window=full_window).resolve(cfg)
        self.cfg, self.opts = cfg, opts
        self.hidden, self.ffn, self.vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
        self.nh, self.nk, self.hd = cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim
        self.n_in, self.n_rec, self.n_out = cfg.n_input_layers, cfg.n_recurrent_layers, cfg.n_output_layers
        self.window = cfg.sliding_window
        self.loops = opts.loops
        self.kv_mode = opts.kv_mode
        self.full_window = opts.full_window
        self.prompt_loops = opts.prompt_loops
        self.attn_scale = np.float32(1.0 / math.sqrt(self.hd))
        q_size, kv_size = self.nh * self.hd, self.nk * self.hd

        def vec(name, n):
            v = cmf.tensor(name).astype(np.float32).ravel()
            if v.size != n:
                raise ConfigError(f"{name}: {v.size} values, the config needs {n}")
            return v

        def mat(name, rows, cols):
            t = QTensor.from_cmf(cmf, name)
            if (t.rows, t.cols) != (rows, cols):
                raise ConfigError(f"{name}: shape [{t.rows}, {t.cols}], the config needs "
                                  f"[{rows}, {cols}]")
            return t

        self.layers: list[AttnWeights | MlpWeights] = []
        ordinal = 0
        for li, kind in enumerate(cfg.layer_pattern):
            p, m = f"model.layers.{li}", f"model.layers.{li}.mixer"
            if kind == "-":
                self.layers.append(MlpWeights(
                    gate=mat(f"{m}.gate_proj.weight", self.ffn, self.hidden),
                    up=mat(f"{m}.up_proj.weight", self.ffn, self.hidden),
                    down=mat(f"{m}.down_proj.weight", self.hidden, self.ffn),
                    sg=cfg.suv_scale(vec(f"{m}.suv_gate", self.ffn)),
                    su=cfg.suv_scale(vec(f"{m}.suv_up", self.ffn)),
                    alpha=cfg.alpha_scale(vec(f"{p}.mlp_alpha", self.hidden))))
            else:
                self.layers.append(AttnWeights(
                    q=mat(f"{m}.q_proj.weight", q_size, self.hidden),
                    k=mat(f"{m}.k_proj.weight", kv_size, self.hidden),
                    v=mat(f"{m}.v_proj.weight", kv_size, self.hidden),
                    g=mat(f"{m}.g_proj.weight", q_size, self.hidden),
                    o=mat(f"{m}.o_proj.weight", self.hidden, q_size),
                    sq=cfg.sqk_scale(vec(f"{m}.sqk", q_size)),
                    sg=cfg.s_gate_scale(vec(f"{m}.s_gate", q_size)),
                    alpha=cfg.alpha_scale(vec(f"{p}.attn_alpha", self.hidden)),
                    sliding=kind == "S", ordinal=ordinal))
                ordinal += 1
        self.attn_layers = ordinal
        self.embed = mat("model.embed_tokens.weight", self.vocab, self.hidden)
        self.head_w = mat("lm_head.weight", self.vocab, self.hidden)
        self.logit_scale = cfg.logit_scale(vec("lm_head.logit_scale", self.vocab))
        self.inv_full = inv_freq(self.hd, cfg.rope_theta_full, f64=True)
        self.inv_sliding = inv_freq(self.hd, cfg.rope_theta_sliding, f64=True)
        self.rope_sliding = RopeTable(self.inv_sliding, f64=True, block=ROPE_BLOCK)
        self.rope_full = RopeTable(self.inv_full, f64=True, block=ROPE_BLOCK)
        # Fixed per layer, looked up on every visit: does the KV slot depend on the loop
        # (per_loop recurrent layers), does a later pass rewrite the chunk's rows (last_loop
        # recurrent layers and the output block), the attention window (0: unlimited).
        rec = range(self.n_in, self.n_in + self.n_rec)
        n_layers = len(self.layers)
        self._per_loop = [self.kv_mode == "per_loop" and li in rec for li in range(n_layers)]
        self._rewrite = [(self.kv_mode == "last_loop" and li in rec) or li >= self.n_in + self.n_rec
                         for li in range(n_layers)]
        self._window = [(self.window if w.sliding else (self.full_window or 0))
                        if isinstance(w, AttnWeights) else 0 for w in self.layers]
        # windowed layers' (slot row, keep) for the trim after each chunk
        self._trims = [(w.ordinal, self._keep(w)) for w in self.layers
                       if isinstance(w, AttnWeights) and (w.sliding or self.full_window)]
        self._scratch = max(K.dory_attn_scratch(self.hidden, q_size),
                            K.dory_mlp_scratch(self.hidden, self.ffn))
        self.gate = self._make_gate(opts.gate)
        # ---- o1: the far field of the full layers (src/cortiq/models/dory/far_field.py)
        self.o1rt = O1Runtime.for_model(self, o1=o1, spill=spill,
                                        turbo_defaults=not opts.fixed_loops, env=opts.env)
        if self.o1rt is not None and self.gate is not None and any(
                self._per_loop[li] and not self.layers[li].sliding for li in rec
                if isinstance(self.layers[li], AttnWeights)):
            raise ConfigError("o1: the far field with an early-exit gate needs "
                              "kv_mode='last_loop' (a per_loop far-field cache cannot take "
                              "the rows of a pass a token skipped)")
        # ---- end o1
        self.capabilities = Capabilities(
            rollback=True, batch_unit=None if self.o1rt is not None else HOST_CHUNK,
            far_field=self.o1rt is not None)

    def _make_gate(self, spec) -> Gate | None:
        if spec is None:
            return None
        if spec.kind == "conf":
            return Gate("conf", threshold=spec.threshold)
        if spec.kind == "file":  # the router a turbo file carries
            router = Topologies(*(self.file.tensor(f"dory.router.{n}").ravel() for n in (
                "easy.mean", "easy.basis", "hard.mean", "hard.basis")))
            return Gate("recon", router=router, bias=spec.bias)
        if spec.kind == "recon":
            return Gate("recon", router=Topologies.from_file(spec.path, self.hidden),
                        bias=spec.bias)
        raise ConfigError(f"gate: unknown kind {spec.kind!r}")

    # -- sequences -------------------------------------------------------------
    def new_state(self) -> DoryState:
        return DoryState(scratch=np.empty(self._scratch, np.float32))

    def _chunk_loops(self, want: str) -> int:
        if want == "none" and self.prompt_loops > 0 and self.kv_mode == "last_loop":
            return min(self.loops, self.prompt_loops)
        return self.loops

    def _slot(self, st: DoryState, w: AttnWeights, li: int, loop_i: int, pos0: int) -> KvSlot:
        """The cache pass `loop_i` of layer li reads and writes, ready for rows at pos0."""
        sl = loop_i if self._per_loop[li] else 0
        row = st.slots[w.ordinal]
        while len(row) <= sl:
            row.append(KvSlot(self.nk, self.hd))
        slot = row[sl]
        if sl and slot.first + slot.n < pos0:
            carry_forward(slot, row[sl - 1], pos0)
        return slot

    def forward(self, st: DoryState, ids, want: str = "last",
                prompt: bool | None = None) -> np.ndarray | None:
        """Run tokens `ids` from position st.pos. want: "none" -> None, "last" ->
        [vocab], "all" -> [len(ids), vocab] (float32). prompt: prompt rows (True: the
        products of a prompt chunk, every pass) or generated tokens (False: decode's
        products, and the early-exit gate for one token); None: prompt rows when
        there are several."""
        ids = np.asarray(ids, dtype=np.int64).ravel()
        if want not in ("none", "last", "all"):
            raise ConfigError(f"want must be 'none', 'last' or 'all', got {want!r}")
        if ids.size == 0:
            return None if want == "none" else np.zeros((0, self.vocab) if want == "all" else 0,
                                                        np.float32)
        bad = (ids < 0) | (ids >= self.vocab)
        if bad.any():
            raise ValueError(f"token id {int(ids[bad][0])} is outside the vocabulary "
                             f"[0, {self.vocab})")
        if not st.slots:
            st.slots = [[] for _ in range(self.attn_layers)]
        prompt = ids.size > 1 if prompt is None else bool(prompt)
        out = []
        done = 0
        tail_from = st.pos + ids.size - EXACT_TAIL  # o1: the rebuild before the last rows
        for start in range(0, ids.size, HOST_CHUNK):
            chunk = ids[start:start + HOST_CHUNK]
            if self.o1rt is not None and st.pos >= tail_from:  # o1
                self.o1rt.finish_exact(st)
            t = chunk.size
            last = start + t == ids.size
            w = want if (last or want == "all") else "none"
            h = np.stack([self.embed.row(int(i)) for i in chunk]).astype(np.float32)
            self._stack(st, h, st.pos, self._chunk_loops(w), prompt)
            st.pos += t
            done += t
            if st.exit_logits is not None:
                lg, st.exit_logits = st.exit_logits, None
                if want != "none":
                    out.append(lg[None, :])
                continue
            if want == "all":
                out.append(self._head(h, prompt))
            elif want == "last" and last:
                out.append(self._head(h[-1:]))
        if self.o1rt is not None:  # o1
            self.o1rt.finish_exact(st)
        if want == "none":
            return None
        if want == "last":
            return out[-1][0]
        return np.concatenate(out, axis=0)

    def final_hidden(self, st: DoryState, ids) -> np.ndarray:
        """The hidden states [len(ids), hidden] the head reads, for `ids` run from
        st.pos through every loop (`cortiq.embeddings` pools them)."""
        ids = np.asarray(ids, dtype=np.int64).ravel()
        if not st.slots:
            st.slots = [[] for _ in range(self.attn_layers)]
        rows = []
        for start in range(0, ids.size, HOST_CHUNK):
            chunk = ids[start:start + HOST_CHUNK]
            h = np.stack([self.embed.row(int(i)) for i in chunk]).astype(np.float32)
            self._stack(st, h, st.pos, self.loops, chunk.size > 1)
            st.pos += chunk.size
            st.exit_logits = None             # a one-token chunk may exit early: h still holds its state
            rows.append(h)
        if self.o1rt is not None:  # o1
            self.o1rt.finish_exact(st)
        return np.concatenate(rows, axis=0)

    def rollback(self, st: DoryState, n: int) -> None:
        """Forget positions >= n (Session falls back to re-reading when this cannot)."""
        if not self.can_rollback(st, n):
            raise CortiqError(f"dory: cannot roll back to {n}: a window layer has already "
                              "dropped keys that position reads")
        for row in st.slots:
            for s in row:
                s.rollback(n)
        if self.o1rt is not None:  # o1: the query trace forgets them too
            self.o1rt.rollback(st, n)
        st.pos = min(st.pos, n)

    def can_rollback(self, st: DoryState, n: int) -> bool:
        """True when every window layer still holds the keys a token at n would read."""
        if self.o1rt is not None and not self.o1rt.can_rollback(st, n):  # o1
            return False
        for w in self.layers:
            if isinstance(w, AttnWeights) and st.slots and st.slots[w.ordinal]:
                keep = self._keep(w)
                need = max(0, n + 1 - keep)
                if any(s.first > need for s in st.slots[w.ordinal]):
                    return False
        return True

    def kv_bytes(self, st: DoryState) -> int:
        exact = sum(s.nbytes() for row in st.slots for s in row)
        return exact + (host_kv_bytes(st)[1] if self.o1rt is not None else 0)  # o1

    # -- the stack ------------------------------------------------------------
    def _keep(self, w: AttnWeights) -> int:
        if w.sliding:
            return self.window
        return self.full_window if self.full_window else (1 << 62)

    def _stack(self, st: DoryState, h: np.ndarray, pos0: int, loops: int,
               prompt: bool) -> None:
        t = h.shape[0]
        ropes = (self.rope_sliding(pos0, t), self.rope_full(pos0, t))
        n_in, n_rec, n_out = self.n_in, self.n_rec, self.n_out
        layers, rewrite = self.layers, self._rewrite
        # One row (decode): each sub-layer is one fused kernel call (_attn_row, _mlp_row);
        # the far field's full layers keep the general path.
        one = t == 1 and self.fused_rows and not prompt
        o1 = self.o1rt is not None
        if one and st.scratch is None:
            st.scratch = np.empty(self._scratch, np.float32)

        def run(li, loop_i, h):
            w = layers[li]
            if isinstance(w, AttnWeights):
                # A later pass over this chunk rewrites its rows; a second read-out of
                # the output block replaces the first one's rows too (in either mode).
                overwrite = loop_i > 0 and rewrite[li]
                rope = ropes[0] if w.sliding else ropes[1]
                if one and not (o1 and not w.sliding):
                    self._attn_row(st, w, li, loop_i, h, pos0, overwrite, rope)
                    return
                out = self._attn(st, w, li, loop_i, h, pos0, overwrite, rope, prompt)
            elif one:
                K.dory_mlp_row(w.gate.qmat, w.up.qmat, w.down.qmat, h, w.sg, w.su, w.alpha,
                               st.scratch, EPS)
                return
            else:
                out = self._mlp(w, h, prompt)
            slerp(h, out, w.alpha)

        for li in range(n_in):
            run(li, 0, h)
        inp = h.copy()
        state = inp.copy()
        early = t == 1 and self.gate is not None and not prompt  # generated tokens only
        for i in range(1 if early else loops):
            np.add(state, inp, out=h)
            justnorm(h)
            for li in range(n_in, n_in + n_rec):
                run(li, i, h)
            np.copyto(state, h)
            justnorm(state)
        if early:
            self._early_exit(st, h, state, inp, run)
        else:
            np.copyto(h, state)
            for li in range(n_in + n_rec, n_in + n_rec + n_out):
                run(li, 0, h)
        # Windowed layers keep only what the next position reads; trimming waits for
        # the chunk's end because a later last-loop pass reads what is behind it.
        if self.o1rt is not None:  # o1: sealed rows to the store, the seal
            self.o1rt.after_chunk(st, pos0, t)
        for ordinal, keep in self._trims:
            for s in st.slots[ordinal]:
                s.trim(keep)

    def _early_exit(self, st, h, state, inp, run) -> None:
        n_in, n_rec, n_out = self.n_in, self.n_rec, self.n_out
        g = self.gate
        stay, readout = False, False
        if g.kind == "recon":
            stay = g.router.score(state[0]) < g.bias
        np.copyto(h, state)
        if g.kind == "conf":
            if st.exits.probe():
                readout = True
                for li in range(n_in + n_rec, n_in + n_rec + n_out):
                    run(li, 0, h)
                lg = self._head(h)[0]
                stay = top_prob(lg) < g.threshold
                st.exits.note(not stay)
                if not stay:
                    st.exit_logits = lg
            else:
                stay = True
        elif not stay:
            for li in range(n_in + n_rec, n_in + n_rec + n_out):
                run(li, 0, h)
        if stay:
            np.add(state, inp, out=h)
            justnorm(h)
            for li in range(n_in, n_in + n_rec):
                run(li, 1, h)
            justnorm(h)
            for li in range(n_in + n_rec, n_in + n_rec + n_out):
                run(li, int(readout), h)
        st.gate_tokens += 1
        st.gate_one += int(not stay)

    def _attn_row(self, st, w: AttnWeights, li, loop_i, h, pos0, overwrite, rope) -> None:
        """_attn and the residual for one row, in one kernel call: the cache row is
        written in place (q, g and the heads live in st.scratch)."""
        slot = self._slot(st, w, li, loop_i, pos0)
        if overwrite:
            slot.n -= 1
        slot._reserve(slot.n + 1)
        K.dory_attn_row(w.q.qmat, w.k.qmat, w.v.qmat, w.g.qmat, w.o.qmat, h, w.sq, w.sg, w.alpha,
                        rope[0], rope[1], slot.k, slot.v, slot.n, slot.first, pos0,
                        self._window[li], self.attn_scale, st.scratch, EPS)
        slot.n += 1

    def _attn(self, st, w: AttnWeights, li, loop_i, h, pos0, overwrite, rope,
              prompt: bool = False) -> np.ndarray:
        t = h.shape[0]
        nh, nk, hd = self.nh, self.nk, self.hd
        if t == 1 and not prompt:
            q, k, v, g = w.qkvg.matvec(h[0])
            q, k, v, g = q[None], k[None], v[None], g[None]
        else:
            q, k, v, g = (w.q.matmat(h, prompt=prompt), w.k.matmat(h, prompt=prompt),
                          w.v.matmat(h, prompt=prompt), w.g.matmat(h, prompt=prompt))
        q = q.reshape(t, nh, hd)
        k = k.reshape(t, nk, hd)
        cos, sin = rope
        K.qk_prep(q, cos, sin, w.sq, EPS)     # rotate, justnorm per head, * s_q
        K.qk_prep(k, cos, sin, None, EPS)     # rotate, justnorm per head
        slot = self._slot(st, w, li, loop_i, pos0)
        v = v.reshape(t, nk, hd)

        def exact():
            slot.put(k, v, overwrite)
            window = self.window if w.sliding else (self.full_window or 0)  # 0: unlimited
            return K.attn_gqa_window(q, slot.k[:slot.n], slot.v[:slot.n], pos0, window,
                                     slot.first, float(self.attn_scale))
        if self.o1rt is not None and not w.sliding:  # o1: exact until the seal, then far
            y = self.o1rt.attend(slot, q, k, v, pos0, overwrite, exact)
        else:
            y = exact()
        y = y.reshape(t, nh * hd)
        K.gate_norm(y, g, w.sg, EPS)          # y = (y * sigmoid(g * s_g))^
        return w.o.matvec(y[0])[None] if t == 1 and not prompt else w.o.matmat(y, prompt=prompt)

    def _mlp(self, w: MlpWeights, h: np.ndarray, prompt: bool = False) -> np.ndarray:
        one = h.shape[0] == 1 and not prompt
        if one:
            g, u = w.gate_up.matvec(h[0])
            g, u = g[None], u[None]
        else:
            g, u = w.gate.matmat(h, prompt=prompt), w.up.matmat(h, prompt=prompt)
        K.silu_mul(g, u, w.sg, w.su)
        justnorm(g)
        return w.down.matvec(g[0])[None] if one else w.down.matmat(g, prompt=prompt)

    def _head(self, h: np.ndarray, prompt: bool = False) -> np.ndarray:
        """Logits of the rows of h, one sequence's (prompt: rows of its prompt)."""
        lg = (self.head_w.matvec(h[0])[None] if h.shape[0] == 1 and not prompt
              else self.head_w.matmat(h, prompt=prompt))
        lg *= self.logit_scale
        return lg

    # -- several sequences in one pass ---------------------------------------------
    def forward_batch(self, states, ids_list, wants, prompts=None):
        """`forward` for several sequences at once. Each sequence's ids are cut into
        HOST_CHUNK pieces as `forward` cuts them (same loop counts, same last_loop
        rewrites); the pieces of one round go through each sub-layer together: every
        weight matrix is read once for all their rows (matmat), attention, the KV slots,
        the far field and the early-exit gate run per sequence (a row that exits early
        leaves the later passes of that step); `prompts` (one flag per sequence, as
        `forward`'s `prompt`) picks each row's products. Returns one result per
        sequence, shaped as `forward`'s."""
        ids_list = [np.asarray(ids, dtype=np.int64).ravel() for ids in ids_list]
        for ids in ids_list:
            bad = (ids < 0) | (ids >= self.vocab)
            if bad.any():
                raise ValueError(f"token id {int(ids[bad][0])} is outside the vocabulary "
                                 f"[0, {self.vocab})")
        for st in states:
            if not st.slots:
                st.slots = [[] for _ in range(self.attn_layers)]
        prompts = prompt_flags(prompts, ids_list)
        n = len(states)
        outs = [[] for _ in range(n)]
        at = [0] * n
        tail_from = [st.pos + ids.size - EXACT_TAIL for st, ids in zip(states, ids_list)]
        while True:
            segs, r0 = [], 0
            for i, (st, ids) in enumerate(zip(states, ids_list)):
                if at[i] >= ids.size:
                    continue
                if self.o1rt is not None and st.pos >= tail_from[i]:  # o1
                    self.o1rt.finish_exact(st)
                t = min(HOST_CHUNK, ids.size - at[i])
                last = at[i] + t == ids.size
                w = wants[i] if (last or wants[i] == "all") else "none"
                segs.append(_Seg(i, st, r0, t, self._chunk_loops(w), prompts[i]))
                r0 += t
            if not segs:
                break
            h = np.stack([self.embed.row(int(tok)) for sg in segs
                          for tok in ids_list[sg.i][at[sg.i]:at[sg.i] + sg.t]]).astype(np.float32)
            if len(segs) == 1:
                sg = segs[0]
                self._stack(sg.st, h, sg.pos0, sg.loops, sg.prompt)
            else:
                self._stack_batch(segs, h)
            picks = []
            for sg in segs:
                i, st = sg.i, sg.st
                st.pos += sg.t
                at[i] += sg.t
                if st.exit_logits is not None:
                    lg, st.exit_logits = st.exit_logits, None
                    if wants[i] != "none":
                        outs[i].append(lg[None, :])
                elif wants[i] == "all":
                    picks.append((i, sg.r0, sg.t, sg.prompt))
                elif wants[i] == "last" and at[i] == ids_list[i].size:
                    picks.append((i, sg.r0 + sg.t - 1, 1, False))
            if picks:
                lg = batch_products([self.head_w], h[head_rows(picks)], head_decode(picks))[0]
                lg *= self.logit_scale
                j = 0
                for i, _, k, _ in picks:
                    outs[i].append(lg[j:j + k])
                    j += k
        if self.o1rt is not None:  # o1
            for st in states:
                self.o1rt.finish_exact(st)
        return per_sequence(outs, wants, self.vocab)

    def _stack_batch(self, segs, h: np.ndarray) -> None:
        """`_stack` over several sequences' rows (segs[j] owns h[r0 : r0 + t])."""
        n_in, n_rec, n_out = self.n_in, self.n_rec, self.n_out
        rec = range(n_in, n_in + n_rec)
        out_block = range(n_in + n_rec, n_in + n_rec + n_out)
        for sg in segs:
            sg.ropes = (self.rope_sliding(sg.pos0, sg.t), self.rope_full(sg.pos0, sg.t))
            sg.loop = 0
        self._block(range(n_in), segs, segs, h)
        inp = h.copy()
        state = inp.copy()
        gate = self.gate
        for sg in segs:
            sg.early = sg.t == 1 and gate is not None and not sg.prompt
        passes = max(1 if sg.early else sg.loops for sg in segs)
        for i in range(passes):
            act = [sg for sg in segs if i < (1 if sg.early else sg.loops)]
            rows = _rows(act, segs)
            hs = state + inp if rows is None else state[rows] + inp[rows]
            justnorm(hs)
            for sg in act:
                sg.loop = i
            self._block(rec, act, act, hs)
            justnorm(hs)
            if rows is None:
                state[:] = hs
            else:
                state[rows] = hs
        np.copyto(h, state)
        # The output block: every sequence that leaves the loop now (all of them
        # without a gate); with one, the conf gate's read-outs decide who stays.
        leave, stay, readout = [], [], []
        for sg in segs:
            sg.loop = 0
            if not sg.early:
                leave.append(sg)
                continue
            if gate.kind == "recon":
                if gate.router.score(state[sg.r0]) < gate.bias:
                    sg.readout = False
                    stay.append(sg)
                else:
                    leave.append(sg)
            elif sg.st.exits.probe():
                sg.readout = True
                leave.append(sg)
                readout.append(sg)
            else:
                sg.readout = False
                stay.append(sg)
        if leave:
            self._block(out_block, leave, segs, h)
        if readout:
            rows = np.asarray([sg.r0 for sg in readout])
            lg = batch_products([self.head_w], h[rows])[0]
            lg *= self.logit_scale
            for sg, row in zip(readout, lg):
                go = top_prob(row) >= gate.threshold
                sg.st.exits.note(go)
                if go:
                    sg.st.exit_logits = row
                else:
                    stay.append(sg)
        if stay:
            stay.sort(key=lambda sg: sg.r0)
            rows = _rows(stay, segs)
            hs = state[rows] + inp[rows] if rows is not None else state + inp
            justnorm(hs)
            for sg in stay:
                sg.loop = 1
            self._block(rec, stay, stay, hs)
            justnorm(hs)
            for sg in stay:
                sg.loop = int(sg.readout)
            self._block(out_block, stay, stay, hs)
            if rows is None:
                h[:] = hs
            else:
                h[rows] = hs
        for sg in segs:
            if sg.early:
                sg.st.gate_tokens += 1
                sg.st.gate_one += int(sg.st.exit_logits is not None or (
                    gate.kind == "recon" and sg not in stay))
            if self.o1rt is not None:  # o1: sealed rows to the store, the seal
                self.o1rt.after_chunk(sg.st, sg.pos0, sg.t)
            for ordinal, keep in self._trims:
                for s in sg.st.slots[ordinal]:
                    s.trim(keep)

    def _block(self, lis, group, ordered, h: np.ndarray) -> None:
        """Run sub-layers `lis` on the rows of `group` (a subsequence of `ordered`, the
        sequences h's rows belong to, in order); a proper subset is gathered and
        scattered back."""
        if len(group) == len(ordered):
            r = 0
            for sg in group:
                sg.r = r
                r += sg.t
            for li in lis:
                self._layer_rows(li, group, h)
            return
        rows = _rows(group, ordered, force=True)
        hs = h[rows]
        r = 0
        for sg in group:
            sg.r = r
            r += sg.t
        for li in lis:
            self._layer_rows(li, group, hs)
        h[rows] = hs

    def _layer_rows(self, li: int, segs, h: np.ndarray) -> None:
        """One sub-layer on h (rows of `segs`, each at its own loop), in place."""
        w = self.layers[li]
        o1 = self.o1rt is not None
        if h.shape[0] == 1:   # one row: the path `_stack` takes for it, bit for bit
            sg = segs[0]
            fused = self.fused_rows and not sg.prompt
            st = sg.st
            if st.scratch is None:
                st.scratch = np.empty(self._scratch, np.float32)
            if isinstance(w, AttnWeights):
                overwrite = sg.loop > 0 and self._rewrite[li]
                rope = sg.ropes[0] if w.sliding else sg.ropes[1]
                if fused and not (o1 and not w.sliding):
                    self._attn_row(st, w, li, sg.loop, h, sg.pos0, overwrite, rope)
                    return
                out = self._attn(st, w, li, sg.loop, h, sg.pos0, overwrite, rope, sg.prompt)
            elif fused:
                K.dory_mlp_row(w.gate.qmat, w.up.qmat, w.down.qmat, h, w.sg, w.su, w.alpha,
                               st.scratch, EPS)
                return
            else:
                out = self._mlp(w, h, sg.prompt)
        else:   # generated tokens' rows: decode's products
            decode = np.repeat(np.asarray([not sg.prompt for sg in segs]), [sg.t for sg in segs])
            if isinstance(w, AttnWeights):
                out = self._attn_rows(li, w, segs, h, decode)
            else:
                g, u = batch_products((w.gate, w.up), h, decode)
                K.silu_mul(g, u, w.sg, w.su)
                justnorm(g)
                out = batch_products((w.down,), g, decode)[0]
        slerp(h, out, w.alpha)

    def _attn_rows(self, li: int, w: AttnWeights, segs, h: np.ndarray, decode) -> np.ndarray:
        """`_attn` for the rows of several sequences: the projections once for all
        rows, the rest per sequence."""
        T = h.shape[0]
        nh, nk, hd = self.nh, self.nk, self.hd
        q, k, v, g = batch_products((w.q, w.k, w.v, w.g), h, decode)
        y = np.empty((T, nh * hd), np.float32)
        window = self._window[li]
        far = self.o1rt is not None and not w.sliding
        for sg in segs:
            r, t = sg.r, sg.t
            qs = q[r:r + t].reshape(t, nh, hd)
            ks = k[r:r + t].reshape(t, nk, hd)
            vs = v[r:r + t].reshape(t, nk, hd)
            cos, sin = sg.ropes[0] if w.sliding else sg.ropes[1]
            K.qk_prep(qs, cos, sin, w.sq, EPS)
            K.qk_prep(ks, cos, sin, None, EPS)
            slot = self._slot(sg.st, w, li, sg.loop, sg.pos0)
            overwrite = sg.loop > 0 and self._rewrite[li]

            def exact(slot=slot, qs=qs, ks=ks, vs=vs, overwrite=overwrite, pos0=sg.pos0):
                slot.put(ks, vs, overwrite)
                return K.attn_gqa_window(qs, slot.k[:slot.n], slot.v[:slot.n], pos0, window,
                                         slot.first, float(self.attn_scale))
            ys = self.o1rt.attend(slot, qs, ks, vs, sg.pos0, overwrite, exact) if far \
                else exact()
            y[r:r + t] = ys.reshape(t, nh * hd)
        K.gate_norm(y, g, w.sg, EPS)
        return batch_products((w.o,), y, decode)[0]


def carry_forward(slot: KvSlot, prev: KvSlot, pos0: int) -> None:
    """Give a per_loop cache the positions before pos0 that its pass skipped (tokens that
    left the loop early under a gate, or ran fewer passes than this one): each such
    position reads, in this pass's cache, the keys and values of the last pass it ran,
    which `prev` (the previous pass's cache, already complete up to pos0) holds -- what
    a last_loop cache holds for it too. Rows a window has already dropped from `prev`
    are ones no later position reads."""
    lo = slot.first + slot.n
    if lo < prev.first:
        slot.n, slot.first, lo = 0, prev.first, prev.first
    a, b = lo - prev.first, pos0 - prev.first
    slot.put(prev.k[a:b], prev.v[a:b], False)


class _Seg:
    """One sequence's rows in a batched step: h[r0 : r0 + t] of the step (r: where they
    sit in the array a sub-layer is given), at pass `loop`."""
    __slots__ = ("early", "i", "loop", "loops", "pos0", "prompt", "r", "r0", "readout",
                 "ropes", "st", "t")

    def __init__(self, i, st, r0, t, loops, prompt):
        self.i, self.st, self.r0, self.t, self.pos0, self.loops = i, st, r0, t, st.pos, loops
        self.prompt = prompt
        self.r, self.loop, self.early, self.readout = r0, 0, False, False


def _rows(group, ordered, force=False):
    """Row indices of `group`'s sequences in the step's rows (None: all of them)."""
    if len(group) == len(ordered) and not force:
        return None
    return np.concatenate([np.arange(sg.r0, sg.r0 + sg.t) for sg in group])
