"""Decode speed by calling thread and under a busy neighbour: the kernel pool's targets.

    python benchmarks/bench_threads.py [--quick] [--tokens 64] [--skip-server]

For the bundled demo model and the bench-size Dory in q8_row (the model that
`bench_decode.py --arch dory` builds and caches; --quick: its hidden-1024 variant), at
2 kernel threads, one run measures decode tok/s (one token at a time after a 16-token
prompt; the best of --reps runs):
  (1) on the main thread,
  (2) in a ThreadPoolExecutor worker, after the main thread has decoded,
  (3) two Python threads decoding two sessions at once (aggregate tok/s),
  (4) with a busy-loop process pinned on one core (started here, stopped after), at 1
      and at 2 kernel threads (Linux: the pin needs os.sched_setaffinity);
and on the demo model the server: one chat completion streamed vs not streamed
(tok/s = completion tokens / wall time of the request, through `cortiq serve` in its
own process on 127.0.0.1). Printed ratios and their targets: worker / main >= 0.95 on both models,
streamed / non-streamed >= 0.95, busy 2-thread / busy 1-thread >= 0.9.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import cortiq
from cortiq.kernels import _kernels as K

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_decode  # the bench-size Dory and its cache

PROMPT = 16


def decode_rate(llm, tokens, seed=0):
    """tok/s of `tokens` single-token feeds after a PROMPT-token prefill."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, llm.vocab_size, PROMPT + tokens)
    s = llm.session()
    s.feed(ids[:PROMPT], want="last")
    t0 = time.perf_counter()
    for i in ids[PROMPT:]:
        s.feed([int(i)], want="last")
    return tokens / (time.perf_counter() - t0)


def best(fn, reps):
    return max(fn() for _ in range(reps))


def in_worker(fn):
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(fn).result()


def two_at_once(llm, tokens):
    """Aggregate tok/s of two Python threads decoding a session each."""
    start = threading.Barrier(2)
    spans = []

    def one(seed):
        start.wait()
        t0 = time.perf_counter()
        decode_rate(llm, tokens, seed)
        spans.append((t0, time.perf_counter()))

    ths = [threading.Thread(target=one, args=(k,)) for k in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return 2 * tokens / (max(e for _, e in spans) - min(s for s, _ in spans))


class BusyCore:
    """A busy-loop process pinned on the last CPU this process may use."""

    def __enter__(self):
        cpus = sorted(os.sched_getaffinity(0))
        code = (f"import os, sys; os.sched_setaffinity(0, {{{cpus[-1]}}}); "
                "sys.stdout.write('up\\n'); sys.stdout.flush()\nwhile True: pass")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        self.proc.stdout.readline()  # pinned and spinning
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def bench_model(name, llm, a, threads):
    cortiq.set_num_threads(threads)
    decode_rate(llm, 8)  # warm-up: pages in, pool started
    main = best(lambda: decode_rate(llm, a.tokens), a.reps)
    worker = best(lambda: in_worker(lambda: decode_rate(llm, a.tokens)), a.reps)
    pair = best(lambda: two_at_once(llm, a.tokens), a.reps)
    row = dict(model=name, main=main, worker=worker, pair=pair)
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        with BusyCore():
            for n in (1, threads):
                cortiq.set_num_threads(n)
                row[f"busy{n}"] = best(lambda: decode_rate(llm, a.tokens), a.reps)
        cortiq.set_num_threads(threads)
    return row


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_server(llm, a):
    """(streamed tok/s, non-streamed tok/s) of one chat completion on a live `cortiq
    serve` of the demo model in its own process (a client in the same process would
    compete with the server for the GIL)."""
    import httpx

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", "import sys, cortiq.serve.cli; sys.exit(cortiq.serve.cli.main())",
                             "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--threads", str(a.threads), "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("cortiq serve did not come up")
        url = base + "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "What does `sorted` do?"}],
                "max_tokens": a.server_tokens, "temperature": 0,
                "logit_bias": {str(i): -100 for i in llm.tokenizer.eos_token_ids}}

        def plain():
            t0 = time.perf_counter()
            r = httpx.post(url, json=body, timeout=600).json()
            return r["usage"]["completion_tokens"] / (time.perf_counter() - t0)

        def streamed():
            n = 0
            t0 = time.perf_counter()
            with httpx.stream("POST", url, json=dict(body, stream=True,
                              stream_options={"include_usage": True}), timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage")
                        n = usage["completion_tokens"] if usage else n
            return n / (time.perf_counter() - t0)

        plain(), streamed()  # warm-up
        runs = [(streamed(), plain()) for _ in range(a.reps)]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return max(s for s, _ in runs), max(p for _, p in runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the hidden-1024 bench Dory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens a measurement")
    ap.add_argument("--demo-tokens", type=int, default=256)
    ap.add_argument("--server-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-bench-model", action="store_true")
    a = ap.parse_args()

    cfg = cortiq.config()
    print(f"cortiq {cfg['version']}: isa {cfg['isa']}, {len(os.sched_getaffinity(0))} cpus, "
          f"pool spin {cfg['pool']['spin_us']} us, load average {os.getloadavg()[0]:.2f}")
    rows = []
    demo = cortiq.LLM()
    rows.append(bench_model("demo", demo, argparse.Namespace(**dict(vars(a), tokens=a.demo_tokens)),
                            a.threads))
    if not a.skip_bench_model:
        import tempfile
        p = bench_decode.QUICK if a.quick else bench_decode.RELEASE_LIKE
        cache = a.cache or os.path.join(tempfile.gettempdir(), "cortiq-bench")
        path = bench_decode.build_dory(os.path.join(
            cache, f"dory-{'quick' if a.quick else 'release-like'}-q8_row.cmf"), p, "q8_row")
        big = cortiq.LLM(path)
        rows.append(bench_model(os.path.basename(path), big, a, a.threads))
        big.close()
    print(f"\ndecode tok/s at {a.threads} kernel threads (best of {a.reps})")
    print(f"{'model':<28}{'main':>9}{'worker':>9}{'worker/main':>13}{'2 threads':>11}"
          f"{'busy 1thr':>11}{'busy 2thr':>11}{'busy 2/1':>10}")
    for r in rows:
        busy = (f"{r['busy1']:>11.1f}{r[f'busy{a.threads}']:>11.1f}"
                f"{r[f'busy{a.threads}'] / r['busy1']:>10.2f}") if "busy1" in r else ""
        print(f"{r['model']:<28}{r['main']:>9.1f}{r['worker']:>9.1f}{r['worker'] / r['main']:>13.2f}"
              f"{r['pair']:>11.1f}{busy}")
    print("targets: worker/main >= 0.95; busy 2/1 >= 0.9 (a busy-loop process pinned on one "
          f"core); 2 threads = aggregate of two Python threads decoding at once. "
          f"Pool stalls so far: {K.pool_stalls()}")
    if not a.skip_server:
        cortiq.set_num_threads(a.threads)
        s, p = bench_server(demo, a)
        print(f"\nserver, demo model, chat completion of {a.server_tokens} tokens: streamed "
              f"{s:.1f} tok/s, not streamed {p:.1f} tok/s, ratio {s / p:.2f} (target >= 0.95)")


if __name__ == "__main__":
    main()
