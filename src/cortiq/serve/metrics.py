"""Prometheus metrics of one server app (`prometheus_client`, in the serve extra):
requests by route and status, prompt and completion tokens, time to first token and
time per output token of streamed generations, requests running and queued, and the
size of each batched forward step (requests and token rows). Each app
has its own registry, so several apps in one process (tests, one per model) never
share or collide on a metric."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from starlette.responses import Response

from .errors import error_response

MISSING_MESSAGE = ("metrics need prometheus_client, which is not installed: "
                   "pip install 'cortiq[serve]'")
UNMATCHED_ROUTE = "unmatched"     # every path outside the route table: bounded labels

# Latency buckets (seconds): a token takes milliseconds on a small model, a first token
# behind a long prompt or a queue can take tens of seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Requests per batched forward (max_batch is 8 by default) and token rows per forward
# (a prompt chunk adds up to 64 rows).
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def prometheus_available() -> bool:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


class ServerMetrics:
    """The metrics of one app. `running()` and `queued()` are read at each scrape."""

    def __init__(self, routes: Iterable[str], running: Callable[[], int],
                 queued: Callable[[], int]):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.routes = frozenset(routes)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("cortiq_requests", "HTTP requests answered, by route "
                                "and status code", ("route", "status"), registry=r)
        self.prompt_tokens = Counter("cortiq_prompt_tokens",
                                     "prompt tokens of finished generations", registry=r)
        self.completion_tokens = Counter("cortiq_completion_tokens",
                                         "tokens generated", registry=r)
        self.time_to_first_token = Histogram(
            "cortiq_time_to_first_token_seconds", "time from admission to the first "
            "generated text of a streamed generation", buckets=TTFT_BUCKETS, registry=r)
        self.time_per_output_token = Histogram(
            "cortiq_time_per_output_token_seconds", "time between the generated pieces "
            "of a streamed generation", buckets=TOKEN_BUCKETS, registry=r)
        self.batch_requests = Histogram(
            "cortiq_batch_requests", "requests sharing each batched forward step",
            buckets=BATCH_BUCKETS, registry=r)
        self.batch_rows = Histogram(
            "cortiq_batch_rows", "token rows of each batched forward step (a decoding "
            "request adds one, a prompt chunk its length)", buckets=ROWS_BUCKETS, registry=r)
        Gauge("cortiq_requests_running", "generations running now",
              registry=r).set_function(running)
        Gauge("cortiq_requests_queued", "admitted requests waiting for a running place",
              registry=r).set_function(queued)

    def route_label(self, path: str) -> str:
        return path if path in self.routes else UNMATCHED_ROUTE

    def count_request(self, path: str, status: int) -> None:
        self.requests.labels(self.route_label(path), str(status)).inc()

    def count_usage(self, usage) -> None:
        """Count a finished generation's `usage` dict (absent or None: nothing)."""
        if not isinstance(usage, dict):
            return
        self.prompt_tokens.inc(int(usage.get("prompt_tokens") or 0))
        self.completion_tokens.inc(int(usage.get("completion_tokens") or 0))

    def batch_step(self, requests: int, rows: int) -> None:
        """One batched forward of the model (`LLM.watch_batches` calls it)."""
        self.batch_requests.observe(requests)
        self.batch_rows.observe(rows)

    def stream_clock(self) -> StreamClock:
        return StreamClock(self)

    def exposition(self) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class StreamClock:
    """Times one streamed generation: started when it is admitted, `piece()` at each
    chunk that carries generated text, `chunk(c)` for every chunk (counts its usage)."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics
        self.start = time.perf_counter()
        self.last: float | None = None

    def chunk(self, c) -> None:
        if not isinstance(c, dict):
            return
        self.metrics.count_usage(c.get("usage"))
        if any(_has_text(choice) for choice in c.get("choices") or ()):
            now = time.perf_counter()
            if self.last is None:
                self.metrics.time_to_first_token.observe(now - self.start)
            else:
                self.metrics.time_per_output_token.observe(now - self.last)
            self.last = now


def _has_text(choice) -> bool:
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and bool(
        delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


class CountRequests:
    """ASGI middleware counting every HTTP response by route and status code (a
    request refused for its key, or by CORS, counts too)."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500                      # a handler that raises before answering

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.count_request(scope["path"], status)


def metrics_unavailable() -> Response:
    return error_response(501, MISSING_MESSAGE, None, "metrics_unavailable", "server_error")
