"""API keys: which keys the server accepts, where they come from (arguments, a key
file, CORTIQ_API_KEY), and the ASGI middleware that refuses a request to a protected
path without one (401 in OpenAI's error shape)."""
from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable

from ..errors import ConfigError
from .errors import error_response

AUTH_SCHEME = "bearer"


class ApiKeys:
    """The keys a server accepts. Empty: every request is accepted."""

    def __init__(self, keys: Iterable[str] = ()):
        checked = []
        for key in keys:
            if not isinstance(key, str):
                raise ConfigError(f"api key: expected a string, got {type(key).__name__}")
            if not key or key != key.strip() or any(c.isspace() for c in key):
                raise ConfigError("api key: a key must be non-empty and hold no whitespace")
            checked.append(key.encode("utf-8"))
        self._keys = tuple(dict.fromkeys(checked))

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def accepts(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries one of the keys. Every key is
        compared, in constant time, so the time taken says nothing about which key
        came near."""
        if authorization is None:
            return False
        scheme, _, given = authorization.strip().partition(" ")
        if scheme.lower() != AUTH_SCHEME:
            return False
        candidate = given.strip().encode("utf-8")
        found = False
        for key in self._keys:
            found |= hmac.compare_digest(candidate, key)
        return found


def read_key_file(path: str) -> list[str]:
    """The keys in a file, one a line; blank lines and lines starting with '#' are skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ConfigError(f"--api-key-file: cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--api-key-file: {path} is not UTF-8 text") from None
    keys = [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]
    if not keys:
        raise ConfigError(f"--api-key-file: {path} holds no key")
    return keys


def is_protected(path: str, metrics_auth: bool) -> bool:
    """Paths behind the key: the OpenAI routes, and /metrics when `metrics_auth`.
    Health and readiness stay open (load balancers and orchestrators probe them)."""
    return path.startswith("/v1/") or path == "/v1" or (metrics_auth and path == "/metrics")


class RequireApiKey:
    """ASGI middleware: a request to a path `protected(path)` names needs
    `Authorization: Bearer <key>` with one of `keys`; otherwise 401 with
    `WWW-Authenticate: Bearer`. A CORS preflight never reaches it (the CORS
    middleware, outside it, answers those: browsers send them without credentials)."""

    def __init__(self, app, keys: ApiKeys, protected: Callable[[str], bool]):
        self.app, self.keys, self.protected = app, keys, protected

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        if self.keys.accepts(header):
            await self.app(scope, receive, send)
            return
        message = ("missing API key: send 'Authorization: Bearer <key>'" if header is None
                   else "invalid API key")
        response = error_response(401, message, None, "invalid_api_key",
                                  headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
