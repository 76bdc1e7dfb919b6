"""logprobs, structured output, tool calls, embeddings, hooks and saved states: through
`cortiq.LLM` and through the real `openai` client against `cortiq serve` on 127.0.0.1.

The model is the bundled demo (a real Dory); every value that can be recomputed
independently is: logprobs against a NumPy log-softmax of the logits a plain session
gives for the same ids, embeddings against the model's hidden states pooled by hand,
JSON against its schema (`jsonschema`), tool-call arguments against the function's
parameters.
"""
from __future__ import annotations

import json
import os
import random
import sys

import numpy as np
import pytest

import cortiq
from cortiq.text import tool_calls as tc
from cortiq.errors import ConfigError
from cortiq.runtime.state import StateError

sys.path.insert(0, os.path.dirname(__file__))
import optional

jsonschema, openai, _, _ = optional.need("extras", "jsonschema", "openai", "llguidance",
                                         "starlette")
from test_server import ServerThread  # noqa: E402

from cortiq.serve import create_app  # noqa: E402

CHAT = [{"role": "user", "content": "Write a Python function."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["module", "class", "function"]},
        "size": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"enum": ["io", "net", "math"]}, "maxItems": 3},
        "owner": {"type": "object",
                  "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 50},
                                 "admin": {"type": "boolean"}},
                  "required": ["id", "admin"], "additionalProperties": False},
    },
    "required": ["name", "kind", "size", "tags", "owner"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 10},
                                      "unit": {"enum": ["c", "f"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add",
        "parameters": {"type": "object",
                       "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                      "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]
XML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}"
    "{% endfor %}</tools>\nCall as <tool_call>\n<function=NAME>\n<parameter=P>\nV\n"
    "</parameter>\n</function>\n</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>\n<function={{ c.function.name }}>\n"
    "{%- for k, v in c.function.arguments.items() %}<parameter={{ k }}>\n{{ v }}\n"
    "</parameter>\n{% endfor %}</function>\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HERMES_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'tool' %}<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- else %}{{ m.content or '' }}{% endif %}"
    "{%- for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}")


@pytest.fixture(scope="module")
def llm():
    # the default precision: a request repeated after its prompt was cached re-reads
    # its last prompt token alone, as a prompt row (int8 products for q8 under "auto"),
    # so repeated requests' logprobs agree (these tests compare them to 1e-4)
    with cortiq.LLM(seed=3) as m:
        yield m


@pytest.fixture(scope="module")
def client(llm):
    with ServerThread(create_app(llm, max_concurrency=2, max_queue=8)) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0,
                          timeout=60)
        yield c
        c.close()


def _np_log_softmax(row):
    z = np.asarray(row, np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def _reference_logprobs(llm, prompt_ids, out_ids):
    """Log-softmax rows of a plain session fed as generation feeds it: the prompt in
    one piece, then one token at a time (under precision "auto" a prompt chunk may
    take int8 products while decode steps stay exact, so the pieces matter)."""
    s = llm.session()
    rows = [s.feed(list(prompt_ids), want="last")]
    rows += [s.feed([t], want="last") for t in list(out_ids)[:-1]]
    return [_np_log_softmax(r[:llm.tokenizer.vocab_size]) for r in rows]


# ---------------------------------------------------------------- logprobs

def test_completion_logprobs_match_numpy(llm):
    prompt = "def read_file(path):"
    r = llm.create_completion(prompt, max_tokens=8, logprobs=4, temperature=0.8, seed=11)
    lp = r["choices"][0]["logprobs"]
    n = r["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n > 0
    ids = llm.tokenize(prompt)
    out = llm.tokenize(r["choices"][0]["text"], add_special_tokens=False)
    ref = _reference_logprobs(llm, ids, out[:n]) if len(out) == n else None
    gen_ids = [llm.tokenizer.token_to_id(t) for t in lp["tokens"]]
    ref = ref or _reference_logprobs(llm, ids, gen_ids)
    for i in range(n):
        assert len(lp["top_logprobs"][i]) <= 4
        top_vals = sorted(ref[i], reverse=True)[:4]
        assert np.allclose(sorted(lp["top_logprobs"][i].values(), reverse=True)[:len(
            lp["top_logprobs"][i])], top_vals[:len(lp["top_logprobs"][i])], atol=1e-4)
        assert lp["token_logprobs"][i] <= 0
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])


def test_chat_logprobs_exact_ids_and_stream(llm, client):
    kw = dict(max_tokens=10, temperature=0.9, seed=7, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(model=llm.model_name, messages=CHAT, **kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    # the same request in Python gives the ids; NumPy gives the reference
    py = llm.create_chat_completion(CHAT, **kw)
    assert py["choices"][0]["message"]["content"] == r.choices[0].message.content
    res_ids = llm.tokenize(py["choices"][0]["message"]["content"], add_special_tokens=False)
    prompt_ids = llm.chat_prompt_ids(CHAT)
    ref = _reference_logprobs(llm, prompt_ids, res_ids)
    if len(res_ids) == len(content):         # the text re-tokenizes to the same ids
        for e, row, t in zip(content, ref, res_ids):
            assert abs(e.logprob - row[t]) < 1e-4
    for e, row in zip(content, ref):
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert np.allclose(tops, np.sort(row)[::-1][:3], atol=1e-4)
        assert np.exp(tops).sum() <= 1 + 1e-6
    # streamed: the same tokens and logprobs, spread over the chunks
    streamed = []
    for ch in client.chat.completions.create(model=llm.model_name, messages=CHAT,
                                             stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs is not None:
            streamed += ch.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in content]
    assert np.allclose([e.logprob for e in streamed], [e.logprob for e in content], atol=1e-4)


def test_greedy_logprob_is_the_argmax(llm):
    r = llm.create_chat_completion(CHAT, max_tokens=6, temperature=0, logprobs=True,
                                   top_logprobs=1, repetition_penalty=1.0)
    for e in r["choices"][0]["logprobs"]["content"]:
        assert e["top_logprobs"][0]["logprob"] == pytest.approx(e["logprob"])


def test_echo_prompt_logprobs(llm, client):
    prompt = "import os\nimport sys"
    r = client.completions.create(model=llm.model_name, prompt=prompt, max_tokens=4,
                                  logprobs=2, echo=True, temperature=0)
    lp = r.choices[0].logprobs
    ids = llm.tokenize(prompt)
    assert r.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == len(ids) + r.usage.completion_tokens
    assert lp.token_logprobs[0] is None
    rows = llm.session().feed(ids, want="all")
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(
            _np_log_softmax(rows[i - 1][:llm.tokenizer.vocab_size])[ids[i]], abs=1e-4)


def test_logprobs_are_refused_out_of_range(llm):
    with pytest.raises(ConfigError, match="logprobs"):
        llm.create_completion("x", logprobs=21)
    with pytest.raises(ConfigError, match="top_logprobs"):
        llm.create_chat_completion(CHAT, top_logprobs=2)


# ---------------------------------------------------------------- structured output

def test_json_schema_always_valid_over_seeds(llm, client):
    rf = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA,
                                                 "strict": True}}
    for seed in range(10):
        r = client.chat.completions.create(model=llm.model_name, messages=CHAT,
                                           response_format=rf, seed=seed, temperature=1.2,
                                           max_tokens=300)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_json_object_and_streamed_schema(llm, client):
    r = client.chat.completions.create(model=llm.model_name, messages=CHAT, seed=1,
                                       response_format={"type": "json_object"},
                                       max_tokens=400, temperature=0.7)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:                                   # cut by the limit: still a prefix of an object
        assert r.choices[0].message.content.startswith("{")
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=llm.model_name, messages=CHAT, seed=4, stream=True, max_tokens=300,
        response_format={"type": "json_schema", "json_schema": {"name": "x",
                                                                "schema": SCHEMA}})
                   if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_grammar_argument(llm):
    gbnf = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'
    seen = set()
    for seed in range(8):
        out = llm.generate("Answer:", grammar=gbnf, seed=seed, temperature=1.0, max_tokens=20)
        word, num = out.split(" ")
        assert word in ("yes", "no") and num.isdigit() and len(num) <= 2
        seen.add(word)
    lark = 'start: "a" | "bb" | "ccc"'
    assert llm.generate("x", grammar=lark, seed=2) in ("a", "bb", "ccc")
    with pytest.raises(ConfigError, match="grammar"):
        llm.generate("x", grammar="root ::= (")


def test_unconstrained_output_is_not_json(llm):
    """The constraint bites: the same request without it does not give valid JSON."""
    r = llm.create_chat_completion(CHAT, seed=0, max_tokens=40, temperature=0.7)
    with pytest.raises((ValueError, jsonschema.ValidationError)):
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), SCHEMA)


# ---------------------------------------------------------------- tool calls

def _check_calls(calls, allowed=None):
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert calls
    for c in calls:
        name = c["function"]["name"] if isinstance(c, dict) else c.function.name
        args = c["function"]["arguments"] if isinstance(c, dict) else c.function.arguments
        assert name in (allowed or by_name)
        jsonschema.validate(json.loads(args), by_name[name])


def test_tool_choice_required_and_named_hermes(llm, client):
    for seed in range(4):
        r = client.chat.completions.create(model=llm.model_name, messages=CHAT, tools=TOOLS,
                                           tool_choice="required", parallel_tool_calls=False,
                                           seed=seed, max_tokens=120)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch.message
        assert len(ch.message.tool_calls) == 1
        _check_calls(ch.message.tool_calls)
    r = client.chat.completions.create(
        model=llm.model_name, messages=CHAT, tools=TOOLS, parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "add"}}, seed=5, max_tokens=120)
    _check_calls(r.choices[0].message.tool_calls, ["add"])
    # streamed: delta.tool_calls, no call text leaking into content
    calls, content = {}, ""
    for ch in client.chat.completions.create(model=llm.model_name, messages=CHAT,
                                             tools=TOOLS, tool_choice="required",
                                             parallel_tool_calls=False, seed=2, stream=True,
                                             max_tokens=120):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            calls.setdefault(t.index, {"function": {"name": "", "arguments": ""}})
            f = calls[t.index]["function"]
            f["name"] += t.function.name or ""
            f["arguments"] += t.function.arguments or ""
    assert "<tool_call>" not in content
    _check_calls(list(calls.values()))


DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def _template(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("template,family", [
    ("qwen3_chat_template.jinja", "hermes"), ("nanbeige42_chat_template.jinja", "xml")])
def test_shipped_template_families_through_the_server(template, family):
    """The real Qwen3 (Hermes-style) and Nanbeige (XML-style) templates: calls forced
    in the family's syntax come back as tool_calls, and the call plus a tool result
    render into the next prompt."""
    m = cortiq.LLM(chat_template=_template(template), seed=2)
    try:
        assert tc.detect_format(m.chat_template.source) == family
        with ServerThread(create_app(m)) as s:
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
            r = c.chat.completions.create(model=m.model_name, messages=CHAT, tools=TOOLS,
                                          tool_choice="required", parallel_tool_calls=False,
                                          seed=6, max_tokens=120)
            ch = r.choices[0]
            assert ch.finish_reason == "tool_calls", ch.message
            _check_calls(ch.message.tool_calls)
            call = ch.message.tool_calls[0]
            msgs = CHAT + [ch.message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
            r2 = c.chat.completions.create(model=m.model_name, messages=msgs, tools=TOOLS,
                                           max_tokens=4, seed=1)
            assert r2.usage.prompt_tokens > r.usage.prompt_tokens
            c.close()
        from cortiq.text.chat import parse_tool_call_arguments
        prompt = m.apply_chat_template(parse_tool_call_arguments(msgs), tools=TOOLS)
        assert "<tool_response>\nsunny\n</tool_response>" in prompt
        assert call.function.name in prompt.split("<|im_start|>assistant")[-2]
    finally:
        m.close()


def test_tool_calls_xml_family(llm):
    m = cortiq.LLM(chat_template=XML_TEMPLATE, seed=1)
    try:
        assert tc.detect_format(m.chat_template.source) == "xml"
        for seed in range(3):
            r = m.create_chat_completion(CHAT, tools=TOOLS, tool_choice="required",
                                         parallel_tool_calls=False, seed=seed, max_tokens=120)
            ch = r["choices"][0]
            assert ch["finish_reason"] == "tool_calls", ch
            assert "<function=" not in (ch["message"]["content"] or "")
            _check_calls(ch["message"]["tool_calls"])
        # the call goes back through the template, then the tool's answer
        call = ch["message"]["tool_calls"][0]
        msgs = CHAT + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": call["id"], "content": "42"}]
        prompt = m.apply_chat_template(
            [*msgs[:1], {**msgs[1], "tool_calls": [{**call, "function": {
                **call["function"], "arguments": json.loads(call["function"]["arguments"])}}]},
             msgs[2]], tools=TOOLS)
        assert f"<function={call['function']['name']}>" in prompt and "42" in prompt
    finally:
        m.close()


def test_tool_role_round_trip_through_the_server(client, llm):
    m = cortiq.LLM(chat_template=HERMES_TEMPLATE, seed=1)
    try:
        with ServerThread(create_app(m)) as s:
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
            r = c.chat.completions.create(model=m.model_name, messages=CHAT, tools=TOOLS,
                                          tool_choice="required", parallel_tool_calls=False,
                                          seed=3, max_tokens=120)
            call = r.choices[0].message.tool_calls[0]
            msgs = CHAT + [r.choices[0].message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
            r2 = c.chat.completions.create(model=m.model_name, messages=msgs, tools=TOOLS,
                                           max_tokens=5, seed=1)
            assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
            c.close()
        prompt = m.apply_chat_template(
            [*msgs[:1], {**msgs[1], "tool_calls": [{"type": "function", "function": {
                "name": call.function.name, "arguments": json.loads(call.function.arguments)}}]},
             msgs[2]])
        assert f'"name": "{call.function.name}"' in prompt
        assert "<tool_response>\nsunny\n</tool_response>" in prompt
    finally:
        m.close()


@pytest.mark.parametrize("fmt,text,want", [
    ("hermes", ('Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
                '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
                '"Oslo", "unit": "c"}}\n</tool_call>'),
     ("Sure.", [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo", "unit": "c"})])),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1,', (None, [])),
    ("xml", ("<tool_call>\n<function=add>\n<parameter=a>\n7\n</parameter>\n<parameter=b>\n8\n"
             "</parameter>\n</function>\n</tool_call>"), ("", [("add", {"a": 7, "b": 8})])),
    ("xml", ("<tool_call>\n<function=get_weather>\n<parameter=city>\n12\n</parameter>\n"
             "</function>\n</tool_call>"), ("", [("get_weather", {"city": "12"})])),
    ("deepseek", ("ok<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin"
                  "\uff5c>add<\uff5ctool\u2581sep\uff5c>{\"a\": 3, \"b\": 4}<\uff5ctool\u2581call"
                  "\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>"), ("ok", [("add", {"a": 3, "b": 4})])),
    ("deepseek", ("<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin"
                  "\uff5c>function<\uff5ctool\u2581sep\uff5c>add\n```json\n{\"a\": 5}\n```"
                  "<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>"), ("", [("add", {"a": 5})])),
])
def test_parse_families_and_stream_splits(fmt, text, want):
    content, calls = tc.parse(text, fmt, TOOLS)
    if want[0] is None:                     # unparseable: all content, no calls
        assert (content, calls) == (text, [])
        return
    assert content == want[0]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
        == want[1]
    rng = random.Random(len(text))
    for _ in range(5):                      # any split into pieces gives the same result
        st = tc.ToolCallStream(fmt, TOOLS)
        shown, i = "", 0
        while i < len(text):
            j = i + rng.randint(1, 7)
            shown += st.feed(text[i:j])
            i = j
        rest, got = st.finish()
        assert (shown + rest).strip() == want[0]
        assert [c["function"]["name"] for c in got] == [n for n, _ in want[1]]


def test_tool_requests_refused(llm):
    with pytest.raises(ConfigError, match="tool_choice"):
        llm.create_chat_completion(CHAT, tool_choice="required")
    with pytest.raises(ConfigError, match="no tool named"):
        llm.create_chat_completion(CHAT, tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "nope"}})
    with pytest.raises(ConfigError, match="tools"):
        llm.create_chat_completion(CHAT, tools=[{"type": "function", "function": {}}])


# ---------------------------------------------------------------- embeddings

def test_embeddings_shape_norm_determinism(llm, client):
    texts = ["def add(a, b):", "The quick brown fox", "import os"]
    r = client.embeddings.create(model=llm.model_name, input=texts)
    vecs = np.array([d.embedding for d in r.data])
    assert vecs.shape == (3, llm.model.hidden) and [d.index for d in r.data] == [0, 1, 2]
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)
    again = np.array([d.embedding for d in client.embeddings.create(
        model=llm.model_name, input=texts).data])
    assert np.array_equal(vecs, again)
    assert r.usage.prompt_tokens == sum(len(llm.tokenize(t)) for t in texts)
    b64 = client.embeddings.create(model=llm.model_name, input="import os",
                                   encoding_format="base64").data[0].embedding
    import base64
    assert np.allclose(np.frombuffer(base64.b64decode(b64), "<f4"), vecs[2], atol=1e-6)
    # independent: the model's own hidden states, pooled and normalised by hand
    for pooling in ("mean", "last"):
        e = llm.embed(texts, pooling=pooling)
        for t, v in zip(texts, e):
            h = llm.model.final_hidden(llm.model.new_state(), llm.tokenize(t))
            ref = h.mean(0) if pooling == "mean" else h[-1]
            assert np.allclose(v, ref / np.linalg.norm(ref), atol=1e-5)
    assert not np.allclose(llm.embed("a b c", "mean"), llm.embed("a b c", "last"))
    assert llm.embed("import os").shape == (llm.model.hidden,)
    with pytest.raises(ConfigError, match="pooling"):
        llm.embed("x", pooling="max")


def test_embedding_hidden_matches_the_logits(llm):
    """The hidden states are the head's input: the head applied to them gives the
    logits a session gives."""
    ids = llm.tokenize("class Foo(object):")
    h = llm.model.final_hidden(llm.model.new_state(), ids)
    logits = llm.session().feed(ids, want="all")
    m = llm.model
    head = m.head_w.matmat(h, prompt=True) * m.logit_scale
    assert np.allclose(head, logits, atol=1e-3)


# ---------------------------------------------------------------- hooks

def test_logits_processor_and_stopping_criteria(llm):
    banned = llm.tokenize(" the", add_special_tokens=False)[0]
    forced = llm.tokenize("x", add_special_tokens=False)[0]
    calls = []

    def ban(input_ids, scores):
        calls.append(len(input_ids))
        scores[banned] = -np.inf
        return scores

    def force(input_ids, scores):
        out = np.full_like(scores, -np.inf)
        out[forced] = 0
        return out
    out = llm.create_completion("the the the", max_tokens=12, temperature=1.5, seed=1,
                                logits_processor=[ban], logprobs=0)
    ids = [llm.tokenizer.token_to_id(t) for t in out["choices"][0]["logprobs"]["tokens"]]
    assert banned not in ids and calls == sorted(calls) and len(calls) >= 1
    assert llm.generate("abc", max_tokens=5, logits_processor=force) == "x" * 5
    seen = []
    r = llm.create_completion("abc", max_tokens=50, temperature=1.0, seed=2,
                              stopping_criteria=lambda ids, lg: (seen.append(len(ids)) or
                                                                 len(seen) == 3))
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(ConfigError, match="logits_processor"):
        llm.generate("x", logits_processor=5)


# ---------------------------------------------------------------- saved states

def test_save_and_load_state(llm, tmp_path):
    s = llm.session()
    ids = llm.tokenize("def parse(text):\n    ")
    s.prefill(ids[:5])
    s.feed(ids[5:], want="last")
    data = s.save_state()
    s2 = llm.load_state(data)
    assert s2.ids == s.ids and np.array_equal(s2.logits(), s.logits())
    a = llm.generate(ids + [11], session=s, max_tokens=6, temperature=0)
    b = llm.generate(ids + [11], session=s2, max_tokens=6, temperature=0)
    assert a == b
    with pytest.raises(StateError, match="truncated"):
        llm.load_state(data[:-1])
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x40
    with pytest.raises(StateError, match="damaged|checksum"):
        llm.load_state(bytes(bad))
    with pytest.raises(StateError, match="magic"):
        llm.load_state(b"X" * len(data))
    import toy_model as T
    T.register()
    T.write_toy(tmp_path / "toy.cmf")
    other = cortiq.LLM(str(tmp_path / "toy.cmf"))
    try:
        with pytest.raises(StateError, match="different model"):
            other.load_state(data)
    finally:
        other.close()


# ---------------------------------------------------------------- CLI

def test_cli_json_schema_logprobs_and_embed(tmp_path, capsys, monkeypatch):
    from cortiq.serve.cli import main
    schema_file = tmp_path / "s.json"
    schema_file.write_text(json.dumps(SCHEMA))
    assert main(["run", "-p", "Describe a module.", "--json-schema", str(schema_file),
                 "--seed", "5", "-n", "300"]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out), SCHEMA)
    assert main(["run", "-p", "def f", "--raw", "--greedy", "-n", "3", "--logprobs", "2"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(float(line.split("\t")[1]) <= 0 for line in err)
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "yes" | "no"')
    assert main(["run", "-p", "ok?", "--raw", "--grammar", str(g), "--seed", "1"]) == 0
    assert capsys.readouterr().out.strip() in ("yes", "no")
    assert main(["embed", "-t", "import os", "-t", "x = 1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and abs(np.linalg.norm(rows[0]) - 1) < 1e-4
    assert main(["run", "-p", "x", "--json-schema", str(tmp_path / "missing.json")]) == 1
    assert "missing.json" in capsys.readouterr().err


def test_without_llguidance_only_constraints_fail(llm, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)       # as if not installed
    monkeypatch.setitem(sys.modules, "llguidance.numpy", None)
    assert llm.generate("x", max_tokens=2, seed=1)             # everything else still runs
    assert llm.create_chat_completion(CHAT, max_tokens=2, logprobs=True)["choices"]
    for kw in ({"response_format": {"type": "json_schema", "json_schema": {
                "schema": {"type": "object", "properties": {"q": {"type": "null"}}}}}},
               {"tools": TOOLS, "tool_choice": "required"}):
        with pytest.raises(ConfigError, match=r"cortiq\[structured\]"):
            llm.create_chat_completion(CHAT, max_tokens=2, **kw)


def test_tool_choice_auto_parses_and_none_does_not(llm):
    """Real model output in call syntax (forced by the grammar): "auto" turns it into
    tool_calls, "none" leaves it as content."""
    forced = tc.required_grammar(TOOLS, "function:add", "hermes", parallel=False)
    r = llm.create_chat_completion(CHAT, tools=TOOLS, tool_choice="auto", grammar=forced,
                                   seed=4, max_tokens=80)
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
    _check_calls(ch["message"]["tool_calls"], ["add"])
    r = llm.create_chat_completion(CHAT, tools=TOOLS, tool_choice="none", grammar=forced,
                                   seed=4, max_tokens=80)
    ch = r["choices"][0]
    assert "tool_calls" not in ch["message"] and ch["finish_reason"] == "stop"
    assert ch["message"]["content"].startswith("<tool_call>\n")


def test_streamed_completion_logprobs(llm, client):
    kw = dict(prompt="import os\n", max_tokens=8, logprobs=2, temperature=0.8, seed=9)
    whole = client.completions.create(model=llm.model_name, **kw).choices[0].logprobs
    toks, lps = [], []
    for ch in client.completions.create(model=llm.model_name, stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs is not None:
            toks += ch.choices[0].logprobs.tokens
            lps += ch.choices[0].logprobs.token_logprobs
    assert toks == whole.tokens
    assert np.allclose(lps, whole.token_logprobs, atol=1e-4)


# ---------------------------------------------------------------- logprobs and stop strings

def _stops_inside(text, starts):
    """(cut, stop string) pairs: a 3-character stop string first found at `cut`, one
    starting inside a token's text and one at a token's first character (not the first
    token's: something must stay)."""
    found = {}
    for k in range(1, len(text) - 3):
        s = text[k:k + 3]
        if text.find(s) != k or not s.strip():
            continue
        found.setdefault(k in starts, (k, s))
    assert set(found) == {False, True}, text
    return list(found.values())


def _offsets(tokens):
    at, out = 0, []
    for t in tokens:
        out.append(at)
        at += len(t)
    return out


def test_logprobs_stop_where_a_stop_string_cuts_the_text(llm, client):
    """Logprobs cover exactly the tokens whose text is returned: a token the stop
    string cuts away entirely has none; one it cuts inside keeps its entry (part of
    its text is returned). Completions and chat, streamed and not, the Python API and
    the server, against the same greedy request without the stop string."""
    prompt = "def read_file(path):"
    kw = dict(max_tokens=24, temperature=0, logprobs=2)
    full = llm.create_completion(prompt, **kw)["choices"][0]
    lp = full["logprobs"]
    starts = _offsets(lp["tokens"])
    assert "".join(lp["tokens"]) == full["text"]
    ckw = dict(max_tokens=24, temperature=0, logprobs=True, top_logprobs=2)
    chat_full = llm.create_chat_completion(CHAT, **ckw)["choices"][0]
    chat_tokens = [e["token"] for e in chat_full["logprobs"]["content"]]
    chat_text = chat_full["message"]["content"]
    assert "".join(chat_tokens) == chat_text

    for cut, stop in _stops_inside(full["text"], starts):
        n = sum(s < cut for s in starts)
        want_tokens, want_lps = lp["tokens"][:n], lp["token_logprobs"][:n]
        r = llm.create_completion(prompt, stop=[stop], **kw)["choices"][0]
        assert r["text"] == full["text"][:cut] and r["finish_reason"] == "stop"
        assert r["logprobs"]["tokens"] == want_tokens
        assert r["logprobs"]["token_logprobs"] == pytest.approx(want_lps, abs=1e-5)
        toks = []
        for ch in llm.create_completion(prompt, stop=[stop], stream=True, **kw):
            toks += (ch["choices"][0]["logprobs"] or {}).get("tokens", [])
        assert toks == want_tokens
        s = client.completions.create(model=llm.model_name, prompt=prompt, stop=[stop], **kw)
        assert s.choices[0].text == r["text"] and s.choices[0].logprobs.tokens == want_tokens
        toks = []
        for ch in client.completions.create(model=llm.model_name, prompt=prompt,
                                            stop=[stop], stream=True, **kw):
            if ch.choices and ch.choices[0].logprobs is not None:
                toks += ch.choices[0].logprobs.tokens
        assert toks == want_tokens

    cstarts = _offsets(chat_tokens)
    for cut, stop in _stops_inside(chat_text, cstarts):
        want = chat_tokens[:sum(s < cut for s in cstarts)]
        r = llm.create_chat_completion(CHAT, stop=[stop], **ckw)["choices"][0]
        assert r["message"]["content"] == chat_text[:cut]
        assert [e["token"] for e in r["logprobs"]["content"]] == want
        got = []
        for ch in llm.create_chat_completion(CHAT, stop=[stop], stream=True, **ckw):
            got += [e["token"] for e in (ch["choices"][0]["logprobs"] or {}).get("content", [])]
        assert got == want
        s = client.chat.completions.create(model=llm.model_name, messages=CHAT, stop=[stop],
                                           **ckw)
        assert s.choices[0].message.content == chat_text[:cut]
        assert [e.token for e in s.choices[0].logprobs.content] == want
        got = []
        for ch in client.chat.completions.create(model=llm.model_name, messages=CHAT,
                                                 stop=[stop], stream=True, **ckw):
            if ch.choices and ch.choices[0].logprobs is not None:
                got += [e.token for e in ch.choices[0].logprobs.content]
        assert got == want
