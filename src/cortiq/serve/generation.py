"""The request path the two generation routes share (POST /v1/completions and
/v1/chat/completions): body, plan, admission, then the prompt prepared and the
generation run in worker threads, streamed or answered whole."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import NamedTuple

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from .errors import error_response
from .state import ServerState
from .streaming import start_stream


class GenerationPlan(NamedTuple):
    """What a generation request asks for, checked without the tokenizer or the
    template (on the event loop): `create(**kwargs, **prepare(), stream=..., cancel=...)`
    runs it, where `prepare()` runs in a worker thread and returns the prompt to
    generate from, checked against the context; `stream`: answer as server-sent events."""
    create: Callable
    kwargs: dict
    prepare: Callable[[], dict]
    stream: bool


async def serve_generation(state: ServerState, request,
                           plan_request: Callable[[ServerState, dict], GenerationPlan]
                           ) -> Response:
    """One generation request, planned by `plan_request(state, body)`."""
    body = await state.read_body(request)
    plan = plan_request(state, body)
    state.admit()                                 # before any tokenizing or rendering
    cancel = threading.Event()
    if plan.stream:
        try:
            chunks = await run_in_threadpool(
                lambda: plan.create(**plan.kwargs, **plan.prepare(), stream=True,
                                    cancel=cancel))
        except BaseException:
            state.gate.leave()
            raise
        return start_stream(state, chunks, cancel)
    return await _answer_whole(state, request, plan, cancel)


async def _answer_whole(state: ServerState, request, plan: GenerationPlan,
                        cancel: threading.Event) -> Response:
    """A non-streamed generation in a worker thread; the event loop watches for the
    client hanging up (which cancels it) and for the shutdown's cut (a 503)."""
    gate, shutdown = state.gate, state.shutdown

    def work():
        try:
            prompt = plan.prepare()
            with gate.sem:
                state.active.add(cancel)
                try:
                    return plan.create(**plan.kwargs, **prompt, stream=False, cancel=cancel)
                finally:
                    state.active.discard(cancel)
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
                return error_response(503, msg, param, code, type_)
            if not done and await request.is_disconnected():
                cancel.set()
        result = task.result()
        if isinstance(result, dict) and "model" in result:
            result["model"] = state.model_name.id      # the served id, not the file's name
        if state.metrics is not None:
            state.metrics.count_usage(result.get("usage") if isinstance(result, dict) else None)
        return JSONResponse(result)
    finally:
        cut.cancel()
        if not task.done():
            cancel.set()
