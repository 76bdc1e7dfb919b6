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

The forward is `forward_batch` (one sequence is a batch of one): each round takes a
piece of at most HOST_CHUNK ids of every sequence and runs the stack over all their
rows, every product through `batch_products` (a generated token's row as matvec, a
prompt row as a prompt chunk's matmat). A sub-layer given one generated token's row runs
as one fused kernel call (`dory_attn_row`, `dory_mlp_row`: the same bits).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...kernels import _kernels as K
from ...errors import ConfigError, CortiqError
from ...kernels.tensor import QTensor, batch_products
from .config import DoryConfig, DoryOptions
from ..batch_rows import per_sequence, prompt_flags
from ..base import Capabilities, ModelBase, check_feed, is_prompt
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

@dataclass
class MlpWeights:
    gate: QTensor
    up: QTensor
    down: QTensor
    sg: np.ndarray      # suv_gate * sqrt(hidden), [ffn]
    su: np.ndarray      # suv_up * sqrt(hidden), [ffn]
    alpha: np.ndarray   # |mlp_alpha * alpha0 / sigma0|, [hidden]

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
    #: one-row chunks run each sub-layer as one fused kernel call (bit-identical to the
    #: general path, which tests compare it with by switching this off)
    fused_rows = True

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
        self._input_block = range(self.n_in)
        self._recurrent_block = rec
        self._output_block = range(self.n_in + self.n_rec, self.n_in + self.n_rec + self.n_out)
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
        # a prompt goes to the scheduler in the forward's own chunks; in one piece with
        # the far field, whose exact tail is placed from the end of a feed
        self.capabilities = Capabilities(
            rollback=True, batch_unit=None if self.o1rt is not None else HOST_CHUNK,
            far_field=self.o1rt is not None)
        # what a saved state's identity names besides the file (cortiq.runtime.state)
        self.options = {"loops": self.loops, "kv_mode": self.kv_mode,
                        "prompt_loops": self.prompt_loops}

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

    def matrices(self) -> list[QTensor]:
        """Every matrix the forward multiplies by: each sub-layer's projections and the
        head (the embedding is only read by rows)."""
        mats = [self.head_w]
        for w in self.layers:
            mats += ([w.q, w.k, w.v, w.g, w.o] if isinstance(w, AttnWeights)
                     else [w.gate, w.up, w.down])
        return mats

    # -- the forward -----------------------------------------------------------
    def forward_batch(self, states, ids_list, wants, prompts=None) -> list:
        """The forward: the ids of several sequences (one sequence is a batch of one),
        each run from its state's position. Each sequence's ids are cut into HOST_CHUNK
        pieces; the pieces of one round go through each sub-layer together (every
        matrix read once for all their rows), attention, the KV slots, the far field
        and the early-exit gate per sequence. `prompts` (a flag per sequence; None:
        whether it has several ids) picks each row's products and whether the gate may
        end its token. Returns one result per sequence: None ("none"), [vocab]
        ("last") or [n, vocab] ("all")."""
        if not len(states) == len(ids_list) == len(wants):
            raise ValueError(f"forward_batch: {len(states)} states, {len(ids_list)} feeds "
                             f"and {len(wants)} wants")
        ids_list = [check_feed(ids, want, self.vocab) for ids, want in zip(ids_list, wants)]
        outs: list[list[np.ndarray]] = [[] for _ in states]
        for segs, h in self._rounds(states, ids_list, wants, prompt_flags(prompts, ids_list)):
            # the rows the head reads: every row of an "all" piece (a prompt piece's with
            # the prompt's products), the last row of a feed for "last"
            picks: list[tuple[int, int]] = []
            rows: list[int] = []
            decode: list[bool] = []
            for sg in segs:
                if sg.st.exit_logits is not None:  # the gate's read-out ended this token
                    if sg.want != "none":
                        outs[sg.i].append(sg.st.exit_logits[None, :])
                    sg.st.exit_logits = None
                elif sg.want == "all":
                    picks.append((sg.i, sg.t))
                    rows.extend(range(sg.r0, sg.r0 + sg.t))
                    decode.extend([not sg.prompt] * sg.t)
                elif sg.want == "last":
                    picks.append((sg.i, 1))
                    rows.append(sg.r0 + sg.t - 1)
                    decode.append(True)
            if picks:  # the head, once for all of them
                lg = batch_products([self.head_w], h[rows],
                                    True if all(decode) else np.asarray(decode))[0]
                lg *= self.logit_scale
                j = 0
                for i, k in picks:
                    outs[i].append(lg[j:j + k])
                    j += k
        return per_sequence(outs, wants, self.vocab)

    def final_hidden(self, st: DoryState, ids) -> np.ndarray:
        """The hidden states [len(ids), hidden] the head reads, for `ids` run from
        st.pos through every loop (`cortiq.runtime.embeddings` pools them)."""
        a = check_feed(ids, "all", self.vocab)
        rows = []
        for _, h in self._rounds([st], [a], ["all"], [is_prompt(None, a.size)]):
            st.exit_logits = None  # a token the gate ended: h holds its state all the same
            rows.append(h)
        return np.concatenate(rows, axis=0) if rows else np.zeros((0, self.hidden), np.float32)

    def _rounds(self, states, ids_list, wants, prompts):
        """Run the sequences' pieces round by round; yields (pieces, h) after each round,
        h [rows, hidden] the rows the head reads (piece j owns h[r0 : r0 + t])."""
        for st in states:
            if not st.slots:
                st.slots = [[] for _ in range(self.attn_layers)]
            if st.scratch is None:
                st.scratch = np.empty(self._scratch, np.float32)
        at = [0] * len(states)
        # o1: the far field is rebuilt before a feed's last EXACT_TAIL rows
        tail_from = [st.pos + ids.size - EXACT_TAIL for st, ids in zip(states, ids_list)]
        while True:
            # this round's piece of every sequence with ids left: at most HOST_CHUNK rows
            segs, r0 = [], 0
            for i, (st, ids) in enumerate(zip(states, ids_list)):
                if at[i] >= ids.size:
                    continue
                if self.o1rt is not None and st.pos >= tail_from[i]:  # o1
                    self.o1rt.finish_exact(st)
                t = min(HOST_CHUNK, ids.size - at[i])
                want = wants[i] if at[i] + t == ids.size or wants[i] == "all" else "none"
                segs.append(_Seg(i, st, ids[at[i]:at[i] + t], r0, want,
                                 self._chunk_loops(want), prompts[i], self.gate is not None))
                at[i] += t
                r0 += t
            if not segs:
                break
            # the embeddings of every piece's ids, then the stack over all of them
            h = np.stack([self.embed.row(int(tok)) for sg in segs for tok in sg.ids]
                         ).astype(np.float32)
            self._stack(segs, h)
            for sg in segs:
                sg.st.pos += sg.t
            yield segs, h
        if self.o1rt is not None:  # o1: the far field built over the whole feed
            for st in states:
                self.o1rt.finish_exact(st)

    def _stack(self, segs: list[_Seg], h: np.ndarray) -> None:
        """The three blocks over one round's rows, in place: h ends as the rows the
        head reads (a token the gate ended leaves its logits in st.exit_logits)."""
        # each piece's rotary rows, at its positions
        for sg in segs:
            sg.ropes = (self.rope_sliding(sg.pos0, sg.t), self.rope_full(sg.pos0, sg.t))
            sg.loop = 0
        # the input block, once
        self._block(self._input_block, segs, segs, h)
        # the recurrent block: pass i over every piece that runs more than i passes
        inp = h.copy()
        state = inp.copy()
        for i in range(max(sg.passes for sg in segs)):
            group = [sg for sg in segs if i < sg.passes]
            for sg in group:
                sg.loop = i
            self._recurrent_pass(group, segs, state, inp)
        np.copyto(h, state)
        # who leaves the loop now: every ungated piece; a gated token as the gate says
        leave = [sg for sg in segs if not sg.early or self._gate_lets_go(sg, state)]
        stay = [sg for sg in segs if sg.early and not sg.leaves]
        # the output block on the rows that leave
        for sg in leave:
            sg.loop = 0
        if leave:
            self._block(self._output_block, leave, segs, h)
        # conf: a read-out under the threshold sends its token to the second pass after all
        stay += self._unsure_read_outs([sg for sg in leave if sg.readout], h)
        # the second pass, and the output block again, for the tokens that stay
        if stay:
            stay.sort(key=lambda sg: sg.r0)
            for sg in stay:
                sg.loop = 1
            self._recurrent_pass(stay, segs, state, inp)
            rows = _rows(stay, segs)
            if rows is None:
                np.copyto(h, state)
            else:
                h[rows] = state[rows]
            for sg in stay:
                sg.loop = int(sg.readout)  # a read-out's output rows are rewritten
            self._block(self._output_block, stay, segs, h)
        # the gate's tally, then what follows each piece: o1's store and seal, window trims
        for sg in segs:
            if sg.early:
                sg.st.gate_tokens += 1
                sg.st.gate_one += int(sg.st.exit_logits is not None
                                      or (sg.leaves and not sg.readout))
            if self.o1rt is not None:  # o1: sealed rows to the store, the seal
                self.o1rt.after_chunk(sg.st, sg.pos0, sg.t)
            # trimming waits for the piece's end: a later last_loop pass reads behind it
            for ordinal, keep in self._trims:
                for s in sg.st.slots[ordinal]:
                    s.trim(keep)

    def _recurrent_pass(self, group, segs, state: np.ndarray, inp: np.ndarray) -> None:
        """One pass of the recurrent block over `group`'s rows (of `segs`' rows), each at
        its piece's loop: state = (R((state + inp)^))^."""
        rows = _rows(group, segs)
        hs = state + inp if rows is None else state[rows] + inp[rows]
        justnorm(hs)
        self._block(self._recurrent_block, group, group, hs)
        justnorm(hs)
        if rows is None:
            np.copyto(state, hs)
        else:
            state[rows] = hs

    def _gate_lets_go(self, sg: _Seg, state: np.ndarray) -> bool:
        """Whether a gated token leaves after its first pass: recon, the router's score;
        conf, a read-out when the exit rate asks for one (its logits decide later)."""
        g = self.gate
        if g.kind == "recon":
            sg.leaves = g.router.score(state[sg.r0]) >= g.bias
        else:
            sg.leaves = sg.readout = sg.st.exits.probe()
        return sg.leaves

    def _unsure_read_outs(self, read, h: np.ndarray) -> list[_Seg]:
        """The conf gate's read-outs: a token whose top probability reaches the threshold
        ends with these logits (st.exit_logits); the others are returned, to stay."""
        if not read:
            return []
        lg = batch_products([self.head_w], h[[sg.r0 for sg in read]])[0]
        lg *= self.logit_scale
        unsure = []
        for sg, row in zip(read, lg):
            sure = top_prob(row) >= self.gate.threshold
            sg.st.exits.note(sure)
            if sure:
                sg.st.exit_logits = row
            else:
                sg.leaves = False
                unsure.append(sg)
        return unsure

    def _block(self, lis, group, segs, h: np.ndarray) -> None:
        """Sub-layers `lis` over `group`'s rows of h (h's rows belong to `segs`, in
        order; a proper subset is gathered and put back), each piece at its loop."""
        rows = _rows(group, segs)
        hs = h if rows is None else h[rows]
        r = 0
        for sg in group:
            sg.r = r
            r += sg.t
        # per row: a generated token's products (matvec) or a prompt row's (one flag when
        # every row is of one kind)
        kinds = {sg.prompt for sg in group}
        decode = (not kinds.pop() if len(kinds) == 1
                  else np.repeat([not sg.prompt for sg in group], [sg.t for sg in group]))
        for li in lis:
            self._layer(li, group, hs, decode)
        if rows is not None:
            h[rows] = hs

    def _layer(self, li: int, group, h: np.ndarray, decode) -> None:
        """One sub-layer and its residual over h, in place."""
        w = self.layers[li]
        # one generated token: the sub-layer as one fused kernel call (the same bits),
        # but for the far field's layers
        one = h.shape[0] == 1 and decode is True and self.fused_rows
        if isinstance(w, MlpWeights):
            if one:
                K.dory_mlp_row(w.gate.qmat, w.up.qmat, w.down.qmat, h, w.sg, w.su, w.alpha,
                               group[0].st.scratch, EPS)
                return
            out = self._mlp(w, h, decode)
        elif one and (w.sliding or self.o1rt is None):
            self._attn_row(group[0], w, li, h)
            return
        else:
            out = self._attn(li, w, group, h, decode)
        slerp(h, out, w.alpha)

    def _attn(self, li: int, w: AttnWeights, group, h: np.ndarray, decode) -> np.ndarray:
        """Attention over the rows of several pieces: the projections once for all rows,
        the rotation, cache and softmax per piece."""
        T = h.shape[0]
        nh, nk, hd = self.nh, self.nk, self.hd
        # q, k, v, g = W x
        q, k, v, g = batch_products((w.q, w.k, w.v, w.g), h, decode)
        y = np.empty((T, nh * hd), np.float32)
        window = self._window[li]
        far = self.o1rt is not None and not w.sliding
        for sg in group:
            r, t = sg.r, sg.t
            qs = q[r:r + t].reshape(t, nh, hd)
            ks = k[r:r + t].reshape(t, nk, hd)
            vs = v[r:r + t].reshape(t, nk, hd)
            # rotate, justnorm per head; q * s_q
            cos, sin = sg.ropes[0] if w.sliding else sg.ropes[1]
            K.qk_prep(qs, cos, sin, w.sq, EPS)
            K.qk_prep(ks, cos, sin, None, EPS)
            slot = self._slot(sg.st, w, li, sg.loop, sg.pos0)
            # a later pass over the piece rewrites its rows (last_loop, the output block)
            overwrite = sg.loop > 0 and self._rewrite[li]

            def exact(slot=slot, qs=qs, ks=ks, vs=vs, overwrite=overwrite, pos0=sg.pos0):
                slot.put(ks, vs, overwrite)
                return K.attn_gqa_window(qs, slot.k[:slot.n], slot.v[:slot.n], pos0, window,
                                         slot.first, float(self.attn_scale))
            # softmax(q.k / sqrt(hd)) v over the window (o1: the far field past the seal)
            ys = self.o1rt.attend(slot, qs, ks, vs, sg.pos0, overwrite, exact) if far \
                else exact()
            y[r:r + t] = ys.reshape(t, nh * hd)
        # y = (y * sigmoid(g * s_g))^, then O y
        K.gate_norm(y, g, w.sg, EPS)
        return batch_products((w.o,), y, decode)[0]

    def _attn_row(self, sg: _Seg, w: AttnWeights, li: int, h: np.ndarray) -> None:
        """`_attn` and the residual for one generated token, in one kernel call: the
        cache row is written in place (q, g and the heads live in st.scratch)."""
        slot = self._slot(sg.st, w, li, sg.loop, sg.pos0)
        if sg.loop > 0 and self._rewrite[li]:
            slot.n -= 1
        slot._reserve(slot.n + 1)
        cos, sin = sg.ropes[0] if w.sliding else sg.ropes[1]
        K.dory_attn_row(w.q.qmat, w.k.qmat, w.v.qmat, w.g.qmat, w.o.qmat, h, w.sq, w.sg,
                        w.alpha, cos, sin, slot.k, slot.v, slot.n, slot.first, sg.pos0,
                        self._window[li], self.attn_scale, sg.st.scratch, EPS)
        slot.n += 1

    def _mlp(self, w: MlpWeights, h: np.ndarray, decode) -> np.ndarray:
        """D (silu(g * s_g) * (u * s_u))^ with g, u = W x."""
        g, u = batch_products((w.gate, w.up), h, decode)
        K.silu_mul(g, u, w.sg, w.su)
        justnorm(g)
        return batch_products((w.down,), g, decode)[0]

    # -- per-layer lookups ---------------------------------------------------------
    def _chunk_loops(self, want: str) -> int:
        """Passes of the recurrent block over a piece (prompt_loops: fewer for a prompt
        piece whose logits nobody reads, under last_loop)."""
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

    def _keep(self, w: AttnWeights) -> int:
        if w.sliding:
            return self.window
        return self.full_window if self.full_window else (1 << 62)


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
    """One sequence's piece in a round: its ids, rows h[r0 : r0 + t] of the round (r:
    where they sit in the rows a sub-layer is given), the passes it runs and the pass
    it is at (`loop`); early: a generated token the gate may end after one pass
    (`leaves` the loop then; `readout`: the conf gate read its first pass out)."""
    __slots__ = ("early", "i", "ids", "leaves", "loop", "passes", "pos0", "prompt", "r",
                 "r0", "readout", "ropes", "st", "t", "want")

    def __init__(self, i, st, ids, r0, want, loops, prompt, gated):
        self.i, self.st, self.ids, self.r0, self.want = i, st, ids, r0, want
        self.t, self.pos0, self.prompt = ids.size, st.pos, prompt
        self.early = gated and self.t == 1 and not prompt   # generated tokens only
        self.passes = 1 if self.early else loops
        self.r, self.loop, self.leaves, self.readout = r0, 0, True, False
        self.ropes: tuple = ()   # (sliding, full) rotary rows, set as the round starts


def _rows(group, segs):
    """Row indices of `group`'s pieces in the rows of `segs` (None: all of them)."""
    if len(group) == len(segs):
        return None
    return np.concatenate([np.arange(sg.r0, sg.r0 + sg.t) for sg in group])
