"""Decode and prefill speed of a whole model against the machine's read bandwidth.

    python benchmarks/bench_decode.py --arch dory [--quick] [--threads 2] [--tokens 32] \
        [--preload on|off|both] [--precision exact,int8]
    python benchmarks/bench_decode.py --arch deepseek_v4 ...   (benchmarks/_bench_dsv4.py)
    python benchmarks/bench_decode.py --arch llama [--quick] [--no-peer]
                                           (benchmarks/_bench_llama.py: vs llama.cpp)

Dory: a random-weight model at release proportions scaled down to about 0.85 GB of q8
weights per pass over the stack (hidden 2048, 16/4 heads of 128, MLP 5632,
`S-S-S-*-` x 3, blocks 8/8/8, 2 loops, vocab 32000), written once to a cache file
(--cache, default $TMPDIR/cortiq-bench). In one run it measures, per thread count and
per way of loading the weights (--preload off: the file mapping; on: a copy in
anonymous huge-page memory, cmf.open(preload=True); both, the default: a row each),
  * the read bandwidth (cortiq.kernels._kernels.read_sum over 1 GiB, four streams a thread, at the same thread count)
    right before and right after the decode measurement -- the percentage divides by
    their mean, so a shared machine's drifting bandwidth moves both sides,
  * decode tokens/s (one token at a time after a short prompt) and prefill tokens/s,
    per activation precision (--precision, default exact and int8 side by side: the
    same weights with float32 or int8-quantized activations, LLM(precision=...)),
  * effective GB/s = weight bytes touched per decoded token x tokens/s, and its
    percentage of the read bandwidth (the target: >= 85 % at 2 threads),
  * Python overhead per sub-layer visit, on a tiny model whose matrices are negligible
    (target <= 15 us): decode wall time per token / sub-layer visits per token, best
    of 5 runs of 300 tokens, 1 thread, through the same LLM session path. The tiny
    model's kernels (attention over up to 308 positions, the head, the embedding row)
    are included, so this is an upper bound on the Python overhead.
--quick shrinks the model (hidden 1024) for a fast check; --overhead-only measures
just the tiny model.
"""
import argparse
import gc
import math
import os
import sys
import tempfile
import time

import numpy as np

import cortiq
from cortiq.kernels import _kernels as K
from cortiq import cmf
from cortiq.runtime.llm import LLM
from cortiq.models.dory.config import DoryConfig

RELEASE_LIKE = dict(hidden=2048, heads=16, kv_heads=4, head_dim=128, ffn=5632,
                    pattern="S-S-S-*-" * 3, blocks=(8, 8, 8), loops=2, vocab=32000, window=1024)
QUICK = dict(RELEASE_LIKE, hidden=1024, heads=8, kv_heads=2, ffn=2816, vocab=16000)
TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, pattern="S-S-S-*-" * 3,
            blocks=(8, 8, 8), loops=2, vocab=256, window=64)


def dory_config(p) -> DoryConfig:
    n_in, n_rec, n_out = p["blocks"]
    return DoryConfig(
        hidden_size=p["hidden"], intermediate_size=p["ffn"], num_layers=len(p["pattern"]),
        num_attention_heads=p["heads"], num_kv_heads=p["kv_heads"], head_dim=p["head_dim"],
        vocab_size=p["vocab"], max_position_embeddings=131072, layer_pattern=p["pattern"],
        n_input_layers=n_in, n_recurrent_layers=n_rec, n_output_layers=n_out,
        n_recurrent_loops=p["loops"], recurrent_kv_cache_mode="per_loop",
        sliding_window=p["window"], rope_theta_full=1e6, rope_theta_sliding=1e4,
        initializer_range=0.02, ngpt_alpha_init=0.05, gate_logit_scale_init=math.sqrt(p["hidden"]))


def dory_tensors(p, seed=0):
    """(name, loader) pairs of a random Dory checkpoint, generated one tensor at a time."""
    rng = np.random.default_rng(seed)
    h, f, q, kv = p["hidden"], p["ffn"], p["heads"] * p["head_dim"], p["kv_heads"] * p["head_dim"]

    def mat(r, c):
        return lambda: rng.standard_normal((r, c), dtype=np.float32) * np.float32(0.02)

    def vec(n, v):
        return lambda: np.full(n, v, np.float32)

    yield "model.embed_tokens.weight", mat(p["vocab"], h)
    for i, ch in enumerate(p["pattern"]):
        m = f"model.layers.{i}.mixer"
        if ch == "-":
            yield f"{m}.gate_proj.weight", mat(f, h)
            yield f"{m}.up_proj.weight", mat(f, h)
            yield f"{m}.down_proj.weight", mat(h, f)
            yield f"{m}.suv_gate", vec(f, 1.0 / math.sqrt(h))
            yield f"{m}.suv_up", vec(f, 1.0 / math.sqrt(h))
            yield f"model.layers.{i}.mlp_alpha", vec(h, 0.02)
        else:
            for n, r in (("q", q), ("k", kv), ("v", kv), ("g", q)):
                yield f"{m}.{n}_proj.weight", mat(r, h)
            yield f"{m}.o_proj.weight", mat(h, q)
            yield f"{m}.sqk", vec(q, 0.02)
            yield f"{m}.s_gate", vec(q, 0.02)
            yield f"model.layers.{i}.attn_alpha", vec(h, 0.02)
    yield "lm_head.weight", mat(p["vocab"], h)
    yield "lm_head.logit_scale", vec(p["vocab"], 0.02)


def build_dory(path, p, quant):
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    t0 = time.perf_counter()
    cmf.write(path, dory_tensors(p), arch=dory_config(p).to_arch(), quant=quant, progress=True)
    print(f"wrote {path} ({os.path.getsize(path) / 1e9:.2f} GB) in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


def touched_bytes(model) -> int:
    """Weight bytes one decoded token reads: every visited sub-layer, the head, one
    embedding row."""
    from cortiq.models.dory import AttnWeights
    total = 0
    for i, w in enumerate(model.layers):
        times = model.loops if model.n_in <= i < model.n_in + model.n_rec else 1
        mats = (w.q, w.k, w.v, w.g, w.o) if isinstance(w, AttnWeights) else (w.gate, w.up, w.down)
        total += times * sum(m.nbytes for m in mats)
    return total + model.head_w.nbytes + model.embed.nbytes // model.vocab


def read_bandwidth(threads, buf, reps=3):
    """GB/s of the fastest of `reps` read_sum passes over `buf` (after one warm-up)."""
    K.read_sum(buf, threads, 4)  # four streams a thread, as bench_matvec (a)
    best = min(_timed(lambda: K.read_sum(buf, threads, 4)) for _ in range(reps))
    return buf.nbytes / best / 1e9


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def decode_rate(llm, prompt_len, tokens, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, llm.vocab_size, prompt_len + tokens)
    s = llm.session()
    t0 = time.perf_counter()
    s.feed(ids[:prompt_len], want="last")
    prefill = prompt_len / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in ids[prompt_len:]:
        s.feed([int(i)], want="last")
    decode = tokens / (time.perf_counter() - t0)
    return prefill, decode


def measure(path, threads, preload, probe, a, precision="exact"):
    """One table row: load (timed), read bandwidth, decode, read bandwidth again."""
    t0 = time.perf_counter()
    llm = LLM(path, preload=preload, precision=precision)
    load = time.perf_counter() - t0
    nbytes = touched_bytes(llm.model)
    bw0 = read_bandwidth(threads, probe)
    prefill, decode = decode_rate(llm, a.prompt, a.tokens)
    bw1 = read_bandwidth(threads, probe)
    llm.close()
    eff = nbytes * decode / 1e9
    return dict(threads=threads, mode="preload" if preload else "mmap", precision=precision, load=load, bw0=bw0,
                bw1=bw1, decode=decode, prefill=prefill, eff=eff,
                pct=100 * eff / ((bw0 + bw1) / 2), nbytes=nbytes)


def bench_dory(a):
    p = QUICK if a.quick else RELEASE_LIKE
    cache = a.cache or os.path.join(tempfile.gettempdir(), "cortiq-bench")
    name = f"dory-{'quick' if a.quick else 'release-like'}-{a.quant}.cmf"
    path = None if a.overhead_only else build_dory(os.path.join(cache, name), p, a.quant)
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.preload or "both"]
    rows = []
    probe = None if a.overhead_only else np.ones(1 << 30, np.uint8)
    for threads in ([] if a.overhead_only else a.threads):
        cortiq.set_num_threads(threads)
        for preload in modes:
            for prec in a.precision.split(","):
                rows.append(measure(path, threads, preload, probe, a, prec))
                gc.collect()  # the previous model's weights go before the next load
    del probe
    # Python overhead: a tiny model whose kernels take next to nothing
    tiny = build_dory(os.path.join(cache, "dory-tiny-f32.cmf"), TINY, "f32")
    cortiq.set_num_threads(1)
    t_llm = LLM(tiny)
    visits = t_llm.model.n_in + t_llm.model.loops * t_llm.model.n_rec + t_llm.model.n_out
    dec = max(decode_rate(t_llm, 8, 300, seed=r)[1] for r in range(5))  # best of 5
    per_visit = 1e6 / dec / visits

    if rows:
        print(f"Dory decode, {a.quant}, model {path}")
        print(f"  weights touched per token: {rows[0]['nbytes'] / 1e9:.3f} GB "
              f"(hidden {p['hidden']}, ffn {p['ffn']}, {len(p['pattern'])} sub-layers, "
              f"{p['loops']} loops, vocab {p['vocab']})")
        print("  weights: mmap = the file mapping (4 KiB pages), preload = a copy in anonymous "
              "huge-page memory\n  read GB/s: right before / after the decode run; % of read: "
              "of their mean")
        print(f"{'threads':>7}{'weights':>9}{'precision':>10}{'load s':>8}{'read GB/s':>15}{'decode tok/s':>14}"
              f"{'prefill tok/s':>15}{'eff GB/s':>10}{'% of read':>11}{'target':>8}")
        for r in rows:
            target = ">=85%" if r["threads"] == 2 else ""
            bw = f"{r['bw0']:.1f}/{r['bw1']:.1f}"
            print(f"{r['threads']:>7}{r['mode']:>9}{r['precision']:>10}{r['load']:>8.2f}{bw:>15}{r['decode']:>14.2f}"
                  f"{r['prefill']:>15.1f}{r['eff']:>10.1f}{r['pct']:>10.0f}%{target:>8}")
    print(f"Python overhead per sub-layer visit (tiny model, 1 thread): {per_visit:.1f} us "
          f"(target <= 15 us; {visits} visits per token; decode wall time / visits, the "
          f"tiny model's kernels included)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=("dory", "deepseek_v4", "llama"), default="dory")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--quant", default="q8_row")
    ap.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--overhead-only", action="store_true",
                    help="Dory: only the per-visit overhead on the tiny model")
    ap.add_argument("--precision", default="exact,int8",
                    help="activation precisions to measure, comma-separated (exact, int8, auto)")
    ap.add_argument("--preload", choices=("on", "off", "both"), default=None,
                    help="weights from the file mapping (off), preloaded into "
                         "anonymous huge-page memory (on), or a row of each (both, default)")
    a, rest = ap.parse_known_args()
    if a.arch == "deepseek_v4":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _bench_dsv4  # its own module, owned with the DSV4 forward
        return _bench_dsv4.main(a, rest)
    if a.arch == "llama":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _bench_llama  # its own module: the llama.cpp comparison
        return _bench_llama.main(a, rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    bench_dory(a)


if __name__ == "__main__":
    main()
