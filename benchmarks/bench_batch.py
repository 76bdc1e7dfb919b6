"""Continuous batching: aggregate and per-stream decode speed at B streams at once.

    python benchmarks/bench_batch.py [--threads 2] [--batches 1,2,4,8] [--tokens 24]
        [--precision exact,int8] [--arch dory,deepseek_v4] [--no-peer] [--server]

For each B: B requests decode at once on one `cortiq.LLM` (B Python threads calling
`generate`; the LLM's scheduler batches them into one forward per step) after a short
prompt each. Reported: aggregate decode tok/s (tokens of all streams / the decode
wall time) and per-stream tok/s (each stream's tokens / its own decode time, the
mean over streams).

Models (written once into --cache, default $TMPDIR/cortiq-bench, as bench_decode.py
writes them):
  * the bench-size Dory (bench_decode.py RELEASE_LIKE, q8_row: 0.855 GB of weights per
    token);
  * the DeepSeek-V4 bench model (benchmarks/_bench_dsv4.py's default geometry, q8_row);
  * the peer: llama.cpp (llama-cpp-python, when installed) on a Llama Q8_0 GGUF of the
    same bytes per token (benchmarks/_bench_llama.py GEOMETRY, written with the gguf
    package), decoding B sequences with the low-level batch API: one `llama_decode`
    over a batch holding the next token of each of the B sequences.

Targets at 2 threads: cortiq/llama.cpp aggregate >= 1.15 at B = 4 and 8; cortiq B = 8
aggregate >= 3x its B = 1; per-stream latency at B = 4 <= 1.6x B = 1.
--server adds 8 concurrent streamed chat clients against `cortiq serve`'s app
(max_batch 8 vs 1): aggregate tok/s and mean time to first token.
--steps adds step times without the scheduler's threads: `LLM.feed_batch` of B one-token
rows (after a 16-token prompt each), exact and int8 in alternating rounds (best of each),
with the share of the step spent in `matvec_batch`. --kernel adds the kernel-level figure: matvec_batch of B inputs (exact and int8) against
one of each of bench-size Dory's matrix shapes (q8_row), against B int8 matvecs, in
alternating rounds (best of each), with the load average.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
_QUIET = None           # llama.cpp's log callback, once set
sys.path.insert(0, HERE)

import cortiq  # noqa: E402 -- after the sys.path line that makes the helpers beside it importable

# ---------------------------------------------------------------- cortiq

def cortiq_streams(llm, B, prompt_len, tokens, seed=0):
    """B concurrent greedy generations of `tokens` tokens after prompts of prompt_len:
    (aggregate tok/s, mean per-stream tok/s)."""
    rng = np.random.default_rng(seed)
    hi = min(llm.tokenizer.vocab_size, llm.vocab_size)    # ids the tokenizer can show
    prompts = [rng.integers(3, hi, prompt_len).tolist() for _ in range(B)]
    res = [None] * B
    start = threading.Barrier(B)

    def run(i):
        start.wait()
        r, gen = llm._run(prompts[i], tokens, None, None, None,
                          {"temperature": 0.0, "logit_bias": {t: -100.0 for t in eos}})
        for _ in gen:
            pass
        res[i] = r
    eos = list(llm.tokenizer.eos_token_ids or [])
    th = [threading.Thread(target=run, args=(i,)) for i in range(B)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    n = [len(r.token_ids) for r in res]
    # decode time of a stream: from its first logits to its end; the streams overlap,
    # so the aggregate divides all tokens by the longest of them
    agg = sum(n) / max(r.decode_s for r in res)
    per = float(np.mean([k / r.decode_s for k, r in zip(n, res)]))
    return agg, per


def bench_cortiq(path, batches, tokens, prompt_len, precision, reps):
    warnings.simplefilter("ignore", RuntimeWarning)       # bench files carry no tokenizer
    llm = cortiq.LLM(path, precision=precision, max_batch=max(batches), n_ctx=4096)
    out = {}
    try:
        cortiq_streams(llm, 1, 8, 4)                        # warm up
        for B in batches:
            best = max((cortiq_streams(llm, B, prompt_len, tokens, seed=r) for r in range(reps)),
                       key=lambda x: x[0])
            out[B] = best
            print(f"    cortiq {os.path.basename(path)} {precision} B={B}: aggregate "
                  f"{best[0]:.2f} tok/s, per stream {best[1]:.2f}", flush=True)
    finally:
        llm.close()
    return out


# ---------------------------------------------------------------- llama.cpp

def llamacpp_streams(gguf, threads, batches, tokens, prompt_len, reps):
    """llama.cpp decoding B sequences in one llama_decode per step."""
    import llama_cpp as L
    global _QUIET   # llama.cpp keeps the pointer: the callback must outlive every later call
    _QUIET = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(_QUIET, ctypes.c_void_p(0))
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(gguf.encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    out = {}
    try:
        for B in batches:
            cp = L.llama_context_default_params()
            cp.n_ctx = B * (prompt_len + tokens + 16)
            cp.n_batch = max(B * prompt_len, B)
            cp.n_ubatch = cp.n_batch
            cp.n_seq_max = B
            cp.n_threads = cp.n_threads_batch = threads
            cp.kv_unified = True
            ctx = L.llama_init_from_model(model, cp)
            batch = L.llama_batch_init(cp.n_batch, 0, B)
            best = (0.0, 0.0)
            try:
                for r in range(reps):
                    L.llama_memory_clear(L.llama_get_memory(ctx), True)
                    rng = np.random.default_rng(r)
                    prompts = [rng.integers(300, n_vocab, prompt_len).tolist() for _ in range(B)]

                    def fill(items, batch=batch):
                        batch.n_tokens = len(items)
                        for k, (tok, pos, seq, want) in enumerate(items):
                            batch.token[k] = tok
                            batch.pos[k] = pos
                            batch.n_seq_id[k] = 1
                            batch.seq_id[k][0] = seq
                            batch.logits[k] = want

                    def greedy(k, ctx=ctx):
                        p = L.llama_get_logits_ith(ctx, k)
                        return int(np.argmax(np.ctypeslib.as_array(
                            ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), (n_vocab,))))
                    fill([(t, i, s, i == prompt_len - 1) for s, p in enumerate(prompts)
                          for i, t in enumerate(p)])
                    if L.llama_decode(ctx, batch):
                        raise RuntimeError("llama_decode failed (prompt)")
                    nxt = [greedy(s * prompt_len + prompt_len - 1) for s in range(B)]
                    t0 = time.perf_counter()
                    for step in range(tokens):
                        fill([(nxt[s], prompt_len + step, s, True) for s in range(B)])
                        if L.llama_decode(ctx, batch):
                            raise RuntimeError("llama_decode failed (decode)")
                        nxt = [greedy(s) for s in range(B)]
                    dt = time.perf_counter() - t0
                    agg = B * tokens / dt
                    if agg > best[0]:
                        best = (agg, tokens / dt)
            finally:
                L.llama_batch_free(batch)
                L.llama_free(ctx)
            out[B] = best
            print(f"    llama.cpp B={B}: aggregate {best[0]:.2f} tok/s, per stream "
                  f"{best[1]:.2f}", flush=True)
    finally:
        L.llama_model_free(model)
    return out


# ---------------------------------------------------------------- the server

def server_clients(path, threads, n_clients, tokens, precision, max_batch):
    """n_clients concurrent streamed chat completions against the server app:
    (aggregate tok/s over the whole run, mean time to first token in s)."""
    from starlette.testclient import TestClient

    from cortiq.serve import create_app
    warnings.simplefilter("ignore", RuntimeWarning)
    llm = cortiq.LLM(path, precision=precision, max_batch=max_batch, n_ctx=4096)
    app = create_app(llm, max_concurrency=n_clients, max_queue=n_clients)
    ttft, counts = [0.0] * n_clients, [0] * n_clients
    eos = {str(t): -100 for t in (llm.tokenizer.eos_token_ids or [])}

    def client(c, i, t_start):
        body = {"messages": [{"role": "user", "content": f"tell me story number {i}"}],
                "max_tokens": tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "logit_bias": eos}
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and not ttft[i] and '"content"' in line \
                        and '"content": ""' not in line:
                    ttft[i] = time.perf_counter() - t_start
                if '"usage": {' in line and '"completion_tokens"' in line:
                    import json
                    u = json.loads(line[6:]).get("usage")
                    if u:
                        counts[i] = u["completion_tokens"]
    try:
        with TestClient(app) as c:
            client(c, 0, time.perf_counter())                # warm up
            t0 = time.perf_counter()
            th = [threading.Thread(target=client, args=(c, i, t0)) for i in range(n_clients)]
            for t in th:
                t.start()
            for t in th:
                t.join()
            wall = time.perf_counter() - t0
    finally:
        llm.close()
    return sum(counts) / wall, float(np.mean([t for t in ttft if t] or [float("nan")]))


# ---------------------------------------------------------------- kernels

KERNEL_SHAPES = ((2048, 2048), (5632, 2048), (2048, 5632))   # Dory's attention, up/gate, down


def kernel_figures(B, rounds=7):
    """ms per pass over KERNEL_SHAPES (q8_row): {name: best ms}."""
    from cortiq.kernels import _kernels as K
    from cortiq.cmf.testing import qtensor_from_f32
    rng = np.random.default_rng(0)
    mats = [qtensor_from_f32(rng.standard_normal(s).astype(np.float32), "q8_row")
            for s in KERNEL_SHAPES]
    X = {c: rng.standard_normal((B, c)).astype(np.float32) for c in {s[1] for s in KERNEL_SHAPES}}

    def batch(prec, t):
        for T in mats:
            T.precision = prec
            K.matvec_batch([T.qmat], X[T.cols][:t])

    def single(prec):
        for T in mats:
            T.precision = prec
            for x in X[T.cols]:
                T.matvec(x)
    runs = {f"matvec_batch t={B} exact": lambda: batch("exact", B),
            f"matvec_batch t={B} int8": lambda: batch("int8", B),
            f"{B} x int8 matvec": lambda: single("int8"),
            "matvec_batch t=1 int8": lambda: batch("int8", 1),
            "matvec_batch t=1 exact": lambda: batch("exact", 1)}
    best = {k: float("inf") for k in runs}
    for _ in range(rounds):
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], (time.perf_counter() - t0) * 1e3)
    return best


def step_figures(path, batches, precisions, rounds=4, steps=3):
    """{(precision, B): (best ms per feed_batch step, share of it in matvec_batch)}."""
    from cortiq.kernels import _kernels as K
    warnings.simplefilter("ignore", RuntimeWarning)
    llms = {p: cortiq.LLM(path, precision=p, max_batch=max(batches), n_ctx=4096) for p in precisions}
    rng = np.random.default_rng(0)
    sessions = {}
    for p, llm in llms.items():
        for B in batches:
            ss = [llm.session() for _ in range(B)]
            llm.feed_batch(ss, [rng.integers(3, 1000, 16).tolist() for _ in range(B)])
            sessions[p, B] = ss
    spent = [0.0]
    plain = K.matvec_batch

    def timed(*args):
        t0 = time.perf_counter()
        try:
            return plain(*args)
        finally:
            spent[0] += time.perf_counter() - t0
    best = {}
    K.matvec_batch = timed
    try:
        for _ in range(rounds):
            for p, llm in llms.items():
                for B in batches:
                    spent[0] = 0.0
                    t0 = time.perf_counter()
                    for i in range(steps):
                        llm.feed_batch(sessions[p, B], [[5 + i]] * B)
                    el = (time.perf_counter() - t0) / steps
                    if el < best.get((p, B), (float("inf"),))[0]:
                        best[p, B] = (el, spent[0] / steps / el)
    finally:
        K.matvec_batch = plain
        for llm in llms.values():
            llm.close()
    return best


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 2, 4, 8])
    ap.add_argument("--tokens", type=int, default=24, help="decode tokens per stream")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per stream")
    ap.add_argument("--reps", type=int, default=2, help="runs per point (the best is kept)")
    ap.add_argument("--precision", default="exact,int8")
    ap.add_argument("--arch", default="dory,deepseek_v4")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--server", action="store_true",
                    help="also 8 streamed chat clients against the server app")
    ap.add_argument("--kernel", action="store_true",
                    help="also matvec_batch against Dory's matrix shapes (exact, int8)")
    ap.add_argument("--steps", action="store_true",
                    help="also feed_batch step times on the Dory, no scheduler threads")
    a = ap.parse_args()
    cortiq.set_num_threads(a.threads)
    if a.kernel:
        B = max(a.batches)
        best = kernel_figures(B)
        shapes = ", ".join(f"{r}x{c}" for r, c in KERNEL_SHAPES)
        print(f"kernels, threads {a.threads}, q8_row {shapes}; load average "
              f"{os.getloadavg()[0]:.2f}")
        for k, ms in best.items():
            print(f"    {k}: {ms:.2f} ms")
    cache = a.cache or os.path.join(tempfile.gettempdir(), "cortiq-bench")
    os.makedirs(cache, exist_ok=True)
    import bench_decode as BD
    models = {}
    if "dory" in a.arch:
        models["dory"] = BD.build_dory(os.path.join(cache, "dory-release-like-q8_row.cmf"),
                                       BD.RELEASE_LIKE, "q8_row")
    if "deepseek_v4" in a.arch:
        import _bench_dsv4 as D
        p = argparse.ArgumentParser()
        D.add_args(p)
        g = D.geometry(p.parse_args([]))
        path = os.path.join(cache, "dsv4-bench-q8_row.cmf")
        if not os.path.exists(path):
            D.write_model(path, g, "q8_row")
        models["deepseek_v4"] = path
    if a.steps and "dory" in models:
        best = step_figures(models["dory"], a.batches, a.precision.split(","))
        print(f"feed_batch steps, dory, threads {a.threads}; load average {os.getloadavg()[0]:.2f}")
        for (p, B), (el, share) in best.items():
            b1 = best.get((p, 1), (None,))[0]
            vs = f", aggregate {B * b1 / el:.2f}x B=1" if b1 else ""
            print(f"    {p} B={B}: {el * 1e3:.1f} ms a step ({share:.0%} in matvec_batch){vs}")
        if ("exact", 1) in best and ("int8", 8) in best:
            print(f"    int8 B=8 aggregate / exact B=1: {8 * best['exact', 1][0] / best['int8', 8][0]:.2f}x")
    print(f"threads {a.threads}; {a.tokens} decode tokens per stream after {a.prompt} "
          "prompt tokens; best of", a.reps, flush=True)
    results = {}
    for arch, path in models.items():
        for prec in a.precision.split(","):
            results[arch, prec] = bench_cortiq(path, a.batches, a.tokens, a.prompt, prec, a.reps)
            gc.collect()
    peer = None
    if not a.no_peer:
        try:
            import _bench_llama as BL
            import llama_cpp  # noqa: F401
            g = dict(BL.GEOMETRY)
            gguf = os.path.join(cache, f"llama-{g['hidden']}-{g['layers']}-{g['ffn']}-"
                                       f"{g['vocab']}-q8_0.gguf")
            if not os.path.exists(gguf):
                tmp = gguf + f".tmp-{os.getpid()}"
                BL.write_gguf(tmp, g)
                os.replace(tmp, gguf)
            print(f"  peer: llama.cpp on {gguf} ({BL.weight_bytes_gguf(gguf) / 1e9:.3f} GB "
                  "of weights per token)", flush=True)
            peer = llamacpp_streams(gguf, a.threads, a.batches, a.tokens, a.prompt, a.reps)
            # one sequence through the high-level Llama class, as bench_decode.py runs it
            rng = np.random.default_rng(0)
            p1 = [int(t) for t in rng.integers(300, g["vocab"], a.prompt)]
            one = BL.bench_llamacpp(gguf, a.threads, p1, a.tokens, p1)[0]
            print(f"    llama.cpp, one sequence (Llama.eval): {one:.2f} tok/s", flush=True)
        except ImportError as e:
            print(f"  llama.cpp peer skipped: {e}")
    print("\n| model | precision | B | aggregate tok/s | per-stream tok/s | vs B=1 | "
          "vs llama.cpp |")
    print("|---|---|---|---|---|---|---|")
    for (arch, prec), res in results.items():
        b1 = res.get(1, (None,))[0]
        for B, (agg, per) in res.items():
            vs1 = f"{agg / b1:.2f}x" if b1 else ""
            vp = f"{agg / peer[B][0]:.2f}" if peer and B in peer and arch == "dory" else ""
            print(f"| {arch} | {prec} | {B} | {agg:.2f} | {per:.2f} | {vs1} | {vp} |")
    if peer:
        for B, (agg, per) in peer.items():
            print(f"| llama.cpp Q8_0 | - | {B} | {agg:.2f} | {per:.2f} | "
                  f"{agg / peer[1][0]:.2f}x | |" if 1 in peer else "")
    for (arch, prec), res in results.items():
        if 1 in res and 4 in res:
            print(f"{arch} {prec}: per-stream latency at B=4 is "
                  f"{res[1][1] / res[4][1]:.2f}x B=1 (target <= 1.6)")
    if a.server and "dory" in models:
        print("\n| server: 8 streamed chat clients | aggregate tok/s | mean time to first token s |")
        print("|---|---|---|")
        for mb in (8, 1):
            agg, ttft = server_clients(models["dory"], a.threads, 8, a.tokens,
                                       a.precision.split(",")[-1], mb)
            print(f"| max_batch={mb} | {agg:.2f} | {ttft:.2f} |", flush=True)


if __name__ == "__main__":
    main()
