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
the median latency of GET /v1/models (no model work) and of a 1-token completion,
through Serve minus direct, over sequential requests. The plain servers run in a
subprocess and Ray in a local instance of `--cpus` CPUs, so the clients (threads of
this process) do not share a GIL with the server.
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


def latency_ms(url, n=60):
    """Median ms of GET /v1/models and of a 1-token completion, sequential."""
    out = {}
    with httpx.Client(timeout=60) as c:
        for key, call in (("models", lambda: c.get(url + "/v1/models")),
                          ("completion_1tok", lambda: c.post(url + "/v1/completions", json={
                              "prompt": "def f", "max_tokens": 1, "temperature": 0}))):
            call()
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                r = call()
                ts.append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200, r.text
            out[key] = statistics.median(ts)
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

    for threads in sorted({1, a.cpus}):
        url, p = plain_server(model, threads, concurrency=a.cpus)
        try:
            res["tok_s"][f"plain T={threads}"] = load(url, a.clients, a.requests, a.tokens,
                                                      a.repeat)
            if threads == 1:
                res["latency_ms"]["plain"] = latency_ms(url)
        finally:
            p.terminate()
            p.wait(30)

    import ray
    from ray import serve

    import cortiq.ray as cray
    ray.init(num_cpus=a.cpus, include_dashboard=False, log_to_driver=False,
             logging_level="warning")
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port},
                    logging_config={"log_level": "WARNING", "enable_access_log": False})
        url = f"http://127.0.0.1:{port}"
        for replicas in sorted({1, a.cpus}):
            serve.run(cray.deployment(model, replicas=replicas, threads_per_replica=1,
                                      max_concurrency=a.cpus, max_queue=64),
                      name="cortiq", route_prefix="/",
                      logging_config={"log_level": "WARNING", "enable_access_log": False})
            _wait_up(url)
            res["tok_s"][f"ray {replicas}x1"] = load(url, a.clients, a.requests, a.tokens,
                                                     a.repeat)
            if replicas == 1:
                res["latency_ms"]["ray"] = latency_ms(url)
            serve.delete("cortiq")
    finally:
        serve.shutdown()
        ray.shutdown()
    pl, rl = res["latency_ms"]["plain"], res["latency_ms"]["ray"]
    res["ingress_overhead_ms"] = {k: rl[k] - pl[k] for k in pl}
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
    for k in pl:
        print(f"  median {k}: plain {pl[k]:.2f} ms, via Serve {rl[k]:.2f} ms "
              f"(+{res['ingress_overhead_ms'][k]:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
