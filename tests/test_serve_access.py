"""cortiq serve's access and exposure: API keys (arguments, key file, CORTIQ_API_KEY),
CORS, served model names and aliases, /health and /ready, Prometheus /metrics, and the
`cortiq serve` flags that set them. In-process, through the real app (Starlette's
test client, and the `openai` client over it), on the bundled demo model."""
import json
import os
import sys

import pytest

import cortiq

sys.path.insert(0, os.path.dirname(__file__))
import optional

httpx, openai, _, prometheus_client = optional.need("extras", "httpx", "openai", "starlette",
                                                    "prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from cortiq.errors import ConfigError  # noqa: E402
from cortiq.kernels import _config  # noqa: E402
from cortiq.serve import create_app  # noqa: E402
from cortiq.serve import metrics as metrics_module  # noqa: E402
from cortiq.serve.auth import ApiKeys  # noqa: E402
from cortiq.serve.cli import build_parser, main  # noqa: E402
from cortiq.serve.commands import _access_options  # noqa: E402

KEY, OTHER_KEY = "sk-right-1", "sk-right-2"
ORIGIN = "https://app.example"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def llm():
    with cortiq.LLM(seed=1, n_ctx=128) as m:
        yield m


@pytest.fixture(autouse=True)
def no_env_key(monkeypatch):
    monkeypatch.delenv("CORTIQ_API_KEY", raising=False)


def _client(llm, **options):
    return TestClient(create_app(llm, **options))


def _bearer(key):
    return {"Authorization": f"Bearer {key}"}


def _refused_401(r):
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    assert err["message"]


# ---------------------------------------------------------------- API keys

def test_keys_refuse_missing_and_wrong_and_accept_each_right_one(llm):
    with _client(llm, api_keys=[KEY, OTHER_KEY]) as c:
        _refused_401(c.get("/v1/models"))
        _refused_401(c.post("/v1/chat/completions", json=CHAT))
        _refused_401(c.get("/v1/models", headers=_bearer("sk-wrong")))
        _refused_401(c.get("/v1/models", headers={"Authorization": f"Basic {KEY}"}))
        _refused_401(c.get("/v1/nothing"))               # every /v1/ path, even unknown ones
        for key in (KEY, OTHER_KEY):
            assert c.get("/v1/models", headers=_bearer(key)).status_code == 200
        r = c.post("/v1/chat/completions", json=CHAT, headers=_bearer(KEY))
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
        for open_path in ("/health", "/ready", "/healthz", "/metrics"):
            assert c.get(open_path).status_code == 200, open_path


def test_metrics_auth_protects_metrics_but_not_health(llm):
    with _client(llm, api_keys=[KEY], metrics_auth=True) as c:
        _refused_401(c.get("/metrics"))
        assert c.get("/metrics", headers=_bearer(KEY)).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/ready").status_code == 200


def test_no_keys_no_check(llm):
    with _client(llm, api_keys=[]) as c:
        assert c.get("/v1/models").status_code == 200


def test_env_key_applies_when_no_keys_are_given(llm, monkeypatch):
    monkeypatch.setenv("CORTIQ_API_KEY", f"{KEY}, {OTHER_KEY}")
    assert _config.api_keys_from_env() == [KEY, OTHER_KEY]
    with _client(llm) as c:
        _refused_401(c.get("/v1/models"))
        assert c.get("/v1/models", headers=_bearer(OTHER_KEY)).status_code == 200
    with _client(llm, api_keys=[]) as c:                 # an explicit empty list: none
        assert c.get("/v1/models").status_code == 200


def test_openai_client_with_and_without_the_key(llm):
    app = create_app(llm, api_keys=[KEY])
    with TestClient(app) as http:
        good = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=http,
                             max_retries=0)
        r = good.chat.completions.create(model=llm.model_name, **CHAT)
        assert r.usage.completion_tokens > 0
        bad = openai.OpenAI(base_url="http://testserver/v1", api_key="sk-wrong",
                            http_client=http, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.models.list()
        assert e.value.code == "invalid_api_key"


def test_bad_keys_are_refused_by_name():
    with pytest.raises(ConfigError, match="api key"):
        ApiKeys(["has space"])
    with pytest.raises(ConfigError, match="api key"):
        ApiKeys([""])
    assert not ApiKeys([]) and not ApiKeys([KEY]).accepts(None)


# ---------------------------------------------------------------- CORS

def test_cors_preflight_is_answered_without_a_key_and_responses_carry_the_origin(llm):
    with _client(llm, api_keys=[KEY], cors_origins=[ORIGIN]) as c:
        r = c.options("/v1/chat/completions", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        r = c.get("/v1/models", headers={"Origin": ORIGIN, **_bearer(KEY)})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
        r = c.get("/v1/models", headers={"Origin": ORIGIN})       # a refusal the page can read
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
        r = c.options("/v1/models", headers={"Origin": "https://evil.example",
                                             "Access-Control-Request-Method": "GET"})
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers


def test_cors_is_off_by_default_and_star_allows_any_origin(llm):
    with _client(llm) as c:
        r = c.get("/v1/models", headers={"Origin": ORIGIN})
        assert "access-control-allow-origin" not in r.headers
    with _client(llm, cors_origins=["*"], cors_methods=["GET"]) as c:
        r = c.get("/v1/models", headers={"Origin": ORIGIN})
        assert r.headers["access-control-allow-origin"] == "*"
        r = c.options("/v1/models", headers={"Origin": ORIGIN,
                                             "Access-Control-Request-Method": "POST"})
        assert r.status_code == 400                      # POST not among the allowed methods


# ---------------------------------------------------------------- names

def test_aliases_are_listed_and_accepted_and_other_names_are_404(llm):
    with _client(llm, model_name=["served-id", "alias-a", "alias-b"]) as c:
        ids = [m["id"] for m in c.get("/v1/models").json()["data"]]
        assert ids == ["served-id", "alias-a", "alias-b"]
        for name in ids:
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                                "model": name})
            assert r.status_code == 200, (name, r.text)
            assert r.json()["model"] == "served-id"     # responses name the served id
        with c.stream("POST", "/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                                      "stream": True, "model": "alias-a"}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        assert events and all(e["model"] == "served-id" for e in events)
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                            "model": llm.model_name})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert "served-id" in r.json()["error"]["message"]
        r = c.post("/v1/embeddings", json={"input": "hi", "model": "alias-b"})
        assert r.status_code == 200 and r.json()["model"] == "served-id"
    with pytest.raises(ConfigError, match="served model name"):
        create_app(llm, model_name=["ok", ""])


# ---------------------------------------------------------------- health

def test_health_and_ready_then_draining(llm):
    app = create_app(llm)
    with TestClient(app) as c:
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/ready").status_code == 200
        app.state.shutdown.closing = True               # what begin() marks first
        r = c.get("/ready")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "server_shutting_down" and err["type"] == "server_error"
        assert c.get("/health").status_code == 200      # alive while it drains
        assert c.get("/healthz").json()["status"] == "shutting_down"


# ---------------------------------------------------------------- metrics

def _samples(text):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_count_exactly_the_requests_and_tokens_sent(llm):
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    steps, rows = llm._scheduler.steps, llm._scheduler.rows    # the batching loop's own count
    with _client(llm) as c:
        for _ in range(2):
            r = c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3})
            assert r.status_code == 200
            for k in usage:
                usage[k] += r.json()["usage"][k]
        r = c.post("/v1/chat/completions", json={**CHAT, "stream": True,
                                                 "stream_options": {"include_usage": True}})
        assert r.status_code == 200
        chunks = [line for line in r.text.splitlines() if line.startswith("data: {")]
        last = json.loads(chunks[-1][len("data: "):])
        for k in usage:
            usage[k] += last["usage"][k]
        assert c.post("/v1/completions", json={"max_tokens": 3}).status_code == 400
        assert c.get("/nowhere").status_code == 404
        s = _samples(c.get("/metrics").text)
    assert s[("cortiq_requests_total", (("route", "/v1/completions"), ("status", "200")))] == 2
    assert s[("cortiq_requests_total", (("route", "/v1/completions"), ("status", "400")))] == 1
    assert s[("cortiq_requests_total",
              (("route", "/v1/chat/completions"), ("status", "200")))] == 1
    assert s[("cortiq_requests_total", (("route", "unmatched"), ("status", "404")))] == 1
    assert s[("cortiq_prompt_tokens_total", ())] == usage["prompt_tokens"] > 0
    assert s[("cortiq_completion_tokens_total", ())] == usage["completion_tokens"] > 0
    assert s[("cortiq_time_to_first_token_seconds_count", ())] == 1
    assert s[("cortiq_time_per_output_token_seconds_count", ())] >= 1
    assert s[("cortiq_requests_running", ())] == 0 and s[("cortiq_requests_queued", ())] == 0
    # every batched forward observed: one request each (the requests ran one at a time)
    steps, rows = llm._scheduler.steps - steps, llm._scheduler.rows - rows
    assert steps >= usage["completion_tokens"] - 3          # a forward per token but the last
    assert s[("cortiq_batch_requests_count", ())] == steps
    assert s[("cortiq_batch_requests_sum", ())] == steps
    assert s[("cortiq_batch_rows_count", ())] == steps
    assert s[("cortiq_batch_rows_sum", ())] == rows >= steps


def test_each_app_has_its_own_registry(llm):
    with _client(llm) as a, _client(llm) as b:
        a.get("/health")
        sa, sb = _samples(a.get("/metrics").text), _samples(b.get("/metrics").text)
    key = ("cortiq_requests_total", (("route", "/health"), ("status", "200")))
    assert sa[key] == 1 and key not in sb


def test_without_prometheus_client_metrics_answers_501_and_the_rest_serves(llm, monkeypatch):
    monkeypatch.setattr("cortiq.serve.app.prometheus_available", lambda: False)
    with _client(llm) as c:
        r = c.get("/metrics")
        assert r.status_code == 501
        assert "cortiq[serve]" in r.json()["error"]["message"]
        assert r.json()["error"]["message"] == metrics_module.MISSING_MESSAGE
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


# ---------------------------------------------------------------- the CLI flags

def _serve_args(*argv):
    return build_parser().parse_args(["serve", *argv])


def test_serve_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--api-key", "--api-key-file", "--metrics-auth", "--served-model-name",
                 "--cors-origins", "--cors-methods", "--cors-headers"):
        assert flag in out


def test_serve_flags_become_app_options(tmp_path, monkeypatch):
    keyfile = tmp_path / "keys"
    keyfile.write_text(f"# team keys\n{OTHER_KEY}\n\nsk-from-file\n")
    monkeypatch.setenv("CORTIQ_API_KEY", "sk-from-env")
    opts = _access_options(_serve_args(
        "--api-key", KEY, "--api-key-file", str(keyfile), "--metrics-auth",
        "--served-model-name", "a", "--served-model-name", "b",
        "--cors-origins", f"{ORIGIN},https://b.example", "--cors-origins", "*",
        "--cors-methods", "GET,POST,DELETE", "--cors-headers", "Authorization"))
    assert opts == {"api_keys": [KEY, OTHER_KEY, "sk-from-file", "sk-from-env"],
                    "metrics_auth": True, "model_name": ["a", "b"],
                    "cors_origins": [ORIGIN, "https://b.example", "*"],
                    "cors_methods": ["GET", "POST", "DELETE"],
                    "cors_headers": ["Authorization"]}


def test_key_file_keys_are_accepted(llm, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text(f"{OTHER_KEY}\n")
    opts = _access_options(_serve_args("--api-key-file", str(keyfile)))
    with _client(llm, **opts) as c:
        _refused_401(c.get("/v1/models", headers=_bearer(KEY)))
        assert c.get("/v1/models", headers=_bearer(OTHER_KEY)).status_code == 200


@pytest.mark.parametrize("argv,flag", [
    (["--api-key-file", "/nonexistent/keys"], "--api-key-file"),
    (["--cors-origins", "a,,b"], "--cors-origins"),
    (["--cors-methods", "GET"], "--cors-methods"),
    (["--served-model-name", " "], "--served-model-name"),
    (["--api-key", ""], "--api-key"),
])
def test_bad_serve_flags_name_the_flag(argv, flag, capsys):
    assert main(["serve", *argv]) == 1
    assert flag in capsys.readouterr().err
