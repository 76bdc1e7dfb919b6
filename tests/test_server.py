"""cortiq serve: the OpenAI-compatible server, driven by the real `openai` client and by
raw HTTP (httpx) for the error cases, on 127.0.0.1 only.

uvicorn runs in-process in a thread on a socket bound to a free port; every server is
shut down by its fixture. Request counts are small and bounded; streams that should
stop are checked with deadlines. The model is the deterministic toy of
tests/toy_model.py, so every answer can be compared exactly with a direct
`cortiq.LLM` call.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import cortiq

if os.environ.get("CI"):            # CI installs [test]: a missing package is a failure
    import httpx
    import openai
    import starlette  # noqa: F401 -- the app itself needs it
    import uvicorn
else:
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    uvicorn = pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    openai = pytest.importorskip("openai")

from cortiq.server import create_app  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import toy_model as T  # noqa: E402

T.register()
HERE = os.path.dirname(os.path.abspath(__file__))
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cortiq.__file__)))
CHAT = [{"role": "user", "content": "hello world"}]


class ServerThread:
    def __init__(self, app):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(app, log_level="warning", lifespan="off",
                             timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("srv") / "toy.cmf"
    T.write_toy(p, max_pos=512)
    return str(p)


@pytest.fixture(scope="module")
def llm(toy_path):
    with cortiq.LLM(toy_path, seed=5) as m:
        yield m


@pytest.fixture(scope="module")
def server(llm):
    with ServerThread(create_app(llm, max_concurrency=2, max_queue=4,
                                 max_body_bytes=64 << 10)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                      timeout=30)
    yield c
    c.close()


# ---------------------------------------------------------------- the openai client

def test_models(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["toy"]


def test_completion_matches_the_library(client, llm):
    r = client.completions.create(model="toy", prompt="the quick brown", max_tokens=8,
                                  temperature=0, seed=1)
    ref = llm.create_completion("the quick brown", max_tokens=8, temperature=0, seed=1)
    assert r.choices[0].text == ref["choices"][0]["text"]
    assert r.choices[0].finish_reason == ref["choices"][0]["finish_reason"]
    assert r.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
    assert r.usage.completion_tokens == ref["usage"]["completion_tokens"]
    pieces = []
    for ch in client.completions.create(model="toy", prompt="the quick brown", max_tokens=8,
                                        temperature=0, seed=1, stream=True):
        pieces.append(ch.choices[0].text)
    assert "".join(pieces) == ref["choices"][0]["text"]


def test_chat_completion_and_stream_with_usage(client, llm):
    r = client.chat.completions.create(model="toy", messages=CHAT, max_tokens=10,
                                       temperature=0.8, seed=3, stop=["zzz"])
    ref = llm.create_chat_completion(CHAT, max_tokens=10, temperature=0.8, seed=3, stop=["zzz"])
    assert r.choices[0].message.content == ref["choices"][0]["message"]["content"]
    assert r.choices[0].message.role == "assistant"
    assert r.usage.total_tokens == ref["usage"]["total_tokens"]
    text, usage, finish = [], None, None
    stream = client.chat.completions.create(model="toy", messages=CHAT, max_tokens=10,
                                            temperature=0.8, seed=3, stream=True,
                                            stream_options={"include_usage": True})
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            text.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(text) == ref["choices"][0]["message"]["content"]
    assert finish == ref["choices"][0]["finish_reason"]
    assert usage.completion_tokens == ref["usage"]["completion_tokens"]


def test_openai_client_sees_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=CHAT)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="toy", messages=CHAT, temperature=3)
    assert "temperature" in str(e.value)


# ---------------------------------------------------------------- raw HTTP errors

def _post(server, path, body, raw=None, timeout=30):
    data = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(server.url + path, content=data,
                      headers={"content-type": "application/json"}, timeout=timeout)


def _is_openai_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if param is not None:
        assert e["param"] == param
    if code is not None:
        assert e["code"] == code
    return e


@pytest.mark.parametrize("path,body,status,param,code", [
    ("/v1/chat/completions", {"model": "nope", "messages": CHAT}, 404, "model", "model_not_found"),
    ("/v1/chat/completions", {"messages": CHAT, "temperature": -1}, 400, "temperature", None),
    ("/v1/chat/completions", {"messages": CHAT, "top_p": 1.5}, 400, "top_p", None),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 0}, 400, "max_tokens", None),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": "9"}, 400, "max_tokens", None),
    ("/v1/chat/completions", {"messages": CHAT, "n": 2}, 400, "n", None),
    ("/v1/chat/completions", {"messages": CHAT, "stop": ["a", "b", "c", "d", "e"]}, 400,
     "stop", None),
    ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"99999": 1}}, 400,
     "logit_bias", None),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "messages[0]", None),
    ("/v1/chat/completions", {"messages": CHAT, "stream": "yes"}, 400, "stream", None),
    ("/v1/completions", {"model": "toy"}, 400, "prompt", None),
    ("/v1/completions", {"prompt": {"a": 1}}, 400, "prompt", None),
    ("/v1/completions", {"prompt": [1, 2, 10 ** 6]}, 400, None, None),
    ("/v1/completions", {"prompt": "the quick brown fox " * 200}, 400, "prompt",
     "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * 600}]},
     400, "messages", "context_length_exceeded"),
    ("/v1/completions", [1, 2], 400, None, None),
])
def test_bad_requests(server, path, body, status, param, code):
    _is_openai_error(_post(server, path, body), status, param, code)


def test_invalid_json_oversize_method_and_path(server):
    _is_openai_error(_post(server, "/v1/chat/completions", None, raw=b"{not json"), 400,
                     code="invalid_json")
    _is_openai_error(_post(server, "/v1/completions", None, raw=b"\xff\xfe"), 400)
    big = json.dumps({"prompt": "x" * (70 << 10)}).encode()
    _is_openai_error(_post(server, "/v1/completions", None, raw=big), 413,
                     code="request_too_large")
    _is_openai_error(httpx.get(server.url + "/v1/completions", timeout=10), 405)
    _is_openai_error(httpx.get(server.url + "/v1/nothing", timeout=10), 404)
    assert httpx.get(server.url + "/healthz", timeout=10).json()["status"] == "ok"


# ---------------------------------------------------------------- queue, disconnect

def test_queue_full_is_429_and_disconnect_stops_generation(toy_path):
    with cortiq.cmf.open(toy_path) as cf:
        model = T.ToyModel(cf, delay=0.01, max_seq_len=4096)
        llm = cortiq.LLM.from_model(model, tokenizer=cf.tokenizer_json(),
                                    tokenizer_config=cf.tokenizer_config, name="toy")
    body = {"prompt": "the quick brown", "max_tokens": 2000, "stream": True,
            "temperature": 1.0, "logit_bias": {str(i): -100 for i in llm.tokenizer.eos_token_ids}}
    with ServerThread(create_app(llm, max_concurrency=1, max_queue=0)) as srv:
        with httpx.Client(timeout=30) as c:
            with c.stream("POST", srv.url + "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                lines = resp.iter_lines()
                first = next(ln for ln in lines if ln.startswith("data: "))
                assert json.loads(first[6:])["object"] == "text_completion"
                # The only slot is taken: the next request is refused, not queued.
                r = _post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 1})
                _is_openai_error(r, 429, code="queue_full")
                assert r.json()["error"]["type"] == "rate_limit_error"
            # Closed mid-stream (2000 tokens would take >= 20 s): generation stops.
        deadline = time.monotonic() + 5
        while httpx.get(srv.url + "/healthz", timeout=5).json()["running_or_queued"]:
            assert time.monotonic() < deadline, "generation did not stop after the disconnect"
            time.sleep(0.05)
        n = model.forward_tokens
        time.sleep(0.2)
        assert model.forward_tokens == n < 1000
        r = _post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2
        # A non-streaming client that gives up also stops its generation.
        with pytest.raises(httpx.ReadTimeout):
            _post(srv, "/v1/completions", dict(body, stream=False), timeout=0.3)
        deadline = time.monotonic() + 5
        while httpx.get(srv.url + "/healthz", timeout=5).json()["running_or_queued"]:
            assert time.monotonic() < deadline, "generation did not stop after the timeout"
            time.sleep(0.05)
        n = model.forward_tokens
        time.sleep(0.2)
        assert model.forward_tokens == n


def test_concurrent_requests_match_serial(server, llm):
    prompts = ["the quick brown", "hello world", "the lazy dog", "sliding window"]
    serial = [llm.create_completion(p, max_tokens=6, temperature=0.9, seed=2)["choices"][0]
              ["text"] for p in prompts]
    out = [None] * len(prompts)

    def go(i):
        r = _post(server, "/v1/completions", {"prompt": prompts[i], "max_tokens": 6,
                                              "temperature": 0.9, "seed": 2})
        out[i] = r.json()["choices"][0]["text"]

    ts = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert out == serial


# ---------------------------------------------------------------- the CLI, SIGTERM

def test_cli_serve_and_sigterm(toy_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import sys; sys.path.insert(0, {here!r}); import toy_model; "
            "toy_model.register(); from cortiq.cli import main; "
            "sys.exit(main(['serve', {path!r}, '--port', '{port}']))").format(
                here=HERE, path=toy_path, port=port)
    env = dict(os.environ, CORTIQ_TOY_DELAY="0.01")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=PKG_PARENT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.1)
        # A request in flight when SIGTERM arrives still completes.
        result = {}

        def call():
            result["r"] = httpx.post(url + "/v1/completions", timeout=20,
                                     json={"prompt": "hello", "max_tokens": 40,
                                           "temperature": 0})
        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.15)
        p.send_signal(signal.SIGTERM)
        t.join(20)
        assert result["r"].status_code == 200
        assert p.wait(timeout=20) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
