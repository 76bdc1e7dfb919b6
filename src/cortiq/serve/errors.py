"""OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, and how an
exception raised while serving a request becomes one (status, message, code)."""
from __future__ import annotations

import json
import logging

from starlette.requests import ClientDisconnect
from starlette.responses import Response

from ..text.chat import TemplateRenderError
from ..errors import ConfigError, CortiqError

# The name applications configure to see the server's failures (kept stable for them).
log = logging.getLogger("cortiq.server")


class BadRequest(Exception):
    """A request refused before (or instead of) any work, with its HTTP status and
    OpenAI's error fields; `headers` go on the response (429's Retry-After)."""

    def __init__(self, message, param=None, status=400, code=None, type_="invalid_request_error",
                 headers=None):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = \
            message, param, status, code, type_
        self.headers = headers


def error_body(message, type_="invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_bytes(message, type_="invalid_request_error", param=None, code=None) -> bytes:
    # ensure_ascii: an error body must encode whatever ended up in the message
    return json.dumps(error_body(message, type_, param, code)).encode("ascii")


def error_response(status, message, param=None, code=None, type_="invalid_request_error",
                   headers=None) -> Response:
    return Response(error_bytes(message, type_, param, code), status_code=status,
                    media_type="application/json", headers=headers)


def error_type(status: int) -> str:
    return "server_error" if status >= 500 else "invalid_request_error"


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


def log_failure(status, msg, e) -> None:
    """Log a server-side fault (5xx); a cortiq error's message says it all, anything
    else gets its traceback."""
    if status >= 500:
        log.error("request failed (%d): %s", status, msg,
                  exc_info=e if not isinstance(e, CortiqError) else None)


def failure_response(e: Exception) -> Response:
    """The response to an exception a route handler raised: a BadRequest as it says, a
    client gone mid-body as 400, anything else classified (and logged when it is ours)."""
    if isinstance(e, BadRequest):
        return error_response(e.status, e.message, e.param, e.code, e.type, e.headers)
    if isinstance(e, ClientDisconnect):
        return error_response(400, "client disconnected")
    status, msg, code = classify(e)
    log_failure(status, msg, e)
    return error_response(status, msg, None, code, error_type(status))


async def http_exception_handler(request, exc) -> Response:
    """Starlette's routing errors (an unknown path, a wrong method) in OpenAI's shape."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                          None, code)
