"""Dory's O(1) far field for the full-attention layers (the seed's turbo path; issue 6).

A full layer's KV slot runs exact until the prompt crosses ``seal`` rows; then each KV
head's rows become a ``NystromState`` (sinks + an exact window of ``w`` rows + a skeleton
over ``m`` landmarks), and every later row is read through it at a fixed cost and memory.

With an ``ExactRows`` choice (``dory.exact.weights`` in a turbo file, or
``CMF_DORY_EXACT=FILE:rows``) a sealed prompt also keeps its rows (in RAM, or in files
under ``spill``) until ``EXACT_TAIL`` rows before its end; there the far field is built
anew over all of them in the seal order ``[sinks, kept rows, the rest]``, so the rows the
far field would lose (passwords, codes: keys outside the landmarks' span, large values)
stay exact for the rest of the conversation.

Options (the seed's precedence): ``o1=`` keyword ("m,w,sink,seal", a 4-tuple, a DoryO1
or "off") > ``CMF_DORY_O1`` > the turbo record's ``o1`` (unless ``CMF_DORY_O1=off``) >
off. ``spill=`` keyword > ``CMF_O1_SPILL``.
"""
from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .. import _kernels
from ..errors import ConfigError
from .nystrom import QT_STRIDE, NystromState

__all__ = ["DoryO1", "ExactRows", "MAX_NEAR", "EXACT_TAIL", "EXACT_NEIGHBOURS", "QT_STRIDE",
           "rank_share", "pick_exact_rows", "seal_order", "far_states", "SlotStore",
           "resolve_o1", "resolve_exact", "resolve_spill", "exact_from_var", "O1Slot"]

log = logging.getLogger("cortiq.dory")

#: Keys a sealed token reads exactly, on any backend: w + sinks + exact rows.
MAX_NEAR = 8192
#: A sealed prompt's last rows read the chosen ones: the rebuild comes this many rows
#: before the prompt's end.
EXACT_TAIL = 512
#: Neighbours kept on each side of a chosen row: a fact is several tokens.
EXACT_NEIGHBOURS = 2
ENV_O1 = "CMF_DORY_O1"
ENV_EXACT = "CMF_DORY_EXACT"
ENV_EXACT_FEATURES = "CMF_DORY_EXACT_FEATURES"
ENV_EXACT_LOG = "CMF_DORY_EXACT_LOG"
ENV_SPILL = "CMF_O1_SPILL"


# ------------------------------------------------------------------ options

@dataclass(frozen=True)
class DoryO1:
    """The far field's shape: ``m`` landmarks, an exact window of ``w`` rows, ``sink``
    permanent rows; a slot seals when a chunk ends at or past row ``seal``."""
    m: int
    w: int
    sink: int
    seal: int

    @classmethod
    def of(cls, m: int, w: int, sink: int, seal: int) -> "DoryO1":
        """The seed's clamp: below the window plus a margin the state would be exact
        only, so the seal is at least w + sink + 16."""
        return cls(int(m), int(w), int(sink), max(int(seal), int(w) + int(sink) + 16))

    @classmethod
    def parse(cls, value: Any, where: str = "o1") -> "DoryO1 | None":
        """``"m,w,sink,seal"`` | (m, w, sink, seal) | DoryO1 | "off" / None -> None."""
        if value is None or isinstance(value, DoryO1):
            return value
        if isinstance(value, str):
            if value.strip().lower() == "off":
                return None
            parts = value.split(",")
        elif isinstance(value, (tuple, list)):
            parts = list(value)
        else:
            raise ConfigError(f"{where}: {value!r}; want 'm,w,sink,seal' or 'off'")
        try:
            n = [int(str(p).strip(), 10) for p in parts]
        except ValueError:
            n = []
        if len(n) != 4 or any(x < 0 for x in n):
            raise ConfigError(f"{where}: {value!r}; want 'm,w,sink,seal' (4 integers >= 0) or 'off'")
        m, w, sink, seal = n
        if m < 4 or w < 1:
            raise ConfigError(f"{where}: {value!r}: m must be >= 4 and w >= 1")
        return cls.of(m, w, sink, seal)


@dataclass(frozen=True)
class ExactRows:
    """Which rows of a sealed prompt stay exact: a linear score over per-(layer, KV head)
    rank features ``[layer][2][nk]`` (key residual, value norm), ``budget`` rows."""
    weights: np.ndarray
    budget: int


def exact_from_var(value: str, where: str = ENV_EXACT) -> ExactRows | None:
    """``FILE:rows``: FILE holds little-endian f32, the first value a header; a file that
    is not there gives no weights (which only dumps the features)."""
    file, sep, rows = value.rpartition(":")
    if not sep:
        return None
    try:
        budget = int(rows)
    except ValueError:
        return None
    try:
        with open(file, "rb") as fh:
            b = fh.read()
    except OSError:
        b = b""
    w = np.frombuffer(b[: len(b) // 4 * 4], "<f4").astype(np.float32)
    return ExactRows(w[1:].copy(), budget)


def resolve_o1(keyword: Any = None, turbo=None, env: Mapping[str, str] | None = None
               ) -> DoryO1 | None:
    """keyword > CMF_DORY_O1 > the turbo record's o1 ("off" anywhere turns it off)."""
    env = os.environ if env is None else env
    if keyword is not None:
        return DoryO1.parse(keyword, "o1")
    v = (env.get(ENV_O1) or "").strip()
    if v:
        if v.lower() == "off":
            return None
        try:
            return DoryO1.parse(v, ENV_O1)
        except ConfigError:
            return None   # the seed ignores a malformed variable (falls through to turbo)
    if turbo is not None:
        m, w, sink, seal = turbo.o1
        return DoryO1.of(m, w, sink, seal)
    return None


def resolve_exact(o1: DoryO1 | None, turbo=None, load_weights=None,
                  env: Mapping[str, str] | None = None, keyword: Any = None
                  ) -> ExactRows | None:
    """keyword ExactRows > CMF_DORY_EXACT=FILE:rows > the turbo record's exact_rows with
    ``dory.exact.weights`` (``load_weights()``); then the MAX_NEAR check."""
    env = os.environ if env is None else env
    exact = keyword
    if exact is None and env.get(ENV_EXACT):
        exact = exact_from_var(env[ENV_EXACT])
    if (exact is None and turbo is not None and turbo.exact_rows > 0 and o1 is not None
            and not env.get(ENV_EXACT) and load_weights is not None):
        exact = ExactRows(np.asarray(load_weights(), np.float32).reshape(-1), turbo.exact_rows)
    if exact is not None and o1 is not None and o1.w + o1.sink + exact.budget > MAX_NEAR:
        raise ConfigError(f"dory: window {o1.w} + sinks {o1.sink} + exact rows {exact.budget} "
                          f"go over the near field's {MAX_NEAR}")
    return exact


def resolve_spill(keyword: Any = None, env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    if keyword is not None:
        return os.fspath(keyword)
    v = env.get(ENV_SPILL)
    return v if v else None


# ------------------------------------------------------------------ choice of exact rows

def rank_share(v: np.ndarray) -> np.ndarray:
    """Each entry's rank / (n - 1) (ties: the earlier row ranks lower)."""
    v = np.asarray(v, np.float32)
    n = v.shape[0]
    out = np.empty(n, np.float32)
    out[np.argsort(v, kind="stable")] = np.arange(n, dtype=np.float32) / np.float32(max(n, 2) - 1)
    return out


def pick_exact_rows(x: ExactRows, layers: Sequence[tuple[np.ndarray, np.ndarray]], rows: int,
                    nk: int, hd: int, m: int, lo: int, hi: int,
                    env: Mapping[str, str] | None = None) -> list[int]:
    """The rows to keep exact, ascending. ``layers``: per full layer ``(k, v)`` as
    ``[rows, nk*hd]`` f32; ``lo..hi`` the rows that can go (not sinks, not the window).
    A row goes with its ``EXACT_NEIGHBOURS`` on each side until ``x.budget`` is spent."""
    env = os.environ if env is None else env
    hi = min(hi, rows)
    if hi <= lo or rows < 2:
        return []
    dump = env.get(ENV_EXACT_FEATURES)
    nf = len(layers) * 2 * nk
    if len(x.weights) != nf and not dump:
        return []
    m = max(1, min(m, rows))
    total = np.zeros(rows, np.float32)
    table = np.zeros((rows, nf), np.float32) if dump else None
    use = len(x.weights) == nf
    for li, (k, v) in enumerate(layers):
        k = np.ascontiguousarray(k, np.float32).reshape(rows, nk * hd)
        v = np.ascontiguousarray(v, np.float32).reshape(rows, nk, hd)
        vn_all = np.einsum("rkd,rkd->rk", v, v)
        for kh in range(nk):
            res = rank_share(_kernels.key_residuals(k, m, kh * hd, hd))
            vn = rank_share(vn_all[:, kh])
            f0, f1 = (li * 2) * nk + kh, (li * 2 + 1) * nk + kh
            if table is not None:
                table[:, f0] = res
                table[:, f1] = vn
            if use:
                total += np.float32(x.weights[f0]) * res + np.float32(x.weights[f1]) * vn
    if table is not None:
        _write_quiet(dump, table.astype("<f4").tobytes())
    if env.get(ENV_EXACT_LOG):
        _write_quiet(env[ENV_EXACT_LOG], total.astype("<f4").tobytes())
    cand = np.arange(lo, hi)
    order = cand[np.argsort(-total[lo:hi], kind="stable")]
    keep = np.zeros(rows, bool)
    count = 0
    for r in order:
        if count >= x.budget:
            break
        for j in range(max(r - EXACT_NEIGHBOURS, lo), min(r + EXACT_NEIGHBOURS + 1, hi)):
            if count >= x.budget:
                break
            if not keep[j]:
                keep[j] = True
                count += 1
    return np.flatnonzero(keep).tolist()


def _write_quiet(path: str, data: bytes) -> None:
    try:
        with open(path, "wb") as fh:
            fh.write(data)
    except OSError as e:
        log.warning("dory: cannot write %s: %s", path, e)


def seal_order(rows: int, sink: int, keep: Sequence[int]) -> np.ndarray:
    """The order rows go into a seal: the sinks, the kept rows, then the rest as they
    came, so the window stays the last rows and the kept ones leave the far field."""
    s = min(sink, rows)
    chosen = np.zeros(rows, bool)
    keep = np.asarray(list(keep), np.int64)
    chosen[keep] = True
    rest = np.arange(s, rows)
    rest = rest[~chosen[s:]]
    return np.concatenate([np.arange(s), keep, rest]).astype(np.uint32)


def far_states(nh: int, nk: int, hd: int, o1: DoryO1, ks: np.ndarray, vs: np.ndarray,
               qs: np.ndarray, stride: int, rows: int, order: np.ndarray | None,
               kept: int) -> list[NystromState]:
    """A slot's far field, one state per KV head, over its rows taken in ``order``.
    ``ks``/``vs`` are ``[rows, nk*hd]``, ``qs`` the query trace ``[ceil(rows/stride), nh*hd]``
    (row r's queries at ``r // stride``); ``kept`` rows after the sinks stay exact."""
    rep = nh // nk
    ks = np.asarray(ks, np.float32).reshape(rows, nk, hd)
    vs = np.asarray(vs, np.float32).reshape(rows, nk, hd)
    qs = np.asarray(qs, np.float32).reshape(-1, nk, rep, hd)
    if order is None:
        order = np.arange(rows, dtype=np.uint32)
    order = np.asarray(order, np.uint32)
    q_index = (order // np.uint32(stride)).astype(np.uint32)
    states = []
    for kh in range(nk):
        n = NystromState.new_group(o1.m, o1.w, o1.sink + kept, rep)
        qg = np.ascontiguousarray(qs[:, kh].transpose(1, 0, 2))
        n.prefill_group(qg, ks[order, kh], vs[order, kh], q_index=q_index)
        states.append(n)
    return states


# ------------------------------------------------------------------ the row store

class _Store:
    """An append-only f32 store, in RAM or in one file (spill directory)."""

    def __init__(self, path: str | None):
        self.path = path
        self.n = 0
        self._ram: list[np.ndarray] = []
        self._fh = open(path, "wb") if path is not None else None

    def push(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, np.float32)
        if self._fh is not None:
            self._fh.write(a.tobytes())
        else:
            self._ram.append(a.reshape(-1).copy())
        self.n += a.size

    def freeze(self) -> np.ndarray:
        """All rows as one array; a file store is read back and removed."""
        if self._fh is None:
            return np.concatenate(self._ram) if self._ram else np.zeros(0, np.float32)
        self._fh.close()
        self._fh = None
        try:
            return np.fromfile(self.path, np.float32, self.n)
        finally:
            self.remove()

    def remove(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.path is not None:
            try:
                os.remove(self.path)
            except OSError:
                pass
        self._ram = []


class SlotStore:
    """The rows of a sealed prompt but for the chunk being read: keys, values and one
    query row in ``QT_STRIDE``, in RAM or in files under ``spill``."""
    _next = itertools.count()

    def __init__(self, spill: str | None):
        n = next(SlotStore._next)
        if spill is not None:
            try:
                os.makedirs(spill, exist_ok=True)
            except OSError as e:
                raise OSError(f"spill directory {spill}: {e.strerror or e}") from None
            at = lambda kind: os.path.join(spill, f"dory-host-{os.getpid()}-{n}-{kind}")  # noqa: E731
        else:
            at = lambda kind: None  # noqa: E731
        self.k, self.v, self.q = _Store(at("k")), _Store(at("v")), _Store(at("q"))
        self.rows = 0

    def push(self, k: np.ndarray, v: np.ndarray, q: np.ndarray, kv_row: int, q_row: int,
             pos: int) -> None:
        """A chunk's rows from position ``pos``; its queries are ``[row][nh*hd]``."""
        n = k.size // kv_row
        self.k.push(k)
        self.v.push(v)
        q = np.asarray(q, np.float32).reshape(-1, q_row)
        take = [r for r in range(q.shape[0]) if (pos + r) % QT_STRIDE == 0]
        if take:
            self.q.push(q[take])
        self.rows += n

    def remove(self) -> None:
        for s in (self.k, self.v, self.q):
            s.remove()


@dataclass
class O1Slot:
    """The far-field side of one full-attention KV slot."""
    far: list = None               # one NystromState per KV head after the seal
    qt: list = None                # query rows [t][nh*hd] until the seal / the chunk's
    arch: bool = False             # sealed, and its rows still kept for the choice
    store: SlotStore | None = None

    def __post_init__(self):
        self.far = [] if self.far is None else self.far
        self.qt = [] if self.qt is None else self.qt

    @property
    def sealed(self) -> bool:
        return bool(self.far)

    def memory_bytes(self) -> int:
        return sum(n.memory_bytes() for n in self.far)
