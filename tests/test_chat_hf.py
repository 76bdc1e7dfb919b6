"""Every chat template cortiq ships or runs, rendered by cortiq and by transformers.

The templates: Qwen3 and Nanbeige-4.2 (tests/data/, the project's reference copies),
cortiq's ChatML fallback, the bundled demo model's, those the Llama-family, Dory and
DeepSeek-V4 conversion tests put into their checkpoints, and one written here whose
whitespace depends on trim_blocks/lstrip_blocks.

The reference is transformers' own `PreTrainedTokenizerFast.apply_chat_template(...,
tokenize=False)` on a tiny tokenizer that carries the template and the same special
tokens; the conversations are drawn by hypothesis (roles system/user/assistant/tool,
multi-turn, empty and unicode content, list-of-parts content, content None, reasoning
under each of its names, assistant tool calls, tools, add_generation_prompt,
continue_final_message, enable_thinking and the templates' own switches). The outputs
must be equal strings, and a conversation one side refuses the other must refuse too.

The documented differences from transformers, applied here to its output or kept out
of the drawn inputs:

* `enable_thinking=False` with a generation prompt puts an empty think block after the
  last assistant header when the template wrote no ``</think>`` (cortiq.text.chat's
  docstring, upstream cortiq's rule) -- the rule is re-applied below from that text;
* an empty conversation renders in cortiq (transformers refuses it), so none is drawn;
* cortiq's `bos_token`/`eos_token` are '' where the tokenizer has none (transformers
  leaves them undefined); every template here gets both tokens or only reads `eos_token`.
"""
import os

import jinja2
import pytest
from hypothesis import given
from hypothesis import strategies as st

import optional
from cortiq.text.chat import CHATML_TEMPLATE, ChatTemplate, TemplateRenderError
from cortiq.errors import TemplateError

transformers, tokenizers = optional.need("torch", "transformers", "tokenizers")

import cortiq.cmf  # noqa: E402
from cortiq.demo import demo_path  # noqa: E402
from cortiq.text.tokenizer import Tokenizer  # noqa: E402
from reference import hf_dsv4, hf_llama, hf_tiny  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")


def _read(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


def _demo():
    f = cortiq.cmf.open(demo_path())
    tok = Tokenizer.from_cmf(f)
    return f.tokenizer_config["chat_template"], tok.bos_token, tok.eos_token


DEMO_SRC, DEMO_BOS, DEMO_EOS = _demo()

# Written here, not shipped: plain `{% %}` tags on their own indented lines (whose
# whitespace only trim_blocks/lstrip_blocks remove) and the context variables HF
# always defines.
PLAIN_BLOCKS = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] == 'system' %}
[SYS] {{ message['content'] }}
    {% else %}
[{{ message['role'] | upper }}] {{ message['content'] }}{{ eos_token }}
    {% endif %}
{% endfor %}
{% if documents is defined and documents is none and tools is none %}
(no documents, no tools)
{% endif %}
{% if add_generation_prompt %}
[ASSISTANT]
{% endif %}"""

#: name -> (source, bos, eos, rich): `rich` templates take parts/None content, reasoning
#: fields and tool calls; the plain ChatML ones concatenate `content` as a string
#: (both renderers refuse anything else, which test_refusals_agree covers once).
TEMPLATES = {
    "qwen3": (_read("qwen3_chat_template.jinja"), "", "<|im_end|>", True),
    "nanbeige42": (_read("nanbeige42_chat_template.jinja"), "", "<|im_end|>", True),
    "chatml_fallback": (CHATML_TEMPLATE, "", "", True),
    "demo": (DEMO_SRC, DEMO_BOS, DEMO_EOS, False),
    "llama_family": (hf_llama.CHATML, "", "<|im_end|>", False),
    "dory_tiny": (hf_tiny.CHATML, "", "<|im_end|>", False),
    "deepseek_v4": (hf_dsv4.CHAT_TEMPLATE, "<s>", "</s>", True),
    "plain_blocks": (PLAIN_BLOCKS, "<s>", "</s>", False),
}

_HF: dict = {}


def hf_tokenizer(name):
    """A tokenizer that carries nothing but the template and the special tokens."""
    if name not in _HF:
        src, bos, eos, _ = TEMPLATES[name]
        specials = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v}
        vocab = {"<unk>": 0, **{t: i + 1 for i, t in enumerate(specials.values())}}
        model = tokenizers.models.WordLevel(vocab, unk_token="<unk>")
        _HF[name] = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizers.Tokenizer(model), chat_template=src, **specials)
    return _HF[name]


def ours(name):
    src, bos, eos, _ = TEMPLATES[name]
    return ChatTemplate(src, bos_token=bos, eos_token=eos)


_OURS = {name: ours(name) for name in TEMPLATES}


def test_the_demo_template_is_the_bundled_one():
    assert "<|im_start|>" in DEMO_SRC and DEMO_EOS == "<|im_end|>"
    assert cortiq.LLM().chat_template.source == DEMO_SRC


# ---------------------------------------------------------------- the documented rule

def empty_think_rule(text, add_generation_prompt, enable_thinking):
    """cortiq's documented addition: with thinking disabled and a generation prompt, an
    empty ``<think>\\n\\n</think>\\n\\n`` right after the last ``assistant\\n`` header,
    unless the text already has a ``</think>``."""
    if enable_thinking is not False or not add_generation_prompt or "</think>" in text:
        return text
    head = "assistant\n"
    i = text.rfind(head)
    if i < 0:
        return text
    cut = i + len(head)
    return text[:cut] + "<think>\n\n</think>\n\n" + text[cut:]


# ---------------------------------------------------------------- conversations

# Text that reaches the templates' branches (think blocks, tool responses, whitespace
# they trim) besides arbitrary unicode.
_SPECIAL_TEXT = ["", " ", "\n", "a\n\n", "  padded  ", "<think>\nwhy\n</think>\n\nbecause",
                 "</think>after", "<tool_response>\nx\n</tool_response>", "你好 🙂",
                 "d", "m", "<|im_end|>", "e\u0301t\u00e9", "{{ not jinja }}"]
TEXT = st.one_of(st.sampled_from(_SPECIAL_TEXT),
                 st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))
NAMES = st.sampled_from(["get_weather", "now", "search"])
JSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), TEXT,
                        st.floats(-10, 10, allow_nan=False).map(lambda x: round(x, 3)))
ARGS = st.dictionaries(st.sampled_from(["city", "unit", "q", "n", "城市"]),
                       st.one_of(JSON_SCALAR, st.lists(JSON_SCALAR, max_size=2)), max_size=3)

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather <city> — météo, 天气",
        "parameters": {"type": "object", "required": ["city"],
                       "properties": {"city": {"type": "string"},
                                      "unit": {"type": "string", "enum": ["c", "f"]}}}}},
    {"type": "function", "function": {"name": "now", "description": "Time",
                                      "parameters": {"type": "object", "properties": {}}}},
]


@st.composite
def tool_call(draw):
    name = draw(NAMES)
    args = draw(ARGS)
    if draw(st.booleans()):
        return {"type": "function", "function": {"name": name, "arguments": args}}
    return {"name": name, "arguments": args}          # the flat form some clients send


MISSING = object()           # a message without a "content" key


@st.composite
def content(draw, rich):
    if not rich:
        return draw(TEXT)
    kind = draw(st.sampled_from(["text", "text", "text", "parts", "none", "missing"]))
    if kind == "parts":
        return draw(st.lists(st.one_of(
            TEXT.map(lambda s: {"type": "text", "text": s}),
            st.just({"type": "image", "image": "x.png"})), min_size=1, max_size=3))
    if kind == "none":
        return None
    return MISSING if kind == "missing" else draw(TEXT)


@st.composite
def message(draw, role, rich):
    m = {"role": role}
    c = draw(content(rich))
    if c is not MISSING:
        m["content"] = c
    if rich and role == "assistant":
        if draw(st.booleans()):
            m[draw(st.sampled_from(["reasoning_content", "thinking", "reasoning"]))] = \
                draw(TEXT)
        if draw(st.integers(0, 2)) == 0:
            m["tool_calls"] = draw(st.lists(tool_call(), min_size=1, max_size=2))
    return m


@st.composite
def conversation(draw, rich):
    msgs = []
    if draw(st.booleans()):
        msgs.append(draw(message("system", rich)))
    roles = ["user", "assistant", "tool"] if rich else ["user", "assistant"]
    n = draw(st.integers(1, 5))
    for i in range(n):
        role = "user" if i == 0 else draw(st.sampled_from(roles))
        msgs.append(draw(message(role, rich)))
    return msgs


@st.composite
def case(draw):
    name = draw(st.sampled_from(sorted(TEMPLATES)))
    rich = TEMPLATES[name][3]
    msgs = draw(conversation(rich))
    kw = {}
    continue_final = draw(st.integers(0, 4)) == 0
    kw["add_generation_prompt"] = False if continue_final else draw(st.booleans())
    if continue_final:
        kw["continue_final_message"] = True
    if rich and draw(st.booleans()):
        kw["tools"] = draw(st.sampled_from([TOOLS, TOOLS[:1], []]))
    think = draw(st.sampled_from([None, True, False]))
    if think is not None:
        kw["enable_thinking"] = think
    if name == "nanbeige42":
        fmt = draw(st.sampled_from([None, "xml", "json"]))
        if fmt is not None:
            kw["tool_call_format"] = fmt
        if draw(st.booleans()):
            kw["preserve_thinking"] = draw(st.booleans())
    return name, msgs, kw


def hf_outcome(name, msgs, kw):
    """transformers' rendering plus cortiq's documented empty-think rule, or the kind of
    refusal: "template" for the template's own raise_exception, "fault" for a template
    that failed, "input" for a conversation transformers will not render."""
    try:
        text = hf_tokenizer(name).apply_chat_template(msgs, tokenize=False, **kw)
    except jinja2.TemplateError as e:
        if type(e) is jinja2.TemplateError:           # what raise_exception raises
            return "template", e
        return "fault", e
    except ValueError as e:                           # continue_final_message refusals
        return "input", e
    except Exception as e:  # noqa: BLE001 -- whatever the template's code raises
        return "fault", e
    return "ok", empty_think_rule(text, kw.get("add_generation_prompt"),
                                  kw.get("enable_thinking"))


def ours_outcome(name, msgs, kw):
    try:
        return "ok", _OURS[name].render(msgs, **kw)
    except TemplateRenderError as e:
        return "fault", e
    except TemplateError as e:
        return "refused", e


def check(name, msgs, kw):
    want = hf_outcome(name, msgs, kw)
    got = ours_outcome(name, msgs, kw)
    if want[0] == "ok":
        assert got == want, (name, msgs, kw, got[1])
    elif want[0] == "fault":
        assert got[0] == "fault", (name, msgs, kw, want[1], got)
    else:                       # the template or the option refused this conversation
        assert got[0] == "refused", (name, msgs, kw, want[1], got)


@given(case())
def test_templates_render_as_transformers_does(c):
    check(*c)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_each_template_agrees_on_a_full_conversation(name):
    """One fixed conversation per template and option set, so every template is
    compared whatever hypothesis draws."""
    rich = TEMPLATES[name][3]
    msgs = [{"role": "system", "content": "Be terse. 天气"},
            {"role": "user", "content": "Weather in Paris?"},
            # the OpenAI shape of a tool call: content null, reasoning as "reasoning"
            {"role": "assistant", "content": "Checking.",
             **({"content": None, "reasoning": "use the tool",
                 "tool_calls": [{"type": "function", "function": {
                     "name": "get_weather", "arguments": {"city": "Paris"}}}]}
                if rich else {})},
            {"role": "tool" if rich else "user", "content": "21 °C"},
            {"role": "assistant", "content": "21 °C in Paris  ",
             **({"thinking": "say it"} if rich else {})}]
    tried = 0
    for agp in (True, False):
        for think in (None, True, False):
            for tools in ((None, TOOLS) if rich else (None,)):
                kw = {"add_generation_prompt": agp}
                if think is not None:
                    kw["enable_thinking"] = think
                if tools is not None:
                    kw["tools"] = tools
                want = hf_outcome(name, msgs, kw)
                assert want[0] == "ok", want
                check(name, msgs, kw)
                tried += 1
    check(name, msgs, {"continue_final_message": True})
    assert tried >= 6


def test_refusals_agree():
    """Content that a plain ChatML template cannot concatenate, and a late system
    message Nanbeige rejects: both sides refuse, the same way."""
    for name in ("demo", "llama_family"):
        for bad in ([{"role": "user", "content": None}],
                    [{"role": "user", "content": [{"type": "text", "text": "x"}]}]):
            assert hf_outcome(name, bad, {})[0] == "fault"
            check(name, bad, {})
    late = [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}]
    assert hf_outcome("nanbeige42", late, {})[0] == "template"
    check("nanbeige42", late, {})
