"""POST /v1/completions: a text (or token-id) prompt continued; `logprobs` (0-20) and
`echo`; max_tokens left out is OpenAI's 16."""
from __future__ import annotations

from starlette.responses import Response

from .errors import BadRequest
from .generation import GenerationPlan, generation_fields, serve_generation
from .params import MAX_TOP_LOGPROBS, boolean, max_tokens, number
from .state import ServerState

COMPLETION_MAX_TOKENS = 16      # OpenAI's default for /v1/completions (chat: no limit)


async def completions(state: ServerState, request) -> Response:
    return await serve_generation(state, request, plan_completion)


def plan_completion(state: ServerState, body: dict) -> GenerationPlan:
    fields, stop, stream_options = generation_fields(state, body, completion_structured)
    prompt = completion_prompt(body)
    explicit = max_tokens(body, "max_tokens")
    llm = state.llm

    def prepare():
        ids = prompt if isinstance(prompt, list) else llm.tokenize(prompt)
        state.check_context(len(ids), "prompt", explicit)
        return {"prompt": ids}
    kwargs = dict(max_tokens=explicit or COMPLETION_MAX_TOKENS, stop=stop,
                  stream_options=stream_options, **fields)
    return GenerationPlan(llm.create_completion, kwargs, prepare)


def completion_structured(body) -> dict:
    """`logprobs` and `echo`, type-checked; the chat-only fields refused."""
    out: dict = {}
    for name in ("response_format", "tools", "tool_choice"):   # chat-only fields
        if body.get(name) is not None and body[name] != {"type": "text"}:
            raise BadRequest(f"'{name}' is not supported on /v1/completions (use "
                             "/v1/chat/completions)", name, code="unsupported_parameter")
    lp = number(body, "logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
    if lp is not None:
        out["logprobs"] = lp
    if boolean(body, "echo"):
        out["echo"] = True
    return out


def completion_prompt(body):
    """The one prompt of the request: a string or a list of token ids (a batch of one
    is unwrapped)."""
    if "prompt" not in body:
        raise BadRequest("'prompt' is required", "prompt")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool)
                                         for i in p):
        return p
    raise BadRequest("'prompt' must be a string or a list of token ids (one prompt per "
                     "request)", "prompt")
