"""What the route handlers share: the model and the names it is served under, the
limits, the admission gate, the shutdown, the cancel events of the generations
running now and the metrics (None without prometheus_client)."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .admission import AdmissionGate
from .errors import BadRequest
from .request_body import read_json
from .shutdown import Shutdown

RETRY_AFTER_S = 1               # what a 429 tells the client to wait


@dataclass(frozen=True, init=False)
class ModelNames:
    """The names a served model answers to: its id (what /v1/models lists first and
    responses name) and its aliases, each accepted as a request's `model`."""

    id: str
    aliases: tuple[str, ...]

    def __init__(self, names: str | Sequence[str]):
        listed = [names] if isinstance(names, str) else list(names)
        if not listed:
            raise ConfigError("served model name: give at least one name")
        for n in listed:
            if not isinstance(n, str) or not n.strip():
                raise ConfigError(f"served model name: expected a non-empty string, got {n!r}")
        unique = list(dict.fromkeys(listed))
        object.__setattr__(self, "id", unique[0])
        object.__setattr__(self, "aliases", tuple(unique[1:]))

    @property
    def all(self) -> tuple[str, ...]:
        return (self.id,) + self.aliases

    def __str__(self) -> str:
        return self.id


@dataclass
class ServerState:
    llm: Any
    model_name: ModelNames                # the names `model` may take in a request
    gate: AdmissionGate
    max_body_bytes: int
    max_prompt_tokens: int | None
    shutdown: Shutdown = field(default_factory=Shutdown)
    created: int = field(default_factory=lambda: int(time.time()))
    active: set[threading.Event] = field(default_factory=set)   # running generations' cancels
    metrics: Any = None                   # a metrics.ServerMetrics, or None

    @property
    def ready(self) -> bool:
        """Whether the server takes new work: a model loaded and no shutdown begun."""
        return self.llm is not None and not self.shutdown.closing

    def running(self) -> int:
        return len(self.active)

    def queued(self) -> int:
        return max(self.gate.admitted - len(self.active), 0)

    async def read_body(self, request) -> dict:
        """The request's checked JSON body. Records the event loop first: the shutdown
        schedules its cut there, from a signal handler."""
        self.shutdown.loop = asyncio.get_running_loop()
        return await read_json(request, self.max_body_bytes, self.model_name)

    def admit(self) -> None:
        """Take a place at the gate or refuse the request (429, Retry-After)."""
        # (no refusal while closing: uvicorn accepts no new connections then, and a
        # request that already reached us is served within the grace period)
        if not self.gate.admit():
            raise BadRequest(f"server busy: {self.gate.capacity} requests are running or "
                             "queued; retry later", None, 429, "queue_full", "rate_limit_error",
                             headers={"Retry-After": str(RETRY_AFTER_S)})

    def check_context(self, n, param, max_tokens, max_param="max_tokens") -> None:
        """OpenAI's rule: the prompt must fit, and with an explicit max_tokens so must
        prompt + max_tokens."""
        n_ctx = self.llm.n_ctx
        cap = n_ctx - 1 if self.max_prompt_tokens is None else min(self.max_prompt_tokens,
                                                                   n_ctx - 1)
        if n > cap:
            raise BadRequest(f"the prompt is {n} tokens; this server takes at most {cap}",
                             param, 400, "context_length_exceeded")
        if max_tokens is not None and n + max_tokens > n_ctx:
            raise BadRequest(f"this model's context is {n_ctx} tokens: the prompt's {n} "
                             f"tokens plus max_tokens {max_tokens} do not fit ({n} + "
                             f"{max_tokens} > {n_ctx}); lower max_tokens to at most "
                             f"{n_ctx - n}", max_param, 400,
                             "context_length_exceeded")

    def cancel_all(self) -> None:
        """Stop every running generation (each ends within one token)."""
        for cancel in list(self.active):
            cancel.set()
