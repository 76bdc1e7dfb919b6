"""Reasoning text: a thinking model's ``<think>`` ... ``</think>`` block split off its
reply, as OpenAI-compatible servers return it (`reasoning_content` beside `content`).

Only templates that mark thinking are split (`template_thinks`: the source mentions
``<think>``); the block counts when the reply opens with it (leading whitespace
aside) or when the rendered prompt already opened it (`prompt_opens_think`: Qwen3's
and DeepSeek-R1's templates end the prompt with ``<think>\\n``, so the reply starts
inside the block). A block that never closes (the reply was cut off) is all
reasoning. Reasoning comes without the blank lines around it inside the block. Text after ``</think>`` (its leading blank lines dropped) is content.

`ReasoningStream` does the split incrementally: `feed(piece)` returns the
(reasoning, content) text that is safe to show now, holding back a tail that may be
the start of a tag split across pieces; `finish()` returns what was held.
`split(text, in_think)` is the whole-reply form.
"""
from __future__ import annotations

__all__ = ["ReasoningStream", "prompt_opens_think", "split", "template_thinks"]

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


def template_thinks(template_source: str | None) -> bool:
    """Whether a chat template writes thinking blocks (and so replies are split)."""
    return OPEN_TAG in (template_source or "")


def prompt_opens_think(prompt_tail: str) -> bool:
    """Whether the rendered prompt ends inside an open think block (its last
    ``<think>`` comes after its last ``</think>``), so generation starts there."""
    return prompt_tail.rfind(OPEN_TAG) > prompt_tail.rfind(CLOSE_TAG)


def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ReasoningStream:
    """Incremental reasoning / content split of one reply (see the module docstring)."""

    def __init__(self, in_think: bool = False):
        # "start": nothing but whitespace yet (the reply may still open a block);
        # "think": inside the block; "after": just past </think>, blank lines skipped;
        # "content": the rest is content.
        self._state = "think" if in_think else "start"
        self._held = ""
        self.opened = in_think       # whether the reply had a think block
        self._started = False        # whether the block's text has begun

    def feed(self, piece: str) -> tuple[str, str]:
        """(reasoning, content) text of `piece` that is safe to show now."""
        reasoning, content = [], []
        text = self._held + piece
        self._held = ""
        while text:
            if self._state == "start":
                stripped = text.lstrip()
                if stripped.startswith(OPEN_TAG):
                    self._state, text = "think", stripped[len(OPEN_TAG):]
                    self.opened = True
                elif OPEN_TAG.startswith(stripped):   # blank, or a tag not yet whole
                    self._held = text
                    text = ""
                else:
                    self._state = "content"
            elif self._state == "think":
                if not self._started:            # the blank lines after <think>
                    text = text.lstrip()
                    self._started = bool(text)
                    continue
                end = text.find(CLOSE_TAG)
                if end >= 0:
                    reasoning.append(text[:end].rstrip())
                    self._state, text = "after", text[end + len(CLOSE_TAG):]
                else:
                    # held back: a possible start of </think>, and the whitespace
                    # before it (dropped if the block closes right after)
                    body = text[:len(text) - _partial_tail(text, CLOSE_TAG)]
                    shown = body.rstrip()
                    reasoning.append(shown)
                    self._held, text = text[len(shown):], ""
            elif self._state == "after":
                text = text.lstrip()
                if text:
                    self._state = "content"
            else:
                content.append(text)
                text = ""
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """(reasoning, content) still held at the end of the reply."""
        held, self._held = self._held, ""
        if self._state == "think":
            return held.rstrip(), ""
        if self._state == "start":
            return "", held
        return "", ""


def split(text: str, in_think: bool = False) -> tuple[str | None, str]:
    """(reasoning or None when the reply has no think block, content) of a reply."""
    stream = ReasoningStream(in_think)
    r1, c1 = stream.feed(text)
    r2, c2 = stream.finish()
    return (r1 + r2 if stream.opened else None), c1 + c2
