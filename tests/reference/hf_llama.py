"""Tiny random Llama / Mistral / Qwen2 / Qwen3 checkpoints written by transformers.

``CASES`` name one small configuration per family (plus a tied, biased Llama) where the
family's features fire within a few dozen tokens: Llama-3 rope scaling, linear scaling,
qkv/o/mlp biases, tied embeddings, Mistral's sliding window, Qwen2's YaRN and a Qwen2
layer that slides (max_window_layers), Qwen3's q/k norms. ``build(case)`` returns the
HF model with every weight random (norm weights too, so a misplaced norm shows);
``save(model, dir)`` writes it with a word-level ``tokenizer.json`` and a ChatML
template.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

BASE = dict(vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=2, pad_token_id=None)

CASES = {
    "llama3": ("LlamaConfig", dict(
        rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 1024},
        tie_word_embeddings=False)),
    "llama_tied_bias": ("LlamaConfig", dict(
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        tie_word_embeddings=True, attention_bias=True, mlp_bias=True, num_key_value_heads=4)),
    "mistral": ("MistralConfig", dict(sliding_window=5, head_dim=24, num_hidden_layers=3,
                                      tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", dict(
        rope_parameters={"rope_type": "yarn", "rope_theta": 1.0e6, "factor": 4.0,
                         "original_max_position_embeddings": 16},
        use_sliding_window=True, sliding_window=6, max_window_layers=1,
        max_position_embeddings=64, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=32, num_attention_heads=4, num_key_value_heads=1,
                                  tie_word_embeddings=False)),
}
MODEL_CLASS = {"LlamaConfig": "LlamaForCausalLM", "MistralConfig": "MistralForCausalLM",
               "Qwen2Config": "Qwen2ForCausalLM", "Qwen3Config": "Qwen3ForCausalLM"}


def config(case: str, **over):
    import transformers
    cls, params = CASES[case]
    kw = {**BASE, **params, **over}
    return getattr(transformers, cls)(**kw)


def build(case: str, seed: int = 0, scale: float = 0.08, **over):
    import torch
    import transformers
    cfg = config(case, **over)
    torch.manual_seed(seed)
    model = getattr(transformers, MODEL_CLASS[type(cfg).__name__])(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))
    model.tie_weights()
    return model


def tokenizer_files(out_dir: Path, vocab: int):
    """A word-level tokenizer.json with `vocab` ids (ChatML specials first), its configs."""
    toks = {s: i for i, s in enumerate(SPECIALS)}
    for i in range(len(SPECIALS), vocab):
        toks[f"w{i}"] = i
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
           "post_processor": None, "decoder": {"type": "WordPiece", "prefix": "##",
                                               "cleanup": False},
           "model": {"type": "WordLevel", "vocab": toks, "unk_token": "w3"}}
    (out_dir / "tokenizer.json").write_text(json.dumps(tok))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "chat_template": CHATML}))


def save(model, out_dir) -> Path:
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
