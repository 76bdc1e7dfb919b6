"""POST /v1/chat/completions: a conversation through the model's chat template;
`logprobs` / `top_logprobs`, `response_format` (enforced while sampling), `tools` /
`tool_choice` / `parallel_tool_calls`; max_tokens left out, null or -1 runs until EOS or
the context is full."""
from __future__ import annotations

from starlette.responses import Response

from ..text.chat import MessageContentError, openai_messages, parse_tool_call_arguments
from .errors import BadRequest
from .generation import GenerationPlan, serve_generation
from .request_models import ChatCompletionRequest, parse
from .state import ServerState


async def chat_completions(state: ServerState, request) -> Response:
    return await serve_generation(state, request, plan_chat)


def plan_chat(state: ServerState, body: dict) -> GenerationPlan:
    req = parse(ChatCompletionRequest, body, vocab=state.llm.vocab_size)
    msgs = chat_messages(req.messages, state.llm.chat_template)
    explicit, max_param = req.max_tokens_of("max_completion_tokens", "max_tokens")
    fields = req.sampling() | req.structured()
    tools = fields.get("tools")
    llm = state.llm

    def prepare():
        ids = llm.chat_prompt_ids(msgs, tools)
        state.check_context(len(ids), "messages", explicit, max_param or "max_tokens")
        return {"prompt_ids": ids}
    kwargs = dict(messages=msgs, max_tokens=explicit, stop=req.stop,
                  stream_options=req.stream_options, **fields)
    return GenerationPlan(llm.create_chat_completion, kwargs, prepare, bool(req.stream))


def chat_messages(msgs: list, template) -> list:
    """The request's messages (objects with a string role, as the request model
    checked), their text content (a string or text parts, joined here as `cortiq.LLM`
    joins them; a part of another kind or a malformed one is a 400 naming it), the
    `developer` role as `template` takes it, tool calls' JSON-string arguments parsed."""
    try:
        msgs = openai_messages(msgs, template)
    except MessageContentError as e:
        raise BadRequest(str(e), e.param, code=e.code) from None
    return parse_tool_call_arguments(msgs)
