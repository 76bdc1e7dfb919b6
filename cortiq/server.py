"""An OpenAI-compatible HTTP server over one `cortiq.LLM` (needs the `serve` extra).

    cortiq serve model.cmf --host 127.0.0.1 --port 8080

Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (both
with `"stream": true` as server-sent events ending in `data: [DONE]`, and `usage`
counts; `stream_options.include_usage` adds the usage chunk to chat streams), GET
/healthz. Requests are checked up front and refused with OpenAI's error shape
`{"error": {"message", "type", "param", "code"}}`:

* 400 invalid JSON, a missing/ill-typed field, a parameter out of range, a prompt
  longer than the context (`code: "context_length_exceeded"`);
* 404 a model name this server does not serve (`code: "model_not_found"`) or an
  unknown path; 405 a wrong method; 413 a body over `max_body_bytes`;
* 429 when `max_concurrency` generations run and `max_queue` more wait
  (`code: "queue_full"`); the client may retry.

Generation runs in worker threads (the kernels release the GIL, so requests run
concurrently on one model); a streaming client that disconnects stops its
generation within one token. SIGTERM/SIGINT (uvicorn) stop accepting connections and
let running requests finish (up to `graceful_timeout` seconds).

Sampling fields: OpenAI's temperature [0, 2], top_p [0, 1], presence_penalty and
frequency_penalty [-2, 2], logit_bias, seed, stop (up to 4 strings), max_tokens
(chat: also max_completion_tokens), plus cortiq's top_k, min_p and
repetition_penalty. A sampling field left out takes `cortiq.SamplingParams`' default
(upstream cortiq's, e.g. temperature 0.7), not OpenAI's; max_tokens left out is 16 on
/v1/completions (OpenAI's default) and "until EOS or the context is full" on chat.
`n`, `best_of` other than 1, `echo` and `logprobs` are refused (400) rather than
silently ignored.
"""
from __future__ import annotations

import asyncio
import json
import math
import sys
import threading
import time

from .errors import CortiqError

__all__ = ["create_app", "serve"]

MAX_STOP = 4
COMPLETION_MAX_TOKENS = 16      # OpenAI's default for /v1/completions (chat: no limit)


class BadRequest(Exception):
    def __init__(self, message, param=None, status=400, code=None, type_="invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = \
            message, param, status, code, type_


def _error_body(message, type_="invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


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
    for name, allowed in (("n", (1,)), ("best_of", (1,)), ("echo", (False,)),
                          ("logprobs", (False,)), ("top_logprobs", (0,)), ("suffix", ("",))):
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
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be an array", "tools")
    from .chat import parse_tool_call_arguments
    return parse_tool_call_arguments(msgs), tools


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


def create_app(llm, *, max_concurrency: int = 2, max_queue: int = 8,
               max_body_bytes: int = 4 << 20, model_name: str | None = None,
               max_prompt_tokens: int | None = None):
    """The Starlette app serving `llm`."""
    try:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.requests import ClientDisconnect
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route
    except ImportError as e:  # pragma: no cover - the serve extra
        raise CortiqError("cortiq serve needs the 'serve' extra: pip install "
                          "'cortiq[serve]' (starlette, uvicorn)") from e
    name = model_name or llm.model_name
    gate = _Gate(max_concurrency, max_queue)
    created = int(time.time())
    active: set = set()                       # cancel events of running generations

    def err(status, message, param=None, code=None, type_="invalid_request_error"):
        return JSONResponse(_error_body(message, type_, param, code), status_code=status)

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
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"invalid JSON body: {e}", None, 400, "invalid_json") from None
        if not isinstance(body, dict):
            raise BadRequest("the JSON body must be an object")
        model = body.get("model")
        if model is not None and model != name:
            raise BadRequest(f"the model '{model}' does not exist (this server serves "
                             f"'{name}')", "model", 404, "model_not_found")
        return body

    def check_prompt_len(n, param):
        cap = llm.n_ctx - 1 if max_prompt_tokens is None else min(max_prompt_tokens,
                                                                  llm.n_ctx - 1)
        if n > cap:
            raise BadRequest(f"the prompt is {n} tokens; this server takes at most {cap}",
                             param, 400, "context_length_exceeded")

    async def handle(request, chat: bool):
        body = await read_json(request)
        samp = _sampling(body, llm.vocab_size)
        stream = _bool(body, "stream")
        stop = samp.pop("stop", None)
        stream_options = samp.pop("stream_options", None)
        if chat:
            msgs, tools = _messages(body)
            max_tokens = _max_tokens(body, "max_completion_tokens", "max_tokens")
            text = llm.apply_chat_template(msgs, True, tools)
            n = len(llm.tokenize(text))
            check_prompt_len(n, "messages")
            fn = llm.create_chat_completion
            kw = dict(messages=msgs, tools=tools, max_tokens=max_tokens, stop=stop,
                      stream_options=stream_options, **samp)
        else:
            prompt = _prompt(body)
            max_tokens = _max_tokens(body, "max_tokens") or COMPLETION_MAX_TOKENS
            n = len(prompt) if isinstance(prompt, list) else len(llm.tokenize(prompt))
            check_prompt_len(n, "prompt")
            fn = llm.create_completion
            kw = dict(prompt=prompt, max_tokens=max_tokens, stop=stop,
                      stream_options=stream_options, **samp)
        if max_tokens is None:
            kw["max_tokens"] = None                  # until EOS or the context is full
        if not stream:
            if not gate.admit():
                raise BadRequest(f"server busy: {gate.capacity} requests are running or "
                                 "queued; retry later", None, 429, "queue_full",
                                 "rate_limit_error")
            cancel = threading.Event()

            def work():
                try:
                    with gate.sem:
                        active.add(cancel)
                        try:
                            return fn(**kw, stream=False, cancel=cancel)
                        finally:
                            active.discard(cancel)
                finally:
                    gate.leave()
            from starlette.concurrency import run_in_threadpool
            task = asyncio.ensure_future(run_in_threadpool(work))
            try:
                while not task.done():      # a client that hangs up cancels its generation
                    done, _ = await asyncio.wait({task}, timeout=0.25)
                    if not done and await request.is_disconnected():
                        cancel.set()
                return JSONResponse(await task)
            finally:
                if not task.done():
                    cancel.set()
        return await start_stream(fn, kw)

    async def start_stream(fn, kw):
        if not gate.admit():
            raise BadRequest(f"server busy: {gate.capacity} requests are running or queued; "
                             "retry later", None, 429, "queue_full", "rate_limit_error")
        cancel = threading.Event()
        try:
            chunks = fn(**kw, stream=True, cancel=cancel)   # parameter errors raise here
        except BaseException:
            gate.leave()
            raise
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def put(item):
            loop.call_soon_threadsafe(q.put_nowait, item)

        def producer():
            try:
                with gate.sem:
                    active.add(cancel)
                    try:
                        for c in chunks:
                            put(("data", c))
                            if cancel.is_set():
                                break
                    finally:
                        active.discard(cancel)
                        chunks.close()
            except Exception as e:  # noqa: BLE001 -- reported in-band
                put(("error", e))
            finally:
                gate.leave()
                put(("end", None))

        threading.Thread(target=producer, name="cortiq-gen", daemon=True).start()

        async def body():
            try:
                while True:
                    kind, item = await q.get()
                    if kind == "end":
                        break
                    if kind == "error":
                        msg = item.args[0] if isinstance(item, CortiqError) and item.args \
                            else f"{type(item).__name__}: {item}"
                        yield f"data: {json.dumps(_error_body(msg, 'server_error'))}\n\n"
                        break
                    yield f"data: {json.dumps(item, ensure_ascii=False)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                cancel.set()                    # a disconnected client stops its generation

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    def wrap(chat):
        async def endpoint(request):
            try:
                return await handle(request, chat)
            except BadRequest as e:
                return err(e.status, e.message, e.param, e.code, e.type)
            except ClientDisconnect:
                return err(400, "client disconnected")
            except CortiqError as e:             # ConfigError, TemplateError: the request's
                msg = str(e)
                code = "context_length_exceeded" if "do not fit the context" in msg else None
                return err(400, msg, None, code)
            except Exception as e:  # noqa: BLE001 -- a bug, still answered in OpenAI's shape
                return err(500, f"internal error: {type(e).__name__}: {e}", None, None,
                           "server_error")
        return endpoint

    async def models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "cortiq"}]})

    async def healthz(request):
        return JSONResponse({"status": "ok", "model": name, "running_or_queued": gate.admitted})

    async def http_error(request, exc):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return err(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                   None, code)

    app = Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", wrap(False), methods=["POST"]),
        Route("/v1/chat/completions", wrap(True), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ], exception_handlers={HTTPException: http_error})
    app.state.llm = llm
    app.state.cancel_all = lambda: [c.set() for c in list(active)]
    return app


def serve(llm, host: str = "127.0.0.1", port: int = 8080, *, graceful_timeout: float = 30.0,
          log_level: str = "warning", announce: bool = True, **app_options) -> None:
    """Run the server until SIGINT/SIGTERM (running requests get `graceful_timeout`
    seconds to finish; streams still open then are cancelled)."""
    try:
        import uvicorn
    except ImportError as e:  # pragma: no cover
        raise CortiqError("cortiq serve needs the 'serve' extra: pip install "
                          "'cortiq[serve]' (starlette, uvicorn)") from e
    import signal

    class _Server(uvicorn.Server):
        # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown (the process then
        # dies of the signal); a server that shut down cleanly exits 0 instead.
        def handle_exit(self, sig, frame):
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            else:
                self.should_exit = True

    import socket
    app = create_app(llm, **app_options)
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
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_timeout)
    server = _Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        app.state.cancel_all()
        sock.close()
