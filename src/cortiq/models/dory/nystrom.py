"""The O(1) far field of a full-attention layer (docs/nystrom.md; the reference engine's
``nystrom``).

One ``NystromState`` is one *group*: a KV head and the ``rep`` query heads that read it.
It keeps ``sink`` permanent exact rows, an exact ring of the ``w`` newest rows, and
everything older as a Nyström skeleton over ``m_eff`` landmarks frozen at the seal
(``prefill_group``)::

    out(q) = (sum_{sinks+window} e_j v_j + u.T) / (sum_{sinks+window} e_j + u.Z),
    u = F(q) M,  F_a(q) = exp(s q.k~_a),  M = (A^T A + lam I)^-1 A^T,  A = exp(s Q~ K~^T)

with the far sums ``T``/``Z`` kept per query landmark under running-max shifts (f32), and
the landmarks and ``M`` built in f64 at the seal. The arithmetic lives in C
(``cortiq.kernels._kernels``: the ``nystrom`` family for the streaming parts, ``linalg`` for the
ridge pseudo-inverse); this class owns the buffers and the bookkeeping.

Rows are taken in the caller's order: the first ``sink`` rows stay exact forever, the last
``w`` fill the window, the ones between go to the far field (the reference engine's seal passes
``[sinks, kept exact rows, the rest]`` with ``sink = sinks + kept``).

A prompt of at most ``w + sink + 8`` rows gives an *exact-only* state: every row stays
exact in a growing buffer and the readout is plain softmax attention.

``restep_group`` (our design, docs/nystrom.md §6.4) rewrites the newest row in place: it leaves the
state exactly as a ``step_group`` with the new row would have instead of the previous one,
which is what Dory's ``last_loop`` cache needs when a later loop pass recomputes a row.
"""
from __future__ import annotations

import enum
import logging
import math
from dataclasses import dataclass

import numpy as np

from ...kernels import _kernels

__all__ = [
    "AGGREGATE",
    "EXACT_SLACK",
    "FM",
    "O1_DEFAULT_M",
    "O1_DEFAULT_SINK",
    "O1_DEFAULT_W",
    "QT_STRIDE",
    "NystromState",
    "O1Rect",
    "O1Snapshot",
    "m_eff_for",
    "ridge_pinv",
    "seg_means",
]

log = logging.getLogger("cortiq.nystrom")


class O1Rect(enum.Enum):
    """The far field's rectifier (docs/nystrom.md §1.5)."""
    AGGREGATE = "agg"   # drop the far field for a row whose far denominator is negative
    FM = "fm"           # clamp the landmark weights u_b at 0 (then the aggregate guard)

    @classmethod
    def parse(cls, value) -> O1Rect:
        if isinstance(value, O1Rect):
            return value
        v = str(value).strip().lower()
        if v in ("agg", "aggregate"):
            return cls.AGGREGATE
        if v == "fm":
            return cls.FM
        raise ValueError(f"nystrom: rect {value!r}; allowed: agg, aggregate, fm")


AGGREGATE = O1Rect.AGGREGATE
FM = O1Rect.FM
O1_DEFAULT_M, O1_DEFAULT_W, O1_DEFAULT_SINK = 32, 128, 4
#: A prompt of at most w + sink + EXACT_SLACK rows stays exact (no duplicate landmarks).
EXACT_SLACK = 8
#: One row in this many of a sealed prompt keeps its queries for a rebuild (seed).
QT_STRIDE = 8
_warned_m = False


def m_eff_for(t: int, m: int) -> int:
    """Landmarks of a seal over ``t`` rows: clamp(t // 8, 4, m)."""
    return max(4, min(m, t // 8))


def seg_means(x: np.ndarray, m: int, index: np.ndarray | None = None) -> np.ndarray:
    """f64 means of ``m`` contiguous segments of the rows of float32 ``x`` (in ``index``
    order when given): segment a = rows [a*n/m, (a+1)*n/m)."""
    x = np.ascontiguousarray(x, np.float32)
    if index is not None:
        index = np.ascontiguousarray(index, np.uint32)
    return _kernels.nys_seg_means(x.reshape(x.shape[0], -1), m, index)


def ridge_pinv(a: np.ndarray) -> np.ndarray:
    """(A^T A + lam I)^-1 A^T in f64 with the ridge retries of docs/nystrom.md §1.4."""
    return _kernels.ridge_pinv(np.ascontiguousarray(a, np.float64))[0]


@dataclass
class O1Snapshot:
    """What a step mutates: the ring (or the exact buffer) and the far accumulators."""
    win_k: np.ndarray
    win_v: np.ndarray
    win_len: int
    win_head: int
    far_len: int
    t_hat: np.ndarray
    z_hat: np.ndarray
    m_max: np.ndarray
    rows: int = 0


def _f32(a, name: str, shape: tuple) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.shape != shape:
        if a.size == math.prod(shape):
            return a.reshape(shape)
        raise ValueError(f"nystrom: {name} has shape {a.shape}, want {shape}")
    return a


class NystromState:
    """One group's far field: see the module docstring."""

    def __init__(self, m: int, w: int, sink: int, rep: int = 1, rect=AGGREGATE):
        for name, v, lo in (("m", m, 4), ("w", w, 1), ("sink", sink, 0), ("rep", rep, 1)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
                raise ValueError(f"nystrom: {name} = {v!r}, want an integer >= {lo}")
        self.m, self.w, self.sink, self.rep = int(m), int(w), int(sink), int(rep)
        self.rect = O1Rect.parse(rect)
        self.d = self.dv = 0
        self.m_eff = 0
        self.exact_only = False
        self._g: _kernels.NysGroup | None = None    # the C view
        self._sink_len = 0
        self._rows = 0          # rows seen: prefill + steps

    # ------------------------------------------------------------------ constructors
    @classmethod
    def new_group(cls, m: int, w: int, sink: int, rep: int, rect=AGGREGATE) -> NystromState:
        return cls(m, w, sink, rep, rect)

    @classmethod
    def new(cls, m: int, w: int, sink: int, rect=AGGREGATE) -> NystromState:
        return cls(m, w, sink, 1, rect)

    # ------------------------------------------------------------------ properties
    @property
    def prefilled(self) -> bool:
        return self._g is not None

    @property
    def sink_len(self) -> int:
        """Permanent exact rows held (sink in skeleton mode, 0 in exact-only mode)."""
        return self._sink_len

    @property
    def num_q_heads(self) -> int:
        return self.rep

    @property
    def win_len(self) -> int:
        return 0 if self._g is None else self._g.win_len

    @property
    def rows_seen(self) -> int:
        return self._rows

    def far_len(self, head: int = 0) -> int:
        """Rows absorbed into head ``head``'s far field (the same for every head)."""
        if not 0 <= head < self.rep:
            raise IndexError(f"nystrom: head {head} out of 0..{self.rep - 1}")
        return 0 if self._g is None else self._g.far_len

    def memory_bytes(self) -> int:
        """f32 elements held x 4 (docs/nystrom.md §5)."""
        if self._g is None:
            return 0
        d, dv = self.d, self.dv
        if self.exact_only:
            n = self._g.win_len
            return 4 * (n * d + n * dv) + self.rep * 4 * n
        me, s, w = self.m_eff, self._sink_len, self.w
        group = 4 * (w * d + w * dv + s * d + s * dv + me * d)
        head = 4 * (me * dv + 2 * me + me * d + me * me + (s + w) + 3 * me)
        return group + self.rep * head

    # ------------------------------------------------------------------ the seal
    def _bind(self, win_len: int, win_head: int, far_len: int) -> None:
        self._g = _kernels.NysGroup(
            sink_k=self._sink_k, sink_v=self._sink_v, win_k=self._win_k, win_v=self._win_v,
            k_tilde=self._k_tilde, q_tilde=self._q_tilde, mu=self._mu, t_hat=self._t_hat,
            z_hat=self._z_hat, m_max=self._m_max, scratch=self._scratch, d=self.d,
            dv=self.dv, m=self.m_eff, rep=self.rep, sink_len=self._sink_len,
            w=self._win_k.shape[0], exact_only=self.exact_only,
            rect_fm=self.rect is O1Rect.FM, scale=float(self._scale), win_len=win_len,
            win_head=win_head, far_len=far_len)

    def prefill_group(self, qs, ks, vs, rows: int | None = None, d: int | None = None,
                      dv: int | None = None, q_index=None) -> None:
        """Seal over ``rows`` rows in the given order: ``ks [rows, d]``, ``vs [rows, dv]``
        and per query head a trace ``qs[h] [n_q, d]`` (a sequence of ``rep`` arrays or one
        ``[rep, n_q, d]`` array). Without ``q_index`` the trace has one row per row
        (``n_q == rows``) or one per ``QT_STRIDE`` rows (row r reads trace row
        r // QT_STRIDE); ``q_index[r]`` names the trace row of row r explicitly
        (the reference engine's rebuild: ``order[r] // QT_STRIDE``)."""
        ks = np.ascontiguousarray(ks, np.float32)
        vs = np.ascontiguousarray(vs, np.float32)
        if ks.ndim != 2 or vs.ndim != 2:
            raise ValueError(f"nystrom.prefill_group: ks and vs must be 2-D, got {ks.shape} {vs.shape}")
        t, kd = ks.shape
        if rows is not None and rows != t:
            raise ValueError(f"nystrom.prefill_group: rows = {rows}, ks has {t}")
        if d is not None and d != kd:
            raise ValueError(f"nystrom.prefill_group: d = {d}, ks rows are {kd} wide")
        if vs.shape[0] != t or (dv is not None and vs.shape[1] != dv):
            raise ValueError(f"nystrom.prefill_group: vs has shape {vs.shape}, want ({t}, {dv or 'dv'})")
        if t == 0 or kd == 0 or vs.shape[1] == 0:
            raise ValueError("nystrom.prefill_group: no rows")
        if isinstance(qs, np.ndarray) and qs.ndim == 3:
            qlist = [qs[h] for h in range(qs.shape[0])]
        else:
            qlist = list(qs)
        if len(qlist) != self.rep:
            raise ValueError(f"nystrom.prefill_group: {len(qlist)} query blocks, want rep = {self.rep}")
        qlist = [np.ascontiguousarray(q, np.float32).reshape(-1, kd) for q in qlist]
        n_q = qlist[0].shape[0]
        if any(q.shape[0] != n_q for q in qlist):
            raise ValueError("nystrom.prefill_group: the query blocks differ in length")
        if q_index is None:
            if n_q == t:
                q_index = None
            elif n_q == -(-t // QT_STRIDE):
                q_index = (np.arange(t, dtype=np.uint32) // QT_STRIDE).astype(np.uint32)
            else:
                raise ValueError(f"nystrom.prefill_group: query trace of {n_q} rows for {t} "
                                 f"rows (want {t} or {-(-t // QT_STRIDE)} with stride {QT_STRIDE})")
        else:
            q_index = np.ascontiguousarray(q_index, np.uint32)
            if q_index.shape != (t,) or (t and int(q_index.max()) >= n_q):
                raise ValueError(f"nystrom.prefill_group: q_index must be {t} trace rows < {n_q}")

        self.d, self.dv = kd, vs.shape[1]
        self._scale = np.float32(1.0) / np.sqrt(np.float32(kd))
        self._rows = t
        self.exact_only = t <= self.w + self.sink + EXACT_SLACK
        e = np.zeros(0, np.float32)
        rep = self.rep
        if self.exact_only:
            cap = max(2 * t, t + 64)
            self._sink_len, self.m_eff = 0, 0
            self._sink_k = self._sink_v = self._k_tilde = self._q_tilde = self._mu = e
            self._t_hat = self._z_hat = self._m_max = e
            self._win_k = np.zeros((cap, self.d), np.float32)
            self._win_v = np.zeros((cap, self.dv), np.float32)
            self._win_k[:t] = ks
            self._win_v[:t] = vs
            self._scratch = np.zeros(cap, np.float32)
            self._bind(t, 0, 0)
            return

        global _warned_m
        me = m_eff_for(t, self.m)
        if me < self.m and not _warned_m:
            _warned_m = True
            log.warning("nystrom: a seal over %d rows holds %d landmarks, not %d", t, me, self.m)
        self.m_eff = me
        s, w = self.sink, self.w
        self._sink_len = s
        self._sink_k = ks[:s].copy()
        self._sink_v = vs[:s].copy()
        k64 = _kernels.nys_seg_means(ks, me)
        self._k_tilde = k64.astype(np.float32)
        self._q_tilde = np.empty((rep, me, self.d), np.float32)
        self._mu = np.empty((rep, me, me), np.float32)
        sc64 = float(self._scale)
        for h, q in enumerate(qlist):
            q64 = _kernels.nys_seg_means(q, me, q_index)
            self._q_tilde[h] = q64
            a = np.exp(sc64 * (q64 @ k64.T))        # A[i][j] = exp(s q~_i . k~_j)
            self._mu[h] = _kernels.ridge_pinv(a)[0]
        self._t_hat = np.zeros((rep, me, self.dv), np.float32)
        self._z_hat = np.zeros((rep, me), np.float32)
        self._m_max = np.full((rep, me), -np.inf, np.float32)
        self._scratch = np.zeros(s + w + 3 * me, np.float32)
        # The replay: rows s.. fill the ring, each later one evicts the oldest entry.
        self._win_k = np.zeros((w, self.d), np.float32)
        self._win_v = np.zeros((w, self.dv), np.float32)
        pushed = t - s
        for i in range(t - w, t):
            self._win_k[(i - s) % w] = ks[i]
            self._win_v[(i - s) % w] = vs[i]
        self._bind(w, pushed % w, 0)
        assert self._g is not None                  # _bind set it
        if pushed > w:
            self._g.absorb(ks[s:t - w], vs[s:t - w])

    # ------------------------------------------------------------------ decode
    def _need(self, op: str) -> None:
        if self._g is None:
            raise RuntimeError(f"nystrom.{op}: the state has not been sealed (prefill_group)")

    def _grow(self) -> None:
        assert self._g is not None                  # only called after _need
        n = self._g.win_len
        cap = 2 * self._win_k.shape[0]
        wk = np.zeros((cap, self.d), np.float32)
        wv = np.zeros((cap, self.dv), np.float32)
        wk[:n] = self._win_k[:n]
        wv[:n] = self._win_v[:n]
        self._win_k, self._win_v = wk, wv
        self._scratch = np.zeros(cap, np.float32)
        self._bind(n, 0, 0)

    def step_group(self, q_group, k, v, out=None) -> np.ndarray:
        """Push row (k, v) and read it out for the ``rep`` queries: ``out [rep, dv]``."""
        self._need("step_group")
        assert self._g is not None                  # _need raised otherwise
        if self.exact_only and self._g.win_len >= self._win_k.shape[0]:
            self._grow()
        y = self._g.step(q_group, k, v, out, False)
        self._rows += 1
        return y

    def restep_group(self, q_group, k, v, out=None) -> np.ndarray:
        """Rewrite the newest row with (k, v) and read out (docs/nystrom.md §6.4). Directly after
        the seal it rewrites the last sealed row; the landmarks keep the old one."""
        self._need("restep_group")
        assert self._g is not None                  # _need raised otherwise
        return self._g.step(q_group, k, v, out, True)

    def step_rows(self, q, k, v, out, q_col: int = 0, k_col: int = 0, v_col: int = 0,
                  out_col: int = 0, restep: bool = False) -> None:
        """``step_group`` (or ``restep_group``) over the rows of 2-D arrays, this group's
        columns starting at the given offsets (a chunk's ``[t, nh*hd]`` queries and
        ``[t, nk*hd]`` keys/values, without copies)."""
        self._need("step_rows")
        assert self._g is not None                  # _need raised otherwise
        t = q.shape[0]
        if self.exact_only and not restep:
            while self._g.win_len + t > self._win_k.shape[0]:
                self._grow()
        self._g.step_rows(q, k, v, out, q_col, k_col, v_col, out_col, restep)
        if not restep:
            self._rows += t

    def readout(self, q_group, out=None) -> np.ndarray:
        """The current state's answer to ``rep`` queries, without pushing a row."""
        self._need("readout")
        assert self._g is not None                  # _need raised otherwise
        return self._g.readout(q_group, out)

    # ------------------------------------------------------------------ rollback
    def snapshot(self) -> O1Snapshot:
        self._need("snapshot")
        assert self._g is not None                  # _need raised otherwise
        g = self._g
        n = g.win_len if self.exact_only else self._win_k.shape[0]
        return O1Snapshot(self._win_k[:n].copy(), self._win_v[:n].copy(), g.win_len,
                          g.win_head, g.far_len, self._t_hat.copy(), self._z_hat.copy(),
                          self._m_max.copy(), self._rows)

    def restore(self, snap: O1Snapshot) -> None:
        """Back to ``snap`` (bit-exact)."""
        self._need("restore")
        assert self._g is not None                  # _need raised otherwise
        g = self._g
        n = snap.win_k.shape[0]
        if self.exact_only:
            if n > self._win_k.shape[0]:
                raise ValueError("nystrom.restore: the snapshot is not of this state")
        elif n != self._win_k.shape[0]:
            raise ValueError("nystrom.restore: the snapshot is not of this state")
        self._rows = snap.rows
        self._win_k[:n] = snap.win_k
        self._win_v[:n] = snap.win_v
        self._t_hat[...] = snap.t_hat
        self._z_hat[...] = snap.z_hat
        self._m_max[...] = snap.m_max
        g.win_len, g.win_head, g.far_len = snap.win_len, snap.win_head, snap.far_len
