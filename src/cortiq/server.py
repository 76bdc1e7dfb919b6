"""An OpenAI-compatible HTTP server over one `cortiq.LLM` (needs the `serve` extra).

    cortiq serve model.cmf --host 127.0.0.1 --port 8080

Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (both
with `"stream": true` as server-sent events ending in `data: [DONE]`, and `usage`
counts; `stream_options.include_usage` adds the usage chunk to chat streams), POST
/v1/embeddings (`input`: strings or token ids; `encoding_format` float or base64;
cortiq's `pooling`: "mean" or "last"), GET /healthz. Chat takes `logprobs` /
`top_logprobs`, `response_format` (json_object, json_schema: enforced while sampling),
`tools` / `tool_choice` / `parallel_tool_calls` (calls parsed into
`message.tool_calls`); completions take `logprobs` (0-20) and `echo`. Requests are
checked up front and refused with OpenAI's error shape
`{"error": {"message", "type", "param", "code"}}`:

* 400 invalid JSON or HTTP, JSON nested deeper than 64 levels, a string with a
  lone UTF-16 surrogate (naming the field), a missing/ill-typed field, a parameter
  out of range, a prompt longer than the context or a prompt plus an explicit
  `max_tokens` over it (`code: "context_length_exceeded"`), a parameter this server
  does not implement and that would change the output (`functions`, `function_call`,
  `reasoning_effort`, `modalities` other than ["text"], `audio`, `prediction`,
  `web_search_options`), a conversation the chat template rejects
  (`raise_exception`);
* 404 a model name this server does not serve (`code: "model_not_found"`) or an
  unknown path; 405 a wrong method; 413 a body over `max_body_bytes`;
* 429 when `max_concurrency` generations run and `max_queue` more wait
  (`code: "queue_full"`, with `Retry-After`); the client may retry;
* 500 (`type: "server_error"`, logged) a fault of the server's side: the model's chat
  template failing by itself (a bug, its time or size limit), a damaged weight found
  on first use, non-finite logits;
* 503 the server is shutting down (`code: "server_shutting_down"`).

Admission comes first: a request is admitted (or refused 429) before any work, then
its chat template is rendered and its prompt tokenized once, in a worker thread, so
a huge prompt or a slow template never stalls the event loop (/healthz, other
streams). Generation runs in worker threads (the kernels release the GIL, so
requests run concurrently on one model); a streaming client that disconnects stops
its generation within one token.

Shutdown (SIGTERM/SIGINT): stop accepting connections and let running requests
finish for up to `graceful_timeout` seconds; then every request still running is cut
cleanly -- a stream gets an error event in OpenAI's shape and `data: [DONE]`, a
non-streamed request a 503 -- and `serve` returns the number cut (the CLI then exits
1). A second SIGINT cuts at once.

Sampling fields: OpenAI's temperature [0, 2], top_p [0, 1], presence_penalty and
frequency_penalty [-2, 2], logit_bias, seed, stop (up to 4 strings), max_tokens
(chat: also max_completion_tokens), plus cortiq's top_k, min_p and
repetition_penalty. A sampling field left out takes `cortiq.SamplingParams`' default
(upstream cortiq's, e.g. temperature 0.7), not OpenAI's; max_tokens left out is 16 on
/v1/completions (OpenAI's default) and "until EOS or the context is full" on chat.
`n`, `best_of` other than 1, `suffix` and embeddings' `dimensions` are refused (400)
rather than silently ignored.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from .errors import ConfigError, CortiqError

log = logging.getLogger("cortiq.server")

__all__ = ["create_app", "serve"]

MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
MAX_EMBED_INPUTS = 2048         # OpenAI's limit on inputs per embeddings request
COMPLETION_MAX_TOKENS = 16      # OpenAI's default for /v1/completions (chat: no limit)
MAX_JSON_DEPTH = 64             # deeper request bodies are refused (no request needs 10)
RETRY_AFTER_S = 1               # what a 429 tells the client to wait
SHUTDOWN_MARGIN_S = 5.0         # uvicorn's own deadline, past ours, for the cut replies


class BadRequest(Exception):
    def __init__(self, message, param=None, status=400, code=None, type_="invalid_request_error",
                 headers=None):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = \
            message, param, status, code, type_
        self.headers = headers


def _error_body(message, type_="invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _error_bytes(message, type_="invalid_request_error", param=None, code=None) -> bytes:
    # ensure_ascii: an error body must encode whatever ended up in the message
    return json.dumps(_error_body(message, type_, param, code)).encode("ascii")


def _utf8_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _check_json_tree(body) -> None:
    """Refuse strings that cannot be UTF-8 (lone surrogates, which JSON's \\uXXXX
    escapes can spell) anywhere in the body, naming the field, and nesting deeper
    than MAX_JSON_DEPTH. Iterative, so no depth can overflow the stack."""
    stack: list[tuple[Any, tuple, int]] = [(body, (), 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            if not _utf8_ok(v):
                name = _path_name(path)
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
                             _path_name(path[:1]) or None, code="invalid_json")
        for k, x in items:
            if isinstance(k, str) and not _utf8_ok(k):
                name = _path_name(path)
                raise BadRequest(f"a key in '{name or 'the body'}' contains a lone UTF-16 "
                                 "surrogate: not valid Unicode text", name or None,
                                 code="invalid_unicode")
            if isinstance(x, (str, dict, list)):
                stack.append((x, path + (k,), depth + 1))


def _path_name(path) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else k)
    return out


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


def _refuse_unimplemented(body) -> None:
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


def _structured(body, chat: bool) -> dict:
    """logprobs / echo / response_format / tools fields, type-checked (their contents
    are checked where they are compiled: a ConfigError there is a 400 too)."""
    out: dict = {}
    if chat:
        if _bool(body, "logprobs"):
            out["logprobs"] = True
            top = _num(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
            if top is not None:
                out["top_logprobs"] = top
        elif body.get("top_logprobs") not in (None, 0):
            raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        rf = body.get("response_format")
        if rf is not None:
            if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object",
                                                                  "json_schema"):
                raise BadRequest("'response_format' must be {\"type\": \"text\" | "
                                 "\"json_object\" | \"json_schema\", ...}", "response_format")
            if rf["type"] == "json_schema" and not isinstance(rf.get("json_schema"), dict):
                raise BadRequest("'response_format.json_schema' must be an object with "
                                 "'name' and 'schema'", "response_format.json_schema")
            out["response_format"] = rf
        tools = body.get("tools")
        if tools is not None:
            if not isinstance(tools, list):
                raise BadRequest("'tools' must be an array of tool objects", "tools")
            out["tools"] = tools or None
        if body.get("tool_choice") is not None:
            out["tool_choice"] = body["tool_choice"]
        if body.get("parallel_tool_calls") is not None:
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    else:
        for name in ("response_format", "tools", "tool_choice"):   # chat-only fields
            if body.get(name) is not None and body[name] != {"type": "text"}:
                raise BadRequest(f"'{name}' is not supported on /v1/completions (use "
                                 "/v1/chat/completions)", name, code="unsupported_parameter")
        lp = _num(body, "logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
        if lp is not None:
            out["logprobs"] = lp
        if _bool(body, "echo"):
            out["echo"] = True
    return out


# ---------------------------------------------------------------- request checks

def _num(body, name, lo, hi, *, integer=False, default=None):
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


def _bool(body, name):
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadRequest(f"'{name}' must be a boolean, got {json.dumps(v)}", name)
    return v


def _unsupported(body, name, allowed):
    v = body.get(name)
    if v is not None and v not in allowed:
        raise BadRequest(f"'{name}'={json.dumps(v)} is not supported by this server", name)


def _sampling(body, vocab) -> dict:
    out = {}
    for name, lo, hi, integer in (("temperature", 0, 2, False), ("top_p", 0, 1, False),
                                  ("presence_penalty", -2, 2, False),
                                  ("frequency_penalty", -2, 2, False),
                                  ("min_p", 0, 1, False),
                                  ("repetition_penalty", 1e-6, 10, False),
                                  ("top_k", 0, 1 << 31, True), ("seed", 0, 2**63 - 1, True)):
        v = _num(body, name, lo, hi, integer=integer)
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
        _unsupported(body, name, allowed)
    return out


def _max_tokens(body, *names):
    for name in names:
        v = _num(body, name, 1, 1 << 31, integer=True)
        if v is not None:
            return v
    return None


def _prompt(body):
    if "prompt" not in body:
        raise BadRequest("'prompt' is required", "prompt")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool)
                                         for i in p):
        return p
    raise BadRequest("'prompt' must be a string or a list of token ids (one prompt per "
                     "request)", "prompt")


def _messages(body):
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty array", "messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"'messages[{i}]' must be an object with a string 'role'",
                             f"messages[{i}]")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise BadRequest(f"'messages[{i}].content' must be a string or an array of parts",
                             f"messages[{i}].content")
        for j, part in enumerate(c if isinstance(c, list) else ()):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise BadRequest(f"'{where}' must be an object with a string 'type'", where)
            if part["type"] != "text":
                raise BadRequest(f"'{where}': content parts of type {part['type']!r} are not "
                                 "supported by this server (text only)", where,
                                 code="unsupported_content")
            if not isinstance(part.get("text"), str):
                raise BadRequest(f"'{where}.text' must be a string", f"{where}.text")
    from .chat import parse_tool_call_arguments
    return parse_tool_call_arguments(msgs)


# ---------------------------------------------------------------- the app

class _Gate:
    """At most `running` generations at once and `queued` more waiting."""

    def __init__(self, running: int, queued: int):
        self.capacity = running + queued
        self.sem = threading.BoundedSemaphore(running)
        self.lock = threading.Lock()
        self.admitted = 0

    def admit(self) -> bool:
        with self.lock:
            if self.admitted >= self.capacity:
                return False
            self.admitted += 1
            return True

    def leave(self):
        with self.lock:
            self.admitted -= 1


class _Shutdown:
    """The server's shutdown: `begin(grace)` marks it closing and, `grace` seconds
    later, cuts the requests still running; `cut_now()` cuts at once. Callable from any
    thread or a signal handler (everything goes through call_soon_threadsafe)."""

    def __init__(self):
        self.closing = False
        self.cut = asyncio.Event()
        self.n_cut = 0
        self.loop: asyncio.AbstractEventLoop | None = None   # set by the first request

    def _call(self, fn, *args):
        loop = self.loop
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:        # the loop is closed: nothing is running any more
            pass

    def begin(self, grace: float) -> None:
        self.closing = True
        self._call(lambda: asyncio.get_running_loop().call_later(grace, self.cut.set))

    def cut_now(self) -> None:
        self.closing = True
        self._call(self.cut.set)

    def error(self) -> tuple:
        return ("the server is shutting down: the request was cut before it finished",
                "server_error", None, "server_shutting_down")


def create_app(llm, *, max_concurrency: int = 2, max_queue: int = 8,
               max_body_bytes: int = 4 << 20, model_name: str | None = None,
               max_prompt_tokens: int | None = None):
    """The Starlette app serving `llm`. `app.state.shutdown` (a `_Shutdown`) drives a
    clean shutdown; `serve` calls it from its signal handling."""
    try:
        from starlette.applications import Starlette
        from starlette.concurrency import run_in_threadpool
        from starlette.exceptions import HTTPException
        from starlette.requests import ClientDisconnect
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route
    except ImportError as e:  # pragma: no cover - the serve extra
        raise CortiqError("cortiq serve needs the 'serve' extra: pip install "
                          "'cortiq[serve]' (starlette, uvicorn)") from e
    from .chat import TemplateRenderError
    name = model_name or llm.model_name
    gate = _Gate(max_concurrency, max_queue)
    created = int(time.time())
    active: set = set()                       # cancel events of running generations
    shutdown = _Shutdown()

    def err(status, message, param=None, code=None, type_="invalid_request_error",
            headers=None):
        return Response(_error_bytes(message, type_, param, code), status_code=status,
                        media_type="application/json", headers=headers)

    async def read_json(request):
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
        _check_json_tree(body)
        model = body.get("model")
        if model is not None and model != name:
            shown = model if isinstance(model, str) else json.dumps(model)
            raise BadRequest(f"the model '{shown}' does not exist (this server serves "
                             f"'{name}')", "model", 404, "model_not_found")
        return body

    def check_context(n, param, max_tokens, max_param="max_tokens"):
        """OpenAI's rule: the prompt must fit, and with an explicit max_tokens so must
        prompt + max_tokens."""
        cap = llm.n_ctx - 1 if max_prompt_tokens is None else min(max_prompt_tokens,
                                                                  llm.n_ctx - 1)
        if n > cap:
            raise BadRequest(f"the prompt is {n} tokens; this server takes at most {cap}",
                             param, 400, "context_length_exceeded")
        if max_tokens is not None and n + max_tokens > llm.n_ctx:
            raise BadRequest(f"this model's context is {llm.n_ctx} tokens: the prompt's {n} "
                             f"tokens plus max_tokens {max_tokens} do not fit ({n} + "
                             f"{max_tokens} > {llm.n_ctx}); lower max_tokens to at most "
                             f"{llm.n_ctx - n}", max_param, 400,
                             "context_length_exceeded")

    def plan(body, chat: bool):
        """Everything checkable without the tokenizer or the template (on the loop):
        -> (fn, kwargs, prepare) where prepare() runs in a worker thread and returns
        the prompt to generate from, checked against the context."""
        samp = _sampling(body, llm.vocab_size)
        _refuse_unimplemented(body)
        samp.update(_structured(body, chat))
        stop = samp.pop("stop", None)
        stream_options = samp.pop("stream_options", None)
        if chat:
            msgs = _messages(body)
            explicit = _max_tokens(body, "max_completion_tokens", "max_tokens")
            max_param = "max_completion_tokens" if body.get("max_completion_tokens") \
                is not None else "max_tokens"

            tools = samp.get("tools")

            def prepare():
                ids = llm.chat_prompt_ids(msgs, tools)
                check_context(len(ids), "messages", explicit, max_param)
                return {"prompt_ids": ids}
            kw = dict(messages=msgs, max_tokens=explicit, stop=stop,
                      stream_options=stream_options, **samp)
            fn = llm.create_chat_completion
        else:
            prompt = _prompt(body)
            explicit = _max_tokens(body, "max_tokens")

            def prepare():
                ids = prompt if isinstance(prompt, list) else llm.tokenize(prompt)
                check_context(len(ids), "prompt", explicit)
                return {"prompt": ids}
            kw = dict(max_tokens=explicit or COMPLETION_MAX_TOKENS, stop=stop,
                      stream_options=stream_options, **samp)
            fn = llm.create_completion
        return fn, kw, prepare

    def admit():
        # (no refusal while closing: uvicorn accepts no new connections then, and a
        # request that already reached us is served within the grace period)
        if not gate.admit():
            raise BadRequest(f"server busy: {gate.capacity} requests are running or queued; "
                             "retry later", None, 429, "queue_full", "rate_limit_error",
                             headers={"Retry-After": str(RETRY_AFTER_S)})

    async def handle(request, chat: bool):
        shutdown.loop = asyncio.get_running_loop()
        body = await read_json(request)
        stream = _bool(body, "stream")
        fn, kw, prepare = plan(body, chat)
        admit()                                   # before any tokenizing or rendering
        cancel = threading.Event()
        if stream:
            try:
                chunks = await run_in_threadpool(
                    lambda: fn(**kw, **prepare(), stream=True, cancel=cancel))
            except BaseException:
                gate.leave()
                raise
            return start_stream(chunks, cancel)

        def work():
            try:
                prompt = prepare()
                with gate.sem:
                    active.add(cancel)
                    try:
                        return fn(**kw, **prompt, stream=False, cancel=cancel)
                    finally:
                        active.discard(cancel)
            finally:
                gate.leave()
        task = asyncio.ensure_future(run_in_threadpool(work))
        cut = asyncio.ensure_future(shutdown.cut.wait())
        try:
            while not task.done():      # a client that hangs up cancels its generation
                done, _ = await asyncio.wait({task, cut}, timeout=0.25,
                                             return_when=asyncio.FIRST_COMPLETED)
                if cut in done and not task.done():
                    cancel.set()
                    shutdown.n_cut += 1
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())
                    msg, type_, param, code = shutdown.error()
                    return err(503, msg, param, code, type_)
                if not done and await request.is_disconnected():
                    cancel.set()
            return JSONResponse(task.result())
        finally:
            cut.cancel()
            if not task.done():
                cancel.set()

    def start_stream(chunks, cancel):
        """Generation in a producer thread, events to the client as they come. The
        producer encodes each chunk itself and wakes the event loop only when it finds
        the queue empty; the response drains whatever has piled up into one write. One
        wake-up and one write per token would cost the loop more than a small model
        takes to make the token (and its Python competes with generation for the GIL)."""
        loop = asyncio.get_running_loop()
        pending: collections.deque = collections.deque()
        lock = threading.Lock()
        ready = asyncio.Event()

        def put(kind, item):
            with lock:
                pending.append((kind, item))
                first = len(pending) == 1
            if first:
                try:
                    loop.call_soon_threadsafe(ready.set)
                except RuntimeError:             # the loop is gone (shutdown)
                    cancel.set()

        def producer():
            try:
                with gate.sem:
                    active.add(cancel)
                    try:
                        for c in chunks:
                            put("data", f"data: {json.dumps(c, ensure_ascii=False)}\n\n")
                            if cancel.is_set():
                                break
                    finally:
                        active.discard(cancel)
                        chunks.close()
            except Exception as e:  # noqa: BLE001 -- reported in-band
                put("error", e)
            finally:
                gate.leave()
                put("end", None)

        threading.Thread(target=producer, name="cortiq-gen", daemon=True).start()

        def event(message, type_, param, code):
            return f"data: {json.dumps(_error_body(message, type_, param, code))}\n\n"

        async def body():
            cut = asyncio.ensure_future(shutdown.cut.wait())
            cut.add_done_callback(lambda _: ready.set())
            try:
                while True:
                    await ready.wait()
                    ready.clear()
                    with lock:
                        batch = list(pending)
                        pending.clear()
                    out, last = [], None
                    for kind, item in batch:
                        if kind == "data":
                            out.append(item)
                        else:
                            last = (kind, item)
                            break
                    if out:
                        yield "".join(out)
                    if last is None and cut.done():
                        cancel.set()
                        shutdown.n_cut += 1
                        yield event(*shutdown.error())
                        break
                    if last is None:
                        continue
                    kind, item = last
                    if kind == "error":
                        status, msg, code = classify(item)
                        log_failure(status, msg, item)
                        yield event(msg, "server_error" if status >= 500 else
                                    "invalid_request_error", None, code)
                    break
                yield "data: [DONE]\n\n"
            finally:
                cut.cancel()
                cancel.set()                    # a disconnected client stops its generation

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    def classify(e) -> tuple:
        """(status, message, code) of an exception raised while serving a request."""
        if isinstance(e, BadRequest):
            return e.status, e.message, e.code
        msg = str(e) or type(e).__name__
        if isinstance(e, TemplateRenderError):
            return 500, f"the model's chat template failed: {msg}", "template_error"
        if isinstance(e, ConfigError) or (isinstance(e, CortiqError) and
                                          type(e).__name__ == "TemplateError"):
            code = "context_length_exceeded" if "do not fit the context" in msg else None
            return 400, msg, code
        if isinstance(e, CortiqError):         # FormatError (damaged weights), ModelError
            return 500, msg, None
        return 500, f"internal error: {type(e).__name__}: {e}", None

    def log_failure(status, msg, e):
        if status >= 500:
            log.error("request failed (%d): %s", status, msg,
                      exc_info=e if not isinstance(e, CortiqError) else None)

    def wrap(chat):
        async def endpoint(request):
            try:
                return await handle(request, chat)
            except BadRequest as e:
                return err(e.status, e.message, e.param, e.code, e.type, e.headers)
            except ClientDisconnect:
                return err(400, "client disconnected")
            except Exception as e:  # noqa: BLE001 -- answered in OpenAI's shape
                status, msg, code = classify(e)
                log_failure(status, msg, e)
                type_ = "server_error" if status >= 500 else "invalid_request_error"
                return err(status, msg, None, code, type_)
        return endpoint

    def embed_inputs(body):
        inp = body.get("input")
        if isinstance(inp, str) or isinstance(inp, list) and inp and all(isinstance(i, int) and not isinstance(
                i, bool) for i in inp):
            inp = [inp]
        if not isinstance(inp, list) or not inp or not all(
                (isinstance(x, str) and x) or (isinstance(x, list) and x and all(
                    isinstance(i, int) and not isinstance(i, bool) for i in x)) for x in inp):
            raise BadRequest("'input' must be a non-empty string, an array of them, or "
                             "token ids (an array of integers or of such arrays)", "input")
        if len(inp) > MAX_EMBED_INPUTS:
            raise BadRequest(f"'input' takes at most {MAX_EMBED_INPUTS} items", "input")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise BadRequest("'encoding_format' must be \"float\" or \"base64\"",
                             "encoding_format")
        if body.get("dimensions") is not None:
            raise BadRequest("'dimensions' is not supported by this server (embeddings have "
                             "the model's hidden size)", "dimensions",
                             code="unsupported_parameter")
        pooling = body.get("pooling", "mean")
        if pooling not in ("mean", "last"):
            raise BadRequest("'pooling' must be \"mean\" or \"last\"", "pooling")
        return inp, fmt, pooling

    async def embeddings(request):
        try:
            shutdown.loop = asyncio.get_running_loop()
            body = await read_json(request)
            inp, fmt, pooling = embed_inputs(body)
            admit()

            def work():
                try:
                    ids = [x if isinstance(x, list) else llm.tokenize(x) for x in inp]
                    for i, x in enumerate(ids):
                        check_context(len(x), f"input[{i}]", None)
                    with gate.sem:
                        return sum(map(len, ids)), llm.embed(ids, pooling=pooling)
                finally:
                    gate.leave()
            n, vecs = await run_in_threadpool(work)
        except BadRequest as e:
            return err(e.status, e.message, e.param, e.code, e.type, e.headers)
        except ClientDisconnect:
            return err(400, "client disconnected")
        except Exception as e:  # noqa: BLE001 -- answered in OpenAI's shape
            status, msg, code = classify(e)
            log_failure(status, msg, e)
            return err(status, msg, None, code,
                       "server_error" if status >= 500 else "invalid_request_error")
        import base64
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
                 if fmt == "base64" else [float(x) for x in v]} for i, v in enumerate(vecs)]
        return JSONResponse({"object": "list", "data": data, "model": name,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "cortiq"}]})

    async def healthz(request):
        return JSONResponse({"status": "shutting_down" if shutdown.closing else "ok",
                             "model": name, "running_or_queued": gate.admitted})

    async def http_error(request, exc):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return err(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                   None, code)

    app = Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", wrap(False), methods=["POST"]),
        Route("/v1/chat/completions", wrap(True), methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ], exception_handlers={HTTPException: http_error})
    app.state.llm = llm
    app.state.shutdown = shutdown
    app.state.cancel_all = lambda: [c.set() for c in list(active)]
    return app


def json_error_protocol():
    """uvicorn's HTTP protocol class with its malformed-request reply (a bad request
    line, `Content-Length: abc`, ...) in OpenAI's JSON error shape instead of text."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class JsonErrorHTTPProtocol(AutoHTTPProtocol):
        def send_400_response(self, msg: str) -> None:
            body = _error_bytes(f"invalid HTTP request: {msg}", code="invalid_http")
            head = [b"HTTP/1.1 400 Bad Request"]
            head += [n + b": " + v for n, v in self.server_state.default_headers]
            head += [b"content-type: application/json",
                     b"content-length: " + str(len(body)).encode("ascii"),
                     b"connection: close"]
            self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            self.transport.close()
    return JsonErrorHTTPProtocol


def serve(llm, host: str = "127.0.0.1", port: int = 8080, *, graceful_timeout: float = 30.0,
          log_level: str = "warning", announce: bool = True, **app_options) -> int:
    """Run the server until SIGINT/SIGTERM. Running requests get `graceful_timeout`
    seconds to finish; those still running then are cut (streams: an error event and
    [DONE]; others: 503). A second SIGINT cuts at once, a third exits at once.
    Returns the number of requests cut (0: a clean shutdown)."""
    try:
        import uvicorn
    except ImportError as e:  # pragma: no cover
        raise CortiqError("cortiq serve needs the 'serve' extra: pip install "
                          "'cortiq[serve]' (starlette, uvicorn)") from e
    import signal
    import socket
    app = create_app(llm, **app_options)
    shutdown = app.state.shutdown

    class _Server(uvicorn.Server):
        # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown (the process then
        # dies of the signal); this server returns instead, and cuts what is still
        # running itself (before uvicorn's deadline, which would cancel the tasks).
        def handle_exit(self, sig, frame):
            if not self.should_exit:
                self.should_exit = True
                shutdown.begin(graceful_timeout)
            elif sig == signal.SIGINT and not shutdown.cut.is_set():
                shutdown.cut_now()
            else:
                self.force_exit = True

    with _failures_on_stderr():
        # Bind here so that a busy port or a bad host is one OSError (one CLI line, exit 1),
        # not uvicorn's log line and exit code 3.
        try:
            family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
        except OSError as e:
            sock.close()
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        if announce:
            print(f"cortiq: serving {getattr(llm, 'model_name', 'model')} on "
                  f"http://{host}:{sock.getsockname()[1]}/v1", file=sys.stderr, flush=True)
        config = uvicorn.Config(app, log_level=log_level, http=json_error_protocol(),
                                timeout_graceful_shutdown=graceful_timeout + SHUTDOWN_MARGIN_S)  # type: ignore[arg-type]  # uvicorn takes seconds as float
        server = _Server(config)
        try:
            server.run(sockets=[sock])
        finally:
            app.state.cancel_all()
            sock.close()
        return shutdown.n_cut


@contextlib.contextmanager
def _failures_on_stderr():
    """While `serve` runs, failures (500s) show at the default level on stderr, unless
    the application configured the server's logger itself; undone afterwards, so a
    serve() call leaves the process's logging as it found it."""
    if log.handlers:
        yield
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("cortiq: %(levelname)s: %(message)s"))
    log.addHandler(h)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(h)
        log.propagate = True
