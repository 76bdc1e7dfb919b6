"""Soak test of `cortiq serve`: many mixed requests from concurrent OpenAI clients against
a real server process, checking that nothing fails unexpectedly, that the process does
not grow (memory, file descriptors, threads) and that /metrics counts what the clients
saw.

    python benchmarks/bench_soak.py [--model M.cmf] [--requests 5000 | --quick]
                                    [--clients 8] [--json]

The server runs in a subprocess (`cortiq serve`, the bundled demo model by default), so
its /proc figures are its own. Every client is an `openai.OpenAI` (no retries, so each
request is one HTTP exchange) drawing requests from one shared sequence; the mix cycles
through chat and completions, streamed and not, `response_format` json_schema, tools,
logprobs, embeddings, streams the client closes after a few chunks, and invalid requests
that must get their documented 4xx (status, and `param` or `code`).

The run has three phases, after each of which the server is idle and sampled: warm-up
(the first 10 % of the requests), to 55 %, to the end. Checks (exit status 1 when any
fails):
  * no unexpected outcome (every valid request answered 200, every invalid one its 4xx);
  * RSS at the end at most `--rss-growth` (5 %) above the RSS after warm-up;
  * open file descriptors and threads at the end at most `--fd-slack` / `--thread-slack`
    above the warm-up sample (connections the clients reopen after a cancelled stream,
    worker threads started on demand);
  * /metrics: requests by route and status, prompt and completion tokens equal to the
    clients' own counts.
Latency (p50 / p99 time to first token and per token of the streamed generations) is
reported, not checked.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

SERVED = "soak"
CHAT = [{"role": "user", "content": "What does sorted do in Python?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "the weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
SCHEMA = {"name": "answer", "schema": {"type": "object", "properties": {
    "answer": {"type": "string"}}, "required": ["answer"]}}
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions")

# The request mix, in the order it cycles. Each kind sends one request and returns its
# outcome (see `Outcome`).
KINDS = ("chat", "chat_stream", "completion", "completion_stream", "json_schema", "tools",
         "logprobs", "embeddings", "cancelled_stream", "bad_temperature", "chat",
         "chat_stream", "unknown_model", "completion_stream", "empty_messages",
         "bad_json", "embeddings_dimensions", "over_context", "chat_stream", "completion")


class Outcome:
    """What one request gave: its route and status (as the server's metrics count
    them), its usage, stream timings, and whether it was what the kind expects."""

    def __init__(self, kind, route, status, ok, why="", usage=None, ttft=None, per_token=()):
        self.kind, self.route, self.status, self.ok, self.why = kind, route, status, ok, why
        self.usage = usage or {}
        self.ttft, self.per_token = ttft, list(per_token)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str | None, port: int, clients: int) -> subprocess.Popen:
    """`cortiq serve` in a subprocess, from the cortiq this script imports."""
    import cortiq
    pkg_parent = str(Path(cortiq.__file__).resolve().parents[1])
    args = ["serve"] + ([model] if model else []) + [
        "--port", str(port), "--served-model-name", SERVED,
        "--max-concurrency", str(clients), "--max-queue", str(clients)]
    code = f"import sys; from cortiq.serve.cli import main; sys.exit(main({args!r}))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [pkg_parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.Popen([sys.executable, "-c", code], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.communicate()[1]}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout:.0f} s")


def wait_idle(url: str, timeout: float = 60) -> None:
    """Until no request runs or waits (a closed stream ends within a token)."""
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/healthz", timeout=5).json()["running_or_queued"]:
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not become idle")
        time.sleep(0.05)
    time.sleep(0.2)         # the last responses' metrics are counted as they end


def process_sample(pid: int) -> dict:
    """RSS (bytes), open file descriptors and threads of process `pid`, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_bytes": int(fields["VmRSS"].split()[0]) * 1024,
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(fields["Threads"])}


# ---------------------------------------------------------------- the requests

def _stream(kind, route, chunks, close_after=None) -> Outcome:
    """Read a stream: time to first text, time between text chunks, the usage chunk."""
    t0 = time.perf_counter()
    times, usage, n = [], None, 0
    try:
        for c in chunks:
            n += 1
            if getattr(c, "usage", None) is not None:
                usage = c.usage.model_dump()
            for ch in c.choices:
                text = getattr(ch, "text", None) or (
                    getattr(ch, "delta", None) and ch.delta.content)
                if text:
                    times.append(time.perf_counter())
            if close_after is not None and n >= close_after:
                break
    finally:
        chunks.close()
    if close_after is not None:             # cancelled: the server counts no usage
        return Outcome(kind, route, 200, True)
    if usage is None:
        return Outcome(kind, route, 200, False, "stream without a usage chunk")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return Outcome(kind, route, 200, True, usage=usage,
                   ttft=(times[0] - t0) if times else None, per_token=gaps)


def _expect_error(kind, route, status, fn, *, param=None, code=None) -> Outcome:
    try:
        fn()
    except openai.APIStatusError as e:
        err = (e.body or {}) if isinstance(e.body, dict) else {}
        err = err.get("error", err)             # the client unwraps "error" itself
        ok = e.status_code == status and (param is None or err.get("param") == param) \
            and (code is None or err.get("code") == code)
        return Outcome(kind, route, e.status_code, ok,
                       "" if ok else f"expected {status} {param or code}, got "
                                     f"{e.status_code} {err}")
    return Outcome(kind, route, 200, False, f"expected {status}, got 200")


def send(kind: str, client: openai.OpenAI, http: httpx.Client, url: str, i: int,
         embeddings: bool) -> Outcome:
    chat, comp = client.chat.completions, client.completions
    usage_on = {"include_usage": True}
    seed = i if i % 3 else -1                   # some with a random seed
    if kind == "chat":
        r = chat.create(model=SERVED, messages=CHAT, max_tokens=12, seed=seed)
        return Outcome(kind, GENERATION_ROUTES[0], 200, True, usage=r.usage.model_dump())
    if kind == "chat_stream":
        return _stream(kind, GENERATION_ROUTES[0], chat.create(
            model=SERVED, messages=CHAT, max_tokens=12, stream=True, stream_options=usage_on))
    if kind == "completion":
        r = comp.create(model=SERVED, prompt=f"Item {i}:", max_tokens=12, seed=seed)
        return Outcome(kind, GENERATION_ROUTES[1], 200, True, usage=r.usage.model_dump())
    if kind == "completion_stream":
        return _stream(kind, GENERATION_ROUTES[1], comp.create(
            model=SERVED, prompt="def read(path):", max_tokens=12, stream=True,
            stream_options=usage_on))
    if kind == "json_schema":
        r = chat.create(model=SERVED, messages=CHAT, max_tokens=16,
                        response_format={"type": "json_schema", "json_schema": SCHEMA})
        return Outcome(kind, GENERATION_ROUTES[0], 200, True, usage=r.usage.model_dump())
    if kind == "tools":
        r = chat.create(model=SERVED, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                        max_tokens=16, tools=TOOLS, tool_choice="auto")
        return Outcome(kind, GENERATION_ROUTES[0], 200, True, usage=r.usage.model_dump())
    if kind == "logprobs":
        r = chat.create(model=SERVED, messages=CHAT, max_tokens=8, logprobs=True,
                        top_logprobs=3)
        ok = r.choices[0].logprobs is not None and all(
            len(t.top_logprobs) == 3 for t in r.choices[0].logprobs.content)
        return Outcome(kind, GENERATION_ROUTES[0], 200, ok, "" if ok else "top_logprobs",
                       usage=r.usage.model_dump())
    if kind == "embeddings":
        if not embeddings:
            return send("chat", client, http, url, i, embeddings)
        r = client.embeddings.create(model=SERVED, input=["first text", "second text"])
        ok = len(r.data) == 2 and len(r.data[0].embedding) > 0
        return Outcome(kind, "/v1/embeddings", 200, ok, "" if ok else "embedding shape")
    if kind == "cancelled_stream":
        return _stream(kind, GENERATION_ROUTES[0], chat.create(
            model=SERVED, messages=CHAT, max_tokens=400, stream=True,
            logit_bias={"0": -100, "2": -100}), close_after=3)
    if kind == "bad_temperature":
        return _expect_error(kind, GENERATION_ROUTES[0], 400, lambda: chat.create(
            model=SERVED, messages=CHAT, temperature=5), param="temperature")
    if kind == "unknown_model":
        return _expect_error(kind, GENERATION_ROUTES[1], 404, lambda: comp.create(
            model="no-such-model", prompt="x"), code="model_not_found")
    if kind == "empty_messages":
        return _expect_error(kind, GENERATION_ROUTES[0], 400, lambda: chat.create(
            model=SERVED, messages=[]), param="messages")
    if kind == "embeddings_dimensions":
        return _expect_error(kind, "/v1/embeddings", 400, lambda: client.embeddings.create(
            model=SERVED, input="x", dimensions=8), code="unsupported_parameter")
    if kind == "over_context":
        return _expect_error(kind, GENERATION_ROUTES[0], 400, lambda: chat.create(
            model=SERVED, messages=CHAT, max_tokens=1 << 30),
            code="context_length_exceeded")
    if kind == "bad_json":
        r = http.post(url + GENERATION_ROUTES[0], content=b'{"messages": [',
                      headers={"content-type": "application/json"})
        ok = r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        return Outcome(kind, GENERATION_ROUTES[0], r.status_code, ok,
                       "" if ok else f"bad JSON got {r.status_code} {r.text[:200]}")
    raise ValueError(f"unknown request kind {kind!r}")


def run_phase(base: str, workers: list, start: int, stop: int, outcomes: list,
              embeddings: bool) -> None:
    """Requests start..stop-1, drawn by the worker threads from one shared counter."""
    lock = threading.Lock()
    nxt = [start]

    def worker(client, http):
        while True:
            with lock:
                i = nxt[0]
                if i >= stop:
                    return
                nxt[0] += 1
            kind = KINDS[i % len(KINDS)]
            try:
                out = send(kind, client, http, base, i, embeddings)
            except Exception as e:  # noqa: BLE001 -- an unexpected failure is a finding
                out = Outcome(kind, "?", 0, False, f"{type(e).__name__}: {e}")
            with lock:
                outcomes.append(out)
    ts = [threading.Thread(target=worker, args=w) for w in workers]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def scrape(url: str) -> dict:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _has_embeddings(url: str) -> bool:
    r = httpx.post(url + "/v1/embeddings", json={"input": "probe"}, timeout=60)
    return r.status_code == 200


def soak(model: str | None, requests: int, clients: int, rss_growth: float,
         fd_slack: int, thread_slack: int) -> dict:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(model, port, clients)
    try:
        wait_up(url, proc)
        embeddings = _has_embeddings(url)       # the probe is counted below
        workers = [(openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                  timeout=120), httpx.Client(timeout=120))
                   for _ in range(clients)]
        outcomes: list[Outcome] = []
        samples = {}
        bounds = {"warm-up": requests // 10, "middle": requests * 55 // 100, "end": requests}
        t0, done = time.perf_counter(), 0
        for name, stop in bounds.items():
            run_phase(url, workers, done, stop, outcomes, embeddings)
            done = stop
            wait_idle(url)
            samples[name] = process_sample(proc.pid)
        wall = time.perf_counter() - t0
        metrics = scrape(url)
        for client, http in workers:
            client.close()
            http.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return report(outcomes, samples, metrics, wall, embeddings, rss_growth, fd_slack,
                  thread_slack)


def report(outcomes, samples, metrics, wall, embeddings, rss_growth, fd_slack,
           thread_slack) -> dict:
    by_kind = Counter(o.kind for o in outcomes)
    unexpected = [f"{o.kind}: {o.why}" for o in outcomes if not o.ok]
    seen = Counter((o.route, str(o.status)) for o in outcomes)
    seen[("/v1/embeddings", "200" if embeddings else "400")] += 1      # the probe
    counted = {k: int(metrics.get(("cortiq_requests_total", (("route", k[0]), ("status", k[1])))
                                  , 0)) for k in seen}
    for (name, labels), v in metrics.items():          # routes the clients never sent
        if name == "cortiq_requests_total":
            key = (dict(labels)["route"], dict(labels)["status"])
            if key not in seen and key[0] not in ("/metrics", "/healthz", "/ready"):
                counted[key] = int(v)
    tokens = {k: sum(o.usage.get(k, 0) for o in outcomes
                     if o.route in GENERATION_ROUTES)
              for k in ("prompt_tokens", "completion_tokens")}
    server_tokens = {k: int(metrics.get((f"cortiq_{k}_total", ()), 0)) for k in tokens}
    ttft = [o.ttft for o in outcomes if o.ttft is not None]
    per_token = [g for o in outcomes for g in o.per_token]
    w, e = samples["warm-up"], samples["end"]
    growth = e["rss_bytes"] / w["rss_bytes"] - 1
    checks = {
        "no unexpected outcome": not unexpected,
        f"RSS growth after warm-up <= {rss_growth:.0%}": growth <= rss_growth,
        f"open fds flat (+{fd_slack})": e["fds"] <= w["fds"] + fd_slack,
        f"threads flat (+{thread_slack})": e["threads"] <= w["threads"] + thread_slack,
        "metrics requests == client counts": all(counted[k] == seen.get(k, 0)
                                                 for k in counted),
        "metrics tokens == client counts": server_tokens == tokens,
    }
    batch_n = metrics.get(("cortiq_batch_requests_count", ()), 0)
    return {
        "requests": len(outcomes), "wall_s": round(wall, 2), "by_kind": dict(by_kind),
        "unexpected": unexpected[:20], "n_unexpected": len(unexpected),
        "samples": samples, "rss_growth": round(growth, 4),
        "requests_by_route_status": {f"{r} {s}": [seen.get((r, s), 0), counted[(r, s)]]
                                     for r, s in sorted(counted)},
        "tokens_clients": tokens, "tokens_metrics": server_tokens,
        "ttft_s": {"p50": _percentile(ttft, 0.5), "p99": _percentile(ttft, 0.99)},
        "per_token_s": {"p50": _percentile(per_token, 0.5),
                        "p99": _percentile(per_token, 0.99)},
        "mean_batch_requests": (metrics.get(("cortiq_batch_requests_sum", ()), 0) / batch_n)
        if batch_n else None,
        "embeddings": embeddings,
        "checks": checks, "ok": all(checks.values()),
    }


def print_table(r: dict) -> None:
    mib = 1 << 20
    print(f"{r['requests']} requests in {r['wall_s']} s; embeddings "
          f"{'on' if r['embeddings'] else 'off (the model has no hidden states)'}")
    print(f"{'phase':<10}{'RSS MiB':>10}{'fds':>6}{'threads':>9}")
    for name, s in r["samples"].items():
        print(f"{name:<10}{s['rss_bytes'] / mib:>10.1f}{s['fds']:>6}{s['threads']:>9}")
    print(f"{'route status':<32}{'clients':>9}{'metrics':>9}")
    for k, (a, b) in r["requests_by_route_status"].items():
        print(f"{k:<32}{a:>9}{b:>9}")
    for k in r["tokens_clients"]:
        print(f"{k:<32}{r['tokens_clients'][k]:>9}{r['tokens_metrics'][k]:>9}")

    def ms(x):
        return "-" if x is None else f"{x * 1000:.1f}"
    print(f"time to first token ms: p50 {ms(r['ttft_s']['p50'])}  p99 {ms(r['ttft_s']['p99'])}")
    print(f"per-token ms:           p50 {ms(r['per_token_s']['p50'])}  "
          f"p99 {ms(r['per_token_s']['p99'])}")
    if r["mean_batch_requests"] is not None:
        print(f"requests per forward step (mean): {r['mean_batch_requests']:.2f}")
    for name, ok in r["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    for u in r["unexpected"]:
        print(f"     {u}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a .cmf file (default: the demo model)")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--quick", action="store_true", help="500 requests")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rss-growth", type=float, default=0.05,
                    help="allowed RSS growth after warm-up (fraction)")
    ap.add_argument("--fd-slack", type=int, default=None,
                    help="allowed growth of open fds (default: --clients)")
    ap.add_argument("--thread-slack", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="print the report as JSON too")
    a = ap.parse_args(argv)
    n = 500 if a.quick else a.requests
    r = soak(a.model, n, a.clients, a.rss_growth,
             a.clients if a.fd_slack is None else a.fd_slack, a.thread_slack)
    print_table(r)
    if a.json:
        print(json.dumps(r, default=str))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
