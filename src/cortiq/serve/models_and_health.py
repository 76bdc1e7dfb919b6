"""GET /v1/models (the model this server serves, under each of its names), the health
routes -- /health (liveness), /ready (readiness), /healthz (state and load) -- and
GET /metrics (Prometheus)."""
from __future__ import annotations

from starlette.responses import JSONResponse, Response

from .errors import error_response
from .metrics import metrics_unavailable
from .state import ServerState


async def list_models(state: ServerState, request) -> Response:
    return JSONResponse({"object": "list", "data": [
        {"id": name, "object": "model", "created": state.created, "owned_by": "cortiq"}
        for name in state.model_name.all]})


async def healthz(state: ServerState, request) -> Response:
    return JSONResponse({"status": "shutting_down" if state.shutdown.closing else "ok",
                         "model": state.model_name.id, "running_or_queued": state.gate.admitted})


async def health(state: ServerState, request) -> Response:
    """Liveness: the process answers HTTP."""
    return JSONResponse({"status": "ok"})


async def ready(state: ServerState, request) -> Response:
    """Readiness: 200 while the server takes new requests, 503 once it is draining."""
    if state.ready:
        return JSONResponse({"status": "ready", "model": state.model_name.id})
    return error_response(503, "the server is shutting down and takes no new requests",
                          None, "server_shutting_down", "server_error")


async def metrics(state: ServerState, request) -> Response:
    if state.metrics is None:
        return metrics_unavailable()
    return state.metrics.exposition()
