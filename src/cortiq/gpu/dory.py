"""Dory on the GPU: the forward of src/cortiq/models/dory/model.py as WebGPU compute.

A chunk of up to HOST_CHUNK rows (one token when decoding) is ONE submission: the
embedding, every sub-layer of the three blocks and every pass of the recurrent block,
the head and (greedy) the argmax are recorded into one command buffer, and one
readback returns the logits, or only the token. Per sub-layer:

    attention  matvec Q|K|V|G (one dispatch over the four matrices)
               qk_prep: rotate, justnorm per head, q * s_q, k/v into the KV ring
               attention: windowed GQA, online softmax (decode: split over key ranges,
               and qk_prep's work done in the same dispatch: attention_qk)
               matvec O, whose input stage applies the output gate and the justnorm
               (decode: and merges the attention's splits)
               rownorm: the nGPT residual (decode: in the next product's input stage)
    mlp        matvec gate|up; matvec down with silu(a) * b and the justnorm in its input
               stage; the residual as above

KV caches live on the device: a ring of window + HOST_CHUNK rows for sliding (and
`full_window`) layers, a linear cache grown by doubling for full layers; position p
sits at row p % ring. `per_loop` keeps one cache per (recurrent layer, loop),
`last_loop` one per layer with later passes rewriting the chunk's rows, as on the host.

The model wraps the host `DoryModel` (its validated config, options and load-time
transforms) and implements the model protocol (`cortiq.models.base`), so Session, LLM
and the server run it as they run the host.
"""
from __future__ import annotations

import time

import numpy as np

from ..kernels._config import env
from ..errors import ConfigError, CortiqError
from ..models.base import Capabilities, check_feed, is_prompt
from ..models.dory.model import EPS, HOST_CHUNK, AttnWeights, ExitRate, top_prob
from .device import Device
from .model import SEQUENCE_PART, GpuModel, RowSlices
from .kernels import (FIXED, MATMAT_NT, NONE, Dispatch, GpuMatrix, MatvecOp, ParamArena,
                      WeightUpload, embed_kinds, embed_pipeline, fixed_pipeline, resolve,
                      rows_block_words, u32s)

#: rows of a full (unwindowed) layer's KV cache before its first growth
FULL_CAP0 = 256
#: key ranges a decode row's attention is split into per query head (flash-decoding:
#: nh x splits workgroups instead of nh; the O product merges the partials).
#: CORTIQ_GPU_ATTN_SPLITS overrides it (1: one workgroup a head, no merge).
ATTN_SPLITS = 4
# fuse_residual (default True) takes each decode residual in the next product's input
# stage (29 fewer dispatches a token on the bench model) instead of a rownorm pass;
# False keeps the passes (A/B measurements: docs/PERFORMANCE.md section 15).
# fuse_qk (default True) does a decode row's qk_prep work (rotary, justnorm, s_q, the new
# k/v into the ring) inside the attention dispatch (attention_qk: one dispatch fewer per
# attention sub-layer); False keeps the qk_prep pass. Prompt chunks always run qk_prep.


def _attn_splits(value, nh: int) -> int:
    if value is None:
        raw = (env("CORTIQ_GPU_ATTN_SPLITS") or "").strip()
        try:
            value = int(raw) if raw else ATTN_SPLITS
        except ValueError:
            raise ConfigError(f"CORTIQ_GPU_ATTN_SPLITS: expected an integer, got {raw!r}") \
                from None
    if int(value) < 1:
        raise ConfigError(f"attention splits: expected >= 1, got {value}")
    return max(1, min(int(value), 256 // max(nh, 1)))


class GpuDoryState:
    """One sequence on the device: position, KV rings and the recorded programs."""

    def __init__(self):
        self.pos = 0
        self.hi = -1            # highest position ever written (rollback bound)
        self.slots: list = []   # [attention ordinal][slot] -> [k, v, ring, windowed]
        self.programs: dict = {}
        self.full_cap = FULL_CAP0
        self.arena = None
        self.exits = ExitRate()  # the conf gate's running exit rate
        self.gate_tokens = 0
        self.gate_one = 0


class GpuDoryModel(GpuModel):
    """The host DoryModel's forward on the GPU (see the module docstring): one layer
    program (`_skeleton`) for a sequence's decode rows and prompt chunks and for decode
    rows of several sequences in one submission (`forward_rows`); prompt rows and
    generated tokens are told apart (the conf gate exits generated tokens only)."""

    arch = "dory"
    int8_products = True

    def __init__(self, host, device: Device | None = None, attn_splits: int | None = None,
                 fuse_residual: bool = True, fuse_qk: bool = True, rows_matvec: bool = True):
        if host.capabilities.far_field:
            raise ConfigError("device='gpu': Dory's o1 far field runs on the CPU only "
                              "(open the model with o1='off' for the GPU)")
        if host.gate is not None and host.gate.kind != "conf":
            raise ConfigError(f"device='gpu': the {host.gate.kind} early-exit gate runs on the "
                              "CPU only (the GPU runs gate='conf:T')")
        if host.gate is not None and host.kv_mode == "per_loop" and host.n_rec:
            raise ConfigError("device='gpu': the early-exit gate needs kv_mode='last_loop' "
                              "(a token that exits after one pass leaves no second-pass keys "
                              "for a per_loop cache)")
        self.gate = host.gate
        self.host = host
        self.dev = dev = device or Device.get()
        self.vocab, self.hidden, self.ffn = host.vocab, host.hidden, host.ffn
        self.nh, self.nk, self.hd = host.nh, host.nk, host.hd
        if self.hd > 512 or self.hd % 4:
            raise ConfigError(f"device='gpu': head_dim {self.hd}: the attention kernel takes "
                              "a multiple of 4 up to 512")
        self.file = host.file
        self.max_seq_len = host.capabilities.max_seq_len
        # rollback as on the host; a prompt is read in the host's chunks, so that the
        # last_loop caches end up as a straight run leaves them
        self.capabilities = Capabilities(rollback=True, batch_unit=HOST_CHUNK, greedy_chain=True,
                                         max_seq_len=self.max_seq_len)
        self.options = host.options
        self.loops, self.kv_mode = host.loops, host.kv_mode
        self.layers = host.layers
        self.n_in, self.n_rec, self.n_out = host.n_in, host.n_rec, host.n_out
        self.q_size, self.kv_size = self.nh * self.hd, self.nk * self.hd
        self.qkvg_w = 2 * self.q_size + 2 * self.kv_size
        t0 = time.perf_counter()
        # ---- weights, once, in their stored dtypes
        upload = WeightUpload(dev)
        self.mats: list[GpuMatrix] = upload.mats
        vec, mat = upload.vec, upload.mat

        self.lw = []
        for w in host.layers:
            if isinstance(w, AttnWeights):
                self.lw.append(dict(attn=True, q=mat(w.q), k=mat(w.k), v=mat(w.v), g=mat(w.g),
                                    o=mat(w.o), sq=vec(w.sq), sg=vec(w.sg), alpha=vec(w.alpha),
                                    sliding=w.sliding, ordinal=w.ordinal))
            else:
                self.lw.append(dict(attn=False, gate=mat(w.gate), up=mat(w.up),
                                    down=mat(w.down), sg=vec(w.sg), su=vec(w.su),
                                    alpha=vec(w.alpha)))
        self.embed = mat(host.embed)
        self.head = mat(host.head_w)
        self.v_logit = vec(host.logit_scale)
        self.vbuf = upload.vector_buffer()
        self.weight_bytes = sum(m.nbytes for m in self.mats)
        # ---- activations for a chunk of up to HOST_CHUNK rows
        T, H = HOST_CHUNK, self.hidden
        f4 = 4
        # regions of hb: x, the recurrent block's input and state, and x's other place
        # (a decode step's fused residuals alternate between rx and ralt)
        self.rx, self.rinp, self.rstate, self.ralt = 0, T * H, 2 * T * H, 3 * T * H
        self.hb = dev.buffer(4 * T * H * f4)
        self.qkvg = dev.buffer(T * self.qkvg_w * f4)
        self.att = dev.buffer(T * self.q_size * f4)
        self.out = dev.buffer(T * H * f4)
        self.gu = dev.buffer(T * 2 * self.ffn * f4)
        self.logits = dev.buffer(T * self.vocab * f4, copy_src=True)
        self.ids = dev.buffer(T * 4)
        self.res = dev.buffer(16, copy_src=True)
        self.step = dev.buffer(16, uniform=True)
        self.rope = dev.buffer(4 * T * (self.hd // 2) * f4)
        self.splits = _attn_splits(attn_splits, self.nh)
        self.stage_logits = None
        self.stage_ids = [dev.staging(16), dev.staging(16)]
        self.apart = dev.buffer(self.nh * max(self.splits, 1) * (self.hd + 4) * f4)
        # ---- the products (state-independent), their parameters in one arena
        self.arena = ParamArena(dev)
        self._ops: list = []
        for w in self.lw:
            if w["attn"]:
                w["qkvg_op"] = MatvecOp(dev, [w["q"], w["k"], w["v"], w["g"]], self.arena,
                                        x=self.hb, x_off=self.rx, x_stride=H, y=self.qkvg,
                                        y_off=0, y_stride=self.qkvg_w, vbuf=self.vbuf)
                w["o_op"] = MatvecOp(dev, [w["o"]], self.arena, x=self.att, x_off=0,
                                     x_stride=self.q_size, x2=self.qkvg,
                                     x2_off=self.q_size + 2 * self.kv_size,
                                     x2_stride=self.qkvg_w, y=self.out, y_off=0, y_stride=H,
                                     vbuf=self.vbuf, v_a=w["sg"], pro=1, eps=EPS)
                if self.splits > 1:
                    try:
                        w["o_split_op"] = MatvecOp(
                            dev, [w["o"]], self.arena, x=self.apart, x_off=0, x_stride=0,
                            x2=self.qkvg, x2_off=self.q_size + 2 * self.kv_size, x2_stride=0,
                            y=self.out, y_off=0, y_stride=H, vbuf=self.vbuf, v_a=w["sg"],
                            pro=3, eps=EPS, hd=self.hd, splits=self.splits)
                    except ConfigError:     # no staged decode matvec for this shape
                        self.splits = 1
            else:
                w["gu_op"] = MatvecOp(dev, [w["gate"], w["up"]], self.arena, x=self.hb,
                                      x_off=self.rx, x_stride=H, y=self.gu, y_off=0,
                                      y_stride=2 * self.ffn, vbuf=self.vbuf)
                w["down_op"] = MatvecOp(dev, [w["down"]], self.arena, x=self.gu, x_off=0,
                                        x_stride=2 * self.ffn, x2_off=self.ffn, y=self.out,
                                        y_off=0, y_stride=H, vbuf=self.vbuf, v_a=w["sg"],
                                        v_b=w["su"], pro=2, eps=EPS)
            w["slerp"] = self.arena.ref(u32s(H, 0, self.rx, NONE, 0, NONE, w["alpha"], 0, 1,
                                             float(EPS), 0, 0))
        self.head_last = MatvecOp(dev, [self.head], self.arena, x=self.hb, x_off=self.rx,
                                  x_stride=H, y=self.logits, y_off=0, y_stride=self.vocab,
                                  vbuf=self.vbuf, v_out=self.v_logit, last_row=True)
        self.head_all = MatvecOp(dev, [self.head], self.arena, x=self.hb, x_off=self.rx,
                                 x_stride=H, y=self.logits, y_off=0, y_stride=self.vocab,
                                 vbuf=self.vbuf, v_out=self.v_logit)
        self.p_embed = self.arena.ref(u32s(H, self.rx, len(self.embed.parts), 0)
                                      + _tables(self.embed))
        mix = lambda d1, d2, a, b, norm: self.arena.ref(  # noqa: E731
            u32s(H, 1, d1, d2, a, b, 0, 0, norm, float(EPS), 0, 0))
        self.p_in_copy = mix(self.rinp, self.rstate, self.rx, NONE, 0)     # inp = state = x
        self.p_loop_in = mix(self.rx, NONE, self.rstate, self.rinp, 1)     # x = (state + inp)^
        self.p_loop_out = mix(self.rstate, self.rx, self.rx, NONE, 1)      # state = x = x^
        self.p_argmax = self.arena.ref(u32s(self.vocab, 0, 0, 0))
        self.arena.upload()
        self._static: dict = {}
        self._params: dict = {}
        self.fuse_residual = fuse_residual
        self.fuse_qk = bool(fuse_qk)
        if fuse_residual:   # the decode matvec must stage its input to take the residual
            try:
                w = self.lw[0]
                MatvecOp(dev, [w["q"]] if w["attn"] else [w["gate"]], ParamArena(dev),
                         x=self.hb, x_off=self.rx, x_stride=H, x2=self.out, y=self.out,
                         y_off=0, y_stride=H, vbuf=self.vbuf, pro=4)
            except ConfigError:
                self.fuse_residual = False
        self._rows: _RowProducts | None = None
        self._skeletons: dict = {}
        # rows_matvec (default True): the products of a rows submission (forward_rows) run
        # the rows matvec (matvecb.wgsl, the decode matvec's row dots over up to 8 input
        # rows; input stages as rowstage passes); False, or shapes it does not take: the
        # prompt matmat
        self.rows_matvec = bool(rows_matvec)
        self.load_seconds = time.perf_counter() - t0
        self._decode_program: list | None = None

    # ---- sequences ----------------------------------------------------------------
    def new_state(self) -> GpuDoryState:
        st = GpuDoryState()
        dev = self.dev
        rec = range(self.n_in, self.n_in + self.n_rec)
        per_row = self.kv_size * 4
        st.slots = [None] * self.host.attn_layers
        for li, w in enumerate(self.lw):
            if not w["attn"]:
                continue
            keep = self.host.window if w["sliding"] else (self.host.full_window or 0)
            loops = max(self.loops, 2) if self.gate is not None else self.loops
            n = loops if (self.kv_mode == "per_loop" and li in rec) else 1
            slots = []
            for _ in range(n):
                ring = keep + HOST_CHUNK if keep else st.full_cap
                slots.append([dev.buffer(ring * per_row, copy_src=True),
                              dev.buffer(ring * per_row, copy_src=True), ring, bool(keep)])
            st.slots[w["ordinal"]] = slots
        return st

    def _grow(self, st: GpuDoryState, need: int) -> None:
        """Give the full layers' caches room for `need` positions (copying what they hold)."""
        if need <= st.full_cap:
            return
        cap = self._grown_cap(st.full_cap, need)
        full = [s for slots in st.slots for s in slots or () if not s[3]]
        news = self._grown_copies([b for s in full for b in s[:2]], cap * self.kv_size * 4)
        for i, s in enumerate(full):
            s[0], s[1], s[2] = news[2 * i], news[2 * i + 1], cap
        st.full_cap = cap
        st.programs.clear()
        st.arena = None

    def can_rollback(self, st: GpuDoryState, n: int) -> bool:
        """True when every ring still holds the keys a token at n reads."""
        if n >= st.pos:
            return True
        for li, w in enumerate(self.lw):
            if not w["attn"]:
                continue
            keep = self.host.window if w["sliding"] else (self.host.full_window or 0)
            if keep and max(0, n - keep + 1) <= st.hi - (keep + HOST_CHUNK):
                return False
        return True

    def kv_bytes(self, st: GpuDoryState) -> int:
        per_row = self.kv_size * 4 * 2
        return sum(min(st.pos, s[2]) * per_row for slots in st.slots for s in slots or ())

    # ---- the forward ----------------------------------------------------------------
    def forward(self, st: GpuDoryState, ids, want: str = "last", prompt: bool | None = None):
        """Run tokens `ids` from position st.pos. want: "none" -> None, "last" ->
        [vocab], "all" -> [len(ids), vocab] (float32). prompt: whether the rows are
        prompt rows (None: whether there are several), which the conf gate never
        exits early, as on the CPU."""
        ids = self._check(ids, want)
        prompt = is_prompt(prompt, ids.size)
        return self._forward_chunks(ids, want, HOST_CHUNK,
                                    lambda chunk, w: self._run_chunk(st, chunk, w, prompt))

    def forward_greedy(self, st: GpuDoryState, ids) -> int:
        """Run `ids` and return the argmax of the last row's logits, computed on the
        device (one 4-byte readback)."""
        ids = self._check(ids, "last")
        if ids.size == 0:
            raise CortiqError("forward_greedy: no tokens")
        prompt = ids.size > 1
        for start in range(0, ids.size - 1, HOST_CHUNK):
            chunk = ids[start:min(start + HOST_CHUNK, ids.size - 1)]
            self._run_chunk(st, chunk, "none", prompt)
        return self._run_chunk(st, ids[-1:], "greedy", prompt)

    def greedy_chain(self, st: GpuDoryState, first: int, limit: int | None = None):
        """`GpuModel.greedy_chain`; with the conf gate, whose exit decision is taken on
        the host between passes, one `forward_greedy` a token instead."""
        if self.gate is None:
            yield from super().greedy_chain(st, first, limit)
            return
        self._check(np.array([first]), "last")
        tok, n = first, 0
        while limit is None or n < limit:
            tok = self.forward_greedy(st, [tok])
            n += 1
            yield tok

    def _greedy_pass(self, st: GpuDoryState):
        self._prepare(st, 1)
        self._write_step(st.pos, 1)
        enc = self._record(st, 1, self.loops, "greedy")
        st.hi = max(st.hi, st.pos)
        st.pos += 1
        return enc

    # ---- decode rows of several sequences in one submission ---------------------------
    batch_rows = HOST_CHUNK

    def batchable(self, ids, want: str, prompt: bool) -> bool:
        """One id, and no conf gate (it decides per token on the host between passes)."""
        return ids.size == 1 and self.gate is None

    def forward_rows(self, states, tokens, wants) -> list:
        """One new token for each of up to HOST_CHUNK sequences (distinct states), in
        one submission of the layer program over the rows (`_skeleton`, mode "rows"):
        every product reads its weights once for all the rows, the attention runs per
        sequence over its own KV ring at its own position, and the head writes every
        row's logits. Rows whose feed runs fewer recurrent passes (`prompt_loops` with
        want "none") go in a submission of their own."""
        if len(states) > self.batch_rows:
            raise ConfigError(f"forward_rows: {len(states)} rows exceed {self.batch_rows}")
        outs: list = [None] * len(states)
        by_loops: dict[int, list[int]] = {}
        for i, want in enumerate(wants):
            loops = self.host._chunk_loops("none" if want == "none" else "last")
            by_loops.setdefault(loops, []).append(i)
        for loops, idx in by_loops.items():
            head = any(wants[i] != "none" for i in idx)
            sts, toks = [states[i] for i in idx], [tokens[i] for i in idx]
            if len(idx) == 1:       # one row: the one-sequence decode program
                lg = self._submit(sts[0], np.asarray(toks, np.int64),
                                  "last" if head else "none", loops)
            else:
                R = self._rows_setup()
                lg = self._submit_rows(sts, toks, self._skeleton("rows", loops,
                                                                 "all" if head else "none"),
                                       R.slices, head)
            for j, i in enumerate(idx):     # rows of the readback's own array: no copy
                if wants[i] == "last":
                    outs[i] = lg[j]
                elif wants[i] == "all":
                    outs[i] = lg[j:j + 1]
        return outs

    def _rows_setup(self) -> _RowProducts:
        """The per-row buffers and the products over rows, made on first use."""
        if self._rows is None:
            self._rows = _RowProducts(self)
            self._skeletons = {k: v for k, v in self._skeletons.items() if k[0] != "rows"}
        return self._rows

    def _rope_row(self, pos: int) -> np.ndarray:
        cs, ss = self.host.rope_sliding(pos, 1)
        cf, sf = self.host.rope_full(pos, 1)
        return np.concatenate([np.ravel(a) for a in (cs, ss, cf, sf)]).astype(np.float32)

    def _advance(self, st, t: int) -> None:
        st.hi = max(st.hi, st.pos + t - 1)
        st.pos += t

    def _check(self, ids, want):
        return check_feed(ids, want, self.vocab)

    def _prepare(self, st, t):
        self._grow(st, st.pos + t)

    def _write_step(self, pos0: int, t: int) -> None:
        q = self.dev.queue
        q.write_buffer(self.step, 0, np.array([t, pos0, 0, 0], np.uint32))
        cs, ss = self.host.rope_sliding(pos0, t)
        cf, sf = self.host.rope_full(pos0, t)
        q.write_buffer(self.rope, 0, np.concatenate([np.ravel(a) for a in (cs, ss, cf, sf)])
                       .astype(np.float32))

    def _run_chunk(self, st, chunk, want, prompt: bool):
        if self.gate is not None and chunk.size == 1 and not prompt:
            return self._gated_row(st, chunk, want)
        return self._submit(st, chunk, want, self.host._chunk_loops(
            "none" if want == "none" else "last"))

    def _gated_row(self, st, chunk, want):
        """One decode row under the conf gate (DoryModel._stack's gate): when the exit rate
        asks for a probe, the first pass is read out (one submission, the logits the
        gate needs); a confident token ends there, the others run the second pass and
        the output block again in a second submission. Without a probe: both passes in
        one submission."""
        g = self.gate
        stay = True
        if st.exits.probe():
            lg = self._submit(st, chunk, "last", 1, advance=False)
            stay = top_prob(lg[0]) < g.threshold
            st.exits.note(not stay)
            if stay:
                lg = self._submit(st, chunk, "last", 2, stage="second", advance=False)
        else:
            lg = self._submit(st, chunk, "last", 2, advance=False)
        st.hi = max(st.hi, st.pos)
        st.pos += 1
        st.gate_tokens += 1
        st.gate_one += int(not stay)
        if want == "greedy":
            return int(np.argmax(lg[0]))
        return None if want == "none" else lg

    def _submit(self, st, chunk, want, loops, stage="full", advance=True):
        t = int(chunk.size)
        dev = self.dev
        self._prepare(st, t)
        self._write_step(st.pos, t)
        dev.queue.write_buffer(self.ids, 0, chunk.astype(np.uint32))
        prog = self._program(st, t == 1, loops, want, stage)
        nbytes = 0
        stage = None
        copy = None
        if want in ("last", "all"):
            rows = t if want == "all" else 1
            nbytes = rows * self.vocab * 4
            stage = self._logits_stage(nbytes)
            copy = (self.logits, stage, nbytes)
        elif want == "greedy":
            stage = self.stage_ids[0]
            copy = (self.res, stage, 16)
        done = dev.run(prog, t, copy)
        if advance:
            self._advance(st, t)
        if want == "greedy":
            return self._greedy_token(stage, st.pos - 1, done)
        if stage is None:
            return None
        return dev.read(stage, nbytes, after=done).view(np.float32).reshape(-1, self.vocab)

    def _record(self, st, t, loops, want, stage="full"):
        return self.dev.record(self._program(st, t == 1, loops, want, stage), t)

    # ---- programs: the dispatch lists of a chunk ------------------------------------
    def _program(self, st, one: bool, loops: int, want: str, stage: str = "full") -> list:
        """A sequence's program: a decode row (one) or a prompt chunk, its attention on
        the state's own rings; made once per state."""
        key = (one, loops, want, stage)
        prog = st.programs.get(key)
        if prog is None:
            mode = "decode" if one else "chunk"
            prog = self._resolve(self._skeleton(mode, loops, want, stage),
                                 lambda m: self._sequence_part(st, m, None))
            st.programs[key] = prog
            if one and want in ("last", "greedy"):
                self._decode_program = prog
        return prog

    def _param(self, data: bytes):
        """A uniform block built after load (a decode program's own parameters)."""
        ref = self._params.get(data)
        if ref is None:
            arena = ParamArena(self.dev)
            ref = arena.ref(data)
            arena.upload()
            self._params[data] = ref
        return ref

    def _fused_product(self, w, cur: int, alpha: int):
        """A decode step's first product of sub-layer w (Q|K|V|G, gate|up, or the head
        for w None) taking the previous sub-layer's residual in its input stage: reads
        x at region cur and `out`, writes the new x to the other region."""
        key = ("fused", id(w), cur, alpha)
        d = self._static.get(key)
        if d is None:
            H = self.hidden
            dst = self.ralt if cur == self.rx else self.rx
            arena = ParamArena(self.dev)
            if w is None:
                mats, y, ys, vo = [self.head], self.logits, self.vocab, self.v_logit
            elif w["attn"]:
                mats, y, ys, vo = [w["q"], w["k"], w["v"], w["g"]], self.qkvg, self.qkvg_w, NONE
            else:
                mats, y, ys, vo = [w["gate"], w["up"]], self.gu, 2 * self.ffn, NONE
            op = MatvecOp(self.dev, mats, arena, x=self.hb, x_off=cur, x_stride=H, x2=self.out,
                          y=y, y_off=0, y_stride=ys, vbuf=self.vbuf, v_a=alpha, v_b=dst,
                          v_out=vo, last_row=w is None, pro=4, eps=EPS)
            arena.upload()
            d = op.dispatch(self.step, 1, self.int8)
            self._static[key] = d
        return d

    def _fixed(self, name, params, res, dims):
        dev = self.dev
        group = dev.bind(FIXED[name], resolve([params] + res))
        return Dispatch(fixed_pipeline(dev, name), group, dims, name)

    def _state_arena(self, st):
        """The parameters of a state's KV-dependent kernels (ring sizes per slot)."""
        if st.arena is not None:
            return st.arena
        a = ParamArena(self.dev)
        refs = {}
        for li, w in enumerate(self.lw):
            if not w["attn"]:
                continue
            keep = self.host.window if w["sliding"] else (self.host.full_window or 0)
            for si, s in enumerate(st.slots[w["ordinal"]]):
                ring = s[2]
                prep = a.ref(u32s(self.nh, self.nk, self.hd, self.qkvg_w, self.q_size,
                                  self.q_size + self.kv_size, w["sq"], ring,
                                  0 if w["sliding"] else 1, float(EPS), 0, 0))
                att = a.ref(u32s(self.nh, self.nk, self.hd, self.qkvg_w, keep, ring,
                                 self.q_size, float(self.host.attn_scale), self.q_size,
                                 self.q_size + self.kv_size, w["sq"],
                                 0 if w["sliding"] else 1, float(EPS), 0, 0, 0))
                refs[(li, si)] = (prep, att)
        a.upload()
        st.arena = (a, refs)
        return st.arena

    def _attention_part(self, st, marker: tuple, at) -> list:
        """The attention of sub-layer marker = (SEQUENCE_PART, mode, layer, slot) on
        state st's ring: qk_prep (unless the attention dispatch does its work) and the
        attention, over the chunk's rows (at None) or over one row of a rows submission
        (at: its RowSlices and row)."""
        _tag, mode, li, si = marker
        _arena, refs = self._state_arena(st)
        kb, vb = st.slots[self.lw[li]["ordinal"]][si][:2]
        p_prep, p_att = refs[(li, si)]
        row = None
        if at is None:
            step, qkvg, att, rope = self.step, self.qkvg, self.att, self.rope
        else:
            S, row = at
            step, qkvg, att, rope = S.step_at(row), S.at("qkvg", row), S.at("att", row), \
                S.rope_at(row)
        fused_qk = mode != "chunk" and self.fuse_qk
        ns = self.splits if self._split(mode) else 1
        part = []
        if not fused_qk:
            part.append(self._fixed("qk_prep", p_prep, [step, qkvg, self.vbuf, rope, kb, vb],
                                    (self.nh + self.nk, 1, 1) if row is not None
                                    else lambda t: (self.nh + self.nk, t, 1)))
        part.append(self._fixed("attention_qk" if fused_qk else "attention", p_att,
                                [step, qkvg, kb, vb, att, self.apart, self.vbuf, rope],
                                (self.nh, 1, 1) if row is not None
                                else lambda t, ns=ns: (self.nh, t, ns)))
        return part

    def _split(self, mode: str) -> bool:
        """Whether the attention runs split over key ranges: decode rows of one sequence
        only (the O product's input stage merging the splits exists in the decode
        matvec alone)."""
        return mode == "decode" and self.splits > 1

    def _skeleton(self, mode: str, loops: int, want: str, stage: str = "full") -> list:
        """Dory's layer program, written once for every way a chunk runs; the attention
        of each sub-layer is left as a (SEQUENCE_PART, mode, layer, slot) marker that
        `_sequence_part` fills per sequence. mode "decode": one sequence's decode row
        (the decode matvec, the split attention merged in the O product's input stage,
        each residual in the next product's input stage); "chunk": a prompt chunk (the
        matmat, a rownorm pass a residual); "rows": decode rows of several sequences
        (the products over the rows from `_RowProducts`, a rownorm pass a residual, the
        attention per row). stage "second" is the conf gate's continuation after a
        read-out first pass: the recurrent block's pass 1 and the output block again,
        from the inp/state rows the first submission left on the device."""
        R = self._rows_setup() if mode == "rows" else None
        key = (mode, loops, want, stage)
        made = self._skeletons.get(key)
        if made is not None:
            return made
        dev = self.dev
        rec = range(self.n_in, self.n_in + self.n_rec)
        per_loop = self.kv_mode == "per_loop"
        nt = 1 if mode == "decode" else MATMAT_NT
        prog: list = []
        rows = lambda t: (t, 1, 1)  # noqa: E731
        e = self.embed
        if stage == "full":
            prog.append(Dispatch(embed_pipeline(dev, e.dtype, len(e.parts)), dev.bind(
                embed_kinds(len(e.parts)), resolve([self.p_embed, self.step, self.ids, self.hb]
                                                   + [b for b, _r0, _r in e.parts])), rows,
                "embed"))

        def products(li: int, second: bool) -> list:
            """The products of sub-layer li before (Q|K|V|G, gate|up) or after (O, down)
            its attention or activation: the one place a mode picks its products."""
            w = self.lw[li]
            if R is not None:
                return R.products[li][int(second)]
            if not second:
                return self._chunk_product(w["qkvg_op"] if w["attn"] else w["gu_op"], nt)
            if w["attn"]:
                return self._chunk_product(w["o_split_op"] if self._split(mode)
                                           else w["o_op"], nt)
            return self._chunk_product(w["down_op"], nt)

        # A decode row applies each sub-layer's residual in the next product's input
        # stage (pending: the alpha offset not yet applied; cur: x's region); a rownorm
        # pass only where a mix or a full-logits head reads x.
        fuse = mode == "decode" and self.fuse_residual
        x_at = {"cur": self.rx, "pending": None}

        def first_product(w, li):
            if x_at["pending"] is None:
                prog.extend(products(li, False) if li is not None
                            else self._chunk_product(self.head_last, nt))
                return
            prog.append(self._fused_product(w, x_at["cur"], x_at["pending"]))
            x_at["cur"] = self.ralt if x_at["cur"] == self.rx else self.rx
            x_at["pending"] = None

        def flush():
            if x_at["pending"] is not None:
                p = self._param(u32s(self.hidden, 0, x_at["cur"], self.rx, 0, NONE,
                                     x_at["pending"], 0, 1, float(EPS), 0, 0))
                prog.append(self._fixed("rownorm", p, [self.step, self.hb, self.out,
                                                       self.vbuf], rows))
                x_at["cur"], x_at["pending"] = self.rx, None

        def layer(li, loop_i):
            w = self.lw[li]
            first_product(w, li)
            if w["attn"]:
                si = loop_i if (per_loop and li in rec) else 0
                prog.append((SEQUENCE_PART, mode, li, si))
            prog.extend(products(li, True))
            if fuse:
                x_at["pending"] = w["alpha"]
            else:
                prog.append(self._fixed("rownorm", w["slerp"], [self.step, self.hb, self.out,
                                                                self.vbuf], rows))

        def mix(p):
            flush()
            prog.append(self._fixed("rownorm", p, [self.step, self.hb, self.out, self.vbuf],
                                    rows))

        if stage == "full":
            for li in range(self.n_in):
                layer(li, 0)
            mix(self.p_in_copy)
        for i in (range(loops) if stage == "full" else (1,)):
            mix(self.p_loop_in)
            for li in rec:
                layer(li, i)
            mix(self.p_loop_out)
        for li in range(self.n_in + self.n_rec, self.n_in + self.n_rec + self.n_out):
            layer(li, 0)
        if R is not None and want != "none":
            prog.extend(R.head)     # every row's logits
        elif want in ("last", "greedy"):
            first_product(None, None)
        elif want == "all":
            flush()
            prog.extend(self._chunk_product(self.head_all, nt))
        if want == "greedy":
            prog.append(self._fixed("argmax", self.p_argmax, [self.logits, self.ids, self.res],
                                    (1, 1, 1)))
        self._skeletons[key] = prog
        return prog


class _RowProducts:
    """What decode rows of several sequences in one submission run beyond the chunk's
    buffers: the per-row pieces (`slices`: the Q|K|V|G output and the attention output
    with each row bindable alone, a step block and rotary rows per row) and the
    sub-layers' products over the rows (`products[layer]`: the dispatches before and
    after the attention or activation; `head`). The products are the rows matvec
    (matvecb.wgsl), each input stage a rowstage pass into `xin` before it, or, with
    `rows_matvec` off or for a shape the rows matvec does not take, the prompt matmat
    with its input stages inside."""

    def __init__(self, m: GpuDoryModel):
        self.m = m
        self.slices = RowSlices(m.dev, m.batch_rows, 4 * (m.hd // 2), qkvg=m.qkvg_w,
                                att=m.q_size)
        self.products: dict = {}
        self.matvec = False
        if m.rows_matvec:
            try:
                self._rows_products()
                self.matvec = True
            except ConfigError:     # a shape the rows matvec does not take
                self.products = {}
        if not self.matvec:
            self._matmat_products()

    def _attn_ops(self, arena, w, o_input: dict):
        m, S = self.m, self.slices
        qkvg = MatvecOp(m.dev, [w["q"], w["k"], w["v"], w["g"]], arena, x=m.hb, x_off=m.rx,
                        x_stride=m.hidden, y=S.bufs["qkvg"], y_off=0,
                        y_stride=S.stride["qkvg"], vbuf=m.vbuf)
        o = MatvecOp(m.dev, [w["o"]], arena, y=m.out, y_off=0, y_stride=m.hidden,
                     vbuf=m.vbuf, **o_input)
        return qkvg, o

    def _matmat_products(self) -> None:
        """The sub-layers' products as the prompt matmat (input stages inside)."""
        m, S = self.m, self.slices
        arena = ParamArena(m.dev)
        ops = {li: self._attn_ops(arena, w, dict(
            x=S.bufs["att"], x_off=0, x_stride=S.stride["att"], x2=S.bufs["qkvg"],
            x2_off=m.q_size + 2 * m.kv_size, x2_stride=S.stride["qkvg"], v_a=w["sg"],
            pro=1, eps=EPS)) for li, w in enumerate(m.lw) if w["attn"]}
        arena.upload()
        self.arena = arena
        for li, w in enumerate(m.lw):
            if w["attn"]:
                a, o = ops[li]
                self.products[li] = ([a.dispatch(m.step, MATMAT_NT)],
                                     [o.dispatch(m.step, MATMAT_NT)])
            else:
                self.products[li] = (m._chunk_product(w["gu_op"], MATMAT_NT),
                                     m._chunk_product(w["down_op"], MATMAT_NT))
        self.head = m._chunk_product(m.head_all, MATMAT_NT)

    def _rows_products(self) -> None:
        """The sub-layers' products as the rows matvec, each input stage (the output
        gate, SwiGLU, with their norms) a rowstage pass into `xin` before it."""
        m, S, dev, H = self.m, self.slices, self.m.dev, self.m.hidden
        xs = max(m.q_size, m.ffn)
        self.xin = dev.buffer(m.batch_rows * xs * 4)
        arena = ParamArena(dev)
        ops: dict = {}
        stages: dict = {}
        for li, w in enumerate(m.lw):
            if w["attn"]:
                ops[li] = self._attn_ops(arena, w, dict(x=self.xin, x_off=0, x_stride=xs))
                stages[li] = (arena.ref(u32s(m.q_size, 1, 0, S.stride["att"],
                                             m.q_size + 2 * m.kv_size, S.stride["qkvg"],
                                             w["sg"], NONE, xs, float(EPS), 0, 0)),
                              S.bufs["att"], S.bufs["qkvg"])
            else:
                ops[li] = (
                    MatvecOp(dev, [w["gate"], w["up"]], arena, x=m.hb, x_off=m.rx, x_stride=H,
                             y=m.gu, y_off=0, y_stride=2 * m.ffn, vbuf=m.vbuf),
                    MatvecOp(dev, [w["down"]], arena, x=self.xin, x_off=0, x_stride=xs,
                             y=m.out, y_off=0, y_stride=H, vbuf=m.vbuf))
                stages[li] = (arena.ref(u32s(m.ffn, 2, 0, 2 * m.ffn, m.ffn, 0, w["sg"],
                                             w["su"], xs, float(EPS), 0, 0)), m.gu, m.gu)
        head = MatvecOp(dev, [m.head], arena, x=m.hb, x_off=m.rx, x_stride=H, y=m.logits,
                        y_off=0, y_stride=m.vocab, vbuf=m.vbuf, v_out=m.v_logit)
        arena.upload()
        self.arena = arena
        rows = lambda t: (t, 1, 1)  # noqa: E731
        # int8 activations: every product's rows quantized into one scratch first
        xq = dev.buffer(m.batch_rows * 16 * max(rows_block_words(c) for c in (
            H, xs))) if m.int8 else None
        for li, (a, b) in ops.items():
            p, x, x2 = stages[li]
            stage = m._fixed("rowstage", p, [m.step, x, x2, m.vbuf, self.xin], rows)
            self.products[li] = (a.dispatch_rows(m.step, xq),
                                 [stage] + b.dispatch_rows(m.step, xq))
        self.head = head.dispatch_rows(m.step, xq)


def _tables(m: GpuMatrix) -> bytes:
    from .kernels import _part_tables
    return _part_tables([r for _b, _r0, r in m.parts])
