"""One sequence's state on a model: feed tokens, read logits, roll back.

A Session is cheap; many share one model (and its one mapping of the file). It keeps
the token ids it holds, and how they were fed, so that a rollback the model cannot do
in place (a sliding window already dropped the keys it would need) is done by
re-reading the prefix in the same pieces: the state is then exactly the one a straight
run would have (Dory's last_loop cache depends on where chunks begin and end).

Every feed says whether its ids are prompt rows or generated tokens (`prompt`), and
the model gives each row the arithmetic of its kind (precision "auto" multiplies q8
prompt rows with int8 activations, generated ones exactly; Dory's early-exit gate sees
generated tokens only), so a prompt gives the same rows however it is cut -- whole,
or a cached prefix and its last id. Left None, a feed of several ids counts as prompt
rows and a feed of one as a generated token.

The session calls the model only through the model protocol (`cortiq.models.base`):
`forward`, `new_state`, `capabilities.rollback`, `can_rollback` and `rollback`.
"""
from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from typing import cast

import numpy as np

from ..errors import CortiqError
from ..models.base import WANTS, is_prompt


class Session:
    def __init__(self, model) -> None:
        self._model = model
        self._state = model.new_state()
        self._ids: list[int] = []
        self._feeds: list[tuple[int, str, bool]] = []  # (tokens, want, prompt) of every feed
        self._last: np.ndarray | None = None
        self._lock = threading.Lock()

    @property
    def pos(self) -> int:
        """Tokens held."""
        return len(self._ids)

    @property
    def ids(self) -> list[int]:
        return list(self._ids)

    @property
    def model(self):
        return self._model

    def common_prefix(self, ids: Sequence[int]) -> int:
        """Length of the longest common prefix of what the session holds and `ids`."""
        held = self._ids
        n = min(len(held), len(ids))
        i = 0
        while i < n and held[i] == ids[i]:
            i += 1
        return i

    def prefill(self, ids: Sequence[int] | np.ndarray, reuse: bool = True
                ) -> tuple[int, np.ndarray]:
        """Make the session hold exactly `ids` and return `(reused, logits)`: the
        logits [vocab] after the last id, and how many leading ids were kept from
        what the session already held (the longest common prefix, capped so that at
        least the last id is run) instead of being read again."""
        ids = [int(i) for i in np.asarray(ids, dtype=np.int64).ravel()]
        keep = self.prepare(ids, reuse)
        logits = self.feed(ids[keep:], want="last", prompt=True)
        return keep, cast(np.ndarray, logits)

    def prepare(self, ids, reuse: bool = True) -> int:
        """The first half of `prefill`: keep the longest common prefix of what the
        session holds and `ids` (at least the last id is left to run), forget the rest,
        and return how many ids are kept; the caller then feeds `ids[kept:]` (at once or
        in pieces)."""
        ids = [int(i) for i in np.asarray(ids, dtype=np.int64).ravel()]
        if not ids:
            raise CortiqError("empty prompt: nothing to generate from")
        keep = min(self.common_prefix(ids), len(ids) - 1) if reuse else 0
        if keep < len(self._ids):
            if keep == 0 or not self._model.capabilities.rollback:
                self.reset()
                keep = 0
            else:
                self.rollback(keep)
        return keep

    def feed(self, ids: Sequence[int] | np.ndarray, want: str = "last",
             prompt: bool | None = None) -> np.ndarray | None:
        """Run `ids` after what the session holds. Returns None, the last row of logits
        [vocab] or every row [len(ids), vocab] for want = "none" / "last" / "all".
        `prompt`: the ids are prompt rows (True) or generated tokens (False); None:
        prompt rows when there are several (see the module docstring)."""
        if want not in WANTS:
            raise ValueError(f"want must be one of {', '.join(WANTS)}, got {want!r}")
        arr = np.asarray(ids, dtype=np.int64).ravel()
        with self._lock:
            if arr.size == 0:
                return None if want == "none" else (
                    np.zeros((0, self._model.vocab), np.float32) if want == "all" else self._last)
            p = is_prompt(prompt, arr.size)
            out = self._model.forward(self._state, arr, want, prompt=p)
            self._record(arr, want, out, p)
            return out

    def greedy_chain(self, first: int) -> Generator[int, None, None]:
        """The argmax tokens after feeding `first`, each fed to the next pass on the
        model's device with no logits read back (a model whose
        `capabilities.greedy_chain` is set). Whenever the caller stops taking them, the
        session holds `first` and every token taken but the last, as if each had been
        fed as a generated token; it has no logits then (`logits()` refuses). A pass
        that fails empties the session (its state would no longer match its ids)."""
        if not self._model.capabilities.greedy_chain:
            raise CortiqError(f"{self._model.arch}: this model does not decode greedy "
                              "tokens on its device; feed tokens and sample instead")
        with self._lock:
            self._last = None
            chain = self._model.greedy_chain(self._state, int(first))
            fed = int(first)
            try:
                for t in chain:
                    self._ids.append(fed)
                    self._feeds.append((1, "last", False))
                    yield t
                    fed = t
            except Exception:
                # a pass failed part way: the state no longer matches the ids held
                self._state = self._model.new_state()
                self._ids, self._feeds = [], []
                raise
            finally:
                chain.close()

    def _record(self, arr: np.ndarray, want: str, out, prompt: bool) -> None:
        """Note a feed of `arr` that produced `out` (by `feed` or a batched forward)."""
        self._ids.extend(int(i) for i in arr)
        self._feeds.append((int(arr.size), want, prompt))
        if want == "all":
            self._last = out[-1].copy()
        elif want == "last":
            self._last = out.copy()
        else:
            self._last = None

    def logits(self) -> np.ndarray:
        """The last row of logits of the most recent feed that asked for them."""
        if self._last is None:
            raise CortiqError("no logits: feed tokens with want='last' or 'all' first")
        return self._last

    def rollback(self, n: int) -> None:
        """Forget positions >= n (keep the first n tokens)."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"rollback: n must be a non-negative integer, got {n!r}")
        with self._lock:
            if n >= len(self._ids):
                return
            if not self._model.capabilities.rollback:
                raise CortiqError(f"{self._model.arch}: rollback is not supported; start a "
                                  "new session instead")
            keep = self._ids[:n]
            feeds, left = [], n
            for size, want, prompt in self._feeds:
                if left <= 0:
                    break
                feeds.append((min(size, left), want, prompt))
                left -= size
            if self._model.can_rollback(self._state, n):
                self._model.rollback(self._state, n)
            else:  # re-read the prefix in the pieces it was fed in
                self._state = self._model.new_state()
                at = 0
                for size, want, prompt in feeds:
                    self._model.forward(self._state, np.asarray(keep[at:at + size], np.int64),
                                        "none" if want == "none" else "last", prompt=prompt)
                    at += size
            self._ids = keep
            self._feeds = feeds
            self._last = None

    def save_state(self) -> bytes:
        """The session's state as bytes (`cortiq.runtime.state`); `LLM.load_state` or
        `Session.load_state` restores it on the same model."""
        from .state import pack
        with self._lock:
            return pack(self._model, self._ids, self._feeds)

    @classmethod
    def load_state(cls, model, data) -> Session:
        """A session on `model` holding what the saved `data` held (StateError when
        the bytes are damaged or were saved on another model)."""
        from .state import unpack
        ids, feeds = unpack(model, data)
        s = cls(model)
        at = 0
        for size, want, prompt in feeds:
            s.feed(ids[at:at + size], want=want, prompt=prompt)
            at += size
        return s

    def reset(self) -> None:
        with self._lock:
            self._state = self._model.new_state()
            self._ids = []
            self._feeds = []
            self._last = None
