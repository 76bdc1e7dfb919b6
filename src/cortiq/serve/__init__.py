"""An OpenAI-compatible HTTP server over one `cortiq.LLM` (needs the `serve` extra).

    cortiq serve model.cmf --host 127.0.0.1 --port 8080

Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (both
with `"stream": true` as server-sent events ending in `data: [DONE]`, and `usage`
counts; `stream_options.include_usage` adds the usage chunk to chat streams), POST
/v1/embeddings (`input`: strings or token ids; `encoding_format` float or base64;
cortiq's `pooling`: "mean" or "last"), GET /healthz. Chat takes `logprobs` /
`top_logprobs`, `response_format` (json_object, json_schema: enforced while sampling),
`tools` / `tool_choice` / `parallel_tool_calls` (calls parsed into
`message.tool_calls`); completions take `logprobs` (0-20) and `echo`. Requests are
checked up front and refused with OpenAI's error shape
`{"error": {"message", "type", "param", "code"}}`:

* 400 invalid JSON or HTTP, JSON nested deeper than 64 levels, a string with a
  lone UTF-16 surrogate (naming the field), a missing/ill-typed field, a parameter
  out of range, a prompt longer than the context or a prompt plus an explicit
  `max_tokens` over it (`code: "context_length_exceeded"`), a parameter this server
  does not implement and that would change the output (`functions`, `function_call`,
  `reasoning_effort`, `modalities` other than ["text"], `audio`, `prediction`,
  `web_search_options`), a conversation the chat template rejects
  (`raise_exception`);
* 404 a model name this server does not serve (`code: "model_not_found"`) or an
  unknown path; 405 a wrong method; 413 a body over `max_body_bytes`;
* 429 when `max_concurrency` generations run and `max_queue` more wait
  (`code: "queue_full"`, with `Retry-After`); the client may retry;
* 500 (`type: "server_error"`, logged) a fault of the server's side: the model's chat
  template failing by itself (a bug, its time or size limit), a damaged weight found
  on first use, non-finite logits;
* 503 the server is shutting down (`code: "server_shutting_down"`).

Admission comes first: a request is admitted (or refused 429) before any work, then
its chat template is rendered and its prompt tokenized once, in a worker thread, so
a huge prompt or a slow template never stalls the event loop (/healthz, other
streams). Generation runs in worker threads (the kernels release the GIL, so
requests run concurrently on one model); a streaming client that disconnects stops
its generation within one token.

Shutdown (SIGTERM/SIGINT): stop accepting connections and let running requests
finish for up to `graceful_timeout` seconds; then every request still running is cut
cleanly -- a stream gets an error event in OpenAI's shape and `data: [DONE]`, a
non-streamed request a 503 -- and `serve` returns the number cut (the CLI then exits
1). A second SIGINT cuts at once.

Sampling fields: OpenAI's temperature [0, 2], top_p [0, 1], presence_penalty and
frequency_penalty [-2, 2], logit_bias, seed, stop (up to 4 strings), max_tokens
(chat: also max_completion_tokens), plus cortiq's top_k, min_p and
repetition_penalty. A sampling field left out takes OpenAI's default (temperature 1,
top_p 1, no top_k, min_p or penalties) unless the model's generation_config sets it
(docs/api.md, "Sampling defaults"); max_tokens left out is 16 on
/v1/completions (OpenAI's default) and "until EOS or the context is full" on chat.
`n`, `best_of` other than 1, `suffix` and embeddings' `dimensions` are refused (400)
rather than silently ignored.

Modules: `app` (create_app: the routes and their shared `state.ServerState`), one module
per route family (`completions`, `chat_completions`, `embeddings`, `models_and_health`)
over `generation` (the path both generation routes share) and `streaming` (server-sent
events); `request_body` and `params` check requests, `errors` shapes refusals and
failures, `admission` and `shutdown` hold the gate and the shutdown, `runner` runs it
all under uvicorn (`serve`), and `ray` puts replicas on Ray Serve (the `ray` extra).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ..errors import CortiqError

if TYPE_CHECKING:
    from .app import create_app
    from .runner import json_error_protocol, serve

__all__ = ["create_app", "json_error_protocol", "serve"]

# Loaded on first use, so that importing the package (the CLI does) needs neither
# starlette nor uvicorn: only serving does.
_EXPORTED_FROM = {"create_app": "app", "serve": "runner", "json_error_protocol": "runner"}
_SERVE_EXTRA = ("starlette", "uvicorn")


def __getattr__(name: str):
    module_name = _EXPORTED_FROM.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as e:
        if (e.name or "").partition(".")[0] not in _SERVE_EXTRA:
            raise
        raise CortiqError("cortiq serve needs the 'serve' extra: pip install "
                          "'cortiq[serve]' (starlette, uvicorn)") from e
    value = getattr(module, name)
    globals()[name] = value
    return value
