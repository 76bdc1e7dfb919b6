"""A batched forward's (`forward_batch`) per-sequence bookkeeping: its prompt flags,
the rows its head reads, and what it returns for each sequence."""
from __future__ import annotations

import numpy as np


def per_sequence(outs: list[list[np.ndarray]], wants: list[str], vocab: int) -> list:
    """One result per sequence, shaped as `forward`'s for its `want`: None ("none"), the
    last row of logits [vocab] ("last"), or every row [n, vocab] ("all"). `outs[i]`: the
    logit pieces [k, vocab] sequence i produced, in order."""
    res: list = []
    for out, want in zip(outs, wants):
        if want == "none":
            res.append(None)
        elif want == "last":
            res.append(out[-1][-1] if out else np.zeros(0, np.float32))
        else:
            res.append(np.concatenate(out, axis=0) if out
                       else np.zeros((0, vocab), np.float32))
    return res


def prompt_flags(prompts, ids_list) -> list[bool]:
    """`forward_batch`'s prompt flags, one per sequence: as given, or (None) whether the
    sequence's piece has several ids (`cortiq.runtime.session.is_prompt`)."""
    if prompts is None:
        prompts = [None] * len(ids_list)
    if len(prompts) != len(ids_list):
        raise ValueError(f"forward_batch: {len(prompts)} prompt flags for {len(ids_list)} "
                         "sequences")
    return [ids.size > 1 if p is None else bool(p) for p, ids in zip(prompts, ids_list)]


def head_rows(picks) -> np.ndarray:
    """The step's rows the head reads: picks are (sequence, first row, rows, prompt)."""
    return np.concatenate([np.arange(r, r + n) for _, r, n, _ in picks])


def head_decode(picks) -> np.ndarray:
    """Per head row: a decode product (`batch_products`' `decode`). The rows of a
    prompt piece whose every row is wanted take the prompt's products, as `forward`'s
    head does; a last row alone takes the matvec `forward` gives it."""
    return np.concatenate([np.full(n, not p) for _, _, n, p in picks])
