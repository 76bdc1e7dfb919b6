"""`cortiq.serve`'s app and runner under the module name `cortiq.server`
(`cortiq.server.create_app`, `cortiq.server.serve`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import serve as _serve_package

if TYPE_CHECKING:
    from .serve import create_app, json_error_protocol, serve

__all__ = ["create_app", "json_error_protocol", "serve"]


def __getattr__(name: str):
    # Looked up in cortiq.serve on use, which loads starlette and uvicorn only then.
    if name in __all__:
        return getattr(_serve_package, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
