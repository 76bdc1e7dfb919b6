"""One forward for several sessions: `feed_batch`.

Decode is bound by streaming the weights, so sessions that advance together should
share each pass over them. `feed_batch(sessions, ids_per_session, want, prompt)` runs every
session's new tokens in one call of the model's `forward_batch(states, ids_list, wants,
prompts)` (the model protocol, `cortiq.models.base`), which multiplies each weight
matrix once for the rows of all of them and runs attention and its other per-sequence
state per session; a lone session of a model runs through its `forward`. Lengths may
differ (one session prefilling a chunk while the others decode one token each).

The sessions keep their usual bookkeeping (ids, feeds, last logits), so rollback,
prefix reuse and `Session.feed` work on them afterwards as if each had been fed alone;
the results equal one-at-a-time feeds within float32 rounding (the rows of a batch go
through the matrix-matrix kernels, a lone decode row through the matrix-vector ones;
prompt rows get a prompt's products, generated tokens decode's, as `Session.feed`).
"""
from __future__ import annotations

from contextlib import ExitStack

import numpy as np

from ..errors import ConfigError
from ..models.base import WANTS, check_feed, is_prompt
from .session import Session

__all__ = ["feed_batch"]


def _wants(want, n: int) -> list[str]:
    ws = [want] * n if isinstance(want, str) else list(want)
    if len(ws) != n:
        raise ConfigError(f"feed_batch: {len(ws)} wants for {n} sessions")
    for w in ws:
        if w not in WANTS:
            raise ConfigError(f"feed_batch: want must be one of {', '.join(WANTS)}, got {w!r}")
    return ws


def _prompts(prompt, n: int) -> list:
    ps = [prompt] * n if prompt is None or isinstance(prompt, (bool, np.bool_)) else list(prompt)
    if len(ps) != n:
        raise ConfigError(f"feed_batch: {len(ps)} prompt flags for {n} sessions")
    return ps


def feed_batch(sessions, ids_per_session, want="last", prompt=None) -> list:
    """Feed `ids_per_session[i]` to `sessions[i]` for every i in one forward per model.
    `want`: "none", "last" or "all", or one of those per session; `prompt`: whether
    the ids are prompt rows or generated tokens (`Session.feed`), one flag or one per
    session. Returns one result per session, as `Session.feed` returns it (None,
    [vocab] or [n_i, vocab])."""
    sessions = list(sessions)
    if not all(isinstance(s, Session) for s in sessions):
        bad = next(s for s in sessions if not isinstance(s, Session))
        raise TypeError(f"feed_batch: expected cortiq Sessions, got {type(bad).__name__}")
    if len({id(s) for s in sessions}) != len(sessions):
        raise ConfigError("feed_batch: a session appears twice in one batch")
    ids_per_session = list(ids_per_session)
    if len(ids_per_session) != len(sessions):
        raise ConfigError(f"feed_batch: {len(ids_per_session)} id lists for "
                          f"{len(sessions)} sessions")
    wants = _wants(want, len(sessions))
    flags = _prompts(prompt, len(sessions))
    arrs = [check_feed(ids, w, s.model.vocab)
            for s, ids, w in zip(sessions, ids_per_session, wants)]
    prompts = [is_prompt(p, a.size) for p, a in zip(flags, arrs)]
    out: list = [None] * len(sessions)
    with ExitStack() as locks:
        for s in sorted(sessions, key=id):          # one order: no lock cycles
            locks.enter_context(s._lock)
        groups: dict = {}
        for i, s in enumerate(sessions):
            if arrs[i].size == 0:
                w = wants[i]
                out[i] = None if w == "none" else (
                    np.zeros((0, s.model.vocab), np.float32) if w == "all" else s._last)
                continue
            groups.setdefault(id(s.model), []).append(i)
        for idx in groups.values():
            model = sessions[idx[0]].model
            if len(idx) > 1:
                res = model.forward_batch([sessions[i]._state for i in idx],
                                          [arrs[i] for i in idx], [wants[i] for i in idx],
                                          [prompts[i] for i in idx])
            else:
                i = idx[0]
                res = [model.forward(sessions[i]._state, arrs[i], wants[i], prompt=prompts[i])]
            for i, r in zip(idx, res):
                sessions[i]._record(arrs[i], wants[i], r, prompts[i])
                out[i] = r
    return out
