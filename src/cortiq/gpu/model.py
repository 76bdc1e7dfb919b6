"""What the GPU models share as models of the protocol (`cortiq.models.base`): the
device runs a sequence's feed as one submission a chunk, on weights kept in their
stored dtypes; decode rows of several sequences may share one submission."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import ConfigError, CortiqError, ModelError
from ..models.base import ModelBase, check_feed, is_prompt
from .kernels import stage_words

#: the per-sequence part of a layer program: a marker the program's builder leaves where
#: a sequence's own kernels go (its attention over its own cache), filled per sequence
#: by the model's `_sequence_part(state, marker, row)`
SEQUENCE_PART = "sequence"


class RowSlices:
    """The per-row pieces of a rows submission (decode rows of several sequences): a
    step block, rotary rows and named activations per row, each row at the adapter's
    binding offset alignment, so that a sequence's own dispatches bind its row alone
    (as a one-row chunk at its own position)."""

    def __init__(self, dev, rows: int, rope_floats: int, **widths: int):
        fa = max(dev.storage_align // 4, 4)

        def padded(n: int) -> int:
            return (n + fa - 1) // fa * fa

        self.width = dict(widths)
        self.stride = {k: padded(v) for k, v in widths.items()}
        self.bufs = {k: dev.buffer(rows * self.stride[k] * 4, copy_src=True) for k in widths}
        self.rope_floats, self.rope_stride = rope_floats, padded(rope_floats)
        self.rope = dev.buffer(rows * self.rope_stride * 4)
        self.step_words = max(dev.uniform_align // 4, 4)
        self.step = dev.buffer(rows * self.step_words * 4, uniform=True)

    def at(self, name: str, b: int):
        """Row b of activation `name` as a binding (buffer, offset, size)."""
        return (self.bufs[name], b * self.stride[name] * 4,
                (self.width[name] * 4 + 15) // 16 * 16)

    def step_at(self, b: int):
        return (self.step, b * self.step_words * 4, 16)

    def rope_at(self, b: int):
        return (self.rope, b * self.rope_stride * 4, self.rope_floats * 4)

    def write(self, queue, positions: list, rope_rows: list) -> None:
        """Each row's step block (one row at its position) and rotary rows."""
        steps = np.zeros((len(positions), self.step_words), np.uint32)
        steps[:, 0] = 1
        steps[:, 1] = positions
        queue.write_buffer(self.step, 0, steps)
        rope = np.zeros((len(positions), self.rope_stride), np.float32)
        for b, r in enumerate(rope_rows):
            rope[b, :self.rope_floats] = r
        queue.write_buffer(self.rope, 0, rope)


class GpuModel(ModelBase):
    """A GPU model: it writes `forward` (one sequence, one submission a token) and this
    class makes its `forward_batch` of it. A model that can run the decode rows of
    several sequences as one submission (every product reading its weights once for
    all the rows) sets `batch_rows` > 1 and writes `forward_rows`."""

    # set by every GPU model: its device and the host model's position limit (None: none)
    dev: Any
    max_seq_len: int | None

    #: decode rows (one id each, distinct sequences) one `forward_rows` call takes;
    #: 0 or 1: the model has no `forward_rows`, every feed runs on its own
    batch_rows = 0

    # set by every GPU model: its chunk step block, token ids, logits and the products
    # it has made dispatches of
    step: Any
    ids: Any
    logits: Any
    _static: dict
    # greedy decode's result word and the two staging buffers its reads alternate over
    res: Any
    stage_ids: list
    stage_logits: Any = None
    #: what decode rows of several sequences run beyond the chunk's buffers, made on
    #: first use (a model with `forward_rows`)
    _rows: Any = None

    def _chunk_product(self, op, nt: int) -> list:
        """The dispatches of product `op` over a chunk's rows, made once: for nt 1 the
        decode matvec, after the pass that stages its int8 input once where it takes one
        (`MatvecOp.staged`; that pass runs no workgroup while the product is float32)."""
        key = (id(op), nt)
        ds = self._static.get(key)
        if ds is None:
            if nt == 1 and self.int8_products and op.stages_once():
                d = op.staged(self.step, self._stage_buffer(op.cols), self.int8)
                ds = [d.pre, d]
            else:
                ds = [op.dispatch(self.step, nt, self.int8)]
            self._static[key] = ds
        return ds

    def _stage_buffer(self, cols: int):
        """The buffer the decode products' int8 inputs are staged in (one product's at a
        time), at least stage_words(cols) words: grown by a new buffer, the dispatches
        made before keeping the one they bound."""
        need = 16 * stage_words(cols)
        buf = self._staged_input
        if buf is None or buf.size < need:
            buf = self._staged_input = self.dev.buffer(need)
        return buf

    @staticmethod
    def _resolve(skeleton: list, part) -> list:
        """A program from a layer program's skeleton: each SEQUENCE_PART marker replaced
        by the dispatches part(marker) returns."""
        prog: list = []
        for item in skeleton:
            if isinstance(item, tuple) and item and item[0] == SEQUENCE_PART:
                prog.extend(part(item))
            else:
                prog.append(item)
        return prog

    def greedy_chain(self, st, first: int, limit: int | None = None) -> Iterator[int]:
        """The greedy tokens after `first` (fed at st.pos), one a pass, the ids chained
        on the device: each pass's argmax writes the id the next pass embeds, and only
        the 4-byte id (and the logits' finiteness) is read back. At most `limit` passes
        (None: until the consumer stops).

        Where the model rolls back in place, pass i + 1 is submitted before token i is
        read, so the host records a pass while the device runs the one before (a read
        waits for its own submission only); closing the generator then forgets the
        pass run ahead. Whenever the consumer stops, the state holds `first` and every
        token yielded but the last: the last is not fed, as in a feed-and-sample loop."""
        return self._chain(st, first, limit, self.capabilities.rollback)

    def _chain(self, st, first: int, limit: int | None, ahead: bool) -> Iterator[int]:
        """`greedy_chain`, running a pass ahead of the consumer where `ahead` (the
        caller either takes every token up to `limit` or the model rolls back)."""
        check_feed(np.array([first]), "last", self.vocab)
        if limit is not None and limit <= 0:
            return
        dev = self.dev
        dev.queue.write_buffer(self.ids, 0, np.array([first], np.uint32))

        def submit(i: int):
            enc = self._greedy_pass(st)
            stage = self.stage_ids[i % 2]
            enc.copy_buffer_to_buffer(self.res, 0, stage, 0, 16)
            return stage, dev.submit([enc.finish()])

        pending = submit(0)
        done = 0
        try:
            while True:
                more = limit is None or done + 1 < limit
                nxt = submit(done + 1) if ahead and more else None
                tok = self._greedy_token(pending[0], st.pos - (2 if nxt else 1), pending[1])
                pending = nxt
                done += 1
                yield tok
                if not more:
                    return
                if pending is None:
                    pending = submit(done)
        finally:
            if pending is not None and self.capabilities.rollback:
                self.rollback(st, st.pos - 1)   # the pass run ahead of what was taken

    def _greedy_token(self, stage, pos: int, after: int | None = None) -> int:
        """The argmax a greedy pass copied to `stage` (the pass fed position `pos`);
        ModelError where that pass's logits were not all finite (the argmax shader's
        flag), as the host's sampler refuses such a row."""
        word = self.dev.read(stage, 8, after=after).view(np.uint32)
        if word[1]:
            raise ModelError(f"{self.arch}: the model produced non-finite logits at position "
                             f"{pos} — the file may be damaged: run cortiq verify")
        return int(word[0])

    def decode_greedy(self, st, first: int, n: int) -> list[int]:
        """n greedy tokens after `first` (fed at st.pos), chained on the device
        (`greedy_chain`, every pass but the first submitted before the one before it is
        read back); the state advances by n."""
        return list(self._chain(st, first, n, True))

    def _greedy_pass(self, st):
        """A command encoder holding one decode pass at st.pos that embeds the id in
        `ids`, writes its argmax back there and into `res`; the state advanced past it."""
        raise NotImplementedError

    def _advance(self, st, t: int) -> None:
        """Move a state past t rows just run."""
        st.pos += t

    def can_rollback(self, st, n: int) -> bool:
        return True

    def rollback(self, st, n: int) -> None:
        if int(n) < 0:
            raise CortiqError(f"{self.arch}: cannot roll back to {n}")
        if not self.can_rollback(st, int(n)):
            raise CortiqError(f"{self.arch}: cannot roll back to {n}: a window layer has "
                              "already dropped keys that position reads")
        st.pos = min(st.pos, int(n))

    def _logits_stage(self, nbytes: int):
        """A staging buffer of at least nbytes for logits read back."""
        if self.stage_logits is None or self.stage_logits.size < nbytes:
            self.stage_logits = self.dev.staging(max(nbytes, self.vocab * 4))
        return self.stage_logits

    def _submit_rows(self, sts, toks, skeleton: list, slices: RowSlices, head: bool):
        """One submission of decode rows of several sequences (one token each, distinct
        states) through a layer program's rows skeleton: the chunk step holds B rows
        (what runs over the rows together), each row's own step and rotary rows go to
        `slices` for its sequence's part. Returns the rows' logits [B, vocab] (head) or
        None."""
        dev, q = self.dev, self.dev.queue
        B = len(sts)
        for st in sts:
            self._grow(st, st.pos + 1)
        q.write_buffer(self.step, 0, np.array([B, 0, 0, 0], np.uint32))
        slices.write(q, [st.pos for st in sts], [self._rope_row(st.pos) for st in sts])
        q.write_buffer(self.ids, 0, np.asarray(toks, np.uint32))
        prog = self._resolve(skeleton, lambda m: self._rows_part(sts, m))
        nbytes = B * self.vocab * 4
        done = dev.run(prog, B, (self.logits, self._logits_stage(nbytes), nbytes) if head
                       else None)
        for st in sts:
            self._advance(st, 1)
        if not head:
            return None
        return dev.read(self.stage_logits, nbytes, after=done).view(np.float32).reshape(
            B, self.vocab)

    def _grow(self, st, need: int) -> None:
        """Room in a state's caches for `need` positions."""
        raise NotImplementedError

    def _rope_row(self, pos: int) -> np.ndarray:
        """The rotary rows of one position, as a rows submission's slice holds them."""
        raise NotImplementedError

    def _rows_part(self, sts, marker: tuple) -> list:
        """The dispatches of a SEQUENCE_PART marker over every row of a rows submission:
        each row's own (`_sequence_part`), unless the model runs them together."""
        return [d for b, st in enumerate(sts) for d in self._sequence_part(st, marker, b)]

    def _sequence_part(self, st, marker: tuple, row: int | None) -> list:
        """The dispatches of a SEQUENCE_PART marker for state st (`_attention_part`):
        over the chunk's rows (row None), or over row `row` of a rows submission, bound
        to that row's pieces of the per-row buffers and made once per state and rows
        setup."""
        if row is None:
            return self._attention_part(st, marker, None)
        R = self._rows_setup()
        key = ("row", row) + tuple(marker[2:])
        made = st.programs.get(key)
        if made is not None and made[0] is R:
            return made[1]
        part = self._attention_part(st, marker, (R.slices, row))
        st.programs[key] = (R, part)    # R: the rows buffers the dispatches bind
        return part

    def _attention_part(self, st, marker: tuple, at) -> list:
        """The dispatches of a SEQUENCE_PART marker for state st over the chunk's rows
        (at None) or over one row of a rows submission (at: (RowSlices, row))."""
        raise NotImplementedError

    def _rows_setup(self):
        """The per-row buffers and products of a rows submission, made on first use."""
        raise NotImplementedError

    def _forward_chunks(self, ids: np.ndarray, want: str, chunk: int, run):
        """Feed checked `ids` in pieces of `chunk` rows through run(piece, want) (each
        piece's own want: "none" but for the last, or "all") and assemble the result:
        None, the last row's logits [vocab], or every row's [len(ids), vocab]."""
        if ids.size == 0:
            return None if want == "none" else np.zeros(
                (0, self.vocab) if want == "all" else 0, np.float32)
        out = []
        for start in range(0, ids.size, chunk):
            piece = ids[start:start + chunk]
            last = start + piece.size == ids.size
            lg = run(piece, want if (last or want == "all") else "none")
            if lg is not None:
                out.append(lg)
        if want == "none":
            return None
        if want == "last":
            return out[-1][0]
        return np.concatenate(out, axis=0)

    def _grown_cap(self, cap: int, need: int) -> int:
        """A KV cache capacity doubled from `cap` until it holds `need` positions;
        ConfigError past the model's max_position_embeddings."""
        if self.max_seq_len and need > int(self.max_seq_len):
            raise ConfigError(f"{self.arch}: position {need - 1} is past the model's "
                              f"max_position_embeddings {self.max_seq_len}")
        while cap < need:
            cap *= 2
        return cap

    def _grown_copies(self, olds: list, nbytes: int) -> list:
        """New device buffers of `nbytes`, each holding an old buffer's bytes at its start
        (the copies in one submission)."""
        dev = self.dev
        enc = dev.dev.create_command_encoder()
        news = []
        for old in olds:
            nb = dev.buffer(nbytes, copy_src=True)
            enc.copy_buffer_to_buffer(old, 0, nb, 0, old.size)
            news.append(nb)
        dev.queue.submit([enc.finish()])
        return news

    _decode_program: list | None = None
    #: the buffer the decode products' int8 inputs are staged in (`_stage_buffer`)
    _staged_input: Any = None

    @property
    def dispatches_per_token(self) -> int | None:
        """Dispatches a decode token runs: those of the last decode program made that
        have workgroups at the precision the model is at now."""
        prog = self._decode_program
        if prog is None:
            return None
        return sum(0 not in (d.dims(1) if callable(d.dims) else d.dims) for d in prog)

    #: whether the model's decode products follow precision "int8" (made through
    #: `_chunk_product`); a model without it keeps float32 products whatever is asked
    int8_products = False
    #: the decode products' activations: False float32, True int8 (`set_precision`)
    int8 = False

    def matrices(self) -> list:
        """No host matrices: the device's products run on its own copies of the weights
        (`set_precision` switches their variant)."""
        return []

    def set_precision(self, precision) -> int:
        """The decode products' activation precision: "int8" quantizes each decode
        product's input per 32 columns and takes integer dots (q8_row weights, in a
        model with `int8_products`: matvec1.wgsl for one row, quantrows.wgsl and
        matvecb.wgsl for rows of several sequences); "exact" and "auto" keep float32
        products (prompt chunks always do); None takes the process default as it is now.
        Recorded programs follow: their decode dispatches are switched in place and the
        products over rows made again. Returns how many recorded decode products changed
        variant."""
        from ..kernels._config import check_precision, get_precision
        check_precision(precision)
        self.int8 = self.int8_products and (precision or get_precision()) == "int8"
        switched = 0
        for ds in self._static.values():
            for d in ds if isinstance(ds, list) else [ds]:
                if d.op is not None and d.name == "matvec":
                    switched += d.op.switch(d, self.int8)
        self._rows = None      # the products over rows are made again, in the new precision
        return switched

    def batchable(self, ids, want: str, prompt: bool) -> bool:
        """Whether a feed may go into `forward_rows` (one id; a model with per-token
        decisions, such as an early-exit gate, narrows this)."""
        return ids.size == 1

    def forward_rows(self, states, tokens, wants) -> list:
        """One new token for each of several sequences, as one pass over the weights:
        results as `forward` gives them ([vocab] for "last", [1, vocab] for "all",
        None for "none")."""
        raise NotImplementedError

    def forward_batch(self, states, ids_list, wants, prompts=None) -> list:
        """The sequences' feeds: prompts (and rows the model does not batch) one after
        the other, then the decode rows `batch_rows` at a time through `forward_rows`.
        Each result equals the sequence's own `forward` (within the float rounding of the
        products' summation order), whatever the batch."""
        if not len(states) == len(ids_list) == len(wants):
            raise ValueError(f"forward_batch: {len(states)} states, {len(ids_list)} feeds "
                             f"and {len(wants)} wants")
        if prompts is None:
            prompts = [None] * len(states)
        if len({id(st) for st in states}) != len(states):
            raise ValueError("forward_batch: a state appears twice in one batch")
        ids_list = [check_feed(ids, want, self.vocab) for ids, want in zip(ids_list, wants)]
        outs: list = [None] * len(states)
        rows: list[int] = []
        for i, (st, ids, want, prompt) in enumerate(zip(states, ids_list, wants, prompts)):
            if self.batch_rows > 1 and self.batchable(ids, want, is_prompt(prompt, ids.size)):
                rows.append(i)
            else:
                outs[i] = self.forward(st, ids, want, prompt)
        for at in range(0, len(rows), self.batch_rows):
            group = rows[at:at + self.batch_rows]
            if len(group) == 1:     # a lone row takes the one-sequence decode path
                i = group[0]
                outs[i] = self.forward(states[i], ids_list[i], wants[i], prompts[i])
                continue
            got = self.forward_rows([states[i] for i in group],
                                    [int(ids_list[i][0]) for i in group],
                                    [wants[i] for i in group])
            for i, out in zip(group, got):
                outs[i] = out
        return outs
