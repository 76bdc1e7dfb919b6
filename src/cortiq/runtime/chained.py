"""Greedy decoding chained on the model's device.

A request whose tokens are plain argmax (`Generation.plain_argmax`) needs no logits on
the host. A model with `capabilities.greedy_chain` (the GPU models) computes each
token's argmax on its device and feeds it to the next pass there: 4 bytes come back a
token instead of a row of logits, and where the model rolls back in place the host
records the next pass while the device runs the current one. `chained_pieces` drives a
request's `Generation` through such a chain for as long as the caller lets it (the
scheduler stops it when another request arrives, so that the two share passes again);
the tokens and text are the ones the feed-and-sample loop gives.
"""
from __future__ import annotations

from collections.abc import Callable, Generator

from .generation import Generation
from .session import Session

__all__ = ["can_chain", "chained_pieces"]


def can_chain(session: Session, gen: Generation) -> bool:
    """Whether `gen`'s next tokens may come from `session`'s device chain: the model
    has one, the request's tokens are plain argmax, and a token in the model's padded
    vocabulary tail (which the host never samples) can be undone by a rollback."""
    model = session.model
    caps = model.capabilities
    return (caps.greedy_chain and not gen.done and gen.token is not None
            and gen.plain_argmax and (caps.rollback or model.vocab <= gen.n_vocab))


def chained_pieces(session: Session, gen: Generation,
                   interrupt: Callable[[], bool]) -> Generator[str, None, None]:
    """Take `gen`'s tokens from the device chain (`can_chain` must hold), yielding the
    text each makes safe to show (one piece a token, maybe ""), until `gen` is done or
    `interrupt()` is true after a token. Afterwards, as in the feed-and-sample loop,
    the session holds every token of the request but `gen.token`, which the caller
    feeds next (with logits) unless `gen` is done: also after a token in the model's
    padded vocabulary tail, which is dropped, so that the row it came from is
    sampled on the host."""
    if gen.token is None:
        raise ValueError("chained_pieces: the generation has no token to feed")
    tail = False
    chain = session.greedy_chain(gen.token)
    try:
        for t in chain:
            if t >= gen.n_vocab:
                tail = True
                break
            yield gen.take(t) or ""
            if gen.done or interrupt():
                break
    finally:
        chain.close()
    if tail:        # gen.token was fed by the chain: forget it, the caller feeds it again
        session.rollback(session.pos - 1)
