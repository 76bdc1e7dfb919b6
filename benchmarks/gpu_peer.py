"""llama.cpp on the GPU as the peer of `bench_gpu.py`: greedy decode of Llama-shaped Q8_0
GGUFs through `llama-bench` (built from llama.cpp's source with its CUDA backend, see
`tools/gpu_peer_run.sh`).

The files hold random Q8_0 blocks (random int8 codes, one small f16 scale) in the
geometries `bench_gpu.py` runs for cortiq: the bench-size Llama (`_bench_llama.GEOMETRY`,
hidden 2048, 16 layers) and the Llama-3-8B shape (hidden 4096, 32 layers, FFN 14336,
32/8 heads of 128, vocab 128256). Decode speed does not depend on the weights' values,
and writing raw blocks takes seconds where quantizing an 8B float model takes minutes:
every tensor is a view of one pool of random blocks, so the writer streams ~8.5 GB
without building it. Q8_0 is 34 bytes a 32 weights (1.0625 bytes a weight), cortiq's
q8_row 1 byte a weight plus a scale a row: the per-byte comparison is the share of the
read bandwidth each reaches, tok/s x weight bytes a token / read GB/s.

    python benchmarks/gpu_peer.py --llama-bench BUILD/bin/llama-bench --cache DIR \\
        [--models bench,8b] (quick: a small smoke test) [--tokens 64] [--reps 3] --out results.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_llama as bl

LLAMA8B = dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
               vocab=128256)
MODELS = {"bench": bl.GEOMETRY, "8b": LLAMA8B, "quick": bl.QUICK}
Q8_0_BLOCK, Q8_0_BYTES = 32, 34


def _shapes(g) -> dict:
    """ggml tensor name -> (rows, cols) of every matrix, 1-D tensors as (1, n)."""
    H, F, V = g["hidden"], g["ffn"], g["vocab"]
    q, kv = g["heads"] * g["head_dim"], g["kv_heads"] * g["head_dim"]
    out = {"token_embd.weight": (V, H), "output_norm.weight": (1, H), "output.weight": (V, H)}
    for i in range(g["layers"]):
        p = f"blk.{i}."
        out.update({p + "attn_norm.weight": (1, H), p + "ffn_norm.weight": (1, H),
                    p + "attn_q.weight": (q, H), p + "attn_k.weight": (kv, H),
                    p + "attn_v.weight": (kv, H), p + "attn_output.weight": (H, q),
                    p + "ffn_gate.weight": (F, H), p + "ffn_up.weight": (F, H),
                    p + "ffn_down.weight": (H, F)})
    return out


def write_q8_0(path: str, g: dict, seed: int = 0) -> int:
    """Write a Llama GGUF of geometry `g` with random Q8_0 matrices; returns the bytes
    of the matrices a decoded token reads (every matrix but the embedding)."""
    import gguf
    shapes = _shapes(g)
    biggest = max(r * (c // Q8_0_BLOCK) for r, c in shapes.values())
    rng = np.random.default_rng(seed)
    pool = rng.integers(-127, 128, (biggest, Q8_0_BYTES), dtype=np.int8).view(np.uint8)
    pool[:, :2] = np.full((biggest, 1), 4e-4, np.float16).view(np.uint8)  # scale d
    tmp = path + f".tmp-{os.getpid()}"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("cortiq gpu peer bench model")
    w.add_context_length(4096)
    w.add_embedding_length(g["hidden"])
    w.add_block_count(g["layers"])
    w.add_feed_forward_length(g["ffn"])
    w.add_head_count(g["heads"])
    w.add_head_count_kv(g["kv_heads"])
    w.add_key_length(g["head_dim"])
    w.add_value_length(g["head_dim"])
    w.add_rope_dimension_count(g["head_dim"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_vocab_size(g["vocab"])
    tok = bl.spm_vocab(g["vocab"])
    w.add_tokenizer_model(tok["model"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_scores(tok["scores"])
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    token_bytes = 0
    for name, (r, c) in shapes.items():
        if r == 1:
            w.add_tensor(name, np.ones(c, np.float32))
            continue
        blocks = pool[:r * (c // Q8_0_BLOCK)].reshape(r, c // Q8_0_BLOCK * Q8_0_BYTES)
        w.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        if name != "token_embd.weight":
            token_bytes += blocks.nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return token_bytes


def llama_bench(exe: str, path: str, tokens: int, reps: int, extra=()) -> dict:
    """tok/s of llama-bench's text-generation test (greedy decode of `tokens` tokens
    after an empty prompt, all layers on the GPU), its JSON record."""
    cmd = [exe, "-m", path, "-ngl", "99", "-p", "0", "-n", str(tokens), "-r", str(reps),
           "-o", "json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    rec = json.loads(r.stdout)[0]
    return {"tok_s": rec["avg_ts"], "tok_s_stddev": rec.get("stddev_ts"),
            "gpu": rec.get("gpu_info"), "backends": rec.get("backends"),
            "build": rec.get("build_commit"), "cmd": " ".join(cmd)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--cache", default="/tmp/cortiq-bench")
    ap.add_argument("--models", default="bench,8b")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    os.makedirs(a.cache, exist_ok=True)
    out: dict = {"peer": "llama.cpp llama-bench (CUDA)", "models": {}}
    for key in a.models.split(","):
        g = MODELS[key]
        path = os.path.join(a.cache, f"peer-llama-{key}-q8_0.gguf")
        t0 = time.perf_counter()
        nbytes = write_q8_0(path, g)
        rec = {"geometry": g, "gb_token": nbytes / 1e9,
               "write_s": time.perf_counter() - t0}
        try:
            rec.update(llama_bench(a.llama_bench, path, a.tokens, a.reps))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            rec["error"] = str(e)
        out["models"][key] = rec
        os.remove(path)
        if a.out:
            with open(a.out, "w") as fh:
                json.dump(out, fh, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
