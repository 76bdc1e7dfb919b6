"""POST /v1/completions: a text (or token-id) prompt continued; `logprobs` (0-20) and
`echo`; max_tokens left out is OpenAI's 16, null or -1 runs until EOS or the context
is full."""
from __future__ import annotations

from starlette.responses import Response

from .generation import GenerationPlan, serve_generation
from .request_models import CompletionRequest, parse
from .state import ServerState

COMPLETION_MAX_TOKENS = 16      # OpenAI's default for /v1/completions (chat: no limit)


async def completions(state: ServerState, request) -> Response:
    return await serve_generation(state, request, plan_completion)


def plan_completion(state: ServerState, body: dict) -> GenerationPlan:
    req = parse(CompletionRequest, body, vocab=state.llm.vocab_size)
    prompt = req.prompt
    explicit, given = req.max_tokens_of("max_tokens")
    fields = req.sampling()
    if req.logprobs is not None:
        fields["logprobs"] = req.logprobs
    if req.echo:
        fields["echo"] = True
    llm = state.llm

    def prepare():
        ids = prompt if isinstance(prompt, list) else llm.tokenize(prompt)
        state.check_context(len(ids), "prompt", explicit)
        return {"prompt": ids}
    kwargs = dict(max_tokens=explicit if given else COMPLETION_MAX_TOKENS, stop=req.stop,
                  stream_options=req.stream_options, **fields)
    return GenerationPlan(llm.create_completion, kwargs, prepare, bool(req.stream))
