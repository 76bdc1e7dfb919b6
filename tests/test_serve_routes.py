"""cortiq.serve's wiring: every route module's handler is mounted by `create_app` and
answers through it (success, and its refusals in OpenAI's error shape), the router's
own 404 / 405 come in that shape too, and the package's short paths (`cortiq.server`,
`cortiq.ray`) name the same objects. In-process (Starlette's test client), on the bundled
demo model (the toy of tests/toy_model.py has no hidden states to embed)."""
import os
import subprocess
import sys

import pytest

import cortiq

sys.path.insert(0, os.path.dirname(__file__))
import optional

optional.need("extras", "httpx", "starlette")

from starlette.testclient import TestClient  # noqa: E402

import cortiq.server  # noqa: E402
from cortiq.serve import app as app_module  # noqa: E402
from cortiq.serve import create_app  # noqa: E402

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cortiq.__file__)))

# One request per route that the route's handler answers 200, with a field of its answer
# only that handler writes, and one that the handler refuses (naming the field).
GOOD = {
    "/v1/models": (None, lambda r: r["data"][0]["id"] == "demo"),
    "/healthz": (None, lambda r: r["status"] == "ok" and r["running_or_queued"] == 0),
    "/health": (None, lambda r: r == {"status": "ok"}),
    "/ready": (None, lambda r: r["status"] == "ready"),
    "/metrics": (None, None),
    "/openapi.json": (None, lambda r: r["openapi"].startswith("3.")
                      and "/v1/chat/completions" in r["paths"]),
    "/v1/completions": ({"prompt": "hello", "max_tokens": 2},
                        lambda r: r["object"] == "text_completion"),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 2},
                             lambda r: r["object"] == "chat.completion"),
    "/v1/embeddings": ({"input": "hello"},
                       lambda r: r["object"] == "list" and len(r["data"][0]["embedding"]) > 0),
}
REFUSED = {
    "/v1/completions": ({"max_tokens": 2}, "prompt"),
    "/v1/chat/completions": ({"messages": []}, "messages"),
    "/v1/embeddings": ({"input": []}, "input"),
}


@pytest.fixture(scope="module")
def http():
    with cortiq.LLM(seed=1, n_ctx=128) as llm, TestClient(create_app(llm)) as c:
        yield c


def _openai_error(response, status, code=None, param=None):
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code and err["param"] == param
    return err


def test_every_route_of_the_table_is_tested():
    assert {path for path, _, _ in app_module.ROUTES} == set(GOOD)


@pytest.mark.parametrize("path,method,handler", app_module.ROUTES,
                         ids=[p for p, _, _ in app_module.ROUTES])
def test_each_route_module_answers_through_create_app(http, path, method, handler):
    body, answered = GOOD[path]
    r = http.request(method, path, json=body)
    assert r.status_code == 200, r.text
    if path == "/metrics":                 # Prometheus text, not JSON
        assert r.text.startswith("# HELP")
    else:
        assert answered(r.json())
    mounted = {route.path: route.endpoint.__name__ for route in http.app.routes}
    assert mounted[path] == handler.__name__


@pytest.mark.parametrize("path", sorted(REFUSED))
def test_each_route_module_refuses_in_openai_shape(http, path):
    body, param = REFUSED[path]
    err = _openai_error(http.post(path, json=body), 400, param=param)
    assert err["type"] == "invalid_request_error"


def test_unknown_path_and_wrong_method_in_openai_shape(http):
    err = _openai_error(http.get("/v1/nothing"), 404, code="not_found")
    assert err["message"] == "GET /v1/nothing: Not Found"
    err = _openai_error(http.get("/v1/completions"), 405, code="method_not_allowed")
    assert err["message"].startswith("GET /v1/completions: ")


def test_short_paths_name_the_package_objects():
    import cortiq.serve
    assert cortiq.server.create_app is cortiq.serve.create_app
    assert cortiq.server.serve is cortiq.serve.serve
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        cortiq.serve.nothing  # noqa: B018


def test_importing_the_package_needs_no_server_library():
    code = ("import sys, cortiq.serve, cortiq.server; "
            "sys.exit(int(any(m in sys.modules for m in ('starlette', 'uvicorn', 'ray'))))")
    assert subprocess.run([sys.executable, "-c", code], cwd=PKG_PARENT,
                          check=False).returncode == 0


def test_cortiq_ray_is_cortiq_serve_ray():
    optional.need("ray", "ray")
    import cortiq.ray
    import cortiq.serve.ray
    for name in cortiq.ray.__all__:
        assert getattr(cortiq.ray, name) is getattr(cortiq.serve.ray, name)
