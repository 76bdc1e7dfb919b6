"""POST /v1/chat/completions: a conversation through the model's chat template;
`logprobs` / `top_logprobs`, `response_format` (enforced while sampling), `tools` /
`tool_choice` / `parallel_tool_calls`; max_tokens left out runs until EOS or the
context is full."""
from __future__ import annotations

from starlette.responses import Response

from ..text.chat import MessageContentError, openai_messages, parse_tool_call_arguments
from .errors import BadRequest
from .generation import GenerationPlan, generation_fields, serve_generation
from .params import MAX_TOP_LOGPROBS, boolean, max_tokens, number
from .state import ServerState


async def chat_completions(state: ServerState, request) -> Response:
    return await serve_generation(state, request, plan_chat)


def plan_chat(state: ServerState, body: dict) -> GenerationPlan:
    fields, stop, stream_options = generation_fields(state, body, chat_structured)
    msgs = chat_messages(body, state.llm.chat_template)
    explicit = max_tokens(body, "max_completion_tokens", "max_tokens")
    max_param = "max_completion_tokens" if body.get("max_completion_tokens") \
        is not None else "max_tokens"
    tools = fields.get("tools")
    llm = state.llm

    def prepare():
        ids = llm.chat_prompt_ids(msgs, tools)
        state.check_context(len(ids), "messages", explicit, max_param)
        return {"prompt_ids": ids}
    kwargs = dict(messages=msgs, max_tokens=explicit, stop=stop,
                  stream_options=stream_options, **fields)
    return GenerationPlan(llm.create_chat_completion, kwargs, prepare)


def chat_structured(body) -> dict:
    """logprobs / response_format / tools fields, type-checked (their contents are
    checked where they are compiled: a ConfigError there is a 400 too)."""
    out: dict = {}
    if boolean(body, "logprobs"):
        out["logprobs"] = True
        top = number(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
        if top is not None:
            out["top_logprobs"] = top
    elif body.get("top_logprobs") not in (None, 0):
        raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object",
                                                              "json_schema"):
            raise BadRequest("'response_format' must be {\"type\": \"text\" | "
                             "\"json_object\" | \"json_schema\", ...}", "response_format")
        if rf["type"] == "json_schema" and not isinstance(rf.get("json_schema"), dict):
            raise BadRequest("'response_format.json_schema' must be an object with "
                             "'name' and 'schema'", "response_format.json_schema")
        out["response_format"] = rf
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be an array of tool objects", "tools")
        out["tools"] = tools or None
    if body.get("tool_choice") is not None:
        out["tool_choice"] = body["tool_choice"]
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    return out


def chat_messages(body, template) -> list:
    """`messages`: a non-empty array of objects with a string role and text content
    (a string or text parts, joined here as `cortiq.LLM` joins them; a part of another
    kind or a malformed one is a 400 naming it), the `developer` role as `template`
    takes it, tool calls' JSON-string arguments parsed."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty array", "messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"'messages[{i}]' must be an object with a string 'role'",
                             f"messages[{i}]")
    try:
        msgs = openai_messages(msgs, template)
    except MessageContentError as e:
        raise BadRequest(str(e), e.param, code=e.code) from None
    return parse_tool_call_arguments(msgs)
