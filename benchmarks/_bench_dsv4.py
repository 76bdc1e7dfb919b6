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

With ``--release`` the model is written in DeepSeek's release layout (FP8 / FP4) and
converted by cortiq; given llama-cpp-python and a llama.cpp source tree
(``--llama-cpp-src`` or $LLAMA_CPP_SRC), llama.cpp's converter turns the same files into a
GGUF that llama.cpp decodes at the same thread counts, and the per-byte ratio is printed.
llama.cpp loads only compression ratios 0, 4 and 128 and aborts on toy head sizes: use
``--hca-ratio 128 --head-dim 512 --rope 64`` for that comparison.
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
                ratios=[0 if i % 4 == 0 else (4 if i % 2 else a.hca_ratio) for i in range(a.layers)],
                hash_layers=[0, 1], hca=a.hca_ratio)


def hf_config(g):
    from transformers import DeepseekV4Config
    hca = g["hca"]
    lt = {0: "sliding_attention", 4: "compressed_sparse_attention",
          hca: "heavily_compressed_attention"}
    return DeepseekV4Config(
        vocab_size=g["vocab"], hidden_size=g["dim"], moe_intermediate_size=g["inter"],
        num_hidden_layers=g["layers"], num_attention_heads=g["heads"], num_key_value_heads=1,
        head_dim=g["head_dim"], q_lora_rank=g["q_lora"], qk_rope_head_dim=g["rope"],
        num_experts_per_tok=g["top_k"], n_routed_experts=g["experts"],
        layer_types=[lt[r] for r in g["ratios"]],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": hca},
        mlp_layer_types=["hash_moe" if i in g["hash_layers"] else "moe" for i in range(g["layers"])],
        sliding_window=g["window"], o_groups=g["o_groups"], o_lora_rank=g["o_lora"],
        index_n_heads=g["ih"], index_head_dim=g["ihd"], index_topk=g["topk"],
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "yarn", "factor": 16.0,
                         "original_max_position_embeddings": 65536, "beta_fast": 32.0,
                         "beta_slow": 1.0})


def tensor_specs(g, seed=0):
    """[(cmf name, shape, loader, keep_f32)] of a random-weight model of geometry `g`;
    the loaders draw from one seeded stream in list order (call them in order)."""
    rng = np.random.default_rng(seed)
    D, H, hd, hc = g["dim"], g["heads"], g["head_dim"], g["hc"]
    E, inter, V = g["experts"], g["inter"], g["vocab"]
    t = []

    def add(name, shape, fn, keep=False):
        t.append((name, tuple(shape), fn, keep))

    def mat(name, r, c, keep=False):
        add(name, (r, c), lambda: rng.standard_normal((r, c), dtype=np.float32) * np.float32(c ** -0.5), keep)

    def vec(name, n, base=0.0, sd=0.1):
        add(name, (n,), lambda: (base + sd * rng.standard_normal(n, dtype=np.float32)).astype(np.float32), True)

    def small(name, shape):
        add(name, shape, lambda: 0.1 * rng.standard_normal(shape, dtype=np.float32), True)
    mat("model.embed_tokens.weight", V, D)
    mat("lm_head.weight", V, D)
    vec("model.norm.weight", D, 1.0)
    mat("model.hc_head_fn", hc, hc * D, True)
    vec("model.hc_head_base", hc)
    vec("model.hc_head_scale", 1, 1.0)
    for li in range(g["layers"]):
        p, a = f"model.layers.{li}", f"model.layers.{li}.self_attn"
        vec(f"{p}.input_layernorm.weight", D, 1.0)
        vec(f"{p}.post_attention_layernorm.weight", D, 1.0)
        mat(f"{a}.wq_a.weight", g["q_lora"], D)
        vec(f"{a}.q_norm.weight", g["q_lora"], 1.0)
        mat(f"{a}.wq_b.weight", H * hd, g["q_lora"])
        mat(f"{a}.wkv.weight", hd, D)
        vec(f"{a}.kv_norm.weight", hd, 1.0)
        mat(f"{a}.wo_a.weight", g["o_groups"] * g["o_lora"], H * hd // g["o_groups"])
        mat(f"{a}.wo_b.weight", D, g["o_groups"] * g["o_lora"])
        vec(f"{a}.attn_sink", H)
        r = g["ratios"][li]
        if r:
            w = 2 * hd if r == 4 else hd
            mat(f"{a}.compressor.wkv.weight", w, D)
            mat(f"{a}.compressor.wgate.weight", w, D)
            vec(f"{a}.compressor.norm.weight", hd, 1.0)
            small(f"{a}.compressor.ape", (r, w))
        if r == 4:
            mat(f"{a}.indexer.wq_b.weight", g["ih"] * g["ihd"], g["q_lora"])
            mat(f"{a}.indexer.weights_proj.weight", g["ih"], D)
            mat(f"{a}.indexer.compressor.wkv.weight", 2 * g["ihd"], D)
            mat(f"{a}.indexer.compressor.wgate.weight", 2 * g["ihd"], D)
            vec(f"{a}.indexer.compressor.norm.weight", g["ihd"], 1.0)
            small(f"{a}.indexer.compressor.ape", (4, 2 * g["ihd"]))
        for which in ("attn", "ffn"):
            mat(f"{p}.hc_{which}_fn", (2 + hc) * hc, hc * D, True)
            vec(f"{p}.hc_{which}_base", (2 + hc) * hc)
            vec(f"{p}.hc_{which}_scale", 3, 1.0)
        mat(f"{p}.mlp.gate.weight", E, D)
        if li in g["hash_layers"]:
            add(f"{p}.mlp.tid2eid", (V, g["top_k"]), lambda: np.stack(
                [rng.permutation(E)[:g["top_k"]] for _ in range(V)]).astype(np.float32))
        else:
            vec(f"{p}.mlp.expert_bias", E)
        for role, (rr, cc) in (("gate", (inter, D)), ("up", (inter, D)), ("down", (D, inter))):
            for e in range(E):
                mat(f"{p}.mlp.experts.{e}.{role}_proj.weight", rr, cc)
        mat(f"{p}.mlp.shared_expert.gate_proj.weight", inter, D)
        mat(f"{p}.mlp.shared_expert.up_proj.weight", inter, D)
        mat(f"{p}.mlp.shared_expert.down_proj.weight", D, inter)
    return t


def cmf_arch(g):
    return {"arch_name": "deepseek_v4", "hidden_size": g["dim"], "num_layers": g["layers"],
            "num_attention_heads": g["heads"], "num_kv_heads": 1, "head_dim": g["head_dim"],
            "vocab_size": g["vocab"], "rms_norm_eps": 1e-6,
            "partial_rotary_factor": g["rope"] / g["head_dim"],
            "sliding_window": g["window"], "intermediate_size": g["inter"],
            "max_position_embeddings": 4096,
            "moe": {"num_experts": g["experts"], "top_k": g["top_k"],
                    "moe_intermediate_size": g["inter"],
                    "shared_expert_intermediate_size": g["inter"], "routed_scaling_factor": 1.5},
            "deepseek_v4": {"index_topk": g["topk"]}}


def write_model(path, g, quant, seed=0):
    """Stream random weights into a CMF file (bounded memory)."""
    from cortiq import cmf
    specs = tensor_specs(g, seed)
    cmf.write(path, [(n, fn) for n, _, fn, _ in specs], arch=cmf_arch(g), quant=quant,
              dtypes={n: "f32" for n, _, _, keep in specs if keep}, progress=False)


def reference_config(g):
    """config.json of the release-layout bench model, in DeepSeek's reference keys."""
    return {"model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
            "vocab_size": g["vocab"], "hidden_size": g["dim"], "moe_intermediate_size": g["inter"],
            "num_hidden_layers": g["layers"], "num_attention_heads": g["heads"],
            "num_key_value_heads": 1, "head_dim": g["head_dim"], "qk_rope_head_dim": g["rope"],
            "q_lora_rank": g["q_lora"], "o_groups": g["o_groups"], "o_lora_rank": g["o_lora"],
            "n_routed_experts": g["experts"], "num_experts_per_tok": g["top_k"],
            "n_shared_experts": 1, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
            "norm_topk_prob": True, "compress_ratios": list(g["ratios"]) + [0],
            "num_hash_layers": len(g["hash_layers"]), "sliding_window": g["window"],
            "index_n_heads": g["ih"], "index_head_dim": g["ihd"], "index_topk": g["topk"],
            "hc_mult": g["hc"], "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
            "max_position_embeddings": 4096, "num_nextn_predict_layers": 0,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                             "beta_fast": 32, "beta_slow": 1},
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                    "weight_block_size": [128, 128]},
            "expert_dtype": "fp4", "bos_token_id": 0, "eos_token_id": 1}


_RELEASE_FP8 = ("wq_a", "wq_b", "wkv", "wo_a", "wo_b", "compressor.wkv", "compressor.wgate",
                "indexer.wq_b", "shared_expert")


def release_name(c):
    """CMF name -> DeepSeek's reference name."""
    glob = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
            "model.norm.weight": "norm.weight"}
    if c in glob:
        return glob[c]
    if c.startswith("model.hc_head_"):
        return c[len("model."):]
    i, rest = c[len("model.layers."):].split(".", 1)
    rest = rest.replace("self_attn.", "attn.", 1)
    rest = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight":
            "ffn_norm.weight", "mlp.gate.weight": "ffn.gate.weight", "mlp.expert_bias":
            "ffn.gate.bias", "mlp.tid2eid": "ffn.gate.tid2eid"}.get(rest, rest)
    roles = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    if rest.startswith("mlp.experts."):
        _, _, e, role, _ = rest.split(".")
        rest = f"ffn.experts.{e}.{roles[role]}.weight"
    elif rest.startswith("mlp.shared_expert."):
        rest = f"ffn.shared_experts.{roles[rest.split('.')[2]]}.weight"
    return f"layers.{i}.{rest}"


def write_release(out_dir, g, seed=0):
    """The same random model in DeepSeek's release layout: attention, compressor, indexer
    and shared-expert projections FP8 (E4M3, E8M0 per 128x128), routed experts FP4
    (E2M1 packed in I8, E8M0 per 32), embeddings / head / router / norms BF16, the rest
    F32, tid2eid I32 -- one safetensors file written tensor by tensor."""
    import json
    import struct
    from cortiq.convert import microfloat as M
    os.makedirs(out_dir, exist_ok=True)
    specs = tensor_specs(g, seed)
    plan = []  # (release name, dtype, shape, nbytes, encode -> list of bytes per entry)
    for c, shape, fn, keep in specs:
        r = release_name(c)
        n = int(np.prod(shape))
        if ".mlp.experts." in c:
            rows, cols = shape
            plan.append((r, "I8", (rows, cols // 2), n // 2, c, "fp4w"))
            plan.append((r[:-7] + ".scale", "F8_E8M0", (rows, -(-cols // 32)),
                         rows * -(-cols // 32), c, "fp4s"))
        elif any(f".{k}." in c for k in _RELEASE_FP8) and len(shape) == 2:
            bs = M.fp8_block_shape(*shape)
            plan.append((r, "F8_E4M3", shape, n, c, "fp8w"))
            plan.append((r[:-7] + ".scale", "F8_E8M0", bs, bs[0] * bs[1], c, "fp8s"))
        elif c.endswith("tid2eid"):
            plan.append((r, "I32", shape, 4 * n, c, "i32"))
        elif keep:
            plan.append((r, "F32", shape, 4 * n, c, "f32"))
        else:
            plan.append((r, "BF16", shape, 2 * n, c, "bf16"))
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for r, dt, shape, nb, _, _ in plan:
        header[r] = {"dtype": dt, "shape": list(shape), "data_offsets": [at, at + nb]}
        at += nb
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    fns = {c: fn for c, _, fn, _ in specs}
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        pending = None
        for r, dt, shape, nb, c, how in plan:
            if how in ("fp8s", "fp4s"):
                f.write(pending)
                continue
            a = fns[c]()
            if how == "fp8w":
                codes, pending = M.quant_fp8_blocks(a)
                f.write(codes.tobytes())
                pending = pending.tobytes()
            elif how == "fp4w":
                packed, pending = M.quant_fp4_groups(a)
                f.write(packed.tobytes())
                pending = pending.tobytes()
            elif how == "i32":
                f.write(a.astype("<i4").tobytes())
            elif how == "f32":
                f.write(a.astype("<f4").tobytes())
            else:
                b = a.astype(np.float32).view(np.uint32).astype(np.uint64)
                f.write(((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype("<u2").tobytes())
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(reference_config(g), f)
    return out_dir


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
    from cortiq.kernels import _kernels as K
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
    if hasattr(model, "set_experts_implementation"):   # transformers without it: eager already
        model.set_experts_implementation("eager")
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
            ("--index-topk", 16), ("--prompt", 40), ("--tokens", 24), ("--hf-tokens", 8),
            ("--hca-ratio", 16)]  # the compression ratio of the non-indexer compressed layers
    for name, default in opts:
        if name not in have:
            p.add_argument(name, type=int, default=default)
    if "--quant" not in have:
        p.add_argument("--quant", default="q8_row")
    if "--threads" not in have:
        p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[2])
    p.add_argument("--no-hf", action="store_true", help="skip transformers")
    p.add_argument("--release", action="store_true",
                   help="write the model in DeepSeek's release layout (FP8 attention, FP4 "
                        "experts) and convert it with cortiq convert; with llama-cpp-python "
                        "installed, llama.cpp decodes the same file too")
    p.add_argument("--experts-quant", default=None,
                   help="with --release: cortiq's dtype for the routed experts (default q4tp)")
    if "--preload" not in have:
        p.add_argument("--preload", choices=("on", "off", "both"), default=None,
                       help="weights from the file mapping (off), copied to huge-page memory "
                            "(on), or a row each (both, the default)")
    p.add_argument("--keep", default=None, help="write/reuse the CMF file at this path")
    p.add_argument("--llama-cpp-src", default=os.environ.get("LLAMA_CPP_SRC"),
                   help="with --release: a llama.cpp source tree (convert_hf_to_gguf.py, "
                        "conversion/, gguf-py/; e.g. llama-cpp-python's sdist vendor/llama.cpp) "
                        "whose converter turns the release files into the GGUF that "
                        "llama-cpp-python decodes (default: $LLAMA_CPP_SRC)")


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


def requant_report(rel_dir, path, n_planes=6):
    """Relative Frobenius error requantization adds to a few FP4 expert planes."""
    from cortiq import cmf
    from cortiq.convert import hf_deepseek_v4 as C
    _, _, _items, shards, sources = C.plan(rel_dir)
    names = [n for n in sources if sources[n].kind == "fp4"][:: max(1, len(sources) // n_planes)]
    errs = {}
    with cmf.open(path) as f:
        for n in names[:n_planes]:
            v = sources[n].load()
            got = np.asarray(f.tensor(n), np.float32).reshape(v.shape)
            errs[n] = (f.tensors[n].dtype, float(np.linalg.norm(got - v) / np.linalg.norm(v)))
    for s in set(shards.values()):
        s.close()
    return errs


def prompt_logits(path, prompt):
    from cortiq import cmf
    from cortiq.models.deepseek_v4 import DeepseekV4Model
    with cmf.open(path) as cf:
        m = DeepseekV4Model(cf)
        return np.asarray(m.forward(m.new_state(), prompt, "all"), np.float64)


def logits_report(rel_dir, path, prompt):
    """The requantized file's logits over the prompt against the exact (f32) conversion
    of the same release file: max |diff| / logit range, and argmax agreement."""
    from cortiq.convert import hf_deepseek_v4 as C
    exact = path + ".f32.cmf"
    try:
        C.convert(rel_dir, exact, quant="f32", progress=False)
        ref = prompt_logits(exact, prompt)
    finally:
        if os.path.exists(exact):
            os.remove(exact)
    got = prompt_logits(path, prompt)
    rel = float(np.abs(got - ref).max() / (ref.max() - ref.min()))
    return rel, float((got.argmax(-1) == ref.argmax(-1)).mean())


def write_tokenizer(out_dir, vocab=320):
    """A tiny GPT-2-style byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json)
    beside the release files: llama.cpp's converter reads the vocabulary from the model
    directory. Token ids 0 and 1 are the config's BOS / EOS."""
    import json
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<bos>", "<eos>"],
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 8], trainer)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>",
                   "eos_token": "<eos>", "add_bos_token": False}, f)


def llama_cpp_available(src):
    """None when the llama.cpp peer can run, else the one-line reason it cannot."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return ("llama.cpp peer skipped: llama-cpp-python is not installed (pip install "
                "llama-cpp-python; its source distribution ships the converter under "
                "vendor/llama.cpp)")
    if not src:
        return ("llama.cpp peer skipped: no llama.cpp source tree (--llama-cpp-src DIR or "
                "$LLAMA_CPP_SRC, holding convert_hf_to_gguf.py and gguf-py/)")
    for need in ("convert_hf_to_gguf.py", "gguf-py", "conversion"):
        if not os.path.exists(os.path.join(src, need)):
            return f"llama.cpp peer skipped: {src} has no {need}"
    return None


def llama_cpp_convert(src, rel_dir, out_path):
    """Convert the release directory with llama.cpp's converter (FP8 weights -> Q8_0, FP4
    experts repacked losslessly to MXFP4, BF16 / F32 tensors kept as they are)."""
    import subprocess
    import sys
    write_tokenizer(rel_dir)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(src, "gguf-py"), src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    wrapper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_llama_cpp_convert.py")
    cmd = [sys.executable, wrapper, src, rel_dir, "--outfile", out_path, "--outtype", "q8_0"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0 or not os.path.exists(out_path):
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise RuntimeError("llama.cpp's converter failed: " + " | ".join(tail))


_ROUTED = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def gguf_touched_bytes(path, src, top_k, n_experts):
    """Bytes one decode step reads from the GGUF, accounted as touched_bytes does for
    cortiq: every non-expert tensor, top_k / n_experts of the routed experts, the head and
    one embedding row (one row of the hash-routing table)."""
    import sys
    sys.path.insert(0, os.path.join(src, "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    n = 0
    for t in GGUFReader(path).tensors:
        nb = int(t.n_bytes)
        rows = int(np.prod([int(x) for x in t.shape[1:]])) or 1  # ggml shapes: ne0 first
        if t.name == "token_embd.weight" or t.name.endswith("tid2eid.weight"):
            n += nb // rows
        elif any(f".{k}." in t.name for k in _ROUTED):
            n += nb * top_k // n_experts
        else:
            n += nb
    return n


def bench_llama_cpp(path, prompt, n_tok, threads):
    """Median seconds per decoded token (argmax included, as for cortiq) of llama.cpp on
    the GGUF, fed token ids directly."""
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads,
                          n_ctx=len(prompt) + n_tok + 8, n_batch=len(prompt) + 1, verbose=False)
    n_vocab = llm.n_vocab()

    def last_argmax():
        logits = llama_cpp.llama_get_logits(llm.ctx)  # the last evaluated position
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(n_vocab,))))
    llm.eval(prompt)
    llm.eval([1])
    tok = last_argmax()
    times = []
    for _ in range(n_tok):
        t0 = time.perf_counter()
        llm.eval([tok])
        tok = last_argmax()
        times.append(time.perf_counter() - t0)
    llm.close()
    return float(np.median(times))


def prepare_release(a, g, path):
    """Write the release-layout model, convert it with cortiq; returns its directory."""
    from cortiq.convert import hf_deepseek_v4 as C
    rel = os.path.join(os.path.dirname(path), "release")
    t0 = time.perf_counter()
    write_release(rel, g)
    size = os.path.getsize(os.path.join(rel, "model.safetensors"))
    print(f"wrote release layout {rel} ({size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    C.convert(rel, path, quant=a.quant, experts_quant=a.experts_quant or "q4tp", progress=False)
    print(f"cortiq convert --quant {a.quant} --experts-quant {a.experts_quant or 'q4tp'}: "
          f"{os.path.getsize(path) / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")
    return rel


def prepare_llama_cpp(a, g, rel, path):
    """The GGUF llama.cpp converted from the release directory and its bytes per token,
    or None after printing why the peer is skipped."""
    why = llama_cpp_available(a.llama_cpp_src)
    if why is None:
        gg = path + ".gguf"
        t0 = time.perf_counter()
        try:
            llama_cpp_convert(a.llama_cpp_src, rel, gg)
        except RuntimeError as e:
            why = f"llama.cpp peer skipped: {e}"
    if why:
        print(why)
        return None
    print(f"llama.cpp convert_hf_to_gguf --outtype q8_0 (FP8 -> Q8_0, FP4 -> MXFP4): "
          f"{os.path.getsize(gg) / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")
    return gg, gguf_touched_bytes(gg, a.llama_cpp_src, g["top_k"], g["experts"])


def llama_cpp_row(peer, prompt, n_tok, th, cortiq_row):
    """Decode with llama.cpp at `th` threads; print its row and cortiq's ratios."""
    gg, tb = peer
    sec = bench_llama_cpp(gg, prompt, n_tok, th)
    gbs = tb / sec / 1e9
    c_sec, c_tb, bw = cortiq_row
    print(f"| llama.cpp | Q8_0 + MXFP4 experts, from FP8/FP4 | {th} | {sec * 1e3:.1f} | "
          f"{1 / sec:.2f} | {tb / 1e9:.3f} | {gbs:.2f} | {bw:.2f} | {100 * gbs / bw:.0f} % |")
    print(f"cortiq / llama.cpp at {th} thread(s): {sec / c_sec:.2f}x tokens/s, "
          f"{(c_tb / c_sec) / (tb / sec):.2f}x per byte (target >= 1.15 at 2 threads)", flush=True)


def run(a):
    g = geometry(a)
    prompt = [int(x) for x in np.random.default_rng(1).integers(2, a.vocab, a.prompt)]
    path = a.keep or os.path.join(tempfile.mkdtemp(prefix="cortiq-dsv4-"), "bench.cmf")
    rel = None
    if getattr(a, "release", False):
        rel = prepare_release(a, g, path)
        for n, (dt, e) in requant_report(rel, path).items():
            print(f"requantization FP4 -> {dt}: {n}: relative error {e:.4f}")
        r, agree = logits_report(rel, path, prompt)
        print(f"requantization on the logits (prompt of {len(prompt)}, against the exact f32 "
              f"conversion): max |diff| / range {r:.4f}, argmax agreement {agree:.0%}")
    elif not os.path.exists(path):
        t0 = time.perf_counter()
        write_model(path, g, a.quant)
        print(f"wrote {path} ({os.path.getsize(path) / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")
    peer = prepare_llama_cpp(a, g, rel, path) if rel is not None else None
    print(f"geometry: {g}")
    print("| engine | weights | threads | ms/token | tokens/s | GB touched/token | eff. GB/s | read bw GB/s | % of read bw |")
    print("|---|---|---|---|---|---|---|---|---|")
    best = None
    cortiq_rows = {}  # threads -> (s/token, bytes/token, read bw), the mapped-weights row
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.preload or "both"]
    for th in a.threads:
        for preload in modes:
            bw = read_bw(th)
            sec, tb = bench_cortiq(path, prompt, a.tokens, th, preload)
            gbs = tb / sec / 1e9
            best = sec if best is None else min(best, sec)
            how = a.quant if rel is None else f"{a.quant} + {a.experts_quant or 'q4tp'} experts, from FP8/FP4"
            how += ", preload" if preload else ""
            print(f"| cortiq | {how} | {th} | {sec * 1e3:.1f} | {1 / sec:.2f} | {tb / 1e9:.3f} | "
                  f"{gbs:.2f} | {bw:.2f} | {100 * gbs / bw:.0f} % |", flush=True)
            if not preload or th not in cortiq_rows:
                cortiq_rows[th] = (sec, tb, bw)
        if peer is not None:  # right after cortiq's rows, under the same machine load
            llama_cpp_row(peer, prompt, a.tokens, th, cortiq_rows[th])
    if not a.no_hf:
        th = max(a.threads)
        for dt in ("float32", "bfloat16"):
            s = bench_hf(g, dt, prompt, a.hf_tokens, th)
            print(f"| transformers | {dt} | {th} | {s * 1e3:.1f} | {1 / s:.2f} | | | | "
                  f"cortiq is {s / best:.1f}x faster |", flush=True)
    if not a.keep:
        os.remove(path)
    if peer is not None:
        os.remove(peer[0])
    if rel is not None:
        import shutil
        shutil.rmtree(rel, ignore_errors=True)
