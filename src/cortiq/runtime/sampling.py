"""Choosing the next token from a row of logits.

`SamplingParams` holds the knobs (validated: a bad value raises ConfigError naming
the field and its allowed range); `Sampler(params)` turns logits + the ids seen so
far into one token id. The chain follows upstream cortiq's `sampler.rs`
(docs/runtime.md §2), with the OpenAI-style extras slotted in where
OpenAI and llama.cpp put them::

    logit_bias (+) and suppress_tokens (-inf)
    -> repetition penalty  over the distinct seen ids: l > 0 ? l / p : l * p
    -> presence penalty    l -= presence             (once per distinct seen id)
       frequency penalty   l -= frequency * count    (count = occurrences seen)
    -> [temperature < 1e-6: argmax, ties -> lower index]
    -> temperature         l /= T                    (skipped when T == 1)
    -> softmax             (float64, max subtracted)
    -> min-p               zero p < min_p * max(p)
    -> top-k               zero p < k-th largest p   (ties at the k-th place survive)
    -> top-p               keep the shortest prefix of the descending survivors whose
                           cumulative (not yet renormalised) mass reaches top_p
    -> renormalise, draw   first index whose running sum exceeds u * total,
                           u ~ U[0, 1) from a seeded numpy Generator

Deliberate differences from upstream: ties in the greedy argmax go to the lower
index (upstream: higher), and the random source is numpy's PCG64 Generator rather
than SplitMix64, so the same seed reproduces cortiq's own draws, not upstream's.
Everything is vectorised over the vocabulary; no Python loop touches every logit.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["GREEDY_EPS", "OPENAI_DEFAULTS", "Sampler", "SamplingParams", "model_defaults",
           "request_defaults"]

GREEDY_EPS = 1e-6          # temperature below this means argmax (upstream's threshold)
_BIAS_LIMIT = 100.0        # OpenAI's logit_bias range
_PENALTY_LIMIT = 2.0       # OpenAI's presence/frequency penalty range


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"SamplingParams.{name}: expected a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"SamplingParams.{name}: must be finite, got {value!r}")
    return v


def _in_range(name: str, value: Any, lo: float, hi: float, *, lo_open=False,
              desc: str | None = None) -> float:
    v = _real(name, value)
    ok = (v > lo if lo_open else v >= lo) and v <= hi
    if not ok:
        rng = desc or f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ConfigError(f"SamplingParams.{name}: must be in {rng}, got {value!r}")
    return v


def _token_id(name: str, value: Any) -> int:
    if isinstance(value, str):              # JSON object keys arrive as strings
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigError(f"SamplingParams.{name}: token id {value!r} is not an integer") \
                from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"SamplingParams.{name}: token ids must be integers >= 0, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling knobs. Defaults are upstream cortiq's (`temperature` 0.7, `top_k` 40,
    `top_p` 0.9, `min_p` 0.05, `repetition_penalty` 1.1).

    * temperature in [0, inf); < 1e-6 means greedy (argmax).
    * top_k int >= 0 (0 = off); top_p in [0, 1] (1 = off; 0 keeps only the most
      probable token); min_p in [0, 1] (0 = off).
    * repetition_penalty in (0, inf) (1 = off); presence_penalty and
      frequency_penalty in [-2, 2] (0 = off), all over `history_ids`.
    * logit_bias {token id: bias in [-100, 100]} added to the logits (string keys, as
      JSON delivers them, are accepted); suppress_tokens: ids that are never chosen.
    * seed: int in [0, 2**64) or None (fresh entropy); -1 also means fresh entropy
      (llama.cpp's and llama-cpp-python's spelling of "random"), stored as None.
    """

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.05
    repetition_penalty: float = 1.1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = field(default=None)
    suppress_tokens: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        s = object.__setattr__
        s(self, "temperature", _in_range("temperature", self.temperature, 0.0, math.inf,
                                         desc="[0, inf)"))
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ConfigError(f"SamplingParams.top_k: must be an integer >= 0 (0 = off), got {k!r}")
        s(self, "top_k", int(k))
        s(self, "top_p", _in_range("top_p", self.top_p, 0.0, 1.0))
        s(self, "min_p", _in_range("min_p", self.min_p, 0.0, 1.0))
        s(self, "repetition_penalty", _in_range(
            "repetition_penalty", self.repetition_penalty, 0.0, math.inf, lo_open=True,
            desc="(0, inf)"))
        for name in ("presence_penalty", "frequency_penalty"):
            s(self, name, _in_range(name, getattr(self, name), -_PENALTY_LIMIT, _PENALTY_LIMIT))
        bias = self.logit_bias
        if bias is not None:
            if not isinstance(bias, Mapping):
                raise ConfigError(
                    f"SamplingParams.logit_bias: expected a mapping token id -> bias, got {bias!r}")
            clean = {}
            for key, val in bias.items():
                tid = _token_id("logit_bias", key)
                clean[tid] = _in_range(f"logit_bias[{tid}]", val, -_BIAS_LIMIT, _BIAS_LIMIT)
            bias = clean or None
        s(self, "logit_bias", bias)
        sup = self.suppress_tokens
        if sup is None:
            sup = ()
        if isinstance(sup, (str, bytes)) or not isinstance(sup, Iterable):
            raise ConfigError(
                f"SamplingParams.suppress_tokens: expected a list of ids, got {sup!r}")
        s(self, "suppress_tokens", tuple(sorted({_token_id("suppress_tokens", t) for t in sup})))
        seed = self.seed
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed == -1:
            seed = None
            s(self, "seed", None)
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
                    or not 0 <= seed < 2**64:
                raise ConfigError(f"SamplingParams.seed: must be an integer in [0, 2**64), -1 or None, "
                                  f"got {seed!r}")
            s(self, "seed", int(seed))

    @classmethod
    def greedy(cls, **overrides) -> SamplingParams:
        """Argmax decoding without penalties (the CLI's --greedy)."""
        kw: dict[str, Any] = dict(temperature=0.0, repetition_penalty=1.0)
        kw.update(overrides)
        return cls(**kw)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def is_plain_argmax(self) -> bool:
        """Greedy with nothing that changes the row before the argmax (no penalties,
        logit_bias or suppressed ids): the token is the row's own argmax."""
        return (self.is_greedy and self.repetition_penalty == 1.0
                and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0
                and not self.logit_bias and not self.suppress_tokens)

    def replace(self, **changes) -> SamplingParams:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# What an OpenAI client expects when it leaves a sampling field out: plain sampling at
# temperature 1, every filter and penalty off.
OPENAI_DEFAULTS: Mapping[str, float] = {
    "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0}

# The fields of a model's generation defaults (Hugging Face generation_config.json names,
# kept by the converter in the chat bundle) that override OPENAI_DEFAULTS.
MODEL_DEFAULT_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def model_defaults(raw: Mapping | None) -> dict:
    """The sampling fields a model file names as its own (`tokenizer_config.
    generation_defaults`, docs/cmf-format.md §4.4; keys other than MODEL_DEFAULT_FIELDS
    are ignored). A value out of range raises ConfigError naming it."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("tokenizer_config.generation_defaults: expected a JSON object, got "
                          f"{type(raw).__name__}")
    given = {k: raw[k] for k in MODEL_DEFAULT_FIELDS if raw.get(k) is not None}
    try:
        SamplingParams(**{**OPENAI_DEFAULTS, **given})
    except ConfigError as e:
        raise ConfigError(f"tokenizer_config.generation_defaults: {e}") from None
    return given


def request_defaults(raw: Mapping | None) -> dict:
    """The sampling values of a request that leaves fields out: OPENAI_DEFAULTS, overridden
    by the model's own (`model_defaults`) where it has them."""
    return {**OPENAI_DEFAULTS, **model_defaults(raw)}


class Sampler:
    """Draws token ids with `params`; holds its own seeded random generator."""

    def __init__(self, params: SamplingParams | None = None, **kw):
        if params is None:
            params = SamplingParams(**kw)
        elif kw:
            params = params.replace(**kw)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"Sampler: params must be SamplingParams, got {type(params).__name__}")
        self.params = params
        self.reseed(params.seed)

    def reseed(self, seed: int | None = None) -> None:
        """Restart the random stream (same seed => same draws)."""
        self.rng = np.random.default_rng(seed)

    # -- the chain ------------------------------------------------------------------
    def _prepare(self, logits, history_ids) -> np.ndarray:
        x = np.asarray(logits)
        if x.ndim != 1 or x.size == 0:
            raise ValueError(f"Sampler: logits must be a non-empty 1-D array, got shape {x.shape}")
        if not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"Sampler: logits must be floating point, got {x.dtype}")
        v = x.size
        z = x.astype(np.float64)                         # a private copy
        z[np.isnan(z)] = -np.inf
        p = self.params
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
            if ids.max() >= v:
                raise ConfigError(f"SamplingParams.logit_bias: token id {int(ids.max())} is "
                                  f"outside the vocabulary [0, {v})")
            z[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float64, count=ids.size)
        if p.suppress_tokens:
            sup = np.asarray(p.suppress_tokens, dtype=np.int64)
            z[sup[sup < v]] = -np.inf
        penalties = (p.repetition_penalty != 1.0 or p.presence_penalty != 0.0
                     or p.frequency_penalty != 0.0)
        if penalties and history_ids is not None:
            h = history_ids if isinstance(history_ids, np.ndarray) else np.asarray(
                list(history_ids))
            if h.size:
                if not np.issubdtype(h.dtype, np.integer):
                    raise TypeError(f"Sampler: history_ids must be integers, got {h.dtype}")
                h = h.astype(np.int64, copy=False).ravel()
                if h.min() < 0 or h.max() >= v:
                    bad = int(h.min()) if h.min() < 0 else int(h.max())
                    raise ValueError(
                        f"Sampler: history id {bad} is outside the vocabulary [0, {v})")
                seen, counts = np.unique(h, return_counts=True)
                if p.repetition_penalty != 1.0:
                    ls = z[seen]
                    z[seen] = np.where(ls > 0, ls / p.repetition_penalty,
                                       ls * p.repetition_penalty)
                if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
                    z[seen] -= p.presence_penalty + p.frequency_penalty * counts
        return z

    def probabilities(self, logits, history_ids=()) -> np.ndarray:
        """The distribution `sample` draws from (float64, sums to 1; one-hot when greedy)."""
        z = self._prepare(logits, history_ids)
        out = np.zeros(z.size, dtype=np.float64)
        if self.params.is_greedy:
            out[self._argmax(z, logits)] = 1.0
            return out
        probs = self._filtered(z)
        if probs is None:
            out[self._argmax(z, logits)] = 1.0
            return out
        return probs / probs.sum()

    @staticmethod
    def _argmax(z: np.ndarray, raw) -> int:
        if np.isfinite(z).any() or np.isposinf(z).any():
            return int(np.argmax(z))                     # first maximum: lower index wins
        raw = np.asarray(raw, dtype=np.float64)
        if np.isnan(raw).all():
            raise ValueError("Sampler: logits are all NaN")
        return int(np.nanargmax(raw))                    # everything suppressed: raw argmax

    def _filtered(self, z: np.ndarray) -> np.ndarray | None:
        """Unnormalised probabilities after temperature/softmax/min-p/top-k/top-p,
        or None when nothing survives."""
        p = self.params
        if p.temperature != 1.0:
            z = z / p.temperature
        m = z.max()
        if not np.isfinite(m):
            if np.isposinf(m):                           # +inf logits: uniform over them
                return np.isposinf(z).astype(np.float64)
            return None                                  # all -inf
        probs = np.exp(z - m)
        probs /= probs.sum()
        if p.min_p > 0.0:
            probs[probs < probs.max() * p.min_p] = 0.0
        v = probs.size
        if 0 < p.top_k < v:
            kth = np.partition(probs, v - p.top_k)[v - p.top_k]
            probs[probs < kth] = 0.0
        if p.top_p < 1.0:
            idx = np.flatnonzero(probs)
            order = idx[np.argsort(-probs[idx], kind="stable")]
            csum = np.cumsum(probs[order])
            keep = int(np.searchsorted(csum, p.top_p, side="left")) + 1
            if keep < order.size:
                probs[order[keep:]] = 0.0
        if not probs.any():
            return None
        return probs

    def sample(self, logits, history_ids=()) -> int:
        """One token id. `history_ids`: every id so far (prompt + generated), used by
        the penalties."""
        z = self._prepare(logits, history_ids)
        if self.params.is_greedy:
            return self._argmax(z, logits)
        probs = self._filtered(z)
        if probs is None:
            return self._argmax(z, logits)
        idx = np.flatnonzero(probs)
        csum = np.cumsum(probs[idx])
        u = self.rng.random()
        j = int(np.searchsorted(csum, u * csum[-1], side="right"))
        return int(idx[min(j, idx.size - 1)])

    def __repr__(self) -> str:
        return f"Sampler({self.params!r})"
