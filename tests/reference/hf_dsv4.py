"""Tiny random DeepSeek-V4 models in transformers (>= 5.23), for parity and converter tests.

Needs torch + transformers (test-only; cortiq never imports torch).

``tiny_config(**over)`` -> ``DeepseekV4Config`` where every feature fires within 40
tokens: a sliding window shorter than the sequence, ratio-4 (CSA: overlapping
compressor + indexer with ``index_topk`` below the number of entries) layers, a
plain-ratio (HCA) layer, hash layers, YaRN on the compress rope, a small
``swiglu_limit`` so the clamp bites.
``build(cfg, seed)`` -> a DeepseekV4ForCausalLM in float32 with every parameter redrawn
from a seeded generator (HF's init leaves sinks, biases and ``position_bias`` at zero and
``tid2eid`` all zeros); ``tid2eid`` rows name distinct experts.
``save(model, out_dir)`` -> ``save_pretrained`` + a small tokenizer and chat template.
``full_logits(model, ids)`` -> HF's full-sequence logits [T, vocab] (float64 numpy).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for m in messages %}<｜{{ m['role'] }}｜>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)


def tiny_config(**over):
    from transformers import DeepseekV4Config
    kw = dict(
        vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=5,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, q_lora_rank=24,
        qk_rope_head_dim=8, num_experts_per_tok=2, n_routed_experts=8, n_shared_experts=1,
        routed_scaling_factor=1.5, rope_theta=10000.0, compress_rope_theta=160000.0,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention", "compressed_sparse_attention",
                     "sliding_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=0.6, sliding_window=6,
        o_groups=2, o_lora_rank=12, index_n_heads=16, index_head_dim=16, index_topk=3,
        rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "factor": 16.0,
                         "original_max_position_embeddings": 65536, "beta_fast": 32.0,
                         "beta_slow": 1.0},
    )
    kw.update(over)
    return DeepseekV4Config(**kw)


def build(cfg, seed: int = 0, scale: float = 0.3):
    import torch
    from transformers import DeepseekV4ForCausalLM
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    else:   # older spelling
        model.config._experts_implementation = "eager"
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("scale"):
                p.copy_(0.5 + 0.5 * torch.rand(p.shape, generator=g))
            elif name.endswith(("sinks",)):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 1 or name.endswith(("base", "position_bias")):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (scale * 3.0 / fan_in ** 0.5))
        E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                rows = [torch.randperm(E, generator=g)[:k] for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows).to(b.dtype))
            elif name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=g))
    return model


def tokenizer_files(out_dir: Path, vocab: int):
    """A word-level tokenizer.json with `vocab` tokens, and its configs."""
    toks = {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1}
    for i in range(2, vocab):
        toks[f"w{i}"] = i
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": 0, "content": "<｜begin▁of▁sentence｜>", "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False, "special": True},
                            {"id": 1, "content": "<｜end▁of▁sentence｜>", "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
           "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
           "post_processor": None, "decoder": None,
           "model": {"type": "WordLevel", "vocab": toks, "unk_token": "w2"}}
    (out_dir / "tokenizer.json").write_text(json.dumps(tok))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
        "chat_template": CHAT_TEMPLATE}))


def save(model, out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer_files(out, model.config.vocab_size)
    return out


def full_logits(model, ids) -> np.ndarray:
    import torch
    with torch.no_grad():
        out = model(torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    return out.logits[0].double().numpy()


def sequence(vocab: int, n: int, seed: int = 1) -> list:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, vocab, n)]
