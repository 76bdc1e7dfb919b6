"""An independent float64 NumPy transcription of the Nyström far field (docs/nystrom.md
§1-§2, §6.2), written from the spec and importing nothing from cortiq.

It holds no streaming state: ``FarFieldRef`` is built from a seal's rows and answers a
query from the whole history in the seal's order (the seal's rows, then every row pushed
after it), splitting it into sinks, window and far rows as §1.1 says, and reading the far
rows through the landmark skeleton in float64 (no running maxima: the scores of a model's
normed q/k stay far from float64's range).
"""
from __future__ import annotations

import numpy as np


def seg_means(x: np.ndarray, m: int, index: np.ndarray | None = None) -> np.ndarray:
    """Means of the ``m`` contiguous segments of the rows of ``x`` (taken in ``index``
    order when given): segment a covers rows [a*n//m, (a+1)*n//m)."""
    x = np.asarray(x, np.float64)
    if index is not None:
        x = x[np.asarray(index, np.int64)]
    n = x.shape[0]
    return np.stack([x[a * n // m:(a + 1) * n // m].mean(0) for a in range(m)])


def ridge_pinv(a: np.ndarray) -> np.ndarray:
    """M = (AᵀA + λI)⁻¹ Aᵀ, λ = 1e-6 mean(diag AᵀA), λ ×= 10 while the Cholesky fails
    (12 tries), else I / mean(diag AᵀA) (§1.4)."""
    g = a.T @ a
    mean = float(np.mean(np.diag(g)))
    lam = 1e-6 * mean
    eye = np.eye(g.shape[0])
    for _ in range(12):
        try:
            c = np.linalg.cholesky(g + lam * eye)
        except np.linalg.LinAlgError:
            lam *= 10
            continue
        if np.all(np.isfinite(c)):
            y = np.linalg.solve(c, a.T)
            return np.linalg.solve(c.T, y)
        lam *= 10
    return eye / mean


class FarFieldRef:
    """One query head's far field sealed over ``ks``/``vs`` (the seal's rows in order) with
    the head's query trace ``qs`` (row r reads trace row ``q_index[r]``; every row its own
    when None); ``m`` landmarks at most, ``w`` window rows, ``sink`` permanent rows."""

    def __init__(self, qs, ks, vs, m: int, w: int, sink: int, q_index=None):
        ks = np.asarray(ks, np.float64)
        t, d = ks.shape
        self.w, self.sink, self.t = w, sink, t
        self.scale = 1.0 / np.sqrt(d)
        self.exact_only = t <= w + sink + 8
        if self.exact_only:
            return
        me = max(4, min(m, t // 8))
        self.k_tilde = seg_means(ks, me)
        self.q_tilde = seg_means(qs, me, np.arange(t) if q_index is None else q_index)
        self.mix = ridge_pinv(np.exp(self.scale * self.q_tilde @ self.k_tilde.T))

    def read(self, q, keys, values) -> np.ndarray:
        """The output for query ``q`` over ``keys``/``values``: the seal's rows, then every
        row pushed since, the current one last."""
        q = np.asarray(q, np.float64)
        k = np.asarray(keys, np.float64)
        v = np.asarray(values, np.float64)
        n = k.shape[0]
        if self.exact_only:
            e = np.exp(self.scale * k @ q)
            return e @ v / e.sum()
        near = np.r_[np.arange(self.sink), np.arange(n - self.w, n)]
        far = np.arange(self.sink, n - self.w)
        e = np.exp(self.scale * k[near] @ q)
        num, den = e @ v[near], e.sum()
        if far.size:
            u = np.exp(self.scale * self.k_tilde @ q) @ self.mix          # F(q) M
            big_e = np.exp(self.scale * k[far] @ self.q_tilde.T)          # E_b(k_j)
            far_den = u @ big_e.sum(0)
            if far_den >= 0:                                             # aggregate guard
                num = num + u @ (big_e.T @ v[far])
                den = den + far_den
        return num / max(den, 1e-30)
