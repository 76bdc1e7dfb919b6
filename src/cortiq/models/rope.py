"""Rotary position embeddings: the inverse frequencies of each profile (plain, per-pair
factors, YaRN) and one table type that gives cos and sin rows for a run of positions.

Two arithmetics are in use, and a model keeps the one its reference computes in:
transformers' float32 (the angle a float32 product, `f64=False`: Llama family,
DeepSeek-V4) and the reference engine's float64 (inverse frequencies rounded once to
float32, angles and cos/sin in float64, `f64=True`: Dory).
"""
from __future__ import annotations

import math

import numpy as np


def inv_freq(dim: int, theta: float, *, f64: bool = False) -> np.ndarray:
    """1 / theta^(2i/dim) for i < dim/2, float32. f64: evaluated in float64 and rounded
    once (the reference engine); else in float32 as transformers does."""
    if f64:
        i = np.arange(dim // 2, dtype=np.float64)
        return (1.0 / np.power(float(theta), 2.0 * i / dim)).astype(np.float32)
    e = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    return (np.float32(1.0) / (np.float32(theta) ** e)).astype(np.float32)


def yarn_inv_freq(dim: int, theta: float, factor: float, original: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> np.ndarray:
    """YaRN's blend of interpolated and extrapolated frequencies, float32, as
    transformers' `_compute_yarn_parameters` (truncate=True). The reference engine
    clamps the ramp's upper end to dim/2 - 1 where transformers clamps to dim - 1; the
    two agree whenever ceil(correction(beta_slow)) <= dim/2 - 1 (DeepSeek-V4's release,
    rope dim 64), and transformers' bound lets tiny test models match it exactly."""
    def correction(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low = max(math.floor(correction(beta_fast)), 0)
    high = min(math.ceil(correction(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    pos = np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extrap = np.float32(1.0) / pos
    interp = np.float32(1.0) / (np.float32(factor) * pos)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low))
                   / np.float32(high - low), 0, 1).astype(np.float32)
    keep = np.float32(1.0) - ramp
    return (interp * (np.float32(1.0) - keep) + extrap * keep).astype(np.float32)


def yarn_attention_factor(factor: float) -> float:
    """YaRN's default cos/sin scale when the checkpoint names none."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


class RopeTable:
    """cos and sin [t, dim/2] (float32) for positions pos0 .. pos0+t-1 of one set of
    inverse frequencies.

    scale: multiplies cos and sin after they are taken (YaRN's attention factor).
    f64: angles and cos/sin in float64, rounded once (the reference engine's Dory);
        else float32 throughout (transformers).
    block: keep the aligned block of this many positions the last request fell in, so
        a decode step reads its row instead of evaluating cos/sin again (the same
        elementwise expression, so the same floats); 0 keeps nothing.
    """

    def __init__(self, inv: np.ndarray, scale: float = 1.0, *, f64: bool = False,
                 block: int = 0):
        self.inv = np.ascontiguousarray(inv, np.float32)
        self.scale = np.float32(scale)
        self.f64 = f64
        self.block = int(block)
        self._cached: tuple = (-1, None, None)  # (first position, cos, sin): swapped whole

    def __call__(self, pos0: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        if self.block:
            b0 = pos0 - pos0 % self.block
            if pos0 + t <= b0 + self.block:
                blk = self._cached
                if blk[0] != b0:
                    blk = (b0, *self._table(b0, self.block))
                    self._cached = blk
                i = pos0 - b0
                return blk[1][i:i + t], blk[2][i:i + t]
        return self._table(pos0, t)

    def at(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin [dim/2] of one position."""
        c, s = self(pos, 1)
        return c[0], s[0]

    def _table(self, pos0: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        if self.f64:
            wide = (np.arange(pos0, pos0 + t, dtype=np.float64)[:, None]
                    * self.inv.astype(np.float64)[None, :])
            c, s = np.cos(wide).astype(np.float32), np.sin(wide).astype(np.float32)
        else:
            ang = np.arange(pos0, pos0 + t, dtype=np.float32)[:, None] * self.inv[None, :]
            c, s = np.cos(ang), np.sin(ang)
        if self.scale != 1:
            c *= self.scale
            s *= self.scale
        return np.ascontiguousarray(c, np.float32), np.ascontiguousarray(s, np.float32)
