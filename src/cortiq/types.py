"""The shapes of what `cortiq.LLM` and the server return, as TypedDicts (OpenAI's).

    from cortiq.types import ChatCompletion
    r: ChatCompletion = llm.create_chat_completion(messages)

They describe plain dicts (JSON-ready, what the server sends): nothing is wrapped.
Keys declared in a `total=False` part are present only when the request asked for
them (`message.tool_calls`, a chunk's `usage`).
"""
from __future__ import annotations

from typing import Any, Literal, TypedDict

__all__ = [
    "ChatCompletion", "ChatCompletionChoice", "ChatCompletionChunk", "ChatCompletionChunkChoice",
    "ChatCompletionDelta", "ChatCompletionLogprobs", "ChatCompletionMessage",
    "ChatCompletionTokenLogprob", "ChatMessage", "Completion", "CompletionChoice",
    "CompletionLogprobs", "CompletionUsage", "Embedding", "EmbeddingList",
    "EmbeddingUsage", "FinishReason", "FunctionCall", "PromptTokensDetails",
    "ResponseFormat", "Tool", "ToolCall", "ToolCallDelta", "ToolChoice", "TopLogprob",
]

FinishReason = Literal["stop", "length", "tool_calls", "cancelled"]


class PromptTokensDetails(TypedDict):
    cached_tokens: int


class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


# -- logprobs ----------------------------------------------------------------------------
class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]


class ChatCompletionTokenLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatCompletionLogprobs(TypedDict):
    content: list[ChatCompletionTokenLogprob]
    refusal: None


class CompletionLogprobs(TypedDict):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


# -- completions -------------------------------------------------------------------------
class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class Completion(TypedDict):
    """`create_completion` (and each streamed chunk: `usage` None but on the last)."""
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None


# -- chat --------------------------------------------------------------------------------
class FunctionCall(TypedDict):
    name: str
    arguments: str                 # JSON text


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ToolCallDelta(ToolCall):
    index: int


class _Message(TypedDict):
    role: Literal["assistant"]
    content: str | None


class ChatCompletionMessage(_Message, total=False):
    tool_calls: list[ToolCall]


class ChatCompletionChoice(TypedDict):
    index: int
    message: ChatCompletionMessage
    logprobs: ChatCompletionLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage


class ChatCompletionDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str
    tool_calls: list[ToolCallDelta]


class ChatCompletionChunkChoice(TypedDict):
    index: int
    delta: ChatCompletionDelta
    logprobs: ChatCompletionLogprobs | None
    finish_reason: FinishReason | None


class _Chunk(TypedDict):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]   # empty in the final usage chunk


class ChatCompletionChunk(_Chunk, total=False):
    usage: CompletionUsage | None              # with stream_options.include_usage


# -- requests ----------------------------------------------------------------------------
class ChatMessage(TypedDict, total=False):
    role: str                      # "system", "user", "assistant", "tool"
    content: str | list[dict[str, Any]] | None
    tool_calls: list[ToolCall]
    tool_call_id: str
    name: str


class _FunctionSpec(TypedDict, total=False):
    name: str
    description: str
    parameters: dict[str, Any]     # JSON schema
    strict: bool


class Tool(TypedDict):
    type: Literal["function"]
    function: _FunctionSpec


class _NamedFunction(TypedDict):
    name: str


class _NamedToolChoice(TypedDict):
    type: Literal["function"]
    function: _NamedFunction


ToolChoice = Literal["none", "auto", "required"] | _NamedToolChoice


class _JsonSchemaSpec(TypedDict, total=False):
    name: str
    schema: dict[str, Any]
    strict: bool
    description: str


class ResponseFormat(TypedDict, total=False):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchemaSpec


# -- embeddings --------------------------------------------------------------------------
class Embedding(TypedDict):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str   # str: base64 of little-endian float32


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(TypedDict):
    """POST /v1/embeddings (`LLM.embed` returns the vectors as one NumPy array)."""
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
