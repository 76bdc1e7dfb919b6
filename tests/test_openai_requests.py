"""OpenAI request shapes through `cortiq.LLM` and the server: content given as text
parts, the `developer` role, and the sampling values a request that leaves fields out
gets (OpenAI's, or the model's generation_config)."""
import os
import sys

import pytest

import cortiq
from cortiq.errors import ConfigError
from cortiq.runtime.sampling import OPENAI_DEFAULTS, SamplingParams, request_defaults
from cortiq.text.chat import ChatTemplate, MessageContentError, openai_messages

sys.path.insert(0, os.path.dirname(__file__))
import optional
import toy_model as T

T.register()
PLAIN = [{"role": "user", "content": "What does sorted do?"}]
PARTS = [{"role": "user", "content": [{"type": "text", "text": "What does "},
                                      {"type": "text", "text": "sorted do?"}]}]


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("oai") / "toy.cmf"
    T.write_toy(p, max_pos=512)
    return str(p)


@pytest.fixture(scope="module")
def llm(toy_path):
    with cortiq.LLM(toy_path, seed=3) as m:
        yield m


def _recording(llm, monkeypatch) -> list:
    """Record the SamplingParams every generation of `llm` runs with."""
    seen: list = []
    real = llm._params

    def params(*a, **kw):
        p = real(*a, **kw)
        seen.append(p)
        return p
    monkeypatch.setattr(llm, "_params", params)
    return seen


# ---------------------------------------------------------------- content parts

def test_text_parts_render_as_the_plain_string():
    bundled = cortiq.LLM(os.path.join(os.path.dirname(cortiq.__file__), "data", "demo.cmf"))
    with bundled:
        assert bundled.chat_prompt_ids(PARTS) == bundled.chat_prompt_ids(PLAIN)
        r = bundled.create_chat_completion(PARTS, max_tokens=2, temperature=0)
        assert r["usage"]["prompt_tokens"] == len(bundled.chat_prompt_ids(PLAIN))


def test_parts_of_every_role_and_null_content_beside_tool_calls():
    t = ChatTemplate(None)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": [{"type": "text", "text": "4"},
                                         {"type": "text", "text": "2"}]}]
    out = openai_messages(msgs, t)
    assert [m.get("content") for m in out] == ["Be terse.", "hi", None, "42"]
    assert out[2]["tool_calls"] == [call]
    assert msgs[3]["content"][0] == {"type": "text", "text": "4"}      # not modified
    assert "<|im_start|>tool\n42<|im_end|>" in t.render(out)


@pytest.mark.parametrize("content,param,match", [
    ([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}],
     "messages[0].content[1]", "'image_url'"),
    ([{"type": "input_audio", "input_audio": {}}], "messages[0].content[0]", "'input_audio'"),
    ([{"text": "no type"}], "messages[0].content[0]", "'type'"),
    (["bare string"], "messages[0].content[0]", "'type'"),
    ([{"type": "text", "text": 5}], "messages[0].content[0].text", "expected a string"),
    ({"type": "text", "text": "x"}, "messages[0].content", "a list of text parts"),
])
def test_unsupported_or_malformed_parts_name_the_part(llm, content, param, match):
    with pytest.raises(MessageContentError, match=match) as e:
        llm.create_chat_completion([{"role": "user", "content": content}], max_tokens=1)
    assert e.value.param == param and isinstance(e.value, ConfigError)


# ---------------------------------------------------------------- developer role

def test_developer_role_is_system_unless_the_template_knows_it():
    msgs = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "hi"}]
    chatml = ChatTemplate(None)
    assert chatml.render(openai_messages(msgs, chatml)) == chatml.render(
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}])
    knows = ChatTemplate("{% for m in messages %}{% if m.role == 'developer' %}D:"
                         "{% endif %}{{ m.content }}|{% endfor %}")
    assert knows.render(openai_messages(msgs, knows)) == "D:Be terse.|hi|"


def test_developer_role_through_the_llm(llm):
    dev = [{"role": "developer", "content": "Be terse."}, *PLAIN]
    sys_ = [{"role": "system", "content": "Be terse."}, *PLAIN]
    assert llm.chat_prompt_ids(dev) == llm.chat_prompt_ids(sys_)


# ---------------------------------------------------------------- sampling defaults

def test_openai_defaults_for_left_out_fields(llm, monkeypatch):
    seen = _recording(llm, monkeypatch)
    llm.create_chat_completion(PLAIN, max_tokens=1)
    llm.create_completion("x", max_tokens=1, top_k=5)
    llm.generate("x", max_tokens=1)
    chat, completion, low_level = seen
    assert chat == SamplingParams(seed=3, **OPENAI_DEFAULTS)
    assert completion == SamplingParams(seed=3, **{**OPENAI_DEFAULTS, "top_k": 5})
    assert low_level == SamplingParams(seed=3)            # generate keeps its own defaults
    assert low_level.temperature == 0.7
    given = SamplingParams(temperature=0.2)               # an explicit base is used as is
    llm.create_chat_completion(PLAIN, max_tokens=1, sampling=given)
    assert seen[-1] == given


def test_model_generation_defaults_override_openai(tmp_path, monkeypatch):
    p = tmp_path / "gen.cmf"
    T.write_toy(p, max_pos=512, generation_defaults={"temperature": 0.6, "top_p": 0.95,
                                                     "top_k": 20, "do_sample": True})
    with cortiq.LLM(str(p), seed=1) as m:
        seen = _recording(m, monkeypatch)
        m.create_chat_completion(PLAIN, max_tokens=1)
        m.create_chat_completion(PLAIN, max_tokens=1, temperature=0.0)
    want = {**OPENAI_DEFAULTS, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert seen[0] == SamplingParams(seed=1, **want)
    assert seen[1] == SamplingParams(seed=1, **{**want, "temperature": 0.0})


def test_bad_generation_defaults_are_named():
    assert request_defaults(None) == dict(OPENAI_DEFAULTS)
    with pytest.raises(ConfigError, match="generation_defaults: SamplingParams.top_p"):
        request_defaults({"top_p": 3})
    with pytest.raises(ConfigError, match="expected a JSON object"):
        request_defaults([1])


def test_converter_keeps_generation_config_sampling_fields():
    from cortiq.convert.hf_dory import generation_defaults
    assert generation_defaults({"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                "do_sample": True, "eos_token_id": 2,
                                "repetition_penalty": True}) == \
        {"temperature": 0.7, "top_p": 0.8, "top_k": 20}


# ---------------------------------------------------------------- the server

@pytest.fixture(scope="module")
def client(llm):
    optional.need("extras", "starlette", "httpx")
    from starlette.testclient import TestClient
    from cortiq.serve import create_app
    with TestClient(create_app(llm)) as c:
        yield c


def test_server_parts_and_developer_equal_plain(client, llm):
    a = client.post("/v1/chat/completions", json={"messages": PARTS, "max_tokens": 1})
    b = client.post("/v1/chat/completions", json={"messages": PLAIN, "max_tokens": 1})
    assert a.status_code == b.status_code == 200, a.text
    assert a.json()["usage"]["prompt_tokens"] == b.json()["usage"]["prompt_tokens"] == \
        len(llm.chat_prompt_ids(PLAIN))
    d = client.post("/v1/chat/completions", json={
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "Hi."}]},
                     *PLAIN], "max_tokens": 1})
    assert d.status_code == 200, d.text
    assert d.json()["usage"]["prompt_tokens"] == len(llm.chat_prompt_ids(
        [{"role": "system", "content": "Hi."}, *PLAIN]))


def test_server_image_part_is_a_400_naming_it(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]})
    assert r.status_code == 400
    e = r.json()["error"]
    assert e["type"] == "invalid_request_error" and e["param"] == "messages[0].content[1]"
    assert e["code"] == "unsupported_content" and "image_url" in e["message"]


def test_server_left_out_fields_get_openai_defaults(client, llm, monkeypatch):
    seen = _recording(llm, monkeypatch)
    assert client.post("/v1/chat/completions",
                       json={"messages": PLAIN, "max_tokens": 1}).status_code == 200
    assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1,
                                                "temperature": 0.5}).status_code == 200
    assert seen[0] == SamplingParams(seed=3, **OPENAI_DEFAULTS)
    assert seen[1] == SamplingParams(seed=3, **{**OPENAI_DEFAULTS, "temperature": 0.5})


@pytest.mark.parametrize("own", [None, {"temperature": 0.4, "top_k": 7}])
def test_cli_samples_with_cortiqs_defaults_under_the_models_own(tmp_path, monkeypatch, own,
                                                                capsys):
    """`cortiq run` keeps SamplingParams' defaults (coherent text from small models), the
    file's generation defaults over them, a flag over both."""
    from cortiq.runtime.llm import LLM
    from cortiq.serve.cli import main
    path = tmp_path / "toy.cmf"
    T.write_toy(path, max_pos=512, generation_defaults=own)
    seen: list = []
    real = LLM._params

    def params(self, *a, **kw):
        p = real(self, *a, **kw)
        seen.append(p)
        return p
    monkeypatch.setattr(LLM, "_params", params)
    assert main(["run", str(path), "--prompt", "x", "-n", "1", "--raw"]) == 0
    assert main(["run", str(path), "--prompt", "x", "-n", "1", "--raw",
                 "--top-p", "0.5"]) == 0
    capsys.readouterr()
    want = SamplingParams(**(own or {}))
    assert seen[0].replace(seed=None) == want
    assert seen[1].replace(seed=None) == want.replace(top_p=0.5)


@pytest.mark.parametrize("route,body", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": PLAIN, "max_tokens": 1}),
])
def test_server_seed_minus_one_draws_fresh_entropy_as_the_python_api(client, llm, monkeypatch,
                                                                      route, body):
    seen = _recording(llm, monkeypatch)
    assert client.post(route, json=dict(body, seed=-1)).status_code == 200
    assert client.post(route, json=dict(body, seed=2**64 - 1)).status_code == 200
    assert seen[0].seed is None                      # -1: fresh entropy, not the LLM's 3
    assert seen[1].seed == 2**64 - 1
    r = client.post(route, json=dict(body, seed=-2))
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"


@pytest.mark.parametrize("route,prompt_field", [
    ("/v1/completions", {"prompt": [5] * 480}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * 240}]}),
])
def test_server_max_tokens_minus_one_or_null_runs_to_the_end_of_the_context(
        client, llm, route, prompt_field):
    never_end = {str(i): -100 for i in llm.tokenizer.eos_token_ids}
    body = dict(prompt_field, temperature=1.0, logit_bias=never_end)
    names = ["max_tokens"] + (["max_completion_tokens"] if "chat" in route else [])
    for name in names:
        for value in (-1, None):
            r = client.post(route, json=dict(body, **{name: value}))
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] + usage["completion_tokens"] == llm.n_ctx
            assert r.json()["choices"][0]["finish_reason"] == "length"
        r = client.post(route, json=dict(body, **{name: 0}))
        assert r.status_code == 400 and r.json()["error"]["param"] == name
    if route == "/v1/completions":                   # left out: OpenAI's 16
        assert client.post(route, json=body).json()["usage"]["completion_tokens"] == 16


def test_server_ignores_unknown_fields(client):
    r = client.post("/v1/chat/completions", json={"messages": PLAIN, "max_tokens": 1,
                                                  "vendor_extension": {"x": 1}})
    assert r.status_code == 200, r.text
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1,
                                             "not_openai": True})
    assert r.status_code == 200, r.text
