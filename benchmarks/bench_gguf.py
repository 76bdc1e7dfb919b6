"""GGUF files run directly, against llama.cpp on the same files.

One random bench-size Llama (``_bench_llama.GEOMETRY``: hidden 2048, 16 layers, MLP
5632, vocab 32000) is written once as an F16 GGUF with the ``gguf`` package, then
quantized by llama.cpp's own quantizer (``llama_cpp.llama_model_quantize``) to each
requested type (default Q4_K_M, Q6_K, Q8_0). For every file, in one run:

* decode tokens/s after a 64-token prompt (greedy, one token at a time), cortiq
  (``LLM(path.gguf)``, no conversion, with the default preload decision (on a machine
  offering huge pages: the weights copied into memory on 2 MiB pages), and mapped with
  ``preload=False``) and llama.cpp (llama-cpp-python, its default mmap), same threads;
* prefill tokens/s of a 512-token prompt (cortiq's default precision);
* the size of the CMF ``cortiq import-gguf`` writes from it, over the GGUF's size;
* greedy agreement: over 64 steps of llama.cpp's greedy continuation, the share where
  cortiq's argmax (default precision) is llama.cpp's token.

Both engines stream the same bytes a token (the same file), so the decode ratio is a
per-byte ratio by construction. Targets: decode >= 1.3x and prefill >= 1.0x llama.cpp at
2 threads; imported size <= 1.01x. Results go to ``benchmarks/results/gguf-*.json``.

    python benchmarks/bench_gguf.py [--types Q4_K_M,Q6_K,Q8_0] [--threads 2] [--quick]

llama-cpp-python is a benchmark-only dependency, built from source (README of
docs/PERFORMANCE.md §7.4 gives the flags); without it the cortiq rows are printed alone
and the GGUFs are quantized by nothing: the run stops with a message.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_llama as bl

from cortiq.cmf import worth_preloading

#: llama.cpp's file types (llama.h: enum llama_ftype) by the names its tools print
FTYPES = {"Q4_0": 2, "Q8_0": 7, "Q5_K_M": 17, "Q6_K": 18, "Q4_K_M": 15, "Q4_K_S": 14,
          "Q5_K_S": 16, "Q3_K_M": 12, "Q2_K": 10}
TARGETS = {"decode": 1.3, "prefill": 1.0, "size": 1.01}


def write_f16(path, g):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests"))
    import gguf
    from reference import gguf_llama  # the tests' GGUF writer
    T = gguf.GGMLQuantizationType
    gguf_llama.write(path, bl.random_tensors(g), bl.arch_of(g),
                     types=lambda n, a: T.F16 if a.ndim == 2 else T.F32,
                     tokenizer=bl.spm_vocab(g["vocab"]))


def quantize(src, dst, kind, threads):
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.nthread = threads
    tmp = dst + f".tmp-{os.getpid()}"
    rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({kind}) returned {rc}")
    os.replace(tmp, dst)


def greedy_agreement(path, prompt, steps, threads) -> float:
    """Share of `steps` greedy steps where cortiq picks llama.cpp's token, teacher-forced
    on llama.cpp's own continuation (the engines quantize activations differently, so a
    free-running comparison would only measure the first near-tie)."""
    import cortiq
    from llama_cpp import Llama
    ref = Llama(model_path=path, n_ctx=len(prompt) + steps + 8, n_threads=threads,
                verbose=False, logits_all=True)
    try:
        ref.eval(prompt)
        theirs = []
        for _ in range(steps):
            t = int(np.argmax(ref.scores[ref.n_tokens - 1]))
            theirs.append(t)
            ref.eval([t])
    finally:
        ref.close()
    with cortiq.LLM(path, n_threads=threads) as llm:
        s = llm.session()
        lg = s.feed(prompt, want="last")
        agree = 0
        for t in theirs:
            agree += int(np.argmax(lg)) == t
            lg = s.feed([t], want="last")
    return agree / steps


def tensor_types(path) -> dict:
    import gguf
    r = gguf.GGUFReader(path)
    out: dict = {}
    for t in r.tensors:
        name = t.tensor_type.name
        out[name] = out.get(name, 0) + 1
    return out


def imported_ratio(path) -> float:
    from cortiq.convert.gguf_import import import_gguf
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "m.cmf")
        import_gguf(path, out, progress=False)
        return os.path.getsize(out) / os.path.getsize(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--types", default="Q4_K_M,Q6_K,Q8_0")
    p.add_argument("--threads", default="2")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--quick", action="store_true", help="the small geometry")
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "cortiq-bench"))
    p.add_argument("--no-import", action="store_true", help="skip the import size check")
    a = p.parse_args()
    kinds = [k.strip().upper() for k in a.types.split(",") if k.strip()]
    bad = [k for k in kinds if k not in FTYPES]
    if bad:
        p.error(f"--types: unknown {', '.join(bad)}; one of {', '.join(FTYPES)}")
    threads = [int(t) for t in a.threads.split(",")]
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        sys.exit(f"llama_cpp is not importable ({e}): build llama-cpp-python from source "
                 "(docs/PERFORMANCE.md §7.4) to make and compare the GGUFs")
    import cortiq
    g = dict(bl.QUICK if a.quick else bl.GEOMETRY)
    os.makedirs(a.cache, exist_ok=True)
    tag = f"llama-{g['hidden']}-{g['layers']}-{g['ffn']}-{g['vocab']}"
    f16 = os.path.join(a.cache, tag + "-f16.gguf")
    if not os.path.exists(f16):
        tmp = f16 + f".tmp-{os.getpid()}"
        write_f16(tmp, g)
        os.replace(tmp, f16)
    rng = np.random.default_rng(1)
    prompt = [int(x) for x in rng.integers(259, g["vocab"], a.prompt)]
    long_prompt = [int(x) for x in rng.integers(259, g["vocab"], a.prefill)]
    rows, results = [], []
    for kind in kinds:
        path = os.path.join(a.cache, f"{tag}-{kind.lower()}.gguf")
        if not os.path.exists(path):
            quantize(f16, path, kind, max(threads))
        gb = bl.weight_bytes_gguf(path) / 1e9
        size = None if a.no_import else imported_ratio(path)
        agree = greedy_agreement(path, prompt, 64, max(threads))
        for th in threads:
            dec, pre, _ = bl.bench_cortiq(path, th, prompt, a.tokens, long_prompt)
            pdec, ppre = bl.bench_llamacpp(path, th, prompt, a.tokens, long_prompt)
            mdec, _, _ = bl.bench_cortiq(path, th, prompt, a.tokens, long_prompt[:8],
                                         preload=False)
            r = dict(type=kind, threads=th, tensor_types=tensor_types(path), gb_token=gb,
                     cortiq_decode=dec, llamacpp_decode=pdec, decode_ratio=dec / pdec,
                     preloaded_by_default=worth_preloading(path),
                     cortiq_decode_mapped=mdec, decode_ratio_mapped=mdec / pdec,
                     cortiq_prefill=pre, llamacpp_prefill=ppre, prefill_ratio=pre / ppre,
                     import_size_ratio=size, greedy_agreement=agree)
            results.append(r)
            rows.append(f"| {kind} | {th} | {gb:.3f} | {dec:.2f} | {mdec:.2f} | {pdec:.2f} | "
                        f"{dec / pdec:.2f} | {mdec / pdec:.2f} | {pre:.1f} | {ppre:.1f} | "
                        f"{pre / ppre:.2f} | "
                        + (f"{size:.4f}" if size is not None else "-") + f" | {agree:.0%} |")
            print(rows[-1], flush=True)
    cfg = cortiq.config()
    print(f"\nmachine: {platform.machine()}, cortiq table {cfg['isa']}, CPU features "
          f"{' '.join(cfg['cpu_features'])}, precision {cfg['precision']}")
    print("| type | threads | GB/token | cortiq decode | cortiq decode, mapped | llama.cpp "
          "decode | ratio | ratio, mapped | cortiq prefill | llama.cpp prefill | ratio | "
          "import size ratio | greedy agreement |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"targets at 2 threads: decode >= {TARGETS['decode']}, prefill >= "
          f"{TARGETS['prefill']}, import size <= {TARGETS['size']}")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       f"gguf-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(dict(geometry=g, tokens=a.tokens, prompt=a.prompt, prefill=a.prefill,
                       isa=cfg['isa'], results=results), f, indent=1)
    os.replace(out + ".tmp", out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
