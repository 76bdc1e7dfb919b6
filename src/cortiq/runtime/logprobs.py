"""Log-probabilities in OpenAI's response shapes.

`cortiq.runtime.generation` records, per generated token, its log-probability under the
model's own distribution (the log-softmax of the raw logits, before logit_bias,
penalties, hooks, the grammar mask and temperature) and the most likely alternatives
(`TokenLogprob`). This module spells them the way the OpenAI API does:

* chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
  "logprob", "bytes"}]}], "refusal": None}``;
* completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
  "text_offset"}`` (with ``echo``, the prompt's tokens first, the first one's
  logprob None as nothing predicts it).

A token's ``bytes`` are its exact UTF-8 bytes (a byte-level BPE token may hold part of
a character); its ``token`` is those bytes decoded, with U+FFFD for a partial
character.
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Sequence
from typing import ClassVar

from .generation import TokenLogprob

__all__ = ["TokenBytes", "chat_logprobs", "completion_logprobs"]

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_inverse() -> dict[str, int]:
    from ..text.tokenizer import _bytes_to_unicode
    return {c: b for b, c in _bytes_to_unicode().items()}


class TokenBytes:
    """Token id -> its bytes, for one tokenizer (cached; thread-safe)."""

    _by_tokenizer: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, tokenizer):
        self._tok = weakref.proxy(tokenizer)       # the cache entry must not keep it alive
        self._cache: dict[int, bytes] = {}
        self._special = frozenset(tokenizer.special_token_ids)
        backend = tokenizer.backend
        dec = backend.decoder
        try:
            text = dec.__getstate__() if dec is not None else ""
            text = text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # noqa: BLE001 -- older tokenizers: look at the whole JSON
            text = json.dumps(json.loads(backend.to_str()).get("decoder"))
        self._byte_level = "ByteLevel" in text
        self._metaspace = "Metaspace" in text or "\u2581" in text
        self._inverse = _byte_level_inverse() if self._byte_level else None

    @classmethod
    def of(cls, tokenizer) -> TokenBytes:
        with cls._lock:
            hit = cls._by_tokenizer.get(tokenizer)
            if hit is None:
                hit = cls._by_tokenizer[tokenizer] = cls(tokenizer)
            return hit

    def __call__(self, tid: int) -> bytes:
        b = self._cache.get(tid)
        if b is None:
            b = self._cache[tid] = self._compute(tid)
        return b

    def _compute(self, tid: int) -> bytes:
        piece = self._tok.id_to_token(tid)
        if piece is None:
            return b""
        if tid in self._special:
            return piece.encode("utf-8")
        m = _BYTE_TOKEN.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        inv = self._inverse
        if inv is not None and all(c in inv for c in piece):
            return bytes(inv[c] for c in piece)
        if self._metaspace:
            return piece.replace("\u2581", " ").encode("utf-8")
        return self._tok.decode([tid]).encode("utf-8")

    def text(self, tid: int) -> str:
        return self(tid).decode("utf-8", errors="replace")


def _entry(tb: TokenBytes, tid: int, lp: float) -> dict:
    return {"token": tb.text(tid), "logprob": lp, "bytes": list(tb(tid))}


def chat_logprobs(tokenizer, entries: Sequence[TokenLogprob]) -> dict:
    """The `choices[i].logprobs` object of a chat completion (or of one chunk)."""
    tb = TokenBytes.of(tokenizer)
    return {"content": [{**_entry(tb, e.token, e.logprob),
                         "top_logprobs": [_entry(tb, i, lp) for i, lp in e.top]}
                        for e in entries],
            "refusal": None}


def completion_logprobs(tokenizer, entries: Sequence[TokenLogprob], *,
                        text_offset: int = 0,
                        prompt: Sequence[TokenLogprob | int] = ()) -> dict:
    """The `choices[i].logprobs` object of a text completion: the prompt's entries
    first (echo; a bare token id where nothing predicts the token: logprob None),
    then the generated ones; `text_offset` is where the first token's text starts."""
    tb = TokenBytes.of(tokenizer)
    tokens: list[str] = []
    lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    at = text_offset
    for item in (*prompt, *entries):
        e = item if isinstance(item, TokenLogprob) else None
        tid = e.token if e is not None else int(item)  # type: ignore[arg-type]
        s = tb.text(tid)
        tokens.append(s)
        offsets.append(at)
        at += len(s)
        if e is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(e.logprob)
        top: dict[str, float] = {}
        for i, lp in e.top:
            top.setdefault(tb.text(i), lp)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": offsets}
