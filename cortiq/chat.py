"""Chat templates rendered with Hugging Face semantics.

A CMF chat bundle (`header.tokenizer_config`, docs/cmf-format.md §4.4) carries the model's
Jinja chat template. It is rendered the way `transformers`' `apply_chat_template`
does, so prompts match what the model was trained on:

* `jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`
  with the `loopcontrols` extension (`{% break %}`, `{% continue %}`) and support for
  `{% generation %}...{% endgeneration %}` blocks (rendered as their body);
* `raise_exception(msg)` raises `cortiq.errors.TemplateError(msg)`;
* `tojson` is HF's: `json.dumps(x, ensure_ascii=False, indent=..., separators=...,
  sort_keys=False)` -- no HTML escaping, key order kept, non-ASCII kept;
* `strftime_now(fmt)` formats the current local time;
* context: `messages`, `tools` (None when not given), `add_generation_prompt`,
  `bos_token`, `eos_token` (strings, '' when the tokenizer has none) and any extra
  keyword (`enable_thinking`, `tool_call_format`, `documents`, ...). A variable
  that is not passed stays undefined, as in HF.

Without a template the runtime falls back to ChatML (upstream cortiq's fallback)::

    <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n

Upstream cortiq also inserts an empty ``<think>\\n\\n</think>\\n\\n`` after the final
assistant header when thinking is disabled and the template did not produce a
``</think>`` itself; `render(..., enable_thinking=False)` does the same.
Errors in the template (syntax, undefined operations, sandbox violations,
`raise_exception`) raise `TemplateError` naming the template and the problem.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from .errors import TemplateError

__all__ = ["ChatTemplate", "CHATML_TEMPLATE", "render_chatml", "parse_tool_call_arguments"]

# The fallback as a template, so that it goes through the same renderer (and a
# message's list-of-parts content is flattened the same way everywhere).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is iterable and message['content'] is not mapping -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part is string -%}{{- part -}}"
    "{%- elif part is mapping and part.get('type') == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- elif message['content'] is not none and message['content'] is defined -%}"
    "{{- message['content'] -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_EMPTY_THINK = "<think>\n\n</think>\n\n"


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """HF's override of jinja's tojson: no HTML escaping, keys in their order."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _RaisedByTemplate(TemplateError):
    """raise_exception() from inside a template; render() adds the template's name."""


def _raise_exception(message):
    raise _RaisedByTemplate(str(message))


_ENV = None


def _environment():
    """The shared sandboxed environment (built on first use: jinja2 imports lazily)."""
    global _ENV
    if _ENV is not None:
        return _ENV
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}body{% endgeneration %}` renders body (HF marks assistant
        spans with it for training masks; inference only needs the text)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols],
        undefined=jinja2.Undefined)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    _ENV = env
    return env


def _check_messages(messages) -> list:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TemplateError(
            f"chat messages: expected a list of {{'role', 'content'}} objects, got "
            f"{type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise TemplateError(f"chat messages[{i}]: expected an object, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise TemplateError(f"chat messages[{i}]: 'role' must be a non-empty string, "
                                f"got {role!r}")
    return list(messages)


def _check_tools(tools):
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TemplateError(f"chat tools: expected a list of tool objects, got "
                            f"{type(tools).__name__}")
    for i, t in enumerate(tools):
        if not isinstance(t, Mapping):
            raise TemplateError(f"chat tools[{i}]: expected a JSON-schema object, got "
                                f"{type(t).__name__}")
    return list(tools)


def _template_lineno(tb) -> int | None:
    """The template line of the innermost frame that belongs to the template."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def parse_tool_call_arguments(messages) -> list:
    """A copy of `messages` in which each assistant tool call's `arguments`, when it
    is a JSON string holding an object (the OpenAI wire format), is parsed into that
    object. Templates that iterate the arguments (`arguments|items`, e.g. Nanbeige's
    XML tool-call format) need objects; HF passes messages through unchanged, so this
    is opt-in (the server does it for OpenAI requests, as vLLM does)."""
    out = []
    for m in _check_messages(messages):
        calls = m.get("tool_calls")
        if not calls or isinstance(calls, (str, Mapping)) or not isinstance(calls, Sequence):
            out.append(m)
            continue
        new_calls = []
        for call in calls:
            if isinstance(call, Mapping):
                fn = call.get("function")
                target = fn if isinstance(fn, Mapping) else call
                args = target.get("arguments")
                if isinstance(args, str):
                    try:
                        parsed = json.loads(args)
                    except ValueError:
                        parsed = None
                    if isinstance(parsed, dict):
                        target = {**target, "arguments": parsed}
                        call = {**call, "function": target} if isinstance(fn, Mapping) \
                            else target
            new_calls.append(call)
        out.append({**m, "tool_calls": new_calls})
    return out


def insert_empty_think(text: str) -> str:
    """Upstream's --no-think rule: when the rendered prompt has no ``</think>``, put
    an empty think block right after the last ``assistant`` header line."""
    if "</think>" in text:
        return text
    i = text.rfind("assistant\n")
    if i == -1:
        return text
    j = i + len("assistant\n")
    return text[:j] + _EMPTY_THINK + text[j:]


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may use."""

    def __init__(self, source: str | None = None, *, bos_token: str | None = "",
                 eos_token: str | None = "", name: str = "chat_template"):
        self.name = name
        self.is_fallback = source is None
        if source is None:
            source = CHATML_TEMPLATE
            self.name = "ChatML fallback"
        if not isinstance(source, str):
            raise TemplateError(f"{name}: expected the template as a string, got "
                                f"{type(source).__name__}")
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        import jinja2
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"{self.name}: syntax error on line {e.lineno}: {e.message}") \
                from None

    @classmethod
    def from_bundle(cls, tokenizer_config: Mapping | None, tokenizer=None) -> "ChatTemplate":
        """From a CMF chat bundle (`{"chat_template": str?, ...}`) and the model's
        `cortiq.tokenizer.Tokenizer` (for `bos_token` / `eos_token`); ChatML when the
        bundle has no template."""
        if tokenizer_config is not None and not isinstance(tokenizer_config, Mapping):
            raise TemplateError(f"tokenizer_config: expected a JSON object, got "
                                f"{type(tokenizer_config).__name__}")
        src = (tokenizer_config or {}).get("chat_template")
        if isinstance(src, str) and not src.strip():
            src = None
        if src is not None and not isinstance(src, str):
            # HF also allows a list of named templates: take "default".
            if isinstance(src, list):
                named = {d.get("name"): d.get("template") for d in src if isinstance(d, Mapping)}
                src = named.get("default")
                if src is None:
                    raise TemplateError("tokenizer_config.chat_template: a list of named "
                                        f"templates without 'default' (has {sorted(named)})")
            else:
                raise TemplateError("tokenizer_config.chat_template: expected a string, got "
                                    f"{type(src).__name__}")
        bos = getattr(tokenizer, "bos_token", None) if tokenizer is not None else None
        eos = getattr(tokenizer, "eos_token", None) if tokenizer is not None else None
        return cls(src, bos_token=bos, eos_token=eos,
                   name="tokenizer_config.chat_template")

    @classmethod
    def chatml(cls) -> "ChatTemplate":
        return cls(None)

    def render(self, messages, add_generation_prompt: bool = True, tools=None, *,
               continue_final_message: bool = False, **extra: Any) -> str:
        """The prompt text for `messages` (a list of `{"role", "content", ...}`).

        `continue_final_message=True` (HF's option, implies no generation prompt)
        cuts the text right after the last message's content, so the model continues
        that message (e.g. a prefilled assistant answer)."""
        messages = _check_messages(messages)
        if continue_final_message:
            add_generation_prompt = False
        tools = _check_tools(tools)
        ctx = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        ctx.update(extra)
        ctx.update(messages=messages, tools=tools,
                   add_generation_prompt=bool(add_generation_prompt))
        import jinja2
        try:
            text = self._template.render(**ctx)
        except _RaisedByTemplate as e:
            line = _template_lineno(e.__traceback__)
            where = f" (line {line})" if line else ""
            raise TemplateError(f"{self.name}{where}: raise_exception: {e}") from None
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            line = _template_lineno(e.__traceback__)
            where = f" (line {line})" if line else ""
            raise TemplateError(f"{self.name}{where}: {type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001 -- template code can raise anything
            line = _template_lineno(e.__traceback__)
            where = f" (line {line})" if line else ""
            raise TemplateError(f"{self.name}{where}: {type(e).__name__}: {e}") from None
        if continue_final_message:
            text = self._cut_after_final(text, messages)
        if extra.get("enable_thinking") is False and add_generation_prompt:
            text = insert_empty_think(text)
        return text

    def _cut_after_final(self, text: str, messages: list) -> str:
        if not messages:
            raise TemplateError("continue_final_message: there are no messages")
        final = messages[-1].get("content")
        if isinstance(final, (list, tuple)):
            texts = [b.get("text") for b in final if isinstance(b, Mapping)
                     and isinstance(b.get("text"), str)]
            final = texts[-1] if texts else None
        if not isinstance(final, str):
            raise TemplateError("continue_final_message: the final message has no text content")
        final = final.strip()
        i = text.rfind(final)
        if i == -1:
            raise TemplateError(f"{self.name}: continue_final_message: the final message's "
                                "content does not appear in the rendered prompt")
        return text[:i + len(final)]

    def __repr__(self) -> str:
        kind = "ChatML fallback" if self.is_fallback else f"{len(self.source)} chars"
        return f"ChatTemplate({kind})"


def render_chatml(messages, add_generation_prompt: bool = True) -> str:
    """The ChatML fallback rendering of `messages`."""
    return ChatTemplate(None).render(messages, add_generation_prompt)
