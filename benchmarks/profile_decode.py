"""Where a decode token's time goes: matrix products against everything else.

Runs a Llama-family file (GGUF or CMF) with `cortiq.LLM`, feeds a prompt, then decodes
greedily one token at a time (the decode loop of ``bench_gguf.py``) and reports, per
token, at each thread count:

* sections: wall time inside each kernel entry the Llama forward calls per token
  (``matvec_batch`` = the products, attention, norms, rope, silu) and the rest (Python,
  NumPy, the sampler's argmax), by timers wrapped around the kernel entries;
* the Python side alone: CPU time of a step whose products return preallocated outputs
  (and, second figure, with attention stubbed too), i.e. what the forward costs beyond
  its kernels;
* one token's products back to back (one call per product group, as the forward makes
  them) against the same matrices merged into one call per input width (no barrier or
  x quantization between products), against the weight bytes over the read probe
  (``read_sum``, the probe of ``bench_matvec.py``) at the same thread count.

    python benchmarks/profile_decode.py [PATH] [--threads 1,2] [--prompt 64] [--tokens 32]

Default PATH: the Q4_K_M bench GGUF ``bench_gguf.py`` caches. On a shared machine
every figure is the best of ``--reps`` rounds.
"""
from __future__ import annotations

import argparse
import collections
import os
import tempfile
import time

import numpy as np

import cortiq
from cortiq.kernels import _kernels as K

DEFAULT = os.path.join(tempfile.gettempdir(), "cortiq-bench",
                       "llama-2048-16-5632-32000-q4_k_m.gguf")
#: the kernel entries the Llama forward calls per decode token
ENTRIES = ("matvec_batch", "attn_gqa_window", "rmsnorm", "rope_interleaved_tail",
           "rope_halfsplit", "silu_mul")


class Timers:
    """Wall time and calls per kernel entry, by wrappers installed on the module."""

    def __init__(self):
        self.seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self._orig = {n: getattr(K, n) for n in ENTRIES if hasattr(K, n)}

    def install(self):
        clock = time.perf_counter
        for name, fn in self._orig.items():
            def timed(*a, _fn=fn, _name=name, **kw):
                t0 = clock()
                try:
                    return _fn(*a, **kw)
                finally:
                    self.seconds[_name] += clock() - t0
                    self.calls[_name] += 1
            setattr(K, name, timed)

    def remove(self):
        for name, fn in self._orig.items():
            setattr(K, name, fn)


def decode(session, first, n, start, clock=time.perf_counter):
    """Seconds a token of n greedy steps from `first`; the session is rolled back to
    `start` (the prompt) after."""
    t = first
    t0 = clock()
    for _ in range(n):
        t = int(np.argmax(session.feed([t], want="last")))
    dt = (clock() - t0) / n
    session.rollback(start)
    return dt


def sections(llm, prompt, tokens, reps):
    s = llm.session()
    first = int(np.argmax(s.feed(prompt, want="last")))
    decode(s, first, 4, len(prompt))                      # warm the path
    timers, best = Timers(), None
    timers.install()
    try:
        for _ in range(reps):
            timers.seconds.clear()
            timers.calls.clear()
            wall = decode(s, first, tokens, len(prompt))
            if best is None or wall < best[0]:
                best = (wall, dict(timers.seconds), dict(timers.calls))
    finally:
        timers.remove()
    return best


def python_side(llm, prompt, tokens, reps, stub_attention):
    """CPU seconds a token with the products (and attention) stubbed out."""
    s = llm.session()
    first = int(np.argmax(s.feed(prompt, want="last")))
    real_mv, real_attn = K.matvec_batch, K.attn_gqa_window
    shapes: dict = {}

    def no_products(ms, X, outs=None):
        key = tuple(id(m) for m in ms)
        if key not in shapes:
            shapes[key] = [(X.shape[0], m.rows) for m in ms]
        return [np.zeros(sh, np.float32) for sh in shapes[key]]

    K.matvec_batch = no_products
    if stub_attention:
        K.attn_gqa_window = lambda *a, **kw: None
    try:
        best = min(decode(s, first, tokens, len(prompt), clock=time.thread_time)
                   for _ in range(reps))
    finally:
        K.matvec_batch, K.attn_gqa_window = real_mv, real_attn
    return best


def products(model, threads, reps):
    groups = [[t.qmat for t in g.mats] for L in model.layers
              for g in (L.qkv, L.o, L.gate_up, L.down)] + [[model.head.qmat]]
    nbytes = sum(q.nbytes for g in groups for q in g)
    rng = np.random.default_rng(0)
    xs = {g[0].cols: rng.standard_normal((1, g[0].cols)).astype(np.float32) for g in groups}
    by_cols: dict = {}
    for g in groups:
        by_cols.setdefault(g[0].cols, []).extend(g)

    def back_to_back():
        for g in groups:
            K.matvec_batch(g, xs[g[0].cols])

    def merged():
        for c, g in by_cols.items():
            K.matvec_batch(g, xs[c])

    probe = np.ones(512 << 20, np.uint8)
    back_to_back()
    merged()
    got: dict = {"calls": [], "merged": [], "probe": []}
    for _ in range(reps):
        for name, fn in (("calls", back_to_back), ("merged", merged)):
            t0 = time.perf_counter()
            fn()
            got[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        K.read_sum(probe, threads)
        got["probe"].append(probe.size / (time.perf_counter() - t0))
    return nbytes, len(groups), len(by_cols), min(got["calls"]), min(got["merged"]), \
        max(got["probe"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("path", nargs="?", default=DEFAULT)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    if not os.path.exists(a.path):
        p.error(f"{a.path}: no such file (bench_gguf.py writes the bench GGUFs there)")
    rng = np.random.default_rng(1)
    with cortiq.LLM(a.path, n_ctx=4096) as probe_llm:
        vocab = probe_llm._models[None].vocab
    prompt = [int(x) for x in rng.integers(min(259, vocab - 1), vocab, a.prompt)]
    print(f"{a.path}: prompt {a.prompt}, {a.tokens} tokens a round, best of {a.reps}; "
          f"load average {os.getloadavg()[0]:.2f}")
    for th in (int(x) for x in a.threads.split(",")):
        with cortiq.LLM(a.path, n_threads=th, n_ctx=4096) as llm:
            model = llm._models[None]
            wall, secs, calls = sections(llm, prompt, a.tokens, a.reps)
            n = a.tokens
            print(f"\nthreads {th}: {wall * 1e3:.2f} ms a token ({1 / wall:.1f} tok/s)")
            print("| part | ms a token | calls a token | share |")
            print("|---|---|---|---|")
            inside = 0.0
            for name, v in sorted(secs.items(), key=lambda kv: -kv[1]):
                inside += v / n
                print(f"| {name} | {v / n * 1e3:.3f} | {calls[name] // n} | "
                      f"{v / n / wall:.1%} |")
            print(f"| rest (Python, NumPy, argmax) | {(wall - inside) * 1e3:.3f} | | "
                  f"{1 - inside / wall:.1%} |")
            py = python_side(llm, prompt, n, a.reps, False)
            py_na = python_side(llm, prompt, n, a.reps, True)
            print(f"CPU a token with the products stubbed: {py * 1e3:.3f} ms; with attention "
                  f"stubbed too: {py_na * 1e3:.3f} ms")
            nbytes, ncalls, nmerged, t_calls, t_merged, bw = products(model, th, a.reps)
            print(f"products: {nbytes / 1e6:.1f} MB a token; {ncalls} calls back to back "
                  f"{t_calls * 1e3:.2f} ms ({nbytes / t_calls / 1e9:.1f} GB/s), merged into "
                  f"{nmerged} calls {t_merged * 1e3:.2f} ms ({nbytes / t_merged / 1e9:.1f} GB/s); "
                  f"read probe {bw / 1e9:.1f} GB/s -> bytes / probe {nbytes / bw * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
