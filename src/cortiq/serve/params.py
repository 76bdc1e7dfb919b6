"""Checks of the request fields the generation routes share: typed numbers and booleans
in range, the sampling fields, max_tokens, and OpenAI parameters this server refuses
rather than silently ignores. Each failure is a BadRequest naming the field."""
from __future__ import annotations

import json
import math

from .errors import BadRequest

MAX_STOP = 4
MAX_TOP_LOGPROBS = 20

# Parameters OpenAI defines that this server does not implement, with the values that
# leave the output unchanged (anything else is refused rather than silently ignored).
_UNIMPLEMENTED = (
    ("functions", lambda v: v == []),
    ("function_call", lambda v: v in ("none", "auto")),
    ("reasoning_effort", lambda v: False),
    ("modalities", lambda v: v == ["text"]),
    ("audio", lambda v: False),
    ("prediction", lambda v: False),
    ("web_search_options", lambda v: False),
)


def number(body, name, lo, hi, *, integer=False, default=None):
    """body[name] as a number in [lo, hi] (an int when `integer`), or None if absent."""
    v = body.get(name, default)
    if v is None:
        return None
    ok_type = (isinstance(v, int) if integer else isinstance(v, (int, float))) \
        and not isinstance(v, bool)
    if not ok_type or (not integer and not math.isfinite(v)):
        kind = "an integer" if integer else "a number"
        raise BadRequest(f"'{name}' must be {kind}, got {json.dumps(v)}", name)
    if not lo <= v <= hi:
        hi_s = "inf" if hi == math.inf else f"{hi:g}"
        raise BadRequest(f"'{name}' must be in [{lo:g}, {hi_s}], got {v}", name)
    return v


def boolean(body, name) -> bool:
    """body[name] as a boolean; absent or null is False."""
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadRequest(f"'{name}' must be a boolean, got {json.dumps(v)}", name)
    return v


def _refuse_other_values(body, name, allowed) -> None:
    v = body.get(name)
    if v is not None and v not in allowed:
        raise BadRequest(f"'{name}'={json.dumps(v)} is not supported by this server", name)


def refuse_unimplemented(body) -> None:
    for name, harmless in _UNIMPLEMENTED:
        v = body.get(name)
        if v is not None and not harmless(v):
            raise BadRequest(f"'{name}' is not supported by this server yet (it would change "
                             "the output, so it is refused rather than ignored)", name,
                             code="unsupported_parameter")
    v = body.get("parallel_tool_calls")
    if v is not None and not isinstance(v, bool):
        raise BadRequest(f"'parallel_tool_calls' must be a boolean, got {json.dumps(v)}",
                         "parallel_tool_calls")


def sampling(body, vocab: int) -> dict:
    """The sampling fields present in the body, checked (logit_bias against a vocabulary
    of `vocab` tokens), plus `stop` as a list and `stream_options`; `n`, `best_of` other
    than 1 and a non-empty `suffix` are refused."""
    out = {}
    for name, lo, hi, integer in (("temperature", 0, 2, False), ("top_p", 0, 1, False),
                                  ("presence_penalty", -2, 2, False),
                                  ("frequency_penalty", -2, 2, False),
                                  ("min_p", 0, 1, False),
                                  ("repetition_penalty", 1e-6, 10, False),
                                  ("top_k", 0, 1 << 31, True), ("seed", 0, 2**63 - 1, True)):
        v = number(body, name, lo, hi, integer=integer)
        if v is not None:
            out[name] = v
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise BadRequest("'logit_bias' must be an object {token id: bias}", "logit_bias")
        clean = {}
        for k, v in bias.items():
            try:
                tid = int(k)
            except (TypeError, ValueError):
                raise BadRequest(f"'logit_bias': key {k!r} is not a token id", "logit_bias") \
                    from None
            if not 0 <= tid < vocab:
                raise BadRequest(f"'logit_bias': token id {tid} is outside the vocabulary "
                                 f"[0, {vocab})", "logit_bias")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                raise BadRequest(f"'logit_bias': bias of {tid} must be in [-100, 100]",
                                 "logit_bias")
            clean[tid] = float(v)
        out["logit_bias"] = clean
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise BadRequest("'stop' must be a non-empty string or a list of them", "stop")
        if len(stop) > MAX_STOP:
            raise BadRequest(f"'stop' takes at most {MAX_STOP} strings", "stop")
        out["stop"] = stop
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise BadRequest("'stream_options' must be an object", "stream_options")
        out["stream_options"] = so
    for name, allowed in (("n", (1,)), ("best_of", (1,)), ("suffix", ("",))):
        _refuse_other_values(body, name, allowed)
    return out


def max_tokens(body, *names):
    """The first of `names` present, as a token count >= 1, or None."""
    for name in names:
        v = number(body, name, 1, 1 << 31, integer=True)
        if v is not None:
            return v
    return None
