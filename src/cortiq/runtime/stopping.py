"""Stop conditions for generation: end-of-sequence ids and stop strings.

Stop strings are matched on the *text*, so one can straddle several tokens
("<|end" + "|>"). `StopChecker` works incrementally on the pieces a
`StreamDecoder` yields::

    chk = StopChecker(stop=["\\n\\nUser:"], eos_token_ids=tok.eos_token_ids)
    for each new token id t:
        if chk.check_token(t): break               # EOS: finish_reason "stop"
        emit(chk.feed(decoder.feed(t)))            # text that is safe to show now
        if chk.stopped: break                      # a stop string completed
    emit(chk.finish(decoder.flush()))              # what was held back, if no stop hit
    chk.text                                       # final text, cut before the stop string

Rules:

* Text that might be the beginning of a stop string is held back (the longest
  suffix of the pending text that is a proper prefix of some stop string) until
  it either completes a stop string or can no longer do so.
* Generation stops as soon as any stop string appears in the text; the output is
  cut right before the earliest occurrence (ties in position: whichever string
  matches there -- the cut is the same). The stop string itself is not emitted.
  This equals `truncate_at_stop(full_text, stop)` for the text generated up to
  that point.
* EOS ids stop without emitting anything for that token.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigError

__all__ = ["StopChecker", "normalize_stop", "truncate_at_stop"]


def normalize_stop(stop) -> tuple[str, ...]:
    """A stop spec (None, one string, or a list of strings) as a tuple of strings.
    Empty strings are an error; duplicates are dropped."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Iterable):
        raise ConfigError(f"stop: expected a string or a list of strings, got {stop!r}")
    out: list[str] = []
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise ConfigError(f"stop[{i}]: expected a string, got {s!r}")
        if not s:
            raise ConfigError(f"stop[{i}]: stop strings must not be empty")
        if s not in out:
            out.append(s)
    return tuple(out)


def _earliest(text: str, stops: tuple[str, ...], start: int = 0) -> int:
    """Index of the earliest occurrence of any stop string at or after `start`, or -1."""
    best = -1
    for s in stops:
        i = text.find(s, start)
        if i != -1 and (best == -1 or i < best):
            best = i
    return best


def truncate_at_stop(text: str, stop) -> tuple[str, bool]:
    """(text cut before the earliest stop string, whether one was found)."""
    stops = normalize_stop(stop)
    i = _earliest(text, stops)
    return (text, False) if i == -1 else (text[:i], True)


class StopChecker:
    """Incremental stop-string and EOS detection (see the module docstring)."""

    def __init__(self, stop=None, eos_token_ids: Iterable[int] = (), *,
                 stop_token_ids: Iterable[int] = ()):
        self.stop = normalize_stop(stop)
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids) | frozenset(
            int(i) for i in stop_token_ids)
        self._max = max((len(s) for s in self.stop), default=0)
        # Every proper prefix of every stop string, for the hold-back test.
        self._prefixes = frozenset(s[:k] for s in self.stop for k in range(1, len(s)))
        self._pending = ""              # text held back, not yet emitted
        self._out: list[str] = []       # everything emitted
        self.stopped = False
        self.stop_reason: str | None = None     # "eos" | "stop_string" | None
        self.matched: str | int | None = None   # the stop string or EOS id that fired

    # -- tokens ---------------------------------------------------------------------
    def check_token(self, token_id: int) -> bool:
        """True (and stopped) when `token_id` is an EOS / stop id."""
        if self.stopped:
            return True
        if int(token_id) in self.eos_token_ids:
            self.stopped, self.stop_reason, self.matched = True, "eos", int(token_id)
            return True
        return False

    # -- text -----------------------------------------------------------------------
    def _held_suffix_len(self, buf: str) -> int:
        for k in range(min(len(buf), self._max - 1), 0, -1):
            if buf[-k:] in self._prefixes:
                return k
        return 0

    def feed(self, piece: str) -> str:
        """Add streamed text; return the part that is safe to emit now ('' when all
        of it might still start a stop string, or after stopping)."""
        if self.stopped or not piece:
            return ""
        if not self.stop:
            self._out.append(piece)
            return piece
        buf = self._pending + piece
        i = _earliest(buf, self.stop)
        if i != -1:
            self.stopped, self.stop_reason = True, "stop_string"
            self.matched = next(s for s in self.stop if buf.startswith(s, i))
            self._pending = ""
            emit = buf[:i]
        else:
            h = self._held_suffix_len(buf)
            emit, self._pending = buf[:len(buf) - h], buf[len(buf) - h:]
        if emit:
            self._out.append(emit)
        return emit

    def finish(self, piece: str = "") -> str:
        """Generation ended for another reason (EOS, max tokens): feed `piece` (e.g.
        the decoder's flush) and release everything still held back."""
        out = self.feed(piece)
        if self.stopped and self.stop_reason == "stop_string":
            return out
        rest, self._pending = self._pending, ""
        if rest:
            self._out.append(rest)
        return out + rest

    @property
    def pending(self) -> str:
        """Text currently held back."""
        return self._pending

    @property
    def text(self) -> str:
        """Everything emitted so far (after `finish`, the final text)."""
        return "".join(self._out)
