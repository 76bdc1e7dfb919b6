"""GET /v1/models (the one model this server serves) and GET /healthz (up or shutting
down, and how many requests are running or queued)."""
from __future__ import annotations

from starlette.responses import JSONResponse, Response

from .state import ServerState


async def list_models(state: ServerState, request) -> Response:
    return JSONResponse({"object": "list", "data": [
        {"id": state.model_name, "object": "model", "created": state.created,
         "owned_by": "cortiq"}]})


async def healthz(state: ServerState, request) -> Response:
    return JSONResponse({"status": "shutting_down" if state.shutdown.closing else "ok",
                         "model": state.model_name, "running_or_queued": state.gate.admitted})
