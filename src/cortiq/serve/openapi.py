"""GET /openapi.json: an OpenAPI 3.1 document of the server's routes, the request
bodies' schemas generated from the request models (`request_models.py`), so the
document and the validation cannot disagree."""
from __future__ import annotations

from functools import cache

from pydantic.json_schema import models_json_schema
from starlette.responses import JSONResponse, Response

from ..kernels._config import __version__
from .request_models import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from .state import ServerState

# (path, request model, what it does): the routes that take a JSON body
BODY_ROUTES = (
    ("/v1/chat/completions", ChatCompletionRequest, "a conversation continued"),
    ("/v1/completions", CompletionRequest, "a prompt continued"),
    ("/v1/embeddings", EmbeddingRequest, "embedding vectors of the inputs"),
)
# (path, what it does): the routes without a body
GET_ROUTES = (
    ("/v1/models", "the model served, under each of its names"),
    ("/health", "liveness"),
    ("/ready", "readiness: 503 while shutting down"),
    ("/healthz", "state and load"),
    ("/metrics", "Prometheus metrics"),
)

_ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"],
                             "properties": {"message": {"type": "string"},
                                            "type": {"type": "string"},
                                            "param": {"type": ["string", "null"]},
                                            "code": {"type": ["string", "null"]}}}}}


@cache
def openapi_document(version: str) -> dict:
    """The document (the same for every app of this cortiq `version`)."""
    _, defs = models_json_schema([(m, "validation") for _, m, _ in BODY_ROUTES],
                                 ref_template="#/components/schemas/{model}")
    schemas = dict(defs.get("$defs", {}), Error=_ERROR_SCHEMA)
    error = {"description": "refused or failed, in OpenAI's error shape",
             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    paths: dict = {}
    for path, model, summary in BODY_ROUTES:
        paths[path] = {"post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}},
            "responses": {"200": {"description": "the answer (server-sent events when "
                                                 "`stream` is true)"},
                          "4XX": error, "5XX": error}}}
    for path, summary in GET_ROUTES:
        paths[path] = {"get": {"summary": summary, "responses": {"200": {"description": "OK"}}}}
    return {"openapi": "3.1.0",
            "info": {"title": "cortiq OpenAI-compatible server", "version": version},
            "paths": paths,
            "components": {"schemas": schemas,
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}}


async def openapi(state: ServerState, request) -> Response:
    return JSONResponse(openapi_document(__version__))
