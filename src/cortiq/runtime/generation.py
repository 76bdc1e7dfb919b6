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
        logits = session.feed([gen.token], want="last", prompt=False)
    tail = gen.finish()

so one session's loop (`LLM.generate`) and a batch of many (a scheduler feeding
several sessions in one forward) share the same per-request rules, and a request
behaves the same whichever of them runs it.

`Options` adds the optional per-token rules, in the order `step` applies them:

1. logprobs: the log-softmax of the row exactly as the model gave it (before
   logit_bias, penalties, hooks, the grammar mask and temperature, as OpenAI reports
   them): the chosen token's and the `top` most likely ones, into `result.logprobs`
   once some of the token's text is shown -- a token whose text a stop string cuts
   away, or holds back while it may start one, has no entry (yet), so the entries
   cover exactly the tokens whose text is returned, streamed or not;
2. `logits_processor` hooks (llama-cpp-python's contract: `fn(input_ids, scores) ->
   scores`, a list runs in order), on a float32 copy;
3. the grammar mask (`cortiq.text.structured`): forbidden tokens -> -inf;
4. the sampler chain (`cortiq.runtime.sampling`) draws the token;
5. `stopping_criteria(input_ids, scores) -> bool` (ids including the new token, the
   scores it was drawn from): True ends the generation after that token ("stop").
"""
from __future__ import annotations

import collections

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, ModelError
from .sampling import Sampler, SamplingParams
from .stopping import StopChecker

__all__ = ["Generation", "Options", "Result", "TokenLogprob", "check_finite", "log_softmax"]

DETOK_CONTEXT = 4                 # prompt ids given to the stream decoder as context


def check_finite(logits, position: int) -> None:
    """ModelError unless every logit is finite (one vectorised pass, ~30 us for a
    150k vocabulary: a fraction of what the sampler's own float64 copy costs)."""
    if not np.isfinite(logits).all():
        raise ModelError(f"model produced non-finite logits at position {position} — the "
                         "file may be damaged: run cortiq verify")


MAX_TOP_LOGPROBS = 20             # OpenAI's limit on top_logprobs

LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]
StoppingCriterion = Callable[[np.ndarray, np.ndarray], bool]


def log_softmax(row) -> np.ndarray:
    """float64 log-probabilities of a row of logits (max subtracted; -inf stays -inf)."""
    z = np.asarray(row, dtype=np.float64)
    m = z.max()
    if not np.isfinite(m):
        m = 0.0
    z = z - m
    return z - np.log(np.exp(z).sum())


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and the `top` most likely alternatives
    [(id, logprob), ...] (most likely first)."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def _callables(name: str, value) -> tuple:
    if value is None:
        return ()
    fns = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    for f in fns:
        if not callable(f):
            raise ConfigError(f"{name}: expected a callable or a list of them, got {f!r}")
    return fns


@dataclass(frozen=True)
class Options:
    """A request's optional per-token rules (see the module docstring).

    `logprobs`: None (off) or how many top alternatives to report per token (0-20);
    `grammar`: a `cortiq.text.structured.Grammar`; `logits_processor` /
    `stopping_criteria`: a callable or a list of them."""
    logprobs: int | None = None
    grammar: Any = None
    logits_processor: Sequence[LogitsProcessor] | LogitsProcessor | None = None
    stopping_criteria: Sequence[StoppingCriterion] | StoppingCriterion | None = None

    def __post_init__(self):
        lp = self.logprobs
        if lp is not None and (isinstance(lp, bool) or not isinstance(lp, (int, np.integer))
                               or not 0 <= lp <= MAX_TOP_LOGPROBS):
            raise ConfigError(f"logprobs: expected an integer in [0, {MAX_TOP_LOGPROBS}] "
                              f"(how many top alternatives per token), got {lp!r}")
        object.__setattr__(self, "logits_processor",
                           _callables("logits_processor", self.logits_processor))
        object.__setattr__(self, "stopping_criteria",
                           _callables("stopping_criteria", self.stopping_criteria))


NO_OPTIONS = Options()


class Result:
    """What one generation produced (filled while it runs)."""
    __slots__ = (
        "cached_tokens",
        "decode_s",
        "finish_reason",
        "logprobs",
        "prefill_s",
        "prompt_tokens",
        "skill",
        "text",
        "token_ids",
    )

    def __init__(self):
        self.prompt_tokens = self.cached_tokens = 0
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.skill = None
        self.prefill_s = self.decode_s = 0.0
        self.logprobs: list[TokenLogprob] | None = None    # with Options.logprobs

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
    "cancelled" (`cancel()`). `options`: the optional rules (`Options`)."""

    def __init__(self, tokenizer, prompt_ids, params: SamplingParams, limit: int, stop,
                 result: Result, options: Options | None = None):
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
        o = options or NO_OPTIONS
        self.n_top = o.logprobs
        if o.logprobs is not None:
            result.logprobs = []
        # logprobs waiting for their token's text to be shown: (where the token's text
        # starts in the decoded text, entry); the decoded and the shown text's lengths
        self._held_lp: collections.deque = collections.deque()
        self._decoded = self._shown = 0
        self.processors: tuple = tuple(o.logits_processor or ())  # type: ignore[arg-type]
        self.criteria: tuple = tuple(o.stopping_criteria or ())    # type: ignore[arg-type]
        self.matcher = o.grammar.matcher() if o.grammar is not None else None

    @property
    def plain_argmax(self) -> bool:
        """Each token is its row's argmax and nothing else reads the row (no logprobs,
        hooks, grammar or stopping criteria): a token chosen by the model's own argmax
        (`take`) is the one `step` would sample."""
        return (self.sampler.params.is_plain_argmax and self.n_top is None
                and not self.processors and not self.criteria and self.matcher is None)

    def step(self, logits) -> str | None:
        """Sample the next token from `logits` (the row after the last token) and
        return the text it makes safe to show (may be ""); None when finished."""
        if self.done:
            return None
        check_finite(logits, len(self.history) - 1)
        row = logits[:self.n_vocab]
        scores = self._shape_scores(row)
        t = self.sampler.sample(scores, self.history)
        return self._accept(t, row, scores)

    def take(self, t: int) -> str | None:
        """`step` for a token already chosen as its row's argmax (the device's, in a
        chained greedy decode; only where `plain_argmax`, t inside the vocabulary)."""
        if self.done:
            return None
        if not self.plain_argmax:
            raise ConfigError("Generation.take: this request's tokens are not plain argmax "
                              "(sampling, penalties, logprobs or hooks need the logits)")
        if not 0 <= t < self.n_vocab:
            raise ValueError(f"Generation.take: token {t} is outside the vocabulary "
                             f"[0, {self.n_vocab})")
        return self._accept(int(t), None, None)

    def _accept(self, t: int, row, scores) -> str | None:
        """The rules after the choice of token t (from `row`, shaped into `scores`)."""
        if self.matcher is not None:
            self.matcher.accept(t)
        if self.stops.check_token(t):          # an end token is not part of the output
            self._end("stop")
            return None
        if self.result.logprobs is not None:
            self._held_lp.append((self._decoded, self._logprob(row, t)))
        self.history.append(t)
        self.result.token_ids.append(t)
        self.token = t
        text = self.decoder.feed(t)
        self._decoded += len(text)
        piece = self.stops.feed(text)
        self._show(piece)
        if self.stops.stopped or (self.matcher is not None and self.matcher.stopped) or self._criteria_met(scores):
            self._end("stop")
        elif len(self.result.token_ids) >= self.limit:
            self._end("length")
        return piece

    def _shape_scores(self, row):
        """The row the sampler sees: after the hooks and the grammar mask."""
        if not self.processors and self.matcher is None:
            return row
        scores = np.array(row, dtype=np.float32)
        if self.processors:
            ids = np.asarray(self.history, dtype=np.intc)
            for fn in self.processors:
                out = fn(ids, scores)
                if out is not None:
                    out = np.asarray(out)
                    if out.shape != scores.shape or not np.issubdtype(out.dtype, np.floating):
                        raise ConfigError(f"logits_processor {fn!r} returned "
                                          f"{out.dtype} {out.shape}; expected floats of "
                                          f"shape {scores.shape}")
                    scores = np.asarray(out, dtype=np.float32)
            scores[np.isnan(scores)] = -np.inf
        if self.matcher is not None:
            self.matcher.apply(scores)
        return scores

    def _show(self, piece: str, final: bool = False) -> None:
        """`piece` was shown: the tokens whose text now starts inside the shown text
        get their logprobs (at the end every token left, unless a stop string cut
        the text: those tokens' text is not returned)."""
        self._shown += len(piece)
        held, out = self._held_lp, self.result.logprobs
        if not held or out is None:
            return
        cut = self.stops.stop_reason == "stop_string"
        while held and (held[0][0] < self._shown or (final and not cut)):
            out.append(held.popleft()[1])
        if final:
            held.clear()

    def _logprob(self, row, t: int) -> TokenLogprob:
        lp = log_softmax(row)
        top: tuple = ()
        k = self.n_top
        if k:
            k = min(k, lp.size)
            # the k-th largest value; of the ids tied with it, the lowest make the cut
            # (argpartition alone would pick an arbitrary one of them)
            kth = -np.partition(-lp, k - 1)[k - 1]
            above = np.flatnonzero(lp > kth)
            idx = np.concatenate([above, np.flatnonzero(lp == kth)[:k - above.size]])
            idx = idx[np.lexsort((idx, -lp[idx]))]       # most likely first, ties by id
            top = tuple((int(i), float(lp[i])) for i in idx)
        return TokenLogprob(int(t), float(lp[t]), top)

    def _criteria_met(self, scores) -> bool:
        if not self.criteria:
            return False
        ids = np.asarray(self.history, dtype=np.intc)
        return any(bool(fn(ids, scores)) for fn in self.criteria)

    def cancel(self) -> None:
        if not self.done:
            self._end("cancelled")

    def _end(self, reason: str) -> None:
        self.done = True
        self.token = None
        self.result.finish_reason = reason

    def finish(self) -> str:
        """The text held back until the end (stop-string look-ahead, partial UTF-8);
        sets `result.text`."""
        tail = self.stops.finish(self.decoder.flush())
        self._show(tail, final=True)
        self.result.text = self.stops.text
        return tail
