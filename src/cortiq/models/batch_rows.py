"""What a batched forward (`forward_batch`) returns for each of its sequences."""
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
