"""One attention layer's cache of keys and values, shared by the architectures whose
layers keep plain per-position rows (Dory, the Llama family)."""
from __future__ import annotations

import numpy as np


class KvSlot:
    """Keys and values of positions first .. first+n, [row][nk][hd], grown by doubling."""

    def __init__(self, nk: int, hd: int):
        self.k = np.empty((16, nk, hd), np.float32)
        self.v = np.empty((16, nk, hd), np.float32)
        self.n = 0
        self.first = 0

    def _reserve(self, rows: int) -> None:
        cap = self.k.shape[0]
        if rows <= cap:
            return
        while cap < rows:
            cap *= 2
        for name in ("k", "v"):
            old = getattr(self, name)
            new = np.empty((cap,) + old.shape[1:], np.float32)
            new[:self.n] = old[:self.n]
            setattr(self, name, new)

    def put(self, k: np.ndarray, v: np.ndarray, overwrite: bool) -> None:
        """Append a chunk's rows; `overwrite` first drops the same number of newest rows
        (a later pass over the chunk replaces its rows in place)."""
        t = k.shape[0]
        if overwrite:
            self.n -= t
        self._reserve(self.n + t)
        self.k[self.n:self.n + t] = k
        self.v[self.n:self.n + t] = v
        self.n += t

    def free_row(self) -> int:
        """The index of the next row, with room for it (a kernel writes it in place;
        the caller then counts it with ``n += 1``)."""
        self._reserve(self.n + 1)
        return self.n

    def trim(self, keep: int) -> None:
        """Keep the newest `keep` rows once more than twice that many are held."""
        if self.n > 2 * keep:
            drop = self.n - keep
            self.k[:keep] = self.k[drop:self.n]
            self.v[:keep] = self.v[drop:self.n]
            self.first += drop
            self.n = keep

    def rollback(self, pos: int) -> None:
        if self.first + self.n > pos:
            self.n = max(pos - self.first, 0)

    def nbytes(self) -> int:
        return 2 * self.n * self.k.shape[1] * self.k.shape[2] * 4
