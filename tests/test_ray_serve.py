"""cortiq on Ray Serve (cortiq.serve.ray, `cortiq serve --ray`) on a local Ray instance.

One Ray instance for the module (2 CPUs, no dashboard), shut down at its end. The
service under test is the real CLI: `cortiq serve --ray --replicas 2
--threads-per-replica 1` in a subprocess connected to that instance, serving the
bundled demo model (no path). The reference is the plain server (`create_app`, what
`cortiq serve` runs) over the same model in this process, also on one thread, so
greedy answers must match exactly. The tests run in file order: the service's SIGTERM
test stops the CLI and checks the deployment is gone; the last one then deploys a
damaged model through the CLI on the freed CPUs. Tests of single parts (the /healthz
merge, the health check, the model load, the options) need no cluster.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import cortiq

import optional

httpx, openai, uvicorn = optional.need("extras", "httpx", "openai", "uvicorn")
ray, serve = optional.need("ray", "ray", "ray.serve")

import cortiq.serve.ray as cray  # noqa: E402
from cortiq.serve.cli import main  # noqa: E402
from cortiq.demo import demo_path  # noqa: E402
from cortiq.serve import create_app  # noqa: E402


# Ray workers put the driver's working directory first on sys.path: run the drivers
# from the directory that holds the cortiq under test (a source checkout would
# otherwise shadow an installed wheel, or the reverse).
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cortiq.__file__)))
CHAT = [{"role": "user", "content": "What does os.path.join do?"}]
PROMPTS = ["def read_file(path):", "The os module", "Return a list of"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_address():
    here = os.getcwd()
    os.chdir(PKG_PARENT)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="warning")
    finally:
        os.chdir(here)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def service(ray_address):
    """The CLI's Ray Serve deployment: (url, process)."""
    port = _free_port()
    cmd = [sys.executable, "-c", "import sys; from cortiq.serve.cli import main; sys.exit(main())",
           "serve", "--ray", "--ray-address", ray_address, "--replicas", "2",
           "--threads-per-replica", "1", "--port", str(port)]
    p = subprocess.Popen(cmd, cwd=PKG_PARENT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline, "the Ray deployment did not come up"
            try:
                h = httpx.get(url + "/healthz", timeout=5)
                if h.status_code == 200 and h.json()["status"] == "ok":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        yield url, p
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class _PlainServer:
    """`create_app` under uvicorn in a thread of this process, on a free port."""

    def __init__(self, app):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the plain server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(20)
        self.sock.close()


@pytest.fixture(scope="module")
def plain():
    """`cortiq serve`'s app over the demo model, one kernel thread like each replica."""
    before = cortiq.get_num_threads()
    llm = cortiq.LLM(n_threads=1)
    try:
        with _PlainServer(create_app(llm)) as s:
            yield s.url
    finally:
        llm.close()
        cortiq.set_num_threads(before)


def _client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _complete(url, prompt, max_tokens=8, timeout=60):
    return httpx.post(url + "/v1/completions", timeout=timeout,
                      json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


# ---------------------------------------------------------------- same answers

def test_openai_client_gets_the_plain_servers_answers(service, plain):
    ray_c, ref_c = _client(service[0]), _client(plain)
    assert [m.id for m in ray_c.models.list().data] == [m.id for m in ref_c.models.list().data] \
        == ["demo"]
    for prompt in PROMPTS:
        a = ray_c.completions.create(model="demo", prompt=prompt, max_tokens=12, temperature=0)
        b = ref_c.completions.create(model="demo", prompt=prompt, max_tokens=12, temperature=0)
        assert a.choices[0].text == b.choices[0].text and a.choices[0].text
        assert a.usage.model_dump() == b.usage.model_dump()
    a = ray_c.chat.completions.create(model="demo", messages=CHAT, max_tokens=12, temperature=0)
    b = ref_c.chat.completions.create(model="demo", messages=CHAT, max_tokens=12, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].finish_reason == b.choices[0].finish_reason
    # Streaming through Serve's proxy: the same pieces, ending with the usage chunk.
    text, usage = [], None
    for ch in ray_c.chat.completions.create(model="demo", messages=CHAT, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}):
        usage = ch.usage or usage
        text += [c.delta.content or "" for c in ch.choices]
    assert "".join(text) == b.choices[0].message.content
    assert usage.completion_tokens == b.usage.completion_tokens


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/v1/chat/completions", {"model": "gpt-4", "messages": CHAT}),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "temperature": 3}),
    ("POST", "/v1/chat/completions", {"messages": []}),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}),
    ("POST", "/v1/completions", {"prompt": [1, 2, 10 ** 7]}),
    ("POST", "/v1/completions", {"prompt": "the os module " * 2000}),
    ("POST", "/v1/completions", b"{not json"),
    ("GET", "/v1/completions", None),
    ("GET", "/v1/nothing", None),
])
def test_bad_requests_get_the_plain_servers_4xx(service, plain, method, path, body):
    def go(url):
        raw = body if isinstance(body, bytes) else None if body is None else json.dumps(body)
        return httpx.request(method, url + path, content=raw, timeout=30,
                             headers={"content-type": "application/json"})
    a, b = go(service[0]), go(plain)
    assert 400 <= b.status_code < 500
    assert (a.status_code, a.json()) == (b.status_code, b.json())
    assert set(a.json()["error"]) == {"message", "type", "param", "code"}


# ---------------------------------------------------------------- replicas

def test_concurrent_requests_spread_over_both_replicas(service, plain):
    url = service[0]
    want = _complete(plain, PROMPTS[0]).json()["choices"][0]["text"]
    results = [None] * 16

    def go(i):
        results[i] = _complete(url, PROMPTS[0])
    threads = [threading.Thread(target=go, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r is not None and r.status_code == 200 for r in results), \
        [r and r.text for r in results]
    assert {r.json()["choices"][0]["text"] for r in results} == {want}
    served = {}
    for r in results:
        rid = r.headers[cray.REPLICA_HEADER]
        served[rid] = served.get(rid, 0) + 1
    assert len(served) == 2 and min(served.values()) >= 1, served


def test_healthz_aggregates_the_deployment(service):
    r = httpx.get(service[0] + "/healthz", timeout=30)
    h = r.json()
    assert r.status_code == 200 and h["status"] == "ok" and h["model"] == "demo"
    assert h["deployment_status"] == "HEALTHY"
    assert h["replicas"] == {"RUNNING": 2} and h["target"] == 2
    assert h["replica"] == r.headers[cray.REPLICA_HEADER]


def test_killed_replica_is_replaced_and_service_keeps_answering(service):
    url = service[0]
    before = {_complete(url, "x", 1).headers[cray.REPLICA_HEADER] for _ in range(8)}
    victim = min(before)
    log = []                         # (time, status, replica)
    stop = threading.Event()

    def client():
        while not stop.is_set():
            t = time.monotonic()
            try:
                r = _complete(url, PROMPTS[1], 4, timeout=30)
                log.append((t, r.status_code, r.headers.get(cray.REPLICA_HEADER)))
            except httpx.HTTPError as e:
                log.append((t, type(e).__name__, None))
    th = threading.Thread(target=client)
    th.start()
    try:
        time.sleep(0.5)
        killed_at = time.monotonic()
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        deadline = killed_at + 90
        while True:
            assert time.monotonic() < deadline, f"no replacement replica: {log[-5:]}"
            h = httpx.get(url + "/healthz", timeout=30).json()
            fresh = {rid for _, s, rid in log if s == 200 and rid and rid not in before}
            if fresh and h["replicas"] == {"RUNNING": 2}:
                break
            time.sleep(0.5)
        time.sleep(1.0)
    finally:
        stop.set()
        th.join(60)
    after = [e for e in log if e[0] > killed_at]
    ok_after = [e for e in after if e[1] == 200]
    # Only what was in flight on the victim may fail; the rest is answered, by the
    # surviving replica meanwhile and then by its replacement too.
    assert len(after) - len(ok_after) <= 2, after
    assert after[-3:] == ok_after[-3:] and len(ok_after) >= 3
    assert {rid for _, _, rid in ok_after} - before


def test_replica_that_cannot_load_reports_the_cmf_error(service, tmp_path):
    bad = tmp_path / "damaged.cmf"
    shutil.copy(demo_path(), bad)
    with open(bad, "r+b") as f:
        f.seek(0)
        f.write(b"XXXX")
    from cortiq.runtime.model_file import open_model_file
    with pytest.raises(cortiq.FormatError) as ref:    # what LLM's opening says of it
        open_model_file(str(bad))
    app = cray.deployment(bad, replicas=1, ray_actor_options={"num_cpus": 0})
    with pytest.raises(RuntimeError) as e:
        serve.run(app, name="damaged", route_prefix="/damaged")
    try:
        msg = cray.load_error(cray._failure_details("damaged", str(e.value)))
        assert msg.startswith("cortiq replica on ") and str(bad) in msg
        assert str(ref.value) in msg
        assert serve.status().applications["damaged"].deployments["CortiqReplica"] \
            .replica_states.get("RUNNING", 0) == 0
    finally:
        serve.delete("damaged")
    assert _complete(service[0], "x", 1).status_code == 200    # the others are unaffected


def test_replaced_model_file_gets_a_fresh_replica(service, tmp_path):
    path = tmp_path / "m.cmf"
    shutil.copy(demo_path(), path)
    app = cray.deployment(path, replicas=1, ray_actor_options={"num_cpus": 0},
                          deployment_options={"health_check_period_s": 1})
    serve.run(app, name="swap", route_prefix="/swap")
    url = service[0] + "/swap"
    try:
        first = _complete(url, "x", 1).headers[cray.REPLICA_HEADER]
        h = httpx.get(url + "/healthz", timeout=30).json()   # /healthz under a prefix
        assert h["replica"] == first and h["replicas"] == {"RUNNING": 1}
        new = tmp_path / "new.cmf"
        shutil.copy(demo_path(), new)
        os.replace(new, path)
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the replica was not replaced"
            try:
                r = _complete(url, "x", 1, timeout=10)
                if r.status_code == 200 and r.headers[cray.REPLICA_HEADER] != first:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    finally:
        serve.delete("swap")


def test_cli_refuses_bad_ray_options(capsys, tmp_path):
    assert main(["serve", "--ray", "--autoscale", "3:1"]) == 1
    assert "autoscale" in capsys.readouterr().err
    assert main(["serve", "--ray", "--autoscale", "x"]) == 1
    assert "MIN:MAX" in capsys.readouterr().err
    assert main(["serve", "--replicas", "2"]) == 1
    assert "--replicas needs --ray" in capsys.readouterr().err
    assert main(["serve", "--ray", "--threads", "1", "--threads-per-replica", "1"]) == 1
    capsys.readouterr()
    assert main(["serve", "--ray", "--threads-per-replica", "0"]) == 1
    assert "threads_per_replica" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--ray", "--replicas", "2", "--autoscale", "1:2"])
    capsys.readouterr()
    # Without --ray-address the model must be readable here: one line, before any Ray.
    assert main(["serve", str(tmp_path / "missing.cmf"), "--ray"]) == 1
    assert "missing.cmf" in capsys.readouterr().err


def test_deployment_options():
    auto = cray.deployment(None, autoscale="1:3", threads_per_replica=2, max_concurrency=3,
                           max_queue=1)
    with pytest.raises(cortiq.ConfigError):
        cray.deployment(None, replicas=2, autoscale=(1, 2))
    with pytest.raises(cortiq.ConfigError):
        cray.deployment(None, replicas=0)
    with pytest.raises(cortiq.ConfigError):
        cray.deployment(None, bogus=1)
    with pytest.raises(cortiq.ConfigError):
        cray.deployment(None, graceful_timeout=-1)
    assert cray.parse_autoscale("0:4") == (0, 4) and cray.parse_autoscale((2, 2)) == (2, 2)
    # The Serve config-file builder: args are deployment's keyword arguments.
    built = cray.build({"model": "m.cmf", "replicas": 3, "verify": True})
    assert built._bound_deployment._deployment_config.num_replicas == 3
    assert built._bound_deployment.init_args[0]["model"] == os.path.abspath("m.cmf")
    with pytest.raises(cortiq.ConfigError):
        cray.build({"model": "m.cmf", "replica": 3})
    cfg = auto._bound_deployment._deployment_config
    assert cfg.max_ongoing_requests == 4
    a = cfg.autoscaling_config
    assert (a.min_replicas, a.max_replicas, a.target_ongoing_requests) == (1, 3, 3)
    assert auto._bound_deployment.ray_actor_options["num_cpus"] == 2
    tuned = cray.deployment(None, deployment_options={"max_queued_requests": 5})
    assert tuned._bound_deployment._deployment_config.max_queued_requests == 5


class _FakeReplica:
    replica_id, host = "SERVE_REPLICA::cortiq#CortiqReplica#abc", "h1"

    def __init__(self, view):
        self.view = view

    def deployment_view(self):
        if isinstance(self.view, Exception):
            raise self.view
        return self.view


@pytest.mark.parametrize("view,status", [
    ({"deployment_status": "HEALTHY", "replicas": {"RUNNING": 2}, "message": "", "target": 2},
     "ok"),
    ({"deployment_status": "UPDATING", "replicas": {"RUNNING": 1, "STARTING": 1},
      "message": "", "target": 2}, "degraded"),
    ({"deployment_status": "UNHEALTHY", "replicas": {"RUNNING": 1},
      "message": "cortiq replica on h2: cannot load /m.cmf: FormatError: bad magic"},
     "degraded"),
    (ConnectionError("controller gone"), "degraded"),
])
def test_healthz_merges_the_replica_and_the_deployment_view(view, status):
    import asyncio
    llm = cortiq.LLM()
    try:
        app = cray._ReplicaApp(create_app(llm), _FakeReplica(view))

        async def go():                     # mounted under a route prefix, as Serve can
            t = httpx.ASGITransport(app=app, root_path="/m")
            async with httpx.AsyncClient(transport=t, base_url="http://x") as c:
                return await c.get("/m/healthz"), await c.get("/m/v1/models"), \
                    await c.get("/m/v1/nothing")
        h, models, missing = asyncio.run(go())
    finally:
        llm.close()
    body = h.json()
    assert h.status_code == 200 and body["status"] == status and body["model"] == "demo"
    assert body["replica"] == _FakeReplica.replica_id and body["host"] == "h1"
    assert body["running_or_queued"] == 0                   # the replica's own field, kept
    if isinstance(view, Exception):
        assert body["deployment_status"] == "UNKNOWN" and "controller gone" in body["message"]
    else:
        assert {k: body[k] for k in view} == view
    for r in (h, models, missing):                          # every answer names its replica
        assert r.headers[cray.REPLICA_HEADER] == _FakeReplica.replica_id
    assert models.json()["data"][0]["id"] == "demo"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_health_check_fails_when_the_model_file_changes(tmp_path):
    path = tmp_path / "m.cmf"
    shutil.copy(demo_path(), path)
    check = cray.CortiqReplica.func_or_class.check_health
    replica = type("R", (), {})()
    replica.llm = type("L", (), {"path": str(path)})()
    replica.identity = cray._file_identity(str(path))
    check(replica)                                           # unchanged: healthy
    new = tmp_path / "new.cmf"
    shutil.copy(demo_path(), new)
    os.replace(new, path)                                    # a new model, atomically
    with pytest.raises(cray.ReplicaLoadError, match="changed on disk"):
        check(replica)
    os.remove(path)
    with pytest.raises(cray.ReplicaLoadError, match="gone"):
        check(replica)


def test_open_model_verifies_and_names_host_path_and_error(tmp_path):
    flipped = tmp_path / "flipped.cmf"
    shutil.copy(demo_path(), flipped)
    n = os.path.getsize(flipped)
    with open(flipped, "r+b") as f:                          # one payload byte, header intact
        f.seek(n // 2)
        b = f.read(1)
        f.seek(n // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    with cortiq.cmf.open(str(flipped)) as cf:
        problems = cf.verify()
    assert problems
    with pytest.raises(cray.ReplicaLoadError) as e:          # the lazy check as it builds
        cray.open_model({"model": str(flipped)}, "h1")
    assert str(e.value).startswith(f"cortiq replica on h1: cannot load {flipped}: HashMismatch")
    with pytest.raises(cray.ReplicaLoadError) as e:          # every hash, before building
        cray.open_model({"model": str(flipped), "verify": True}, "h1")
    msg = str(e.value)
    assert msg.startswith(f"cortiq replica on h1: cannot load {flipped}: FormatError")
    assert problems[0] in msg
    with pytest.raises(cray.ReplicaLoadError, match="missing.cmf"):
        cray.open_model({"model": str(tmp_path / "missing.cmf")}, "h1")
    with cray.open_model({"verify": True, "n_ctx": 64}) as llm:      # the demo, verified
        assert llm.model_name == "demo" and llm.n_ctx == 64


def test_cortiq_itself_never_imports_ray():
    code = ("import sys, cortiq, cortiq.serve, cortiq.serve.cli; cortiq.serve.cli.build_parser(); "
            "sys.exit(int('ray' in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], cwd=PKG_PARENT, check=False).returncode == 0


def test_load_error_finds_the_replicas_line():
    msg = ("The deployment failed to start 3 times in a row. Error:\nTraceback ...\n"
           "cortiq.serve.ray.ReplicaLoadError: cortiq replica on h1: cannot load /m.cmf: "
           "FormatError: bad magic\n")
    assert cray.load_error(msg) == ("cortiq replica on h1: cannot load /m.cmf: "
                                    "FormatError: bad magic")
    assert cray.load_error("  something else \n") == "something else"


def test_sigterm_tears_the_deployment_down(service):
    url, p = service
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 0, p.communicate()[1]
    assert "serving on Ray Serve" in p.stderr.read()
    assert "cortiq" not in serve.status().applications
    with pytest.raises(httpx.HTTPError):
        r = httpx.get(url + "/healthz", timeout=5)
        r.raise_for_status()


def test_cli_reports_a_model_no_replica_can_load(ray_address, tmp_path):
    # After the service is gone its CPUs are free for this deployment's replica.
    bad = tmp_path / "truncated.cmf"
    with open(demo_path(), "rb") as f:
        bad.write_bytes(f.read()[:4096])
    with pytest.raises(cortiq.FormatError) as ref:
        cortiq.cmf.open(str(bad))
    cmd = [sys.executable, "-c", "import sys; from cortiq.serve.cli import main; sys.exit(main())",
           "serve", str(bad), "--ray", "--ray-address", ray_address, "--port",
           str(_free_port())]
    p = subprocess.run(cmd, cwd=PKG_PARENT, capture_output=True, text=True, timeout=150,
                       check=False)
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("cortiq: error: cortiq replica on ") and str(bad) in last
    assert str(ref.value) in last
    assert "cortiq" not in serve.status().applications
