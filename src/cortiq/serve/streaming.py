"""Server-sent events: a generation's chunks as `data:` events ending in
`data: [DONE]`, with a failure or the shutdown's cut as an error event in OpenAI's
shape before it."""
from __future__ import annotations

import asyncio
import collections
import json
import threading

from starlette.responses import StreamingResponse

from .errors import classify, error_body, error_type, log_failure
from .state import ServerState


def _error_event(message, type_, param, code) -> str:
    return f"data: {json.dumps(error_body(message, type_, param, code))}\n\n"


def start_stream(state: ServerState, chunks, cancel: threading.Event) -> StreamingResponse:
    """Generation in a producer thread, events to the client as they come. The
    producer encodes each chunk itself and wakes the event loop only when it finds
    the queue empty; the response drains whatever has piled up into one write. One
    wake-up and one write per token would cost the loop more than a small model
    takes to make the token (and its Python competes with generation for the GIL).

    The request is already admitted: the producer holds a running place while it
    generates and leaves the gate when it ends."""
    gate, shutdown = state.gate, state.shutdown
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

    clock = state.metrics.stream_clock() if state.metrics is not None else None

    def producer():
        try:
            with gate.sem:
                state.active.add(cancel)
                try:
                    for c in chunks:
                        if clock is not None:
                            clock.chunk(c)
                        if "model" in c:
                            c["model"] = state.model_name.id   # the served id
                        put("data", f"data: {json.dumps(c, ensure_ascii=False)}\n\n")
                        if cancel.is_set():
                            break
                finally:
                    state.active.discard(cancel)
                    chunks.close()
        except Exception as e:  # noqa: BLE001 -- reported in-band
            put("error", e)
        finally:
            gate.leave()
            put("end", None)

    threading.Thread(target=producer, name="cortiq-gen", daemon=True).start()

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
                    yield _error_event(*shutdown.error())
                    break
                if last is None:
                    continue
                kind, item = last
                if kind == "error":
                    status, msg, code = classify(item)
                    log_failure(status, msg, item)
                    yield _error_event(msg, error_type(status), None, code)
                break
            yield "data: [DONE]\n\n"
        finally:
            cut.cancel()
            cancel.set()                    # a disconnected client stops its generation

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
