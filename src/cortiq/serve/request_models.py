"""The request bodies of the generation and embeddings routes as pydantic models: each
field's type and range, and the checks across fields as validators. `parse` validates
a body against one of them and turns the first failure into a BadRequest in OpenAI's
shape (`param` naming the field as OpenAI spells it, `code` where the refusal has one).

Unknown fields are accepted and ignored, as vLLM does: clients and SDKs send vendor
fields of their own (LangChain's, LiteLLM's), and a strict server would refuse them.
OpenAI parameters that would change the output and that this server does not implement
are declared here and refused (code `unsupported_parameter`), never ignored."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError,
                      ValidationInfo, field_validator, model_validator)
from pydantic_core import PydanticCustomError

from .errors import BadRequest
from .request_body import path_name

MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
MAX_EMBED_INPUTS = 2048         # OpenAI's limit on inputs per embeddings request
MAX_TOKENS_LIMIT = 1 << 31
UNTIL_CONTEXT_ENDS = -1         # max_tokens: -1 (or null) generates until the context ends
RANDOM_SEED = -1                # seed: -1 draws fresh entropy, as `cortiq.LLM` takes it


def refusal(message: str, *, code: str | None = None, param: str | None = None):
    """A validation failure carrying OpenAI's `code`, and `param` when it names a
    field other than the one being validated."""
    return PydanticCustomError("request_refused", "{message}",
                               {"message": message, "code": code, "param": param})


def _finite(lo: float, hi: float):
    return Annotated[float, Field(ge=lo, le=hi, allow_inf_nan=False)]


def _max_tokens_value(v: int) -> int:
    if v == 0:
        raise refusal("must be an integer >= 1, or -1 (until the context ends)")
    return v


MaxTokens = Annotated[int, Field(ge=UNTIL_CONTEXT_ENDS, le=MAX_TOKENS_LIMIT),
                      AfterValidator(_max_tokens_value)]


def _is_token_ids(x) -> bool:
    return isinstance(x, list) and bool(x) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in x)


class RequestModel(BaseModel):
    # strict: "9" is not 9 and true is not 1, as OpenAI's API refuses them
    model_config = ConfigDict(strict=True, extra="ignore")

    model: Any = None       # checked against the served names before validation (404)


# OpenAI parameters this server does not implement, with the values that leave the output
# unchanged (anything else is refused rather than silently ignored).
_HARMLESS_VALUES: dict[str, Any] = {
    "functions": lambda v: v == [],
    "function_call": lambda v: v in ("none", "auto"),
    "reasoning_effort": lambda v: False,
    "modalities": lambda v: v == ["text"],
    "audio": lambda v: False,
    "prediction": lambda v: False,
    "web_search_options": lambda v: False,
}


class GenerationRequest(RequestModel):
    """What /v1/completions and /v1/chat/completions share: streaming, sampling, stop
    strings. `parse(..., vocab=n)` checks `logit_bias` against n tokens."""

    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    temperature: _finite(0, 2) | None = None            # type: ignore[valid-type]
    top_p: _finite(0, 1) | None = None                  # type: ignore[valid-type]
    presence_penalty: _finite(-2, 2) | None = None      # type: ignore[valid-type]
    frequency_penalty: _finite(-2, 2) | None = None     # type: ignore[valid-type]
    min_p: _finite(0, 1) | None = None                  # type: ignore[valid-type]
    repetition_penalty: _finite(1e-6, 10) | None = None  # type: ignore[valid-type]
    top_k: Annotated[int, Field(ge=0, le=1 << 31)] | None = None
    seed: Annotated[int, Field(ge=RANDOM_SEED, le=2**64 - 1)] | None = None
    logit_bias: dict[str, Any] | None = None
    stop: Any = Field(None, json_schema_extra={"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}}]})
    n: Any = None
    best_of: Any = None
    suffix: Any = None
    functions: Any = None
    function_call: Any = None
    reasoning_effort: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    user: Any = None

    @field_validator("n", "best_of", "suffix")
    @classmethod
    def _only_the_default(cls, v, info: ValidationInfo):
        if v is not None and v != ("" if info.field_name == "suffix" else 1):
            raise refusal(f"'{info.field_name}'={json.dumps(v)} is not supported by this "
                          "server")
        return v

    @field_validator(*_HARMLESS_VALUES)
    @classmethod
    def _unimplemented(cls, v, info: ValidationInfo):
        name = info.field_name
        assert name is not None
        if v is not None and not _HARMLESS_VALUES[name](v):
            raise refusal(f"'{name}' is not supported by this server yet (it would change "
                          "the output, so it is refused rather than ignored)",
                          code="unsupported_parameter")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _token_biases(cls, v, info: ValidationInfo):
        if v is None:
            return None
        vocab = (info.context or {}).get("vocab")
        clean = {}
        for k, bias in v.items():
            try:
                tid = int(k)
            except ValueError:
                raise refusal(f"key {k!r} is not a token id") from None
            if vocab is not None and not 0 <= tid < vocab:
                raise refusal(f"token id {tid} is outside the vocabulary [0, {vocab})")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                    or not -100 <= bias <= 100:
                raise refusal(f"the bias of token {tid} must be a number in [-100, 100]")
            clean[tid] = float(bias)
        return clean

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        if v is None:
            return None
        stop = [v] if isinstance(v, str) else v
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise refusal("must be a non-empty string or a list of them")
        if len(stop) > MAX_STOP:
            raise refusal(f"takes at most {MAX_STOP} strings")
        return stop

    def sampling(self) -> dict:
        """The sampling keywords the request sets, as `cortiq.LLM` takes them."""
        names = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p",
                 "repetition_penalty", "top_k", "seed", "logit_bias")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}

    def max_tokens_of(self, *names: str) -> tuple[int | None, str | None]:
        """(the first of `names` the body sets, its name): the token limit, None for
        -1 or null (until the context ends); (None, None) when none is set."""
        for name in names:
            if name in self.model_fields_set:
                v = getattr(self, name)
                return (None if v in (None, UNTIL_CONTEXT_ENDS) else v), name
        return None, None


class ChatCompletionRequest(GenerationRequest):
    """POST /v1/chat/completions. The messages' content is checked where it is
    converted (`text.chat.openai_messages`, with the model's template)."""

    messages: list[Any]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    @field_validator("messages")
    @classmethod
    def _messages_have_roles(cls, v):
        if not v:
            raise refusal("'messages' must be a non-empty array")
        for i, m in enumerate(v):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise refusal(f"'messages[{i}]' must be an object with a string 'role'",
                              param=f"messages[{i}]")
        return v

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v):
        if v is None:
            return None
        if v.get("type") not in ("text", "json_object", "json_schema"):
            raise refusal("'response_format' must be {\"type\": \"text\" | \"json_object\" | "
                          "\"json_schema\", ...}")
        if v["type"] == "json_schema" and not isinstance(v.get("json_schema"), dict):
            raise refusal("'response_format.json_schema' must be an object with 'name' and "
                          "'schema'", param="response_format.json_schema")
        return v

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self):
        if not self.logprobs and self.top_logprobs not in (None, 0):
            raise refusal("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return self

    def structured(self) -> dict:
        """The logprobs / response_format / tools keywords of the request (their
        contents are checked where they are compiled: a ConfigError there is a 400)."""
        out: dict = {}
        if self.logprobs:
            out["logprobs"] = True
            if self.top_logprobs is not None:
                out["top_logprobs"] = self.top_logprobs
        if self.response_format is not None:
            out["response_format"] = self.response_format
        if self.tools is not None:
            out["tools"] = self.tools or None
        for name in ("tool_choice", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


class CompletionRequest(GenerationRequest):
    """POST /v1/completions: one prompt, a string or token ids (a batch of one is
    unwrapped)."""

    prompt: Any = Field(json_schema_extra={"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "integer"}}]})
    max_tokens: MaxTokens | None = None
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool | None = None
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, p):
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]
        if isinstance(p, str) or _is_token_ids(p):
            return p
        raise refusal("'prompt' must be a string or a list of token ids (one prompt per "
                      "request)")

    @field_validator("response_format", "tools", "tool_choice")
    @classmethod
    def _chat_only(cls, v, info: ValidationInfo):
        if v is not None and v != {"type": "text"}:
            raise refusal(f"'{info.field_name}' is not supported on /v1/completions (use "
                          "/v1/chat/completions)", code="unsupported_parameter")
        return v


class EmbeddingRequest(RequestModel):
    """POST /v1/embeddings: `input` as strings or token ids; cortiq's `pooling`."""

    input: Any = Field(json_schema_extra={"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer"}},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}]})
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Any = None
    pooling: Literal["mean", "last"] = "mean"
    user: Any = None

    @field_validator("input")
    @classmethod
    def _inputs(cls, inp):
        if isinstance(inp, str) or _is_token_ids(inp):
            inp = [inp]
        if not isinstance(inp, list) or not inp or not all(
                (isinstance(x, str) and x) or _is_token_ids(x) for x in inp):
            raise refusal("'input' must be a non-empty string, an array of them, or token "
                          "ids (an array of integers or of such arrays)")
        if len(inp) > MAX_EMBED_INPUTS:
            raise refusal(f"'input' takes at most {MAX_EMBED_INPUTS} items")
        return inp

    @field_validator("dimensions")
    @classmethod
    def _no_dimensions(cls, v):
        if v is not None:
            raise refusal("'dimensions' is not supported by this server (embeddings have "
                          "the model's hidden size)", code="unsupported_parameter")
        return v


def parse(model: type[RequestModel], body: dict, **context):
    """`body` validated as `model` (`context` reaches the validators), or a BadRequest
    for its first failure."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as e:
        raise _bad_request(e.errors(include_url=False)[0]) from None


def _bad_request(err) -> BadRequest:
    ctx = err.get("ctx") or {}
    param = ctx.get("param") or path_name(err["loc"])
    if err["type"] == "request_refused":
        msg = ctx["message"]
        if not msg.startswith("'"):
            msg = f"'{param}' {msg}"
        return BadRequest(msg, param, code=ctx.get("code"))
    if err["type"] == "missing":
        return BadRequest(f"'{param}' is required", param)
    shown = json.dumps(err.get("input"), default=str)
    return BadRequest(f"'{param}': {err['msg'].lower()}, got {shown[:200]}", param)
