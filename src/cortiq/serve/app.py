"""`create_app`: the Starlette app of one `cortiq.LLM` -- its shared state, its routes,
OpenAI-shaped errors for whatever a route handler or the router refuses, and the
middleware around them: request counting (metrics), CORS, then the API key check."""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..kernels._config import api_keys_from_env
from .admission import AdmissionGate
from .auth import ApiKeys, RequireApiKey, is_protected
from .chat_completions import chat_completions
from .completions import completions
from .embeddings import embeddings
from .errors import failure_response, http_exception_handler
from .metrics import CountRequests, ServerMetrics, prometheus_available
from .models_and_health import health, healthz, list_models, metrics, ready
from .openapi import openapi
from .state import ModelNames, ServerState

Handler = Callable[[ServerState, Request], Awaitable[Response]]

# (path, method, handler): every route the app serves.
ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("/v1/models", "GET", list_models),
    ("/v1/completions", "POST", completions),
    ("/v1/chat/completions", "POST", chat_completions),
    ("/v1/embeddings", "POST", embeddings),
    ("/healthz", "GET", healthz),
    ("/health", "GET", health),
    ("/ready", "GET", ready),
    ("/metrics", "GET", metrics),
    ("/openapi.json", "GET", openapi),
)

CORS_METHODS = ("GET", "POST")                       # what the routes take
CORS_HEADERS = ("Authorization", "Content-Type")     # what an OpenAI client sends


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
               max_body_bytes: int = 4 << 20, model_name: str | Sequence[str] | None = None,
               max_prompt_tokens: int | None = None,
               api_keys: Sequence[str] | None = None, metrics_auth: bool = False,
               cors_origins: Sequence[str] | None = None,
               cors_methods: Sequence[str] | None = None,
               cors_headers: Sequence[str] | None = None) -> Starlette:
    """The Starlette app serving `llm`: at most `max_concurrency` generations at once
    and `max_queue` more waiting (429 beyond), request bodies up to `max_body_bytes`,
    prompts up to `max_prompt_tokens` (default: the context).

    `model_name`: a name or a list of names (default: the model's); the first is the
    id /v1/models lists and responses carry, the others are aliases a request's
    `model` may name too. `api_keys` (default: CORTIQ_API_KEY, comma-separated; an
    empty list: none): when there are any, every /v1/ route needs `Authorization:
    Bearer <key>` (else 401), and so does /metrics with `metrics_auth`; /health,
    /ready and /healthz stay open. `cors_origins` (`*`: any) turns CORS on, allowing
    `cors_methods` (default GET, POST) and `cors_headers` (default Authorization,
    Content-Type); preflights are answered without a key.

    `app.state.shutdown` (a `Shutdown`) drives a clean shutdown and
    `app.state.cancel_all()` stops every running generation; `serve` calls them from
    its signal handling. `app.state.metrics` is the app's `ServerMetrics` (None
    without prometheus_client)."""
    keys = ApiKeys(api_keys_from_env() if api_keys is None else api_keys)
    state = ServerState(llm=llm, model_name=ModelNames(model_name or llm.model_name),
                        gate=AdmissionGate(max_concurrency, max_queue),
                        max_body_bytes=max_body_bytes, max_prompt_tokens=max_prompt_tokens)
    middleware = []
    if prometheus_available():
        state.metrics = ServerMetrics((path for path, _, _ in ROUTES), state.running,
                                      state.queued)
        watch = getattr(llm, "watch_batches", None)     # a cortiq.LLM's batching steps
        if watch is not None:
            watch(state.metrics)
        middleware.append(Middleware(CountRequests, metrics=state.metrics))
    if cors_origins:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(cors_origins),
            allow_methods=list(cors_methods or CORS_METHODS),
            allow_headers=list(cors_headers or CORS_HEADERS)))
    if keys:
        middleware.append(Middleware(RequireApiKey, keys=keys,
                                     protected=partial(is_protected,
                                                       metrics_auth=metrics_auth)))
    app = Starlette(routes=[Route(path, _endpoint(handler, state), methods=[method])
                            for path, method, handler in ROUTES],
                    middleware=middleware,
                    exception_handlers={HTTPException: http_exception_handler})
    app.state.llm = llm
    app.state.shutdown = state.shutdown
    app.state.cancel_all = state.cancel_all
    app.state.metrics = state.metrics
    return app
