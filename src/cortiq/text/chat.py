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
* context: `messages`, `tools` and `documents` (None when not given),
  `add_generation_prompt`, `bos_token`, `eos_token` (strings, '' when the tokenizer
  has none) and any extra keyword (`enable_thinking`, `tool_call_format`, ...). A
  variable that is not passed stays undefined, as in HF;
* each message reaches the template as HF passes it: a copy without its None-valued
  keys, with reasoning given as `reasoning_content`, `thinking` or `reasoning` also
  under `reasoning_content` and `thinking`;
* `continue_final_message` cuts the prompt where a marker appended to the final
  message's text lands (before it, or before the space the template trimmed).

Without a template the runtime falls back to ChatML (upstream cortiq's fallback)::

    <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n

Upstream cortiq also inserts an empty ``<think>\\n\\n</think>\\n\\n`` after the final
assistant header when thinking is disabled and the template did not produce a
``</think>`` itself; `render(..., enable_thinking=False)` does the same.
Errors in the template (syntax, undefined operations, sandbox violations,
`raise_exception`) raise `TemplateError` naming the template and the problem; a
template that fails by itself (anything but `raise_exception` and a malformed
`messages`/`tools` argument) raises its subclass `TemplateRenderError` -- a fault of
the template, not of the conversation (the server answers it 500, not 400).

Resource limits (the template is code from the model file, so it gets a budget):

* time: a render that runs past `render_timeout` seconds (default 2) is stopped
  (an exception is raised in the rendering thread; Python code is interruptible
  between bytecodes) -- `TemplateRenderError("... exceeded the render time limit")`;
* size: the output and every string or list the template builds (`*`, `+`, `~`,
  `%`, `**`, `str.format`, `center`/`ljust`/`rjust`/`zfill`, `replace`, `join`,
  `indent`, `format`, `batch`, set-blocks and macros) are capped at
  `max_output_chars` (default 8 Mi), checked *before* the value is allocated, so
  `'x' * 100000000` is refused without allocating it.

A template is also rendered once on a one-message conversation when it is built, so
one that always exceeds a limit is refused at load rather than on every request.
"""
from __future__ import annotations

import ctypes
import heapq
import json
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence, Sized
from datetime import datetime
from typing import Any

from ..errors import ConfigError, TemplateError

__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplate",
    "MessageContentError",
    "TemplateRenderError",
    "openai_messages",
    "parse_tool_call_arguments",
    "render_chatml",
]

RENDER_TIMEOUT = 2.0                 # seconds a render may take
MAX_OUTPUT_CHARS = 8 << 20           # characters of output (and of any value built)


class TemplateRenderError(TemplateError):
    """The template itself failed (a bug in it, a sandbox violation, a resource limit),
    as opposed to rejecting the conversation with raise_exception()."""


class MessageContentError(ConfigError):
    """A message's content the renderer cannot take: a part that is not text (image,
    audio, file, ...) or a malformed part. `param` names where, in OpenAI's notation
    (`messages[i].content[j]`), so the server can point its 400 at it; `code` is
    "unsupported_content" for a well-formed part of a kind that is not text."""

    def __init__(self, message: str, param: str, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code

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

# Appended to the final message's text for continue_final_message; the prompt is cut
# where it lands (the trailing space tells whether the template trimmed the text).
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

# The names a message's reasoning comes under; templates read the first.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """HF's override of jinja's tojson: no HTML escaping, keys in their order."""
    if isinstance(indent, int) and indent > 64:
        raise _TooBig(f"tojson: indent {indent} exceeds 64")
    if isinstance(indent, str):
        _need(len(indent), "tojson indent")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _RaisedByTemplate(TemplateError):
    """raise_exception() from inside a template; render() adds the template's name."""


def _raise_exception(message):
    raise _RaisedByTemplate(str(message))


class _TooBig(Exception):
    """A value the template was about to build exceeds the size limit."""


class _RenderTimeout(BaseException):
    """Raised asynchronously in the rendering thread when its time is up (a
    BaseException, so no `except Exception` on the way can swallow it)."""


_LIMIT = threading.local()           # the size cap of the render running in this thread


def _cap() -> int:
    return getattr(_LIMIT, "chars", MAX_OUTPUT_CHARS)


def _need(n, what) -> None:
    cap = _cap()
    if n > cap:
        raise _TooBig(f"{what} would build {int(n)} characters/items; the limit is {cap}")


def _size(x) -> int:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else 0


_DIGITS = re.compile(r"\d+")


def _check_widths(fmt: str, args, what: str) -> None:
    """Format widths/precisions ("%0100000000d", "{:>100000000}", "{:{}}" with a huge
    argument) allocate that many characters: refuse any above the cap."""
    cap = _cap()
    for m in _DIGITS.finditer(fmt):
        if len(m.group()) > 9 or int(m.group()) > cap:
            raise _TooBig(f"{what}: a width of {m.group()[:20]} exceeds the limit of {cap}")
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and a > cap:
            raise _TooBig(f"{what}: an argument of {a} exceeds the limit of {cap}")


def _checked_concat(parts) -> str:
    """environment.concat (output, set-blocks, macros, call blocks) with the cap
    applied as the pieces arrive."""
    out, n, cap = [], 0, _cap()
    for p in parts:
        n += len(p)
        if n > cap:
            raise _TooBig(f"the rendered text exceeds the limit of {cap} characters")
        out.append(p)
    return "".join(out)


class _Buffer(list):
    """The output buffer of a macro, set-block, call or filter block, capped as it
    fills (it is only joined at the block's end)."""
    __slots__ = ("n",)

    def __init__(self):
        super().__init__()
        self.n = 0

    def append(self, x):
        self.n += len(x)
        if self.n > _cap():
            raise _TooBig(f"a block's output exceeds the limit of {_cap()} characters")
        super().append(x)

    def extend(self, xs):
        for x in xs:
            self.append(x)


def _checked_str_join(seq) -> str:             # the `~` operator
    return _checked_concat(map(str, seq))


def _guard_binop(op, left, right):
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if _size(seq) and isinstance(n, int):
                _need(len(seq) * max(n, 0), f"{type(seq).__name__} * {n}")
    elif op == "+":
        if _size(left) or _size(right):
            _need(_size(left) + _size(right), "+")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            _need(right * math.log2(abs(left)) / 8, f"{left} ** {right}")
    elif op == "%" and isinstance(left, str):
        _check_widths(left, right if isinstance(right, tuple) else (right,), "'%' formatting")


def _guard_str_method(name, s: str, args, kwargs):
    vals = list(args) + list(kwargs.values())
    if name in ("center", "ljust", "rjust", "zfill"):
        for a in vals:
            if isinstance(a, int):
                _need(a, f"str.{name}")
    elif name == "expandtabs":
        tab = vals[0] if vals and isinstance(vals[0], int) else 8
        _need(len(s) + s.count("\t") * tab, "str.expandtabs")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) \
            and isinstance(args[1], str):
        old, new = args[0], args[1]
        hits = s.count(old) if old else len(s) + 1
        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
            hits = min(hits, args[2])
        _need(len(s) + hits * max(len(new) - len(old), 0), "str.replace")
    elif name == "join" and args and isinstance(args[0], Sized):
        _need(len(s) * len(args[0]), "str.join")
    elif name in ("format", "format_map"):
        _check_widths(s, vals, f"str.{name}")


def _guarded_filters(filters) -> dict:
    """The filters that can build a large value from small arguments, each checked
    before it runs."""
    import functools

    def guard(name, check):
        f = filters[name]

        @functools.wraps(f)
        def wrapper(*a, **kw):
            check(*a, **kw)
            return f(*a, **kw)
        return wrapper

    def center(value, width=80, *_, **__):
        _need(width if isinstance(width, int) else 0, "center")

    def indent(s, width=4, *_, **__):
        w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        text = str(s)
        _need(len(text) + w * (text.count("\n") + 1), "indent")

    def fmt(value, *args, **kwargs):
        _check_widths(str(value), list(args) + list(kwargs.values()), "format")

    def join(*a, **kw):
        # pass_eval_context: (eval_ctx, value, d="", attribute=None)
        value = a[1] if len(a) > 1 else None
        d = a[2] if len(a) > 2 else kw.get("d", "")
        if isinstance(value, Sized) and isinstance(d, str):
            _need(len(d) * len(value), "join")

    def replace(*a, **kw):
        # pass_eval_context: (eval_ctx, s, old, new, count=None)
        if len(a) >= 4 and all(isinstance(x, str) for x in a[1:4]):
            _guard_str_method("replace", a[1], a[2:], {})

    def batch(value, linecount, fill_with=None, *_, **__):
        if fill_with is not None and isinstance(linecount, int):
            _need(linecount, "batch")

    out = {}
    for name, check in (("center", center), ("indent", indent), ("format", fmt),
                        ("join", join), ("replace", replace), ("batch", batch)):
        if name in filters:
            out[name] = guard(name, check)
    return out


def _set_async_exc(tid: int, exc) -> None:
    """Raise `exc` in thread `tid` at its next bytecode boundary. (Never called with
    NULL to cancel one: CPython then leaves the eval breaker tripped, which slows the
    thread and hangs it under a profiler.)"""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(exc))


class _Watchdog:
    """One daemon thread that calls each armed callback at its deadline (a thread per
    render would cost a thread start, milliseconds on a busy machine)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._heap: list = []
        self._seq = 0
        self._thread = None

    def arm(self, seconds: float, callback) -> list:
        with self._cv:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cortiq-template-watchdog",
                                                daemon=True)
                self._thread.start()
            self._seq += 1
            entry = [time.monotonic() + seconds, self._seq, callback]
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:          # earlier than what the thread waits for
                self._cv.notify()
        return entry

    @staticmethod
    def disarm(entry: list) -> None:
        entry[2] = None

    def _run(self):
        while True:
            with self._cv:
                while True:
                    while self._heap and self._heap[0][2] is None:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cv.wait()
                        continue
                    delay = self._heap[0][0] - time.monotonic()
                    if delay > 0:
                        self._cv.wait(delay)
                        continue
                    callback = heapq.heappop(self._heap)[2]
                    break
            if callback is not None:
                callback()


_WATCHDOG = _Watchdog()


def _run_with_time_limit(fn, seconds: float):
    """fn() in this thread, interrupted by _RenderTimeout after `seconds`. The
    watchdog raises it in this thread only while `done` is unset (both under the
    lock); if it fired, the interrupt lands inside this function at the latest in the
    short loop of the finally (the eval breaker is checked on every backward jump), so
    none escapes into the caller."""
    tid = threading.get_ident()
    lock = threading.Lock()
    done: list = []
    fired: list = []

    def fire():
        with lock:
            if not done:
                fired.append(True)
                _set_async_exc(tid, _RenderTimeout)

    entry = None
    try:
        try:
            # armed inside the try: with a tiny limit the interrupt may land in arm()
            # itself (after its lock is released: the watchdog needs that lock to fire)
            entry = _WATCHDOG.arm(seconds, fire)
            return fn()
        finally:
            with lock:
                done.append(True)
            if entry is not None:
                _WATCHDOG.disarm(entry)
            if fired:
                for _ in range(1000):
                    pass
    except _RenderTimeout:
        raise TemplateRenderError(f"exceeded the render time limit of {seconds:g} s") \
            from None


_ENV = None


def _environment():
    """The shared sandboxed environment (built on first use: jinja2 imports lazily)."""
    global _ENV
    if _ENV is not None:
        return _ENV
    import jinja2
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedCodeGenerator(CodeGenerator):
        """`a ~ b` joins through the size check (autoescape is off, so the plain
        str join is the only variant in use); block buffers are capped `_Buffer`s."""

        def buffer(self, frame):
            frame.buffer = self.temporary_identifier()
            self.writeline(f"{frame.buffer} = environment.new_buffer()")

        def visit_Concat(self, node, frame):
            self.write("environment.checked_str_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class LimitedSandbox(ImmutableSandboxedEnvironment):
        """HF's sandbox with the size checks of this module on the operators and the
        calls that can build large values."""
        code_generator_class = LimitedCodeGenerator
        intercepted_binops = frozenset(["*", "+", "**", "%"])

        def call_binop(self, context, operator, left, right):
            _guard_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(self, context, obj, /, *args, **kwargs):  # kwargs are the call's own
            target = getattr(obj, "__wrapped__", obj)
            owner = getattr(target, "__self__", None)
            if isinstance(owner, str):
                _guard_str_method(getattr(target, "__name__", ""), owner, args, kwargs)
            return super().call(context, obj, *args, **kwargs)

    class GenerationTag(Extension):
        """`{% generation %}body{% endgeneration %}` renders body (HF marks assistant
        spans with it for training masks; inference only needs the text)."""
        tags = {"generation"}  # noqa: RUF012 -- jinja2.ext.Extension declares `tags` an instance attribute

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = LimitedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols],
        undefined=jinja2.Undefined)
    env.concat = _checked_concat
    env.checked_str_join = _checked_str_join
    env.new_buffer = _Buffer
    env.filters.update(_guarded_filters(env.filters))
    env.globals.pop("lipsum", None)          # unbounded filler text; no chat template needs it
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


def _flat_content(content, i: int):
    """A message's content with a list of text parts joined (in order, nothing between
    them: how templates that read parts concatenate them) into one string."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, Mapping) or not isinstance(content, Sequence):
        raise MessageContentError(
            f"messages[{i}].content: expected a string or a list of text parts, got "
            f"{type(content).__name__}", f"messages[{i}].content")
    texts = []
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if not isinstance(kind, str):
            raise MessageContentError(f"{where}: expected a part object with a string "
                                      f"'type', got {part!r:.80}", where)
        if kind != "text":
            raise MessageContentError(f"{where}: content parts of type {kind!r} are not "
                                      "supported (text parts only)", where,
                                      "unsupported_content")
        text = part.get("text")
        if not isinstance(text, str):
            raise MessageContentError(f"{where}.text: expected a string, got "
                                      f"{type(text).__name__}", f"{where}.text")
        texts.append(text)
    return "".join(texts)


def openai_messages(messages, template: ChatTemplate) -> list:
    """`messages` in OpenAI's shape made renderable by any HF `template`: a copy in which
    every list-of-parts `content` (`[{"type": "text", "text": ...}, ...]`, any role) is
    one string, so a template renders it the way it renders plain text, and in which
    the `developer` role (OpenAI's system message for newer models) is `system` when
    the template never mentions `developer`. Raises `MessageContentError` naming the
    part for a non-text or malformed part.

    `ChatTemplate.render` itself passes messages through as transformers does; this is
    the OpenAI layer on top that `cortiq.LLM` (and so the server) applies."""
    rename_developer = "developer" not in template.source
    out = []
    for i, m in enumerate(_check_messages(messages)):
        content = m.get("content")
        flat = _flat_content(content, i)
        if flat is not content:
            m = {**m, "content": flat}
        if rename_developer and m["role"] == "developer":
            m = {**m, "role": "system"}
        out.append(m)
    return out


def _normalize_messages(messages: list) -> list:
    """Each message as HF hands it to the template: a fresh dict without the keys whose
    value is None (OpenAI clients send `content: null` beside tool calls; a template
    handles a missing key, where None would print "None"), its reasoning under every
    name (`reasoning_content`, which templates read, and `thinking`) when it came under
    any of `_REASONING_FIELDS`."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING_FIELDS if k in m), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


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
                 eos_token: str | None = "", name: str = "chat_template",
                 render_timeout: float = RENDER_TIMEOUT,
                 max_output_chars: int = MAX_OUTPUT_CHARS):
        self.name = name
        if isinstance(render_timeout, bool) or not isinstance(render_timeout, (int, float)) \
                or not 0 < render_timeout < math.inf:
            raise TemplateError(f"render_timeout: expected seconds > 0, got {render_timeout!r}")
        if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) \
                or max_output_chars < 1:
            raise TemplateError(f"max_output_chars: expected an integer >= 1, got "
                                f"{max_output_chars!r}")
        self.render_timeout = float(render_timeout)
        self.max_output_chars = max_output_chars
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
            raise TemplateRenderError(f"{self.name}: syntax error on line {e.lineno}: "
                                      f"{e.message}") from None
        if not self.is_fallback:
            self._probe()

    def _probe(self) -> None:
        """Render a one-message conversation: a template that breaks a resource limit
        even then would break it on every request, so it is refused now. Other errors
        are left to request time (a template may insist on, say, a system message)."""
        try:
            self.render([{"role": "user", "content": "Hello"}], True)
        except TemplateRenderError as e:
            if "limit" in str(e):
                raise
        except TemplateError:
            pass

    @classmethod
    def from_bundle(cls, tokenizer_config: Mapping | None, tokenizer=None) -> ChatTemplate:
        """From a CMF chat bundle (`{"chat_template": str?, ...}`) and the model's
        `cortiq.text.tokenizer.Tokenizer` (for `bos_token` / `eos_token`); ChatML when the
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
                                        f"templates without 'default' (has {sorted(map(str, named))})")
            else:
                raise TemplateError("tokenizer_config.chat_template: expected a string, got "
                                    f"{type(src).__name__}")
        bos = getattr(tokenizer, "bos_token", None) if tokenizer is not None else None
        eos = getattr(tokenizer, "eos_token", None) if tokenizer is not None else None
        return cls(src, bos_token=bos, eos_token=eos,
                   name="tokenizer_config.chat_template")

    @classmethod
    def chatml(cls) -> ChatTemplate:
        return cls(None)

    def render(self, messages, add_generation_prompt: bool = True, tools=None, *,
               continue_final_message: bool | str = False, **extra: Any) -> str:
        """The prompt text for `messages` (a list of `{"role", "content", ...}`).

        `continue_final_message=True` (HF's option, implies no generation prompt)
        cuts the text right after the last message's content, so the model continues
        that message (e.g. a prefilled assistant answer); a string names the field to
        continue instead of "content" (e.g. "reasoning_content")."""
        messages = _normalize_messages(_check_messages(messages))
        if continue_final_message:
            add_generation_prompt = False
            messages, final = self._tag_final(messages, continue_final_message)
        tools = _check_tools(tools)
        ctx: dict = {"bos_token": self.bos_token, "eos_token": self.eos_token,
                     "documents": None}
        ctx.update(extra)
        ctx.update(messages=messages, tools=tools,
                   add_generation_prompt=bool(add_generation_prompt))
        try:
            text = self._render_limited(ctx)
        except _RaisedByTemplate as e:
            line = _template_lineno(e.__traceback__)
            where = f" (line {line})" if line else ""
            raise TemplateError(f"{self.name}{where}: raise_exception: {e}") from None
        except TemplateRenderError as e:
            raise TemplateRenderError(f"{self.name}: {e}") from None
        except TemplateError:
            raise
        except _TooBig as e:
            line = _template_lineno(e.__traceback__)
            where = f" (line {line})" if line else ""
            raise TemplateRenderError(f"{self.name}{where}: exceeded the output size limit: "
                                      f"{e}") from None
        except Exception as e:  # noqa: BLE001 -- template code can raise anything
            line = _template_lineno(e.__traceback__)
            where = f" (line {line})" if line else ""
            raise TemplateRenderError(f"{self.name}{where}: {type(e).__name__}: {e}") \
                from None
        if continue_final_message:
            text = self._cut_at_tag(text, final)
        if extra.get("enable_thinking") is False and add_generation_prompt:
            text = insert_empty_think(text)
        return text

    def _render_limited(self, ctx) -> str:
        prev = getattr(_LIMIT, "chars", None)
        _LIMIT.chars = self.max_output_chars
        try:
            return _run_with_time_limit(lambda: self._template.render(**ctx),
                                        self.render_timeout)
        finally:
            if prev is None:
                del _LIMIT.chars
            else:
                _LIMIT.chars = prev

    def _tag_final(self, messages: list, field: bool | str) -> tuple[list, str]:
        """Mark the end of the final message's text with `_CONTINUE_TAG` (HF's way: the
        cut is made where the tag lands, so a template that trims or repeats the text
        elsewhere cannot move it). Returns the tagged copy and the final text."""
        if not messages:
            raise TemplateError("continue_final_message: there are no messages")
        field = field if isinstance(field, str) else "content"
        last = dict(messages[-1])
        final = last.get(field)
        if final is None:
            raise TemplateError(f"continue_final_message: the final message has no "
                                f"{field!r} to continue")
        fields = [field]
        if field in _REASONING_FIELDS:       # copied under each name: tag every copy
            fields = [f for f in _REASONING_FIELDS if last.get(f) == final]
        if not any(f in self.source for f in fields):
            raise TemplateError(f"{self.name}: continue_final_message: the template does not "
                                f"read {field!r}")
        if isinstance(final, (list, tuple)):
            blocks = [dict(b) if isinstance(b, Mapping) else b for b in final]
            for b in reversed(blocks):
                if isinstance(b, dict) and "text" in b:
                    final = b["text"]
                    b["text"] = f"{b['text']}{_CONTINUE_TAG}"
                    break
            else:
                raise TemplateError("continue_final_message: the final message has no text "
                                    "content")
            last[field] = blocks
        elif not isinstance(final, str):
            raise TemplateError(f"continue_final_message: the final message's {field!r} is "
                                f"not text")
        else:
            for f in fields:
                last[f] = last[f] + _CONTINUE_TAG
        if not isinstance(final, str):
            raise TemplateError("continue_final_message: the final message's text is not a "
                                "string")
        return messages[:-1] + [last], final

    def _cut_at_tag(self, text: str, final: str) -> str:
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise TemplateError(f"{self.name}: continue_final_message: the final message's "
                                "content does not appear in the rendered prompt")
        at = text.rindex(tag)
        if text.startswith(_CONTINUE_TAG, at):
            return text[:at]                 # the template kept the text as it was
        return text[:at].rstrip()            # it trimmed the text's trailing space

    def __repr__(self) -> str:
        kind = "ChatML fallback" if self.is_fallback else f"{len(self.source)} chars"
        return f"ChatTemplate({kind})"


def render_chatml(messages, add_generation_prompt: bool = True) -> str:
    """The ChatML fallback rendering of `messages`."""
    return ChatTemplate(None).render(messages, add_generation_prompt)
