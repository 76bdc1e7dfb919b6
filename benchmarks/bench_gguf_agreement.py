"""Greedy agreement with llama.cpp, and exactness, on GGUFs made by llama.cpp's quantizer.

Models: the tiny trained Llama, Qwen3 and Mistral of ``_trained_tiny.py`` (trained on
the first run, cached), each written as an F16 GGUF and quantized by
``llama_cpp.llama_model_quantize`` to Q4_K_M (and Q6_K, Q8_0 for the Llama); and, for
contrast, the random-weight Llama of ``bench_gguf.py`` (its ``--quick`` geometry, random
token prompts), whose next-token distribution is nearly flat.

For every file and every prompt (held-out standard-library text the models never saw),
llama.cpp runs its greedy continuation of `--steps` tokens; every engine is then
teacher-forced on that continuation (a free-running comparison would only measure the
first near-tie), and at each step:

* agreement: cortiq's argmax (default precision: int8 activations per 32 values) is
  llama.cpp's token (q8_K activations per 256 for the K-quants, q8_0 per 32 for Q8_0);
* near ties: of the disagreements, the share where llama.cpp's own top-2 logit gap is
  below `--near` (a tie that any activation rounding may flip);
* against float32: transformers' float32 forward of the weights the file holds
  (dequantized by the ``gguf`` package) gives a third argmax; each engine's agreement
  with it says which one the rounding moved;
* exactness: cortiq's exact logits (``precision="exact"``) against that float32 forward,
  max abs error and max abs error over the largest |logit|.

    PYTHONPATH=src:$LLAMA_CPP_SITE python benchmarks/bench_gguf_agreement.py \\
        [--prompts 4] [--steps 64] [--no-random] [--cache DIR]

Results go to ``benchmarks/results/gguf-agreement-*.json``; the table is printed.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import _bench_llama as bl  # noqa: E402
import _trained_tiny as tt  # noqa: E402
import bench_gguf  # noqa: E402

FILES = [("llama", "Q4_K_M"), ("llama", "Q6_K"), ("llama", "Q8_0"), ("qwen3", "Q4_K_M"),
         ("mistral", "Q4_K_M")]
RANDOM_TYPES = ["Q4_K_M", "Q6_K", "Q8_0"]


def llama_cpp_run(path, prompt, steps, threads):
    """llama.cpp's greedy continuation and its logits at every step ([steps, vocab])."""
    from llama_cpp import Llama
    ref = Llama(model_path=str(path), n_ctx=len(prompt) + steps + 8, n_threads=threads,
                n_threads_batch=threads, verbose=False, logits_all=True)
    try:
        ref.eval(prompt)
        tokens, logits = [], []
        for _ in range(steps):
            row = np.array(ref.scores[ref.n_tokens - 1], np.float32)
            logits.append(row)
            tokens.append(int(np.argmax(row)))
            ref.eval([tokens[-1]])
    finally:
        ref.close()
    return tokens, np.stack(logits)


def cortiq_logits(path, ids, steps, threads, precision):
    """cortiq's logits at the last `steps` positions of `ids`, fed one token at a time
    after the prompt (the decode path)."""
    import cortiq
    with cortiq.LLM(str(path), n_threads=threads, precision=precision) as llm:
        s = llm.session()
        out = [s.feed(ids[:len(ids) - steps + 1], want="last")]
        for t in ids[len(ids) - steps + 1:]:
            out.append(s.feed([t], want="last"))
    return np.stack(out)


def top2_gap(logits):
    part = np.sort(logits, axis=-1)[:, -2:]
    return part[:, 1] - part[:, 0]


def measure(path, prompts, steps, threads, near, hf_model=None):
    """The per-file figures over all prompts (see the module docstring)."""
    from reference import hf_llama as H
    from reference.gguf_dequant import load_dequantized
    if hf_model is not None:
        load_dequantized(hf_model, path)
    agree = exact_agree = f32_c = f32_l = n = dis = dis_near = 0
    gaps, dis_gaps, err_abs, err_rel = [], [], 0.0, 0.0
    for prompt in prompts:
        theirs, lc = llama_cpp_run(path, prompt, steps, threads)
        ids = list(prompt) + theirs[:-1]
        mine = cortiq_logits(path, ids, steps, threads, "auto").argmax(-1)
        ex = cortiq_logits(path, ids, steps, threads, "exact")
        gap = top2_gap(lc)
        ok = mine == np.asarray(theirs)
        agree += int(ok.sum())
        exact_agree += int((ex.argmax(-1) == np.asarray(theirs)).sum())
        dis += int((~ok).sum())
        dis_near += int(((~ok) & (gap < near)).sum())
        gaps.extend(gap.tolist())
        dis_gaps.extend(gap[~ok].tolist())
        n += steps
        if hf_model is not None:
            ref = H.full_logits(hf_model, ids)[len(prompt) - 1:]
            f32 = ref.argmax(-1)
            f32_c += int((mine == f32).sum())
            f32_l += int((np.asarray(theirs) == f32).sum())
            e = float(np.abs(ex - ref).max())
            err_abs = max(err_abs, e)
            err_rel = max(err_rel, e / float(np.abs(ref).max()))
    r = dict(steps=n, agreement=agree / n, exact_agreement=exact_agree / n,
             disagreements=dis, near_tie_disagreements=dis_near,
             near_tie_share=(dis_near / dis) if dis else None,
             median_top2_gap=float(np.median(gaps)),
             disagreement_gaps=[round(g, 4) for g in dis_gaps])
    if hf_model is not None:
        r.update(cortiq_vs_f32=f32_c / n, llamacpp_vs_f32=f32_l / n,
                 exact_max_abs=err_abs, exact_max_rel=err_rel)
    return r


def trained_file(family, kind, cache, threads):
    hf_dir = tt.trained(family, cache)
    f16 = os.path.join(cache, f"{os.path.basename(hf_dir)}-f16.gguf")
    if not os.path.exists(f16):
        tt.write_f16_gguf(hf_dir, f16)
    path = os.path.join(cache, f"{os.path.basename(hf_dir)}-{kind.lower()}.gguf")
    if not os.path.exists(path):
        bench_gguf.quantize(f16, path, kind, threads)
    return hf_dir, path


def random_file(kind, cache, threads):
    g = dict(bl.QUICK)
    tag = f"llama-{g['hidden']}-{g['layers']}-{g['ffn']}-{g['vocab']}"
    f16 = os.path.join(cache, tag + "-f16.gguf")
    if not os.path.exists(f16):
        tmp = f16 + f".tmp-{os.getpid()}"
        bench_gguf.write_f16(tmp, g)
        os.replace(tmp, f16)
    path = os.path.join(cache, f"{tag}-{kind.lower()}.gguf")
    if not os.path.exists(path):
        bench_gguf.quantize(f16, path, kind, threads)
    return g, path


def _pct(x):
    return "-" if x is None else f"{x:.1%}"


def row(model, kind, r):
    f32 = (f"{_pct(r['cortiq_vs_f32'])} / {_pct(r['llamacpp_vs_f32'])} | "
           f"{r['exact_max_abs']:.1e} | {r['exact_max_rel']:.1e}"
           if "exact_max_abs" in r else "- | - | -")
    return (f"| {model} | {kind} | {r['steps']} | **{_pct(r['agreement'])}** | "
            f"{_pct(r['exact_agreement'])} | {r['disagreements']} | "
            f"{_pct(r['near_tie_share'])} | {r['median_top2_gap']:.3f} | {f32} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=4, help="held-out prompts per file")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--near", type=float, default=0.05, help="near-tie logit gap")
    p.add_argument("--no-random", action="store_true", help="skip the random-model rows")
    p.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                   "cortiq-bench", "trained"))
    p.add_argument("--random-cache",
                   default=os.path.join(tempfile.gettempdir(), "cortiq-bench"))
    a = p.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        sys.exit(f"llama_cpp is not importable ({e}): build llama-cpp-python from source "
                 "(docs/PERFORMANCE.md §7.4) to make and compare the GGUFs")
    import cortiq
    prompts = tt.held_out_ids(a.cache, a.prompt, a.prompts)
    results, rows = [], []
    for family, kind in FILES:
        hf_dir, path = trained_file(family, kind, a.cache, a.threads)
        r = measure(path, prompts, a.steps, a.threads, a.near, hf_model=tt.load(hf_dir))
        with open(os.path.join(hf_dir, "training.json")) as f:
            training = json.load(f)
        r.update(model=f"trained {family}", type=kind,
                 tensor_types=bench_gguf.tensor_types(path), training=training)
        results.append(r)
        rows.append(row(r["model"], kind, r))
        print(rows[-1], flush=True)
    if not a.no_random:
        os.makedirs(a.random_cache, exist_ok=True)
        rng = np.random.default_rng(1)
        for kind in RANDOM_TYPES:
            g, path = random_file(kind, a.random_cache, a.threads)
            rp = [[int(x) for x in rng.integers(259, g["vocab"], a.prompt)]
                  for _ in range(a.prompts)]
            r = measure(path, rp, a.steps, a.threads, a.near)
            r.update(model="random llama (bench_gguf --quick)", type=kind, geometry=g)
            results.append(r)
            rows.append(row(r["model"], kind, r))
            print(rows[-1], flush=True)
    cfg = cortiq.config()
    print(f"\nmachine: {platform.machine()}, cortiq table {cfg['isa']}, precision "
          f"{cfg['precision']}; {a.prompts} prompts x {a.steps} steps; near tie: gap < "
          f"{a.near}")
    print("| model | type | steps | agreement | exact-precision agreement | disagreements "
          "| of them near ties | median llama.cpp top-2 gap | argmax = float32's, cortiq / "
          "llama.cpp | exact vs float32 max abs | max rel |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    out = os.path.join(HERE, "results", f"gguf-agreement-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(dict(isa=cfg["isa"], prompts=a.prompts, prompt=a.prompt, steps=a.steps,
                       near=a.near, threads=a.threads, results=results), f, indent=1)
    os.replace(out + ".tmp", out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
