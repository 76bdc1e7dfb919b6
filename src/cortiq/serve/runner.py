"""`serve`: the app under uvicorn until SIGINT/SIGTERM -- the listening socket, the
graceful shutdown and its cut, malformed HTTP answered in OpenAI's error shape."""
from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .app import create_app
from .errors import error_bytes, log

SHUTDOWN_MARGIN_S = 5.0         # uvicorn's own deadline, past ours, for the cut replies


def json_error_protocol():
    """uvicorn's HTTP protocol class with its malformed-request reply (a bad request
    line, `Content-Length: abc`, ...) in OpenAI's JSON error shape instead of text."""

    class JsonErrorHTTPProtocol(AutoHTTPProtocol):
        def send_400_response(self, msg: str) -> None:
            body = error_bytes(f"invalid HTTP request: {msg}", code="invalid_http")
            head = [b"HTTP/1.1 400 Bad Request"]
            head += [n + b": " + v for n, v in self.server_state.default_headers]
            head += [b"content-type: application/json",
                     b"content-length: " + str(len(body)).encode("ascii"),
                     b"connection: close"]
            self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            self.transport.close()
    return JsonErrorHTTPProtocol


def serve(llm, host: str = "127.0.0.1", port: int = 8080, *, graceful_timeout: float = 30.0,
          log_level: str = "warning", announce: bool = True, **app_options) -> int:
    """Run the server until SIGINT/SIGTERM. Running requests get `graceful_timeout`
    seconds to finish; those still running then are cut (streams: an error event and
    [DONE]; others: 503). A second SIGINT cuts at once, a third exits at once.
    `app_options` are `create_app`'s. Returns the number of requests cut (0: a clean
    shutdown)."""
    app = create_app(llm, **app_options)
    shutdown = app.state.shutdown

    class _Server(uvicorn.Server):
        # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown (the process then
        # dies of the signal); this server returns instead, and cuts what is still
        # running itself (before uvicorn's deadline, which would cancel the tasks).
        def handle_exit(self, sig, frame):
            if not self.should_exit:
                self.should_exit = True
                shutdown.begin(graceful_timeout)
            elif sig == signal.SIGINT and not shutdown.cut.is_set():
                shutdown.cut_now()
            else:
                self.force_exit = True

    with _failures_on_stderr():
        # Bind here so that a busy port or a bad host is one OSError (one CLI line, exit 1),
        # not uvicorn's log line and exit code 3.
        try:
            family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
        except OSError as e:
            sock.close()
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        if announce:
            print(f"cortiq: serving {getattr(llm, 'model_name', 'model')} on "
                  f"http://{host}:{sock.getsockname()[1]}/v1", file=sys.stderr, flush=True)
        config = uvicorn.Config(app, log_level=log_level, http=json_error_protocol(),
                                timeout_graceful_shutdown=graceful_timeout + SHUTDOWN_MARGIN_S)  # type: ignore[arg-type]  # uvicorn takes seconds as float
        server = _Server(config)
        try:
            server.run(sockets=[sock])
        finally:
            app.state.cancel_all()
            sock.close()
        return shutdown.n_cut


@contextlib.contextmanager
def _failures_on_stderr():
    """While `serve` runs, failures (500s) show at the default level on stderr, unless
    the application configured the server's logger itself; undone afterwards, so a
    serve() call leaves the process's logging as it found it."""
    if log.handlers:
        yield
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("cortiq: %(levelname)s: %(message)s"))
    log.addHandler(h)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(h)
        log.propagate = True
