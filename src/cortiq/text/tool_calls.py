"""Tool calls: the model's tool-call text parsed back into OpenAI's `tool_calls`,
and grammars that force a call when `tool_choice` asks for one.

The chat template renders `tools` (and earlier calls and `role: "tool"` results) into
the prompt; how a model writes a call depends on its template family, detected from
the template source (`detect_format`):

* "hermes" (Qwen2.5/Qwen3, Hermes, Nanbeige's json mode, and the default for
  templates without any tool syntax)::

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

* "xml" (Qwen3-Coder, Nanbeige)::

      <tool_call>
      <function=get_weather>
      <parameter=city>
      Paris
      </parameter>
      </function>
      </tool_call>

* "deepseek" (DeepSeek-V3/R1 and V3.1 special-token markers; one line in the output)::

      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>
      {"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

* "llama3" (Llama 3.1-3.3: templates with ``<|python_tag|>`` or header-style prompts
  that ask for a "parameters" JSON); the reply is the call, JSON objects optionally
  after ``<|python_tag|>`` and separated by ``;``::

      <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

* "mistral" (templates with ``[TOOL_CALLS]``), a JSON list or the newer
  name-``[ARGS]`` form, one per call::

      [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]
      [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}

`parse(text, fmt, tools)` -> (content, calls); text that does not parse as a call
stays content. `ToolCallStream` does the same incrementally: it passes content
through as it comes and holds text back from the first possible start of a call.
`required_grammar(tools, choice, fmt)`: a Lark grammar (llguidance's dialect, JSON
arguments by `%json` against each function's `parameters` schema) whose strings are
exactly the calls allowed, for `tool_choice="required"` or a named function.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .structured import compact_schema

__all__ = [
    "FORMATS",
    "ToolCallStream",
    "check_tool_choice",
    "check_tools",
    "detect_format",
    "parse",
    "required_grammar",
]

FORMATS = ("hermes", "xml", "deepseek", "llama3", "mistral")
_DS_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
_DS_CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
_DS_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
_DS_CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
_DS_SEP = "<\uff5ctool\u2581sep\uff5c>"
_MARKERS = {"hermes": ("<tool_call>",), "xml": ("<tool_call>", "<function="),
            "deepseek": (_DS_CALLS_BEGIN, _DS_CALL_BEGIN, "<tool_call>"),
            "llama3": ("<|python_tag|>", "<tool_call>"),
            "mistral": ("[TOOL_CALLS]", "<tool_call>")}
# Markers that start a call only at the start of the reply (Llama's bare JSON call:
# a "{" later on is ordinary content)
_LEADING_MARKERS = {"llama3": ("{",)}
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_CALLS = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"
_JSON = json.JSONDecoder()

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_XML_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_XML_FN = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)",
                        re.DOTALL)
_DS_CALL = re.compile(re.escape(_DS_CALL_BEGIN) + r"\s*(?:function\s*" + re.escape(_DS_SEP)
                      + r"\s*([^\n]+?)\s*\n```(?:json)?\s*(.*?)\s*```|([^\n]*?)\s*"
                      + re.escape(_DS_SEP) + r"\s*(.*?))\s*(?:" + re.escape(_DS_CALL_END)
                      + "|$)", re.DOTALL)


def detect_format(template_source: str | None) -> str:
    """The tool-call family a chat template writes (see the module docstring)."""
    src = template_source or ""
    if _DS_CALL_BEGIN in src or "tool\u2581call\u2581begin" in src:
        return "deepseek"
    if "<function=" in src and "<parameter=" in src:
        return "xml"
    if _MISTRAL_CALLS in src:
        return "mistral"
    if _PYTHON_TAG in src or ("<|start_header_id|>" in src and "parameters" in src
                              and "tools" in src):
        return "llama3"
    return "hermes"


# ---------------------------------------------------------------- request checks

def check_tools(tools) -> list[dict] | None:
    """OpenAI's `tools`: a list of {"type": "function", "function": {"name", ...}}."""
    if tools is None:
        return None
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ConfigError("tools: expected a list of tool objects")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" \
                or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            raise ConfigError(f"tools[{i}]: expected {{'type': 'function', 'function': "
                              "{'name': ..., 'parameters': {...}}}")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise ConfigError(f"tools[{i}].function.parameters: expected a JSON schema object")
        if fn["name"] in names:
            raise ConfigError(f"tools[{i}]: the function name {fn['name']!r} is used twice")
        names.add(fn["name"])
    return [dict(t) for t in tools] or None


def check_tool_choice(choice, tools) -> str | None:
    """"none", "auto", "required", or the name of the one function to call
    (from {"type": "function", "function": {"name": ...}}); None means "auto" when
    there are tools."""
    if choice is None:
        return "auto" if tools else None
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise ConfigError("tool_choice='required' needs tools")
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(
            choice.get("function"), Mapping) and isinstance(choice["function"].get("name"), str):
        name = choice["function"]["name"]
        if not any(t["function"]["name"] == name for t in tools or ()):
            raise ConfigError(f"tool_choice: no tool named {name!r} in tools")
        return "function:" + name
    raise ConfigError("tool_choice: expected 'none', 'auto', 'required' or {'type': "
                      "'function', 'function': {'name': ...}}")


# ---------------------------------------------------------------- parsing

def _call(name: str, arguments: Any) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(
        arguments if arguments is not None else {}, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": args}}


def _param_types(tools, name: str) -> dict:
    for t in tools or ():
        fn = t.get("function", {})
        if fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return {k: (v or {}).get("type") for k, v in props.items()}
    return {}


def _xml_value(raw: str, typ) -> Any:
    if typ == "string":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _parse_hermes(text: str) -> tuple[str, list[dict]] | None:
    calls, spans = [], []
    for m in _HERMES.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(_call(obj["name"], args))
        spans.append(m.span())
    return (_cut(text, spans), calls) if calls else None


def _parse_xml(text: str, tools) -> tuple[str, list[dict]] | None:
    calls, spans = [], []
    for m in _XML_CALL.finditer(text):
        fns = list(_XML_FN.finditer(m.group(1)))
        if not fns:
            return None
        for f in fns:
            name = f.group(1).strip()
            types = _param_types(tools, name)
            args = {p.group(1).strip(): _xml_value(p.group(2), types.get(p.group(1).strip()))
                    for p in _XML_PARAM.finditer(f.group(2))}
            calls.append(_call(name, args))
        spans.append(m.span())
    return (_cut(text, spans), calls) if calls else None


def _parse_deepseek(text: str) -> tuple[str, list[dict]] | None:
    start = text.find(_DS_CALLS_BEGIN)
    if start < 0:
        start = text.find(_DS_CALL_BEGIN)
    if start < 0:
        return None
    calls = []
    for m in _DS_CALL.finditer(text, start):
        name = (m.group(1) or m.group(3) or "").strip()
        raw = m.group(2) if m.group(1) is not None else m.group(4)
        try:
            args = json.loads(raw)
        except (TypeError, ValueError):
            return None
        if not name:
            return None
        calls.append(_call(name, args))
    if not calls:
        return None
    end = text.find(_DS_CALLS_END, start)
    tail = text[end + len(_DS_CALLS_END):] if end >= 0 else ""
    return (text[:start] + tail).strip(), calls


def _named_call(obj) -> dict | None:
    """A call from {"name", "arguments" or "parameters"}; None for anything else."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return _call(obj["name"], args)


def _parse_llama3(text: str) -> tuple[str, list[dict]] | None:
    start = text.find(_PYTHON_TAG)
    if start >= 0:
        content, at = text[:start], start + len(_PYTHON_TAG)
    elif text.lstrip().startswith("{"):
        content, at = "", len(text) - len(text.lstrip())
    else:
        return None
    calls: list[dict] = []
    while True:
        while at < len(text) and (text[at].isspace() or (calls and text[at] == ";")):
            at += 1
        if at >= len(text):
            break
        try:
            obj, at = _JSON.raw_decode(text, at)
        except ValueError:
            return None
        call = _named_call(obj)
        if call is None:
            return None
        calls.append(call)
    return (content.strip(), calls) if calls else None


def _parse_mistral(text: str) -> tuple[str, list[dict]] | None:
    start = text.find(_MISTRAL_CALLS)
    if start < 0:
        return None
    calls, at = [], start
    while text.startswith(_MISTRAL_CALLS, at):
        at += len(_MISTRAL_CALLS)
        while at < len(text) and text[at].isspace():
            at += 1
        try:
            if text.startswith("[", at):              # a JSON list of calls
                objs, at = _JSON.raw_decode(text, at)
                if not isinstance(objs, list) or not objs:
                    return None
            else:                                     # name[ARGS]{...}
                sep = text.find(_MISTRAL_ARGS, at)
                if sep < 0:
                    return None
                name = text[at:sep].strip()
                args, at = _JSON.raw_decode(text, sep + len(_MISTRAL_ARGS))
                objs = [{"name": name, "arguments": args}]
        except ValueError:
            return None
        for obj in objs:
            call = _named_call(obj)
            if call is None:
                return None
            calls.append(call)
        while at < len(text) and text[at].isspace():
            at += 1
    if text[at:].strip():
        return None
    return text[:start].strip(), calls


def _cut(text: str, spans) -> str:
    out, at = [], 0
    for a, b in spans:
        out.append(text[at:a])
        at = b
    out.append(text[at:])
    return "".join(out).strip()


def parse(text: str, fmt: str = "hermes", tools=None) -> tuple[str, list[dict]]:
    """(content, tool calls) of a model's reply; calls in OpenAI's shape ({"id",
    "type": "function", "function": {"name", "arguments": JSON text}}). A reply whose
    call text does not parse is all content (no calls)."""
    if fmt not in FORMATS:
        raise ConfigError(f"tool-call format {fmt!r}: expected one of {', '.join(FORMATS)}")
    for f in (fmt, "hermes"):
        if f == "xml":
            got = _parse_xml(text, tools)
        elif f == "deepseek":
            got = _parse_deepseek(text)
        elif f == "llama3":
            got = _parse_llama3(text)
        elif f == "mistral":
            got = _parse_mistral(text)
        else:
            got = _parse_hermes(text)
        if got is not None:
            return got
    return text, []


class ToolCallStream:
    """Incremental `parse`: `feed(piece)` returns the content that is safe to show
    now (everything before the first possible start of a call); `finish()` returns
    (the rest of the content, the calls)."""

    def __init__(self, fmt: str = "hermes", tools=None):
        self.fmt, self.tools = fmt, tools
        self._markers = _MARKERS[fmt]
        self._leading = _LEADING_MARKERS.get(fmt, ())
        self._text = ""
        self._shown = 0
        self._held = False           # a marker was seen: everything from it is held

    def feed(self, piece: str) -> str:
        self._text += piece
        if self._held:
            return ""
        t = self._text
        cut = len(t)
        if self._shown == 0 and self._leading:
            head = t.lstrip()
            if any(head.startswith(mk) for mk in self._leading):
                self._held = True
                return ""
            if not head:                 # only whitespace yet: the call may follow
                return ""
        for mk in self._markers:
            i = t.find(mk, self._shown)
            if i >= 0:
                cut = min(cut, i)
                self._held = True
        if not self._held:           # keep back a tail that may begin a marker
            for mk in self._markers:
                for k in range(min(len(mk) - 1, len(t) - self._shown), 0, -1):
                    if mk.startswith(t[len(t) - k:]):
                        cut = min(cut, len(t) - k)
                        break
        out = t[self._shown:cut]
        self._shown = max(self._shown, cut)
        return out

    def finish(self) -> tuple[str, list[dict]]:
        rest = self._text[self._shown:]
        if not self._held:
            self._shown = len(self._text)
            return rest, []
        content, calls = parse(rest, self.fmt, self.tools)
        if not calls:
            return rest, []
        # `parse` strips; what was already shown is not repeated
        return (content if content.strip() else ""), calls


# ---------------------------------------------------------------- forcing a call

def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _chosen(tools, choice: str) -> list[dict]:
    fns = [t["function"] for t in tools]
    if choice.startswith("function:"):
        fns = [f for f in fns if f["name"] == choice[len("function:"):]]
    return fns


def required_grammar(tools, choice: str, fmt: str = "hermes", parallel: bool = True) -> str:
    """Lark grammar text (llguidance) for one or more calls (one when `parallel` is
    False) of the functions `choice` allows ("required": any; "function:NAME": that
    one), in the template's format. DeepSeek's, Llama's and Mistral's markers are
    special tokens that a text grammar cannot spell, so those families are forced in
    the Hermes form (which `parse` also reads)."""
    fns = _chosen(tools, choice)
    rules = []
    if fmt == "xml":
        alts = []
        for i, f in enumerate(fns):
            params = f.get("parameters") or {}
            props = params.get("properties") or {}
            req = [k for k in props if k in set(params.get("required") or ())]
            parts = [_lit(f"<function={f['name']}>\n")]
            for j, k in enumerate(req):
                schema = props[k] or {}
                if schema.get("type") == "string" and "enum" not in schema:
                    lo = max(int(schema.get("minLength", 1)), 1)
                    hi = schema.get("maxLength")
                    rules.append(f"V{i}_{j}: /[^<\\n]{{{lo},{'' if hi is None else int(hi)}}}/")
                    value = f"V{i}_{j}"
                elif "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
                    value = "(" + " | ".join(_lit(v) for v in schema["enum"]) + ")"
                else:
                    rules.append(f"v{i}_{j}: %json {json.dumps(compact_schema(schema))}")
                    value = f"v{i}_{j}"
                parts += [_lit(f"<parameter={k}>\n"), value, _lit("\n</parameter>\n")]
            parts.append(_lit("</function>"))
            rules.append(f"f{i}: " + " ".join(parts))
            alts.append(f"f{i}")
        rules.append("call: " + _lit("<tool_call>\n") + " (" + " | ".join(alts) + ") "
                     + _lit("\n</tool_call>"))
    else:
        one = [{"type": "object",
                "properties": {"name": {"const": f["name"]},
                               "arguments": f.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False}
               for f in fns]
        schema = one[0] if len(one) == 1 else {"anyOf": one}
        rules.append(f"body: %json {json.dumps(compact_schema(schema))}")
        rules.append("call: " + _lit("<tool_call>\n") + " body " + _lit("\n</tool_call>"))
    start = "start: call (" + _lit("\n") + " call)*" if parallel else "start: call"
    return "\n".join([start, *rules]) + "\n"
