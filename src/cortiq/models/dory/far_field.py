"""Dory's O(1) far field for the full-attention layers (the reference engine's turbo path;
spec: docs/models/dory.md §3.3, docs/nystrom.md).

A full layer's KV slot runs exact until the prompt crosses ``seal`` rows; then each KV
head's rows become a ``NystromState`` (sinks + an exact window of ``w`` rows + a skeleton
over ``m`` landmarks), and every later row is read through it at a fixed cost and memory.

With an ``ExactRows`` choice (``dory.exact.weights`` in a turbo file, or
``CORTIQ_DORY_EXACT=FILE:rows``) a sealed prompt also keeps its rows (in RAM, or in files
under ``spill``) until ``EXACT_TAIL`` rows before its end; there the far field is built
anew over all of them in the seal order ``[sinks, kept rows, the rest]``, so the rows the
far field would lose (passwords, codes: keys outside the landmarks' span, large values)
stay exact for the rest of the conversation.

Options (the reference engine's precedence): ``o1=`` keyword ("m,w,sink,seal", a 4-tuple, a DoryO1
or "off") > ``CORTIQ_DORY_O1`` > the turbo record's ``o1`` (unless ``CORTIQ_DORY_O1=off``) >
off. ``spill=`` keyword > ``CORTIQ_DORY_O1_SPILL``. The variables come as a mapping (``env``:
``ResolvedOptions.env``, read once by ``cortiq.models.dory.config``); none given = none set.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...kernels import _kernels
from ...errors import ConfigError
from .config import ENV_EXACT, ENV_EXACT_FEATURES, ENV_EXACT_LOG, ENV_O1, ENV_SPILL
from .nystrom import QT_STRIDE, NystromState

__all__ = [
    "EXACT_NEIGHBOURS",
    "EXACT_TAIL",
    "MAX_NEAR",
    "QT_STRIDE",
    "DoryO1",
    "ExactRows",
    "O1Runtime",
    "O1Slot",
    "SlotStore",
    "exact_from_var",
    "far_states",
    "host_kv_bytes",
    "pick_exact_rows",
    "rank_share",
    "resolve_exact",
    "resolve_o1",
    "resolve_spill",
    "seal_order",
]

log = logging.getLogger("cortiq.dory")

#: Keys a sealed token reads exactly, on any backend: w + sinks + exact rows.
MAX_NEAR = 8192
#: A sealed prompt's last rows read the chosen ones: the rebuild comes this many rows
#: before the prompt's end.
EXACT_TAIL = 512
#: Neighbours kept on each side of a chosen row: a fact is several tokens.
EXACT_NEIGHBOURS = 2


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
    def of(cls, m: int, w: int, sink: int, seal: int) -> DoryO1:
        """The reference engine's clamp: below the window plus a margin the state would be exact
        only, so the seal is at least w + sink + 16."""
        return cls(int(m), int(w), int(sink), max(int(seal), int(w) + int(sink) + 16))

    @classmethod
    def parse(cls, value: Any, where: str = "o1") -> DoryO1 | None:
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
    """keyword > CORTIQ_DORY_O1 > the turbo record's o1 ("off" anywhere turns it off)."""
    env = {} if env is None else env
    if keyword is not None:
        return DoryO1.parse(keyword, "o1")
    v = (env.get(ENV_O1) or "").strip()
    if v:
        if v.lower() == "off":
            return None
        try:
            return DoryO1.parse(v, ENV_O1)
        except ConfigError:
            return None   # as the reference engine: a malformed variable falls through to turbo
    if turbo is not None:
        m, w, sink, seal = turbo.o1
        return DoryO1.of(m, w, sink, seal)
    return None


def resolve_exact(o1: DoryO1 | None, turbo=None, load_weights=None,
                  env: Mapping[str, str] | None = None, keyword: Any = None
                  ) -> ExactRows | None:
    """keyword ExactRows > CORTIQ_DORY_EXACT=FILE:rows > the turbo record's exact_rows with
    ``dory.exact.weights`` (``load_weights()``); then the MAX_NEAR check."""
    env = {} if env is None else env
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
    env = {} if env is None else env
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
    env = {} if env is None else env
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
        assert dump is not None                     # table is only made for a dump path
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


def seal_order(rows: int, sink: int, keep: Sequence[int] | np.ndarray) -> np.ndarray:
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
        self._fh = open(path, "wb") if path is not None else None  # noqa: SIM115 -- until freeze

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
        assert self.path is not None                # a file store has a path
        try:
            return np.fromfile(self.path, np.float32, self.n)
        finally:
            self.remove()
            self.path = None

    def __del__(self):
        # A state dropped before its rebuild leaves no files behind.
        try:
            self.remove()
        except Exception:  # noqa: BLE001, S110 -- interpreter shutdown
            pass

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
        at: Callable[[str], str | None]
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
    far: list = field(default_factory=list)  # one NystromState per KV head after the seal
    qt: list = field(default_factory=list)   # query rows [t][nh*hd] until the seal / the chunk's
    arch: bool = False             # sealed, and its rows still kept for the choice
    store: SlotStore | None = None
    chunk_snap: list | None = None  # the far field before the chunk at chunk_pos
    chunk_pos: int = -1

    def __post_init__(self):
        self.far = [] if self.far is None else self.far
        self.qt = [] if self.qt is None else self.qt

    @property
    def sealed(self) -> bool:
        return bool(self.far)

    def memory_bytes(self) -> int:
        return sum(n.memory_bytes() for n in self.far)


# ------------------------------------------------------------------ the runtime

def _o(slot) -> O1Slot:
    o = getattr(slot, "o1", None)
    if o is None:
        o = O1Slot()
        slot.o1 = o
    return o


def _slot_rows(slot, kv_row: int) -> tuple[np.ndarray, np.ndarray]:
    """A KV slot's rows as ``[n, nk*hd]`` views (KvSlot: k/v ``[cap, nk, hd]``, n)."""
    n = slot.n
    return slot.k[:n].reshape(n, kv_row), slot.v[:n].reshape(n, kv_row)


def _clear_slot(slot, first: int | None = None) -> None:
    """Drop a slot's exact rows (and their memory). ``first`` stays: a sealed slot's
    positions live in its far field, and the model's window checks must not see a gap."""
    cap = min(slot.k.shape[0], 16)
    slot.k = np.empty((cap,) + slot.k.shape[1:], np.float32)
    slot.v = np.empty((cap,) + slot.v.shape[1:], np.float32)
    slot.n = 0


class O1Runtime:
    """The far field of one model's full-attention layers: what ``DoryModel`` calls.

    * ``attend`` — a full layer's attention over a chunk (exact before the seal, the
      NystromState per KV head after it);
    * ``after_chunk`` — at a chunk's end: sealed rows to the store, the seal itself;
    * ``finish_exact`` — before a prompt's last ``EXACT_TAIL`` rows and at its end: the
      rebuild with the chosen exact rows;
    * ``host_kv_bytes`` / ``can_rollback``.
    """

    def __init__(self, o1: DoryO1, nh: int, nk: int, hd: int, full: Sequence[int],
                 exact: ExactRows | None = None, spill: str | None = None,
                 env: Mapping[str, str] | None = None):
        self.o1, self.exact, self.spill = o1, exact, spill
        self.env = {} if env is None else env   # the dump paths of pick_exact_rows
        self.nh, self.nk, self.hd = nh, nk, hd
        self.rep = nh // nk
        self.full = list(full)
        self.kv_row, self.q_row = nk * hd, nh * hd

    @classmethod
    def for_model(cls, model, *, o1: Any = None, spill: Any = None, exact: Any = None,
                  turbo_defaults: bool = True, env: Mapping[str, str] | None = None
                  ) -> O1Runtime | None:
        """From the keyword, CORTIQ_DORY_O1, the turbo record (when ``turbo_defaults``: no
        fixed loop count); None when the far field is off or there is no full layer."""
        cfg = model.cfg
        turbo = cfg.turbo if turbo_defaults else None
        o = resolve_o1(o1, turbo, env)
        if o is None:
            return None
        full = [w.ordinal for w in model.layers
                if hasattr(w, "ordinal") and not getattr(w, "sliding", True)]
        if not full:
            return None

        def weights():
            return model.file.tensor("dory.exact.weights")

        x = resolve_exact(o, turbo, weights, env, exact)
        return cls(o, cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim, full, x,
                   resolve_spill(spill, env), env)

    # -------------------------------------------------------------- per layer
    def attend(self, slot, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int,
               overwrite: bool, exact):
        """A full layer's chunk: q ``[t, nh, hd]`` (scaled, rotated), k/v ``[t, nk, hd]``.
        Before the seal: records the queries and returns ``exact()`` (the model's own
        put + attention). After it: ``[t, nh, hd]`` from the far field."""
        o = _o(slot)
        if o.far:
            if o.arch:   # the chunk's rows wait at the slot for the store
                slot.put(k, v, overwrite)
                self._qt(o, q, overwrite)
            return self._far_rows(o, q, k, v, pos0, overwrite)
        self._qt(o, q, overwrite)
        return exact()

    def _qt(self, o: O1Slot, q: np.ndarray, overwrite: bool) -> None:
        t = q.shape[0]
        if overwrite and o.qt and o.qt[-1].shape[0] == t:
            o.qt.pop()
        o.qt.append(np.array(q, np.float32).reshape(t, self.q_row))

    def _far_rows(self, o: O1Slot, q, k, v, pos0: int, overwrite: bool) -> np.ndarray:
        t, nk, rep, hd = q.shape[0], self.nk, self.rep, self.hd
        q = np.ascontiguousarray(q, np.float32).reshape(t, nk, rep, hd)
        k = np.ascontiguousarray(k, np.float32).reshape(t, nk, hd)
        v = np.ascontiguousarray(v, np.float32).reshape(t, nk, hd)
        y = np.empty((t, nk, rep, hd), np.float32)
        restep = False
        if overwrite and t == 1:
            restep = True          # the newest row, rewritten in place
        elif overwrite and o.chunk_pos == pos0 and o.chunk_snap is not None:
            # A later pass over a chunk of several rows: back to before the chunk, then
            # the rows again (restep rewrites only the newest row).
            for f, s in zip(o.far, o.chunk_snap):
                f.restore(s)
        elif t > 1:
            o.chunk_snap = [f.snapshot() for f in o.far]
            o.chunk_pos = pos0
        q2, k2, v2 = q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)
        y2 = y.reshape(t, -1)
        for kh, f in enumerate(o.far):
            f.step_rows(q2, k2, v2, y2, kh * rep * hd, kh * hd, kh * hd, kh * rep * hd, restep)
        return y.reshape(t, self.nh, hd)

    # -------------------------------------------------------------- per chunk
    def _slots(self, st):
        for o in self.full:
            if o < len(st.slots):
                for sl, s in enumerate(st.slots[o]):
                    yield o, sl, s

    def after_chunk(self, st, pos0: int, t: int) -> None:
        """At a chunk's end (after every pass): its rows join a sealed slot's store;
        a slot seals once the chunk reaches ``o1.seal`` rows."""
        if any(_o(s).arch for _, _, s in self._slots(st)):
            self.store_chunk(st, pos0)
        if pos0 + t >= self.o1.seal:
            self.seal_far(st)

    def store_chunk(self, st, pos0: int) -> None:
        for _, _, s in self._slots(st):
            o = _o(s)
            if not o.arch or o.store is None:
                continue
            k, v = _slot_rows(s, self.kv_row)
            qt = np.concatenate(o.qt) if o.qt else np.zeros((0, self.q_row), np.float32)
            try:
                o.store.push(k, v, qt, self.kv_row, self.q_row, pos0)
            except OSError as e:
                self.give_up_rows(st, f"a store failed: {e}")
                return
            _clear_slot(s, s.first + s.n)
            o.qt = []

    def give_up_rows(self, st, why: str) -> None:
        """The rows did not fit where they were going: the far field stays as first
        sealed, with no exact rows (one warning)."""
        import warnings
        warnings.warn(f"dory: {why}: the prompt's rows are dropped, and none stays exact "
                      f"past the seal", RuntimeWarning, stacklevel=3)
        for _, _, s in self._slots(st):
            o = _o(s)
            if o.arch or o.store is not None:
                if o.store is not None:
                    o.store.remove()
                o.arch, o.store, o.qt = False, None, []
                _clear_slot(s, s.first + s.n)

    def seal_far(self, st) -> None:
        """Freeze each unsealed full slot's landmarks over the rows it holds and go on
        from them row by row; with an exact-row choice to make, the rows go to a store."""
        sealed, failed = False, None
        for _, _, s in self._slots(st):
            o = _o(s)
            if o.far or s.n == 0:
                continue
            sealed = True
            t = s.n
            k, v = _slot_rows(s, self.kv_row)
            qt = np.concatenate(o.qt)[-t:]
            o.far = far_states(self.nh, self.nk, self.hd, self.o1, k, v, qt, 1, t, None, 0)
            if self.exact is not None and failed is None:
                store = None
                try:
                    store = SlotStore(self.spill)
                    store.push(k, v, qt, self.kv_row, self.q_row, 0)
                    o.arch, o.store = True, store
                except OSError as e:
                    failed = str(e)
                    if store is not None:
                        store.remove()
            o.qt = []
            _clear_slot(s, s.first + t)
        if sealed and self.exact is not None:
            if failed is not None:
                self.give_up_rows(st, failed)
            elif any(_o(s).far and not _o(s).arch for _, _, s in self._slots(st)):
                self.give_up_rows(st, "a slot sealed without its rows")

    def finish_exact(self, st) -> None:
        """Before a prompt's last rows (and at its end): the far field built anew over
        all the stored rows, in the seal order [sinks, kept rows, the rest]."""
        if self.exact is None or not any(_o(s).arch for _, _, s in self._slots(st)):
            return
        t0 = time.perf_counter()
        frozen, rows, fail = [], 0, None
        for o_i, sl, s in self._slots(st):
            o = _o(s)
            a, o.store = o.store, None
            if a is None:
                continue
            rows = a.rows
            try:
                frozen.append((o_i, sl, s, a.k.freeze(), a.v.freeze(), a.q.freeze()))
            except OSError as e:
                fail = str(e)
                a.remove()
        if fail is not None:
            self.give_up_rows(st, f"a store could not be read back: {fail}")
            return
        o1 = self.o1
        layers = [(k.reshape(rows, self.kv_row), v.reshape(rows, self.kv_row))
                  for _, sl, _, k, v, _ in frozen if sl == 0]
        keep = pick_exact_rows(self.exact, layers, rows, self.nk, self.hd, o1.m, o1.sink,
                               max(rows - o1.w, 0), self.env)
        order = seal_order(rows, o1.sink, keep)
        for _, _, s, k, v, q in frozen:
            o = _o(s)
            o.far = far_states(self.nh, self.nk, self.hd, o1, k, v, q.reshape(-1, self.q_row),
                               QT_STRIDE, rows, order, len(keep))
            o.arch, o.chunk_snap = False, None
        log.info("dory: far field rebuilt over %d rows, %d kept exact, in %.2f s", rows,
                 len(keep), time.perf_counter() - t0)

    # -------------------------------------------------------------- accounting
    def rollback(self, st, n: int) -> None:
        """After the model's slots forgot positions >= n: an unsealed slot's query trace
        forgets them too (it starts at position 0)."""
        for _, _, s in self._slots(st):
            o = _o(s)
            if o.far or not o.qt:
                continue
            qt = np.concatenate(o.qt)
            o.qt = [qt[:max(n, 0)]] if qt.shape[0] > n else [qt]

    def can_rollback(self, st, n: int) -> bool:
        """A sealed far field cannot forget rows: only a rollback to the end holds."""
        return not any(_o(s).far for _, _, s in self._slots(st)) or n >= st.pos


def host_kv_bytes(st) -> tuple[int, int]:
    """The host's KV bytes: (exact rows, O(1) states)."""
    exact = far = 0
    for row in st.slots:
        for s in row:
            exact += s.nbytes()
            o = getattr(s, "o1", None)
            if o is not None:
                far += o.memory_bytes()
    return exact, far
