"""What the GPU models share as models of the protocol (`cortiq.models.base`): the
device runs a sequence's feed as one submission a chunk, on weights kept in their
stored dtypes; decode rows of several sequences may share one submission."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from ..models.base import ModelBase, check_feed, is_prompt


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

    #: whether the model's decode products follow precision "int8" (its `_mv` passes
    #: `self.int8` to them); a model without it keeps float32 products whatever is asked
    int8_products = False
    #: the decode products' activations: False float32, True int8 (`set_precision`)
    int8 = False
    #: the model's recorded product dispatches (`_mv`: (id(op), rows) -> Dispatch)
    _static: dict

    def matrices(self) -> list:
        """No host matrices: the device's products run on its own copies of the weights
        (`set_precision` switches their variant)."""
        return []

    def set_precision(self, precision) -> int:
        """The decode products' activation precision: "int8" stages each decode
        product's input quantized per 32 columns and takes integer dots (q8_row weights,
        in a model with `int8_products`: matvec1.wgsl); "exact" and "auto" keep float32
        products (prompt chunks always do); None takes the process default as it is now.
        Recorded programs follow: their dispatches are switched in place. Returns how
        many recorded decode products changed variant."""
        from ..kernels._config import check_precision, get_precision
        check_precision(precision)
        self.int8 = self.int8_products and (precision or get_precision()) == "int8"
        switched = 0
        for d in self._static.values():
            if d.op is not None and d.name == "matvec":
                pipe = d.op.decode_pipeline(self.int8)
                switched += pipe is not d.pipeline
                d.pipeline = pipe
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
        Each result equals the sequence's own `forward`, whatever the batch."""
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
        if len(rows) == 1:
            i = rows[0]
            outs[i] = self.forward(states[i], ids_list[i], wants[i], prompts[i])
        elif rows:
            for at in range(0, len(rows), self.batch_rows):
                group = rows[at:at + self.batch_rows]
                got = self.forward_rows([states[i] for i in group],
                                        [int(ids_list[i][0]) for i in group],
                                        [wants[i] for i in group])
                for i, out in zip(group, got):
                    outs[i] = out
        return outs
