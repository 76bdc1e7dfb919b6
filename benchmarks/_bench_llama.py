"""Llama decode/prefill against llama.cpp on the same weights (``bench_decode.py --arch llama``).

A random Llama (default: hidden 2048, 16 layers, 16 heads x 128 with 4 kv heads, MLP
5632, vocab 32000, untied head: about 0.84 GB per token in Q8_0) is written once as a
GGUF file with the ``gguf`` package (weights Q8_0, norms F32, a SentencePiece vocabulary
llama.cpp accepts), imported into cortiq with ``cortiq.convert.gguf_import`` (Q8_0 ->
q8_row, the default precision) and decoded by both engines in one run:

* decode tokens/s after a 64-token prompt (greedy, one token at a time),
* prefill tokens/s of a 512-token prompt (one call each: cortiq's chunked prefill,
  llama.cpp's n_batch = 512),

per thread count (default 1 and 2), and the ratios. "Per byte" divides out the weight
bytes each engine streams per token (cortiq's q8_row payloads vs the Q8_0 payloads), so
the decode ratio compares how fast each engine turns its bytes into tokens. The peer
is llama-cpp-python (``pip install llama-cpp-python``, a benchmark-only dependency);
when it cannot be imported the cortiq rows are still printed and the peer is skipped
with a message.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

GEOMETRY = dict(hidden=2048, layers=16, heads=16, kv_heads=4, head_dim=128, ffn=5632,
                vocab=32000)
QUICK = dict(hidden=1024, layers=8, heads=8, kv_heads=2, head_dim=128, ffn=2816, vocab=16000)


def arch_of(g) -> dict:
    return {"arch_name": "llama", "hidden_size": g["hidden"], "intermediate_size": g["ffn"],
            "num_layers": g["layers"], "num_attention_heads": g["heads"],
            "num_kv_heads": g["kv_heads"], "head_dim": g["head_dim"],
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}


def random_tensors(g, seed=0):
    rng = np.random.default_rng(seed)
    H, F, V = g["hidden"], g["ffn"], g["vocab"]
    q, kv = g["heads"] * g["head_dim"], g["kv_heads"] * g["head_dim"]

    def m(r, c):
        return (rng.standard_normal((r, c), dtype=np.float32) * np.float32(0.02))
    out = {"model.embed_tokens.weight": m(V, H)}
    for i in range(g["layers"]):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = np.ones(H, np.float32)
        out[f"{p}.self_attn.q_proj.weight"] = m(q, H)
        out[f"{p}.self_attn.k_proj.weight"] = m(kv, H)
        out[f"{p}.self_attn.v_proj.weight"] = m(kv, H)
        out[f"{p}.self_attn.o_proj.weight"] = m(H, q)
        out[f"{p}.post_attention_layernorm.weight"] = np.ones(H, np.float32)
        out[f"{p}.mlp.gate_proj.weight"] = m(F, H)
        out[f"{p}.mlp.up_proj.weight"] = m(F, H)
        out[f"{p}.mlp.down_proj.weight"] = m(H, F)
    out["model.norm.weight"] = np.ones(H, np.float32)
    out["lm_head.weight"] = m(V, H)
    return out


def spm_vocab(n):
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = [f"\u2581w{i}" for i in range(n - len(pieces))]
    return {"model": "llama", "tokens": pieces + words,
            "scores": [0.0] * len(pieces) + [-float(i) for i in range(len(words))],
            "types": types + [1] * len(words), "bos": 1, "eos": 2, "add_bos": False}


def write_gguf(path, g):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests"))
    import gguf
    from reference import gguf_llama  # the tests' GGUF writer
    T = gguf.GGMLQuantizationType
    gguf_llama.write(path, random_tensors(g), arch_of(g),
                     types=lambda n, a: T.Q8_0 if a.ndim == 2 else T.F32,
                     tokenizer=spm_vocab(g["vocab"]))


def weight_bytes_cortiq(llm) -> int:
    """Bytes a decode step streams: every matrix the forward multiplies by."""
    return sum(t.nbytes for t in llm.model.matrices())


def weight_bytes_gguf(path) -> int:
    import gguf
    r = gguf.GGUFReader(path)
    return sum(int(t.n_bytes) for t in r.tensors if t.name != "token_embd.weight"
               and len(t.shape) == 2)


def bench_cortiq(cmf_path, th, prompt, tokens, long_prompt, **llm_options):
    import cortiq
    with cortiq.LLM(cmf_path, n_threads=th, n_ctx=4096, **llm_options) as llm:
        s = llm.session()
        lg = s.feed(prompt, want="last")
        t = int(np.argmax(lg))
        t0 = time.perf_counter()
        for _ in range(tokens):
            t = int(np.argmax(s.feed([t], want="last")))
        dec = tokens / (time.perf_counter() - t0)
        s = llm.session()
        s.feed(long_prompt[:8], want="last")          # warm the path
        s = llm.session()
        t0 = time.perf_counter()
        s.feed(long_prompt, want="last")
        pre = len(long_prompt) / (time.perf_counter() - t0)
        return dec, pre, weight_bytes_cortiq(llm)


def bench_llamacpp(gguf_path, th, prompt, tokens, long_prompt):
    from llama_cpp import Llama
    llm = Llama(model_path=gguf_path, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=th,
                n_threads_batch=th, verbose=False, logits_all=False)
    try:
        llm.reset()
        llm.eval(prompt)
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t0 = time.perf_counter()
        for _ in range(tokens):
            llm.eval([t])
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        dec = tokens / (time.perf_counter() - t0)
        llm.reset()
        llm.eval(long_prompt[:8])
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(long_prompt)
        pre = len(long_prompt) / (time.perf_counter() - t0)
        return dec, pre
    finally:
        llm.close()


def main(a, rest):
    p = argparse.ArgumentParser(prog="bench_decode.py --arch llama")
    p.add_argument("--prefill", type=int, default=512, help="prefill prompt tokens")
    p.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    b = p.parse_args(rest)
    g = dict(QUICK if a.quick else GEOMETRY)
    cache = a.cache or os.path.join(tempfile.gettempdir(), "cortiq-bench")
    os.makedirs(cache, exist_ok=True)
    tag = f"llama-{g['hidden']}-{g['layers']}-{g['ffn']}-{g['vocab']}"
    gguf_path = os.path.join(cache, tag + "-q8_0.gguf")
    cmf_path = os.path.join(cache, tag + "-imported.cmf")
    if not os.path.exists(gguf_path):
        t0 = time.perf_counter()
        tmp = gguf_path + f".tmp-{os.getpid()}"
        write_gguf(tmp, g)
        os.replace(tmp, gguf_path)
        print(f"wrote {gguf_path} ({os.path.getsize(gguf_path) / 1e9:.2f} GB) in "
              f"{time.perf_counter() - t0:.0f} s")
    if not os.path.exists(cmf_path):
        from cortiq.convert.gguf_import import import_gguf
        t0 = time.perf_counter()
        import_gguf(gguf_path, cmf_path, progress=False)
        print(f"imported -> {cmf_path} in {time.perf_counter() - t0:.0f} s")
    peer = not b.no_peer
    if peer:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as e:
            print(f"llama.cpp peer skipped: llama_cpp is not importable ({e}); "
                  "pip install llama-cpp-python to compare")
            peer = False
    rng = np.random.default_rng(1)
    prompt = [int(x) for x in rng.integers(259, g["vocab"], a.prompt)]
    long_prompt = [int(x) for x in rng.integers(259, g["vocab"], b.prefill)]
    gb_gguf = weight_bytes_gguf(gguf_path)
    import cortiq
    print(f"geometry: {g}; {a.tokens} decode tokens after {a.prompt}; prefill {b.prefill}; "
          f"cortiq precision {cortiq.get_precision()} (auto: int8 prompt, exact decode for q8)")
    print("| threads | engine | decode tok/s | GB/token | eff. GB/s | prefill tok/s |")
    print("|---|---|---|---|---|---|")
    summary = []
    for th in a.threads:
        dec, pre, nb = bench_cortiq(cmf_path, th, prompt, a.tokens, long_prompt)
        print(f"| {th} | cortiq (q8_row) | {dec:.2f} | {nb / 1e9:.3f} | {dec * nb / 1e9:.1f} "
              f"| {pre:.1f} |", flush=True)
        if peer:
            pdec, ppre = bench_llamacpp(gguf_path, th, prompt, a.tokens, long_prompt)
            print(f"| {th} | llama.cpp (Q8_0) | {pdec:.2f} | {gb_gguf / 1e9:.3f} | "
                  f"{pdec * gb_gguf / 1e9:.1f} | {ppre:.1f} |", flush=True)
            summary.append((th, dec / pdec, (dec * nb) / (pdec * gb_gguf), pre / ppre))
    if summary:
        print("\n| threads | decode ratio (tok/s) | decode ratio per byte | prefill ratio |")
        print("|---|---|---|---|")
        for th, r, rb, rp in summary:
            print(f"| {th} | {r:.2f} | {rb:.2f} | {rp:.2f} |")
        print("targets: per-byte decode >= 1.15 at 2 threads; prefill >= 1.0")
