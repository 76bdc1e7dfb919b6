"""reasoning_content (a thinking template's <think> block split off the reply) and the
Llama-3 / Mistral tool-call formats."""
from __future__ import annotations

import json
import os
import sys
import urllib.request

import pytest

import cortiq
from cortiq.text import reasoning
from cortiq.text import tool_calls as tc

sys.path.insert(0, os.path.dirname(__file__))
from test_server import ServerThread

from cortiq.serve import create_app

DATA = os.path.join(os.path.dirname(__file__), "data")
CHAT = [{"role": "user", "content": "Plan, then answer."}]
THINK_GRAMMAR = 'start: "<think>\\nplan a\\n</think>\\n\\nDone"\n'

# Written for these tests in the shape of the Llama 3.1 and Mistral templates: what
# `detect_format` reads is their tool-call syntax.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if tools is not none and loop.last %}{{- 'Respond with a JSON object "
    "{\"name\": function name, \"parameters\": dictionary of arguments}.\\n' }}"
    "{%- for t in tools %}{{- t | tojson }}{%- endfor %}{%- endif %}"
    "{%- if message.tool_calls is defined %}{%- for c in message.tool_calls %}"
    "{{- '<|python_tag|>{\"name\": \"' + c.function.name + '\", \"parameters\": ' }}"
    "{{- c.function.arguments | tojson }}{{- '}' }}{%- endfor %}"
    "{%- else %}{{- message['content'] }}{%- endif %}{{- '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if tools is not none and loop.last %}{{- '[AVAILABLE_TOOLS]' + tools | tojson "
    "+ '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- elif message.tool_calls is defined %}{{- '[TOOL_CALLS]' }}"
    "{%- for c in message.tool_calls %}{{- c.function.name + '[ARGS]' }}"
    "{{- c.function.arguments | tojson }}{%- endfor %}{{- eos_token }}"
    "{%- else %}{{- message['content'] + eos_token }}{%- endif %}{%- endfor %}")


def _template(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


def _calls(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def _streamed(stream_cls, text, size, *args):
    """Feed `text` in pieces of `size` characters; the joined outputs and finish()."""
    s = stream_cls(*args)
    outs = [s.feed(text[i:i + size]) for i in range(0, len(text), size)]
    return outs, s.finish()


# ---------------------------------------------------------------- reasoning split

def test_template_detection():
    assert reasoning.template_thinks(_template("qwen3_chat_template.jinja"))
    assert reasoning.template_thinks(_template("nanbeige42_chat_template.jinja"))
    assert not reasoning.template_thinks(LLAMA3_TEMPLATE)
    assert not reasoning.template_thinks(None)
    assert reasoning.prompt_opens_think("<|im_start|>assistant\n<think>\n")
    assert not reasoning.prompt_opens_think("assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("text,in_think,want", [
    ("<think>\nstep 1\nstep 2\n</think>\n\nThe answer.", False, ("step 1\nstep 2", "The answer.")),
    ("  <think>x</think>y", False, ("x", "y")),
    ("step 1\n</think>\n\nThe answer.", True, ("step 1", "The answer.")),
    ("cut off mid-thought", True, ("cut off mid-thought", "")),
    ("Plain answer with a <think> inside", False, (None, "Plain answer with a <think> inside")),
    ("<thin>not a tag", False, (None, "<thin>not a tag")),
])
def test_split_whole(text, in_think, want):
    assert reasoning.split(text, in_think) == want


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 1000])
@pytest.mark.parametrize("text,in_think", [
    ("<think>\nstep 1 </thin\nstep 2\n</think>\n\nThe answer.", False),
    ("\n<think>a</think>b", False),
    ("step 1\n</think>\n\nThe answer.", True),
    ("no block here </think>", False),
])
def test_split_streamed_matches_whole_across_split_tags(text, in_think, size):
    outs, (r_end, c_end) = _streamed(reasoning.ReasoningStream, text, size, in_think)
    thought = "".join(r for r, _ in outs) + r_end
    content = "".join(c for _, c in outs) + c_end
    want_thought, want_content = reasoning.split(text, in_think)
    assert (thought, content) == (want_thought or "", want_content)
    assert not any("<think>" in r or "</think>" in r for r, _ in outs)


def test_chat_completion_reasoning_content_whole_and_streamed():
    m = cortiq.LLM(chat_template=_template("qwen3_chat_template.jinja"), seed=2)
    try:
        r = m.create_chat_completion(CHAT, grammar=THINK_GRAMMAR, max_tokens=40, seed=1)
        msg = r["choices"][0]["message"]
        assert msg == {"role": "assistant", "content": "Done", "reasoning_content": "plan a"}
        deltas = [c["choices"][0]["delta"] for c in m.create_chat_completion(
            CHAT, grammar=THINK_GRAMMAR, max_tokens=40, seed=1, stream=True)]
        thought = "".join(d.get("reasoning_content") or "" for d in deltas)
        content = "".join(d.get("content") or "" for d in deltas)
        assert (thought, content) == ("plan a", "Done")
        # the tags are spread over several tokens; none leaks into either field
        assert sum(1 for d in deltas if d.get("reasoning_content")) > 1
    finally:
        m.close()


def test_template_that_opens_the_block_in_the_prompt():
    """Nanbeige's template ends the prompt with <think>: an unclosed reply is all
    reasoning, streamed the same."""
    m = cortiq.LLM(chat_template=_template("nanbeige42_chat_template.jinja"), seed=2)
    try:
        r = m.create_chat_completion(CHAT, max_tokens=6, seed=3)
        msg = r["choices"][0]["message"]
        assert "</think>" not in msg["reasoning_content"]
        assert msg["content"] == "" and msg["reasoning_content"]
        deltas = [c["choices"][0]["delta"] for c in m.create_chat_completion(
            CHAT, max_tokens=6, seed=3, stream=True)]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) \
            == msg["reasoning_content"]
        assert not any(d.get("content") for d in deltas)
        with ServerThread(create_app(m)) as s:
            req = urllib.request.Request(
                s.url + "/v1/chat/completions", method="POST",
                headers={"Content-Type": "application/json"},
                data=json.dumps({"model": m.model_name, "messages": CHAT, "max_tokens": 6,
                                 "seed": 3}).encode())
            with urllib.request.urlopen(req, timeout=60) as resp:
                body = json.loads(resp.read())
        assert body["choices"][0]["message"]["reasoning_content"] == msg["reasoning_content"]
    finally:
        m.close()


def test_template_without_thinking_is_unchanged():
    m = cortiq.LLM(chat_template=LLAMA3_TEMPLATE, seed=2)
    try:
        r = m.create_chat_completion(CHAT, grammar=THINK_GRAMMAR, max_tokens=40, seed=1)
        msg = r["choices"][0]["message"]
        assert msg == {"role": "assistant", "content": "<think>\nplan a\n</think>\n\nDone"}
        deltas = [c["choices"][0]["delta"] for c in m.create_chat_completion(
            CHAT, grammar=THINK_GRAMMAR, max_tokens=40, seed=1, stream=True)]
        assert not any("reasoning_content" in d for d in deltas)
        assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
    finally:
        m.close()


# ---------------------------------------------------------------- tool-call formats

def test_formats_detected_from_their_templates():
    assert tc.detect_format(LLAMA3_TEMPLATE) == "llama3"
    assert tc.detect_format(MISTRAL_TEMPLATE) == "mistral"
    assert tc.detect_format(_template("qwen3_chat_template.jinja")) == "hermes"
    assert tc.detect_format(_template("nanbeige42_chat_template.jinja")) == "xml"


@pytest.mark.parametrize("text,content", [
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
    ('\n{"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
    (('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '{"name": "add", "parameters": {"a": 1, "b": 2}}'), ""),
])
def test_llama3_calls(text, content):
    got_content, calls = tc.parse(text, "llama3")
    assert got_content == content
    want = [("get_weather", {"city": "Paris"})]
    if "add" in text:
        want.append(("add", {"a": 1, "b": 2}))
    assert _calls(calls) == want


@pytest.mark.parametrize("text", [
    ('Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "add", "arguments": {"a": 1, "b": 2}}]'),
    'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
])
def test_mistral_calls(text):
    content, calls = tc.parse(text, "mistral")
    assert content == "Sure."
    assert _calls(calls) == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("fmt,text", [
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": '),
    ("llama3", '{"name": "get_weather", "parameters": {}} and then some words'),
    ("llama3", 'Use {"name": "get_weather"} later'),
    ("llama3", '{"parameters": {"city": "Paris"}}'),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": '),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"'),
    ("mistral", '[TOOL_CALLS]get_weather{"city": "Paris"}'),
])
def test_malformed_calls_stay_content(fmt, text):
    assert tc.parse(text, fmt) == (text, [])
    outs, (rest, calls) = _streamed(tc.ToolCallStream, text, 3, fmt)
    assert "".join(outs) + rest == text and calls == []


@pytest.mark.parametrize("size", [1, 4, 1000])
@pytest.mark.parametrize("fmt,text,shown", [
    ("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', ""),
    ("llama3", '  {"name": "add", "parameters": {"a": 1, "b": 2}}', ""),
    ("mistral", 'Adding. [TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}', "Adding. "),
])
def test_streamed_calls_hold_back_the_call(fmt, text, shown, size):
    outs, (rest, calls) = _streamed(tc.ToolCallStream, text, size, fmt)
    assert "".join(outs) + rest == shown
    assert _calls(calls) == [("add", {"a": 1, "b": 2})]


def test_llama3_content_with_braces_streams_through():
    outs, (rest, calls) = _streamed(tc.ToolCallStream, "Sets use {1, 2} here.", 2, "llama3")
    assert "".join(outs) == "Sets use {1, 2} here." and rest == "" and calls == []


@pytest.mark.parametrize("template", [LLAMA3_TEMPLATE, MISTRAL_TEMPLATE],
                         ids=["llama3", "mistral"])
def test_forced_call_through_create_chat_completion(template):
    """tool_choice="required" forces the Hermes form, which both families' parsers
    also read; the call then renders back through the family's template."""
    tools = [{"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {
            "a": {"enum": [1, 2]}, "b": {"enum": [3, 4]}}, "required": ["a", "b"],
            "additionalProperties": False}}}]
    m = cortiq.LLM(chat_template=template, seed=1)
    try:
        r = m.create_chat_completion(CHAT, tools=tools, tool_choice="required",
                                     parallel_tool_calls=False, max_tokens=80, seed=0)
        ch = r["choices"][0]
        assert ch["finish_reason"] == "tool_calls", ch
        (name, args), = _calls(ch["message"]["tool_calls"])
        assert name == "add" and set(args) == {"a", "b"}
        prompt = m.apply_chat_template(
            CHAT + [{"role": "assistant", "content": None,
                     "tool_calls": [{**ch["message"]["tool_calls"][0], "function": {
                         "name": "add", "arguments": args}}]}], tools=tools,
            add_generation_prompt=False)
        assert ("<|python_tag|>" if template is LLAMA3_TEMPLATE else "[TOOL_CALLS]add[ARGS]") \
            in prompt
    finally:
        m.close()
