"""Reading a request's JSON body: the size limit, JSON that parses to an object, text
that is valid Unicode, a bounded nesting depth, and the model name this server serves."""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .errors import BadRequest

MAX_JSON_DEPTH = 64             # deeper request bodies are refused (no request needs 10)


async def read_json(request, max_body_bytes: int, names) -> dict:
    """The body as a dict, or a BadRequest: 413 over `max_body_bytes` (by its
    Content-Length, or counted as it streams in), 400 for what is not a JSON object,
    404 for a `model` that is none of `names` (a `state.ModelNames`)."""
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > max_body_bytes:
        raise BadRequest(f"request body of {cl} bytes exceeds the limit of "
                         f"{max_body_bytes}", None, 413, "request_too_large")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > max_body_bytes:
            raise BadRequest(f"request body exceeds the limit of {max_body_bytes} bytes",
                             None, 413, "request_too_large")
    try:
        body = json.loads(data)
    except RecursionError:
        raise BadRequest(f"the JSON body is nested deeper than {MAX_JSON_DEPTH} levels",
                         None, 400, "invalid_json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"invalid JSON body: {e}", None, 400, "invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("the JSON body must be an object")
    check_json_tree(body)
    model = body.get("model")
    if model is not None and model not in names.all:
        shown = model if isinstance(model, str) else json.dumps(model)
        served = "', '".join(names.all)
        raise BadRequest(f"the model '{shown}' does not exist (this server serves "
                         f"'{served}')", "model", 404, "model_not_found")
    return body


def _utf8_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def check_json_tree(body) -> None:
    """Refuse strings that cannot be UTF-8 (lone surrogates, which JSON's \\uXXXX
    escapes can spell) anywhere in the body, naming the field, and nesting deeper
    than MAX_JSON_DEPTH. Iterative, so no depth can overflow the stack."""
    stack: list[tuple[Any, tuple, int]] = [(body, (), 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            if not _utf8_ok(v):
                name = path_name(path)
                raise BadRequest(f"'{name}' contains a lone UTF-16 surrogate: not valid "
                                 "Unicode text", name, code="invalid_unicode")
            continue
        items: Iterable[tuple[Any, Any]]
        if isinstance(v, dict):
            items = v.items()
        elif isinstance(v, list):
            items = enumerate(v)
        else:
            continue
        if depth >= MAX_JSON_DEPTH:
            raise BadRequest(f"the JSON body is nested deeper than {MAX_JSON_DEPTH} levels",
                             path_name(path[:1]) or None, code="invalid_json")
        for k, x in items:
            if isinstance(k, str) and not _utf8_ok(k):
                name = path_name(path)
                raise BadRequest(f"a key in '{name or 'the body'}' contains a lone UTF-16 "
                                 "surrogate: not valid Unicode text", name or None,
                                 code="invalid_unicode")
            if isinstance(x, (str, dict, list)):
                stack.append((x, path + (k,), depth + 1))


def path_name(path) -> str:
    """A field's path as OpenAI's `param` spells it: messages[0].content."""
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out
