"""What the route handlers share: the model, the limits, the admission gate, the
shutdown and the cancel events of the generations running now."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .admission import AdmissionGate
from .errors import BadRequest
from .request_body import read_json
from .shutdown import Shutdown

RETRY_AFTER_S = 1               # what a 429 tells the client to wait


@dataclass
class ServerState:
    llm: Any
    model_name: str                       # the one name `model` may take in a request
    gate: AdmissionGate
    max_body_bytes: int
    max_prompt_tokens: int | None
    shutdown: Shutdown = field(default_factory=Shutdown)
    created: int = field(default_factory=lambda: int(time.time()))
    active: set[threading.Event] = field(default_factory=set)   # running generations' cancels

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
