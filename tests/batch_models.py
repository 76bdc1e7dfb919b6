"""Small random models for the batching tests, written straight to CMF (no torch):
a Llama-family file (biases, q/k norms, one sliding layer) and the tiny Dory of
tests/reference/hf_tiny.py converted with cortiq.convert."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

from cortiq import cmf

sys.path.insert(0, os.path.dirname(__file__))

VOCAB = 96
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tokenizer_json(vocab: int = VOCAB) -> bytes:
    """Word-level: w3 .. w{vocab-1}, ChatML specials first (<|im_end|> = EOS)."""
    toks = {s: i for i, s in enumerate(SPECIALS)}
    for i in range(len(SPECIALS), vocab):
        toks[f"w{i}"] = i
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    return json.dumps({"version": "1.0", "truncation": None, "padding": None,
                       "added_tokens": added, "normalizer": None,
                       "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
                       "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
                       "model": {"type": "WordLevel", "vocab": toks, "unk_token": "w3"}}).encode()


def llama_tensors(hidden=64, ffn=96, layers=3, heads=4, kv=2, hd=16, vocab=VOCAB, seed=0):
    rng = np.random.default_rng(seed)

    def m(r, c, s=0.12):
        return (rng.standard_normal((r, c)) * s).astype(np.float32)

    def v(n, base=0.0, s=0.2):
        return (base + rng.standard_normal(n) * s).astype(np.float32)
    q, k = heads * hd, kv * hd
    out = {"model.embed_tokens.weight": m(vocab, hidden, 0.5)}
    for i in range(layers):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        out.update({
            f"{p}.input_layernorm.weight": v(hidden, 1.0), f"{a}.q_proj.weight": m(q, hidden),
            f"{a}.k_proj.weight": m(k, hidden), f"{a}.v_proj.weight": m(k, hidden),
            f"{a}.o_proj.weight": m(hidden, q), f"{a}.q_proj.bias": v(q),
            f"{a}.k_proj.bias": v(k), f"{a}.v_proj.bias": v(k),
            f"{a}.q_norm.weight": v(hd, 1.0), f"{a}.k_norm.weight": v(hd, 1.0),
            f"{p}.post_attention_layernorm.weight": v(hidden, 1.0),
            f"{p}.mlp.gate_proj.weight": m(ffn, hidden), f"{p}.mlp.up_proj.weight": m(ffn, hidden),
            f"{p}.mlp.down_proj.weight": m(hidden, ffn)})
    out["model.norm.weight"] = v(hidden, 1.0)
    out["lm_head.weight"] = m(vocab, hidden, 0.3)
    arch = {"arch_name": "qwen3", "hidden_size": hidden, "intermediate_size": ffn,
            "num_layers": layers, "num_attention_heads": heads, "num_kv_heads": kv,
            "head_dim": hd, "vocab_size": vocab, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 7,
            "layer_types": ["FullAttention", "SlidingAttention"] + ["FullAttention"] * (layers - 2)}
    return out, arch


def write_llama(path, quant="f32", seed=0):
    t, arch = llama_tensors(seed=seed)
    cmf.write(path, t, arch=arch, quant=quant, tokenizer_json=tokenizer_json(), progress=False)
    return str(path)


def write_dory(dirpath, quant="f32", seed=0, **params):
    from reference import hf_tiny

    from cortiq.convert import from_hf
    os.makedirs(dirpath, exist_ok=True)
    hf = os.path.join(dirpath, "hf")
    hf_tiny.build(hf, seed=seed, window=3, dtype="bf16", **params)
    out = os.path.join(dirpath, f"dory_{quant}.cmf")
    from_hf(hf, out, quant=quant, progress=False)
    return out


def alone_then_rewound(g, prompts, tok: int):
    """Each prompt fed to a fresh state of model g, then token `tok` run alone (its
    logits kept) and rolled back off again: (the states at their prompts' ends, each
    one's logits for tok alone), for comparing a batch of the same rows."""
    states, alone = [], []
    for p in prompts:
        st = g.new_state()
        g.forward(st, p, prompt=True)
        alone.append(g.forward(st, [tok]))
        g.rollback(st, len(p))
        states.append(st)
    return states, alone
