"""Ray Serve vs plain `cortiq serve`: aggregate decode throughput of concurrent clients,
and what Serve's ingress adds to each request.

    python benchmarks/bench_ray.py [--model M.cmf] [--clients 8] [--tokens 48]
                                   [--requests 4] [--cpus 2] [--repeat 3] [--json]

Configurations, each measured on this machine in the same run:
  plain T=1   `cortiq serve --threads 1` (one process, its queue shared by all clients)
  plain T=n   `cortiq serve --threads <cpus>`
  ray   1x1   one replica of one thread behind Serve's proxy
  ray   nx1   <cpus> replicas of one thread each
Every client sends `--requests` greedy completions of `--tokens` tokens one after the
other; tok/s = completion tokens of all clients / wall time, the best of `--repeat`
rounds. The ingress overhead is
the median paired difference, through Serve minus direct (requests alternating between
the two), of GET /v1/models (no model work), of a 1-token completion and of the time
per token of one client's stream (every token is one chunk through Serve's proxy).
The plain servers run in a subprocess and Ray in a local instance of `--cpus` CPUs, so
the clients (threads of this process) do not share a GIL with the server.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

PROMPTS = ["def read_file(path):", "The os module", "Return a list of", "class Queue:",
           "import json", "Raise ValueError if", "The default is", "Open the file"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url, proc=None, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.communicate()[1]}")
        try:
            h = httpx.get(url + "/healthz", timeout=5)
            if h.status_code == 200 and h.json().get("status") == "ok":
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up")


def load(url, clients, requests, tokens, repeat):
    """Aggregate completion tok/s of `clients` threads, `requests` each: the best of
    `repeat` rounds (the machine may be shared)."""
    return max(_round(url, clients, requests, tokens) for _ in range(repeat))


def _round(url, clients, requests, tokens):
    counts = [0] * clients
    errors = []

    def client(i):
        with httpx.Client(timeout=600) as c:
            for k in range(requests):
                r = c.post(url + "/v1/completions", json={
                    "prompt": PROMPTS[(i + k) % len(PROMPTS)], "max_tokens": tokens,
                    "temperature": 0})
                if r.status_code != 200:
                    errors.append(r.text)
                    return
                counts[i] += r.json()["usage"]["completion_tokens"]
    # One warm-up request per server (first-touch of the mapped weights).
    httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=120)
    ts = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[0]}")
    return sum(counts) / dt


def _stream(c, url, tokens):
    """One streamed completion; returns its token count (every token is one chunk)."""
    got = 0
    with c.stream("POST", url + "/v1/completions", json={
            "prompt": PROMPTS[0], "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                u = json.loads(line[6:]).get("usage")
                got = u["completion_tokens"] if u else got
    return got


def paired_latency_ms(plain_url, ray_url, tokens, n=80):
    """Median ms per request, direct and through Serve, measured in alternation (so a
    busy spell of the machine hits both), and the median of the paired differences:
    GET /v1/models (no model work), a 1-token completion, and per token of a stream."""
    out = {}
    with httpx.Client(timeout=120) as c:
        probes = {
            "models": (lambda u: (c.get(u + "/v1/models"), 1)[1], n),
            "completion_1tok": (lambda u: (c.post(u + "/v1/completions", json={
                "prompt": "def f", "max_tokens": 1, "temperature": 0}), 1)[1], n),
            "stream_per_token": (lambda u: _stream(c, u, tokens), max(n // 8, 5)),
        }
        for key, (call, reps) in probes.items():
            call(plain_url), call(ray_url)                     # warm-up
            samples = {plain_url: [], ray_url: []}
            for _ in range(reps):
                for u in (plain_url, ray_url):
                    t0 = time.perf_counter()
                    k = call(u)
                    samples[u].append((time.perf_counter() - t0) * 1e3 / max(k, 1))
            d = [r - p for p, r in zip(samples[plain_url], samples[ray_url])]
            out[key] = {"plain": statistics.median(samples[plain_url]),
                        "ray": statistics.median(samples[ray_url]),
                        "overhead": statistics.median(d)}
    return out


def plain_server(model, threads, concurrency):
    port = _free_port()
    cmd = [sys.executable, "-m", "cortiq", "serve", *([model] if model else []),
           "--port", str(port), "--threads", str(threads), "--no-preload",
           "--max-concurrency", str(concurrency), "--max-queue", "64"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    _wait_up(url, p)
    return url, p


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="default: the bundled demo model")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="per client")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs given to Ray = max replicas")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per configuration (best)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    model = os.path.abspath(a.model) if a.model else None
    res = {"clients": a.clients, "requests_per_client": a.requests, "tokens": a.tokens,
           "cpus": a.cpus, "repeat": a.repeat, "tok_s": {}, "latency_ms": {}}

    servers = {t: plain_server(model, t, concurrency=a.cpus) for t in sorted({1, a.cpus})}
    try:
        for t, (url, _) in servers.items():
            res["tok_s"][f"plain T={t}"] = load(url, a.clients, a.requests, a.tokens, a.repeat)
        if a.cpus != 1:                   # plain T=1 stays up: Serve's latency is paired with it
            _, p = servers.pop(a.cpus)
            p.terminate()
            p.wait(30)
        plain_url = servers[1][0]

        import ray
        from ray import serve

        import cortiq.serve.ray as cray
        ray.init(num_cpus=a.cpus, include_dashboard=False, log_to_driver=False,
                 logging_level="warning")
        quiet = {"log_level": "WARNING", "enable_access_log": False}
        try:
            port = _free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=quiet)
            url = f"http://127.0.0.1:{port}"
            for replicas in sorted({1, a.cpus}):
                serve.run(cray.deployment(model, replicas=replicas, threads_per_replica=1,
                                          max_concurrency=a.cpus, max_queue=64),
                          name="cortiq", route_prefix="/", logging_config=quiet)
                _wait_up(url)
                res["tok_s"][f"ray {replicas}x1"] = load(url, a.clients, a.requests, a.tokens,
                                                         a.repeat)
                if replicas == 1:     # the plain T=1 server is still up: measure in pairs
                    res["latency_ms"] = paired_latency_ms(plain_url, url, a.tokens)
                serve.delete("cortiq")
        finally:
            serve.shutdown()
            ray.shutdown()
    finally:
        for _, p in servers.values():
            p.terminate()
            p.wait(30)
    if a.json:
        print(json.dumps(res))
        return 0
    print(f"{a.clients} clients x {a.requests} greedy completions of {a.tokens} tokens "
          f"(best of {a.repeat})")
    for k, v in res["tok_s"].items():
        print(f"  {k:<12} {v:8.1f} tok/s")
    base = res["tok_s"]["plain T=1"]
    for k, v in res["tok_s"].items():
        if k.startswith("ray"):
            print(f"  {k} / plain T=1: x{v / base:.2f}")
    for k, v in res["latency_ms"].items():
        print(f"  median {k}: plain {v['plain']:.2f} ms, via Serve {v['ray']:.2f} ms, "
              f"paired difference {v['overhead']:+.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
