"""`create_app`: the Starlette app of one `cortiq.LLM` -- its shared state, its routes
and OpenAI-shaped errors for whatever a route handler or the router refuses."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .admission import AdmissionGate
from .chat_completions import chat_completions
from .completions import completions
from .embeddings import embeddings
from .errors import failure_response, http_exception_handler
from .models_and_health import healthz, list_models
from .state import ServerState

Handler = Callable[[ServerState, Request], Awaitable[Response]]

# (path, method, handler): every route the app serves.
ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("/v1/models", "GET", list_models),
    ("/v1/completions", "POST", completions),
    ("/v1/chat/completions", "POST", chat_completions),
    ("/v1/embeddings", "POST", embeddings),
    ("/healthz", "GET", healthz),
)


def _endpoint(handler: Handler, state: ServerState):
    """A Starlette endpoint calling `handler(state, request)`; whatever it raises is
    answered in OpenAI's error shape."""
    async def endpoint(request):
        try:
            return await handler(state, request)
        except Exception as e:  # noqa: BLE001 -- answered in OpenAI's shape
            return failure_response(e)
    endpoint.__name__ = handler.__name__
    return endpoint


def create_app(llm, *, max_concurrency: int = 2, max_queue: int = 8,
               max_body_bytes: int = 4 << 20, model_name: str | None = None,
               max_prompt_tokens: int | None = None) -> Starlette:
    """The Starlette app serving `llm`: at most `max_concurrency` generations at once
    and `max_queue` more waiting (429 beyond), request bodies up to `max_body_bytes`,
    prompts up to `max_prompt_tokens` (default: the context), under `model_name`
    (default: the model's). `app.state.shutdown` (a `Shutdown`) drives a clean
    shutdown and `app.state.cancel_all()` stops every running generation; `serve`
    calls them from its signal handling."""
    state = ServerState(llm=llm, model_name=model_name or llm.model_name,
                        gate=AdmissionGate(max_concurrency, max_queue),
                        max_body_bytes=max_body_bytes, max_prompt_tokens=max_prompt_tokens)
    app = Starlette(routes=[Route(path, _endpoint(handler, state), methods=[method])
                            for path, method, handler in ROUTES],
                    exception_handlers={HTTPException: http_exception_handler})
    app.state.llm = llm
    app.state.shutdown = state.shutdown
    app.state.cancel_all = state.cancel_all
    return app
