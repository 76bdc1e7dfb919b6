"""The reference engine's 2-layer DeepSeek-V4 toy as CMF tensors (no torch): layer 0 hash-routed
sliding, layer 1 overlapping compressor + indexer, score-routed."""
from __future__ import annotations

import numpy as np


def w(n, seed):
    i = np.arange(n)
    return (((i * 7 + seed * 13) % 101) / 101.0 - 0.5).astype(np.float32) * 0.3


def toy_tensors(dim=32, nh=4, hd=8, rd=4, ql=16, ol=16, og=2, hc=4, E=8, k=2, inter=16,
                vocab=24, ihd=16, ih=2):
    t = {}
    m = lambda r, c, s: w(r * c, s).reshape(r, c)  # noqa: E731
    t["model.embed_tokens.weight"] = m(vocab, dim, 31)
    t["lm_head.weight"] = m(vocab, dim, 33)
    t["model.norm.weight"] = np.ones(dim, np.float32)
    t["model.hc_head_fn"] = m(hc, hc * dim, 35)
    t["model.hc_head_base"] = w(hc, 37)
    t["model.hc_head_scale"] = np.ones(1, np.float32)
    for li in range(2):
        p = f"model.layers.{li}"
        a = f"{p}.self_attn"
        t[f"{p}.input_layernorm.weight"] = np.ones(dim, np.float32)
        t[f"{p}.post_attention_layernorm.weight"] = np.ones(dim, np.float32)
        t[f"{a}.wq_a.weight"] = m(ql, dim, 1 + li)
        t[f"{a}.q_norm.weight"] = np.ones(ql, np.float32)
        t[f"{a}.wq_b.weight"] = m(nh * hd, ql, 3 + li)
        t[f"{a}.wkv.weight"] = m(hd, dim, 5 + li)
        t[f"{a}.kv_norm.weight"] = np.ones(hd, np.float32)
        t[f"{a}.wo_a.weight"] = m(og * ol, nh * hd // og, 7 + li)
        t[f"{a}.wo_b.weight"] = m(dim, og * ol, 9 + li)
        t[f"{a}.attn_sink"] = np.full(nh, 0.1, np.float32)
        if li == 1:
            t[f"{a}.compressor.wkv.weight"] = m(2 * hd, dim, 11)
            t[f"{a}.compressor.wgate.weight"] = m(2 * hd, dim, 13)
            t[f"{a}.compressor.norm.weight"] = np.ones(hd, np.float32)
            t[f"{a}.compressor.ape"] = np.full((4, 2 * hd), 0.01, np.float32)
            t[f"{a}.indexer.wq_b.weight"] = m(ih * ihd, ql, 41)
            t[f"{a}.indexer.weights_proj.weight"] = m(ih, dim, 43)
            t[f"{a}.indexer.compressor.wkv.weight"] = m(2 * ihd, dim, 45)
            t[f"{a}.indexer.compressor.wgate.weight"] = m(2 * ihd, dim, 47)
            t[f"{a}.indexer.compressor.norm.weight"] = np.ones(ihd, np.float32)
            t[f"{a}.indexer.compressor.ape"] = np.full((4, 2 * ihd), 0.01, np.float32)
        for which, s in (("attn", 15), ("ffn", 19)):
            t[f"{p}.hc_{which}_fn"] = m((2 + hc) * hc, hc * dim, s + li)
            t[f"{p}.hc_{which}_base"] = w((2 + hc) * hc, s + 2 + li)
            t[f"{p}.hc_{which}_scale"] = np.ones(3, np.float32)
        t[f"{p}.mlp.gate.weight"] = m(E, dim, 23 + li)
        if li == 1:
            t[f"{p}.mlp.expert_bias"] = np.zeros(E, np.float32)
        else:
            t[f"{p}.mlp.tid2eid"] = (np.arange(vocab * k) % E).astype(np.float32).reshape(vocab, k)
        for e in range(E):
            ep = f"{p}.mlp.experts.{e}"
            t[f"{ep}.gate_proj.weight"] = m(inter, dim, 40 + e + li * 8)
            t[f"{ep}.down_proj.weight"] = m(dim, inter, 60 + e + li * 8)
            t[f"{ep}.up_proj.weight"] = m(inter, dim, 80 + e + li * 8)
        t[f"{p}.mlp.shared_expert.gate_proj.weight"] = m(inter, dim, 25 + li)
        t[f"{p}.mlp.shared_expert.down_proj.weight"] = m(dim, inter, 27 + li)
        t[f"{p}.mlp.shared_expert.up_proj.weight"] = m(inter, dim, 29 + li)
    arch = {"arch_name": "deepseek_v4", "hidden_size": dim, "num_layers": 2,
            "num_attention_heads": nh, "num_kv_heads": 1, "head_dim": hd, "vocab_size": vocab,
            "rms_norm_eps": 1e-6, "partial_rotary_factor": rd / hd, "sliding_window": 6,
            "intermediate_size": inter, "max_position_embeddings": 4096,
            "moe": {"num_experts": E, "top_k": k, "moe_intermediate_size": inter},
            "deepseek_v4": {"swiglu_limit": 10.0, "index_topk": 8}}
    return t, arch


def tokenizer_json(vocab: int = 24) -> bytes:
    """A word-level tokenizer.json with `vocab` tokens (ids 0 and 1 special)."""
    import json
    toks = {"<bos>": 0, "<eos>": 1}
    for i in range(2, vocab):
        toks[f"w{i}"] = i
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for c, i in (("<bos>", 0), ("<eos>", 1))]
    return json.dumps({"version": "1.0", "truncation": None, "padding": None,
                       "added_tokens": added, "normalizer": None,
                       "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
                       "decoder": None,
                       "model": {"type": "WordLevel", "vocab": toks, "unk_token": "w2"}}).encode()


def write_toy(path, quant="f32", tensors=None, **kw):
    """The toy (or `tensors`) as a CMF file with a tokenizer."""
    from cortiq import cmf
    t, arch = toy_tensors()
    cmf.write(path, tensors if tensors is not None else t, arch=arch, quant=quant,
              tokenizer_json=tokenizer_json(), progress=False, **kw)
    return path
