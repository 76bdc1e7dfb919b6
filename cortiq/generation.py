"""One request's decoding: from each row of logits to the next token and the text to show.

`Generation` holds everything that belongs to a single request and nothing that belongs
to the model: its sampler (seeded per request), the token history the penalties see,
the stop rules (EOS ids, stop strings, the token limit), the incremental detokenizer
and the `Result` it fills. The loop that owns the model feeds it one row of logits at
a time:

    gen = Generation(tokenizer, prompt_ids, params, limit, stop, result)
    logits = session.prefill(prompt_ids)[1]
    while True:
        piece = gen.step(logits)          # samples; None once finished
        if piece: yield piece
        if gen.done: break
        logits = session.feed([gen.token], want="last")
    tail = gen.finish()

so one session's loop (`LLM.generate`) and a batch of many (a scheduler feeding
several sessions in one forward) share the same per-request rules, and a request
behaves the same whichever of them runs it.
"""
from __future__ import annotations

import numpy as np

from .errors import ModelError
from .sampling import Sampler, SamplingParams
from .stopping import StopChecker

__all__ = ["Generation", "Result", "check_finite"]

DETOK_CONTEXT = 4                 # prompt ids given to the stream decoder as context


def check_finite(logits, position: int) -> None:
    """ModelError unless every logit is finite (one vectorised pass, ~30 us for a
    150k vocabulary: a fraction of what the sampler's own float64 copy costs)."""
    if not np.isfinite(logits).all():
        raise ModelError(f"model produced non-finite logits at position {position} — the "
                         "file may be damaged: run cortiq verify")


class Result:
    """What one generation produced (filled while it runs)."""
    __slots__ = ("prompt_tokens", "cached_tokens", "token_ids", "text", "finish_reason",
                 "skill", "prefill_s", "decode_s")

    def __init__(self):
        self.prompt_tokens = self.cached_tokens = 0
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.skill = None
        self.prefill_s = self.decode_s = 0.0

    def usage(self) -> dict:
        n = len(self.token_ids)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n,
                "total_tokens": self.prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


class Generation:
    """The per-request half of a generation loop (see the module docstring).

    `limit`: the most tokens to generate (already capped by the context size); `stop`:
    stop strings (normalised). After `step`, `token` is the id to feed next unless
    `done`; `result.finish_reason` is "stop" (EOS id or stop string), "length" or
    "cancelled" (`cancel()`)."""

    def __init__(self, tokenizer, prompt_ids, params: SamplingParams, limit: int, stop,
                 result: Result):
        self.result = result
        self.limit = limit
        self.sampler = Sampler(params)
        self.history = list(prompt_ids)
        self.decoder = tokenizer.stream_decoder(prefix_ids=self.history[-DETOK_CONTEXT:])
        self.stops = StopChecker(stop, tokenizer.eos_token_ids)
        self.n_vocab = tokenizer.vocab_size    # a padded vocabulary's tail never samples
        self.token: int | None = None
        self.done = limit <= 0
        result.finish_reason = "length"

    def step(self, logits) -> str | None:
        """Sample the next token from `logits` (the row after the last token) and
        return the text it makes safe to show (may be ""); None when finished."""
        if self.done:
            return None
        check_finite(logits, len(self.history) - 1)
        t = self.sampler.sample(logits[:self.n_vocab], self.history)
        if self.stops.check_token(t):
            return self._end("stop")
        self.history.append(t)
        self.result.token_ids.append(t)
        self.token = t
        piece = self.stops.feed(self.decoder.feed(t))
        if self.stops.stopped:
            self._end("stop")
        elif len(self.result.token_ids) >= self.limit:
            self._end("length")
        return piece

    def cancel(self) -> None:
        if not self.done:
            self._end("cancelled")

    def _end(self, reason: str) -> None:
        self.done = True
        self.token = None
        self.result.finish_reason = reason
        return None

    def finish(self) -> str:
        """The text held back until the end (stop-string look-ahead, partial UTF-8);
        sets `result.text`."""
        tail = self.stops.finish(self.decoder.flush())
        self.result.text = self.stops.text
        return tail
