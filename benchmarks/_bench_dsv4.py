"""DeepSeek-V4 decode benchmark (``bench_decode.py --arch deepseek_v4``).

Writes a random-weight DeepSeek-V4 in q8_row (default: dim 1024, 8 layers, 16 heads x
128, 32 experts top-6 with moe_inter 2048, two hash layers, ratio-4 (indexer) and
plain-ratio layers, vocab 32000), decodes with cortiq and reports tokens/s and the
effective GB/s of the weights a token touches (attention, hyper-connections, router,
shared + chosen experts, head) against the read bandwidth measured in the same run
(``_kernels.read_sum`` over a buffer larger than the caches), with the weights
mapped and preloaded (``--preload on|off|both``, default both). Then, unless
``--no-hf``, transformers' DeepseekV4ForCausalLM on the same config in float32 and
bfloat16 (incremental decode with its cache), same thread count.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def geometry(a):
    return dict(dim=a.dim, layers=a.layers, heads=a.heads, head_dim=a.head_dim, rope=a.rope,
                q_lora=a.q_lora, o_groups=a.o_groups, o_lora=a.o_lora, experts=a.experts,
                top_k=a.top_k, inter=a.inter, vocab=a.vocab, window=a.window, hc=4,
                ih=a.index_heads, ihd=a.index_head_dim, topk=a.index_topk,
                ratios=[0 if i % 4 == 0 else (4 if i % 2 else 16) for i in range(a.layers)],
                hash_layers=[0, 1])


def hf_config(g):
    from transformers import DeepseekV4Config
    lt = {0: "sliding_attention", 4: "compressed_sparse_attention",
          16: "heavily_compressed_attention"}
    return DeepseekV4Config(
        vocab_size=g["vocab"], hidden_size=g["dim"], moe_intermediate_size=g["inter"],
        num_hidden_layers=g["layers"], num_attention_heads=g["heads"], num_key_value_heads=1,
        head_dim=g["head_dim"], q_lora_rank=g["q_lora"], qk_rope_head_dim=g["rope"],
        num_experts_per_tok=g["top_k"], n_routed_experts=g["experts"],
        layer_types=[lt[r] for r in g["ratios"]],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        mlp_layer_types=["hash_moe" if i in g["hash_layers"] else "moe" for i in range(g["layers"])],
        sliding_window=g["window"], o_groups=g["o_groups"], o_lora_rank=g["o_lora"],
        index_n_heads=g["ih"], index_head_dim=g["ihd"], index_topk=g["topk"],
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "yarn", "factor": 16.0,
                         "original_max_position_embeddings": 65536, "beta_fast": 32.0,
                         "beta_slow": 1.0})


def write_model(path, g, quant, seed=0):
    """Stream random weights into a CMF file (bounded memory)."""
    from cortiq import cmf
    rng = np.random.default_rng(seed)
    D, H, hd, hc = g["dim"], g["heads"], g["head_dim"], g["hc"]
    E, I, V = g["experts"], g["inter"], g["vocab"]

    def mat(r, c):
        return lambda: (rng.standard_normal((r, c), dtype=np.float32) * np.float32(c ** -0.5))

    def vec(n, base=0.0, s=0.1):
        return lambda: (base + s * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    t, f32 = [], {}

    def add(name, fn, keep=False):
        t.append((name, fn))
        if keep:
            f32[name] = "f32"
    add("model.embed_tokens.weight", mat(V, D))
    add("lm_head.weight", mat(V, D))
    add("model.norm.weight", vec(D, 1.0), True)
    add("model.hc_head_fn", mat(hc, hc * D), True)
    add("model.hc_head_base", vec(hc), True)
    add("model.hc_head_scale", vec(1, 1.0), True)
    for li in range(g["layers"]):
        p, a = f"model.layers.{li}", f"model.layers.{li}.self_attn"
        add(f"{p}.input_layernorm.weight", vec(D, 1.0), True)
        add(f"{p}.post_attention_layernorm.weight", vec(D, 1.0), True)
        add(f"{a}.wq_a.weight", mat(g["q_lora"], D))
        add(f"{a}.q_norm.weight", vec(g["q_lora"], 1.0), True)
        add(f"{a}.wq_b.weight", mat(H * hd, g["q_lora"]))
        add(f"{a}.wkv.weight", mat(hd, D))
        add(f"{a}.kv_norm.weight", vec(hd, 1.0), True)
        add(f"{a}.wo_a.weight", mat(g["o_groups"] * g["o_lora"], H * hd // g["o_groups"]))
        add(f"{a}.wo_b.weight", mat(D, g["o_groups"] * g["o_lora"]))
        add(f"{a}.attn_sink", vec(H), True)
        r = g["ratios"][li]
        if r:
            w = 2 * hd if r == 4 else hd
            add(f"{a}.compressor.wkv.weight", mat(w, D))
            add(f"{a}.compressor.wgate.weight", mat(w, D))
            add(f"{a}.compressor.norm.weight", vec(hd, 1.0), True)
            add(f"{a}.compressor.ape", lambda r=r, w=w: 0.1 * rng.standard_normal((r, w), dtype=np.float32), True)
        if r == 4:
            add(f"{a}.indexer.wq_b.weight", mat(g["ih"] * g["ihd"], g["q_lora"]))
            add(f"{a}.indexer.weights_proj.weight", mat(g["ih"], D))
            add(f"{a}.indexer.compressor.wkv.weight", mat(2 * g["ihd"], D))
            add(f"{a}.indexer.compressor.wgate.weight", mat(2 * g["ihd"], D))
            add(f"{a}.indexer.compressor.norm.weight", vec(g["ihd"], 1.0), True)
            add(f"{a}.indexer.compressor.ape", lambda: 0.1 * rng.standard_normal((4, 2 * g["ihd"]), dtype=np.float32), True)
        for which in ("attn", "ffn"):
            add(f"{p}.hc_{which}_fn", mat((2 + hc) * hc, hc * D), True)
            add(f"{p}.hc_{which}_base", vec((2 + hc) * hc), True)
            add(f"{p}.hc_{which}_scale", vec(3, 1.0), True)
        add(f"{p}.mlp.gate.weight", mat(E, D))
        if li in g["hash_layers"]:
            add(f"{p}.mlp.tid2eid", lambda: np.stack([rng.permutation(E)[:g["top_k"]] for _ in range(V)]).astype(np.float32))
        else:
            add(f"{p}.mlp.expert_bias", vec(E), True)
        for role, (rr, cc) in (("gate", (I, D)), ("up", (I, D)), ("down", (D, I))):
            for e in range(E):
                add(f"{p}.mlp.experts.{e}.{role}_proj.weight", mat(rr, cc))
        add(f"{p}.mlp.shared_expert.gate_proj.weight", mat(I, D))
        add(f"{p}.mlp.shared_expert.up_proj.weight", mat(I, D))
        add(f"{p}.mlp.shared_expert.down_proj.weight", mat(D, I))
    arch = {"arch_name": "deepseek_v4", "hidden_size": D, "num_layers": g["layers"],
            "num_attention_heads": H, "num_kv_heads": 1, "head_dim": hd, "vocab_size": V,
            "rms_norm_eps": 1e-6, "partial_rotary_factor": g["rope"] / hd,
            "sliding_window": g["window"], "intermediate_size": I,
            "max_position_embeddings": 4096,
            "moe": {"num_experts": E, "top_k": g["top_k"], "moe_intermediate_size": I,
                    "shared_expert_intermediate_size": I, "routed_scaling_factor": 1.5},
            "deepseek_v4": {"index_topk": g["topk"]}}
    cmf.write(path, t, arch=arch, quant=quant, dtypes=f32, progress=False)


def touched_bytes(model) -> int:
    """Payload bytes one decode step reads (chosen experts counted at top_k)."""
    cfg = model.cfg
    n = model.head.nbytes + model.embed.nbytes // cfg.vocab + model.hc_head_fn.nbytes
    for L in model.layers:
        n += sum(q.nbytes for q in L.first) + L.wq_b.nbytes + L.wo_a.nbytes + L.wo_b.nbytes
        n += L.hc_attn[0].nbytes + L.hc_ffn[0].nbytes + L.gate.nbytes
        if L.indexer is not None:
            n += L.indexer.wq_b.nbytes
        ex = lambda e: e.w1.nbytes + e.w2.nbytes + e.w3.nbytes  # noqa: E731
        n += ex(L.shared) + cfg.top_k * ex(L.experts[0])
    return n


def read_bw(threads, nbytes=1 << 30, reps=3):
    from cortiq import _kernels as K
    buf = np.ones(nbytes, np.uint8)
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        K.read_sum(buf, threads, 4)  # four streams a thread, as bench_matvec (a)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def bench_cortiq(path, prompt, n_tok, threads, preload=False):
    import cortiq
    from cortiq import cmf
    from cortiq.models.deepseek_v4 import DeepseekV4Model
    cortiq.set_num_threads(threads)
    cf = cmf.open(path, preload=preload)
    m = DeepseekV4Model(cf)
    st = m.new_state()
    m.forward(st, prompt, "none")
    tok = int(np.argmax(m.forward(st, [1], "last")))
    times = []
    for _ in range(n_tok):
        t0 = time.perf_counter()
        tok = int(np.argmax(m.forward(st, [tok], "last")))
        times.append(time.perf_counter() - t0)
    tb = touched_bytes(m)
    cf.close()
    return float(np.median(times)), tb


def bench_hf(g, dtype_name, prompt, n_tok, threads):
    import torch
    from transformers import DeepseekV4ForCausalLM
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = hf_config(g)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    with torch.device("cpu"):
        model = DeepseekV4ForCausalLM(cfg).to(dt).eval()
    try:
        model.set_experts_implementation("eager")
    except Exception:
        pass
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(cfg.n_routed_experts)[:cfg.num_experts_per_tok]
                                     for _ in range(b.shape[0])]))
        out = model(torch.tensor([prompt]), use_cache=True)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        tok = int(out.logits[0, -1].argmax())
        times = []
        for _ in range(n_tok):
            t0 = time.perf_counter()
            out = model(torch.tensor([[tok]]), cache=cache, use_cache=True)
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            tok = int(out.logits[0, -1].float().argmax())
            times.append(time.perf_counter() - t0)
    del model
    return float(np.median(times))


def add_args(p, have=()):
    """DSV4 options; `have` are options the caller's parser already defines."""
    opts = [("--dim", 1024), ("--layers", 8), ("--heads", 16), ("--head-dim", 128),
            ("--rope", 32), ("--q-lora", 512), ("--o-groups", 4), ("--o-lora", 256),
            ("--experts", 32), ("--top-k", 6), ("--inter", 2048), ("--vocab", 32000),
            ("--window", 64), ("--index-heads", 8), ("--index-head-dim", 64),
            ("--index-topk", 16), ("--prompt", 40), ("--tokens", 24), ("--hf-tokens", 8)]
    for name, default in opts:
        if name not in have:
            p.add_argument(name, type=int, default=default)
    if "--quant" not in have:
        p.add_argument("--quant", default="q8_row")
    if "--threads" not in have:
        p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[2])
    p.add_argument("--no-hf", action="store_true", help="skip transformers")
    if "--preload" not in have:
        p.add_argument("--preload", choices=("on", "off", "both"), default=None,
                       help="weights from the file mapping (off), copied to huge-page memory "
                            "(on), or a row each (both, the default)")
    p.add_argument("--keep", default=None, help="write/reuse the CMF file at this path")


def main(a, rest):
    """Entry from bench_decode.py: `a` holds its common options (--quant, --threads,
    --tokens, --prompt, --cache, --quick), `rest` the DSV4 ones."""
    p = argparse.ArgumentParser(prog="bench_decode.py --arch deepseek_v4")
    add_args(p, have=("--quant", "--threads", "--tokens", "--prompt", "--preload"))
    b = p.parse_args(rest)
    for k in ("quant", "threads", "tokens", "prompt", "preload"):
        setattr(b, k, getattr(a, k))
    if getattr(a, "quick", False):
        b.experts, b.inter, b.layers = 16, 512, 4
    if b.keep is None and getattr(a, "cache", None):
        os.makedirs(a.cache, exist_ok=True)
        b.keep = os.path.join(a.cache, f"dsv4-{b.dim}-{b.layers}-{b.experts}-{b.inter}-{b.quant}.cmf")
    run(b)


def run(a):
    g = geometry(a)
    prompt = [int(x) for x in np.random.default_rng(1).integers(2, a.vocab, a.prompt)]
    path = a.keep or os.path.join(tempfile.mkdtemp(prefix="cortiq-dsv4-"), "bench.cmf")
    if not os.path.exists(path):
        t0 = time.perf_counter()
        write_model(path, g, a.quant)
        print(f"wrote {path} ({os.path.getsize(path) / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")
    print(f"geometry: {g}")
    print("| engine | weights | threads | ms/token | tokens/s | GB touched/token | eff. GB/s | read bw GB/s | % of read bw |")
    print("|---|---|---|---|---|---|---|---|---|")
    best = None
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.preload or "both"]
    for th in a.threads:
        for preload in modes:
            bw = read_bw(th)
            sec, tb = bench_cortiq(path, prompt, a.tokens, th, preload)
            gbs = tb / sec / 1e9
            best = sec if best is None else min(best, sec)
            how = f"{a.quant}{', preload' if preload else ''}"
            print(f"| cortiq | {how} | {th} | {sec * 1e3:.1f} | {1 / sec:.2f} | {tb / 1e9:.3f} | "
                  f"{gbs:.2f} | {bw:.2f} | {100 * gbs / bw:.0f} % |", flush=True)
    if not a.no_hf:
        th = max(a.threads)
        for dt in ("float32", "bfloat16"):
            s = bench_hf(g, dt, prompt, a.hf_tokens, th)
            print(f"| transformers | {dt} | {th} | {s * 1e3:.1f} | {1 / s:.2f} | | | | "
                  f"cortiq is {s / best:.1f}x faster |", flush=True)
    if not a.keep:
        os.remove(path)
