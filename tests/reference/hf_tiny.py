"""Tiny random Dory checkpoints in the Hugging Face layout, for converter and parity tests.

``build(out_dir, **params)`` writes

* ``config.json`` -- the keys of vLLM's ``DoryConfig`` (``hybrid_layer_pattern``,
  ``swa_window_size``, ``init_method_std``, ``rope_theta``/``rope_theta_2`` with
  ``rope_profile_layers`` 2 on 'S' layers and 1 elsewhere, the fixed nGPT flags, ...),
* ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` + an index when
  ``shards > 1``) holding f32 tensors via ``safetensors.numpy`` -- or ``dtype="bf16"``
  tensors written with the same tiny on-disk format (numpy has no bfloat16),
* ``tokenizer.json`` -- a byte-level BPE trained with ``tokenizers`` on a small corpus,
  with ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` as added special tokens,
* ``tokenizer_config.json`` and ``generation_config.json``, and a ChatML template either as
  ``chat_template.jinja`` (``chat_template="file"``), inside ``tokenizer_config.json``
  (``"config"``) or nowhere (``None``).

and returns ``(tensors, config)``: the HF-named float32 arrays exactly as stored (after
bf16 rounding when ``bf16_values``) and the config dict. ``make(**params)`` gives the same
without touching the disk. Values are bf16-representable by default (real checkpoints are
bf16), so f16 storage of the scale vectors in a CMF file is lossless.
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import numpy as np

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a looped normalized transformer keeps every hidden state on the unit sphere",
    "sliding window attention reads only the last few keys of the sequence",
    "the recurrent block runs twice with the input mixed back before each pass",
    "hello world this is a tiny tokenizer for tests of the dory converter",
]


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Nearest bf16 value (round half to even) as float32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def hf_config(*, hidden=32, heads=4, kv_heads=2, head_dim=8, mlp=48, pattern="S-*-S-*-S-*-",
              blocks=(4, 4, 4), loops=2, window=3, vocab=96, kv_mode="per_loop",
              std=0.02, alpha_init=0.05, gate_init=None, rope_theta=1.0e6,
              rope_theta_2=1.0e4, max_pos=512) -> dict:
    """The HF ``config.json`` dict of a Dory model (vLLM ``DoryConfig`` keys)."""
    n = len(pattern)
    n_in, n_rec, n_out = blocks
    if n_in + n_rec + n_out != n:
        raise ValueError(f"blocks {blocks} do not add up to the {n} layers of {pattern!r}")
    return {
        "architectures": ["DoryForCausalLM"],
        "model_type": "dory",
        "dory_format_version": 1,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": n,
        "intermediate_size": mlp,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "attention_head_dim": head_dim,
        "head_dim": head_dim,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": False,
        "hybrid_layer_pattern": pattern,
        "swa_window_size": window,
        "swa_num_attention_heads": heads,
        "swa_num_key_value_heads": kv_heads,
        "swa_head_dim": head_dim,
        "rope_theta": rope_theta,
        "partial_rotary_factor": 1.0,
        "rope_theta_2": rope_theta_2,
        "partial_rotary_factor_2": 1.0,
        "rope_profile_layers": [2 if ch == "S" else 1 for ch in pattern],
        "no_rope_layers": [0] * n,
        "ngpt": True,
        "fngpt": True,
        "init_method_std": std,
        "ngpt_alpha_init": alpha_init,
        "ngpt_enable_final_norm": False,
        "attention_output_gate": True,
        "attention_output_gate_logit_scale_init": gate_init,
        "mlp_hidden_act": "silu",
        "mlp_bias": False,
        "attention_bias": False,
        "n_input_layers": n_in,
        "n_recurrent_layers": n_rec,
        "n_output_layers": n_out,
        "n_recurrent_loops": loops,
        "recurrent_kv_cache_mode": kv_mode,
        "initial_state": "input_copy",
        "input_transform": "residual",
        "output_transform": "replace",
        "mixer_type": None,
        "bos_token_id": None,
        "eos_token_id": 0,
    }


def random_tensors(config: dict, seed: int = 0, bf16_values: bool = True,
                   weight_std: float = 0.25) -> dict[str, np.ndarray]:
    """HF-named float32 tensors for ``config``. Scale vectors are drawn so the effective
    (load-transformed) values land where a trained model keeps them: step sizes ~0.1-0.3,
    s_q ~ hd, s_g ~ g0, suv*sqrt(H) ~ 1, logit scale ~ 1-3."""
    rng = np.random.default_rng(seed)
    c = config
    H, ffn, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    nh, nk, hd = c["num_attention_heads"], c["num_key_value_heads"], c["attention_head_dim"]
    std = c["init_method_std"]
    u = lambda n, lo=0.7, hi=1.3: rng.uniform(lo, hi, n)  # noqa: E731

    def mat(r, k, s=weight_std):
        return rng.normal(0.0, s, (r, k))

    t = {"backbone.embeddings.weight": rng.normal(0.0, 1.0, (V, H)),
         "lm_head.weight": mat(V, H, 1.0),
         "lm_head.logit_scale": u(V, 1.0, 3.0) * std}
    for i, ch in enumerate(c["hybrid_layer_pattern"]):
        p, m = f"backbone.layers.{i}", f"backbone.layers.{i}.mixer"
        if ch == "-":
            t[f"{m}.gate_proj.weight"] = mat(ffn, H)
            t[f"{m}.up_proj.weight"] = mat(ffn, H)
            t[f"{m}.down_proj.weight"] = mat(H, ffn)
            t[f"{m}.suv_gate"] = u(ffn) / math.sqrt(H)
            t[f"{m}.suv_up"] = u(ffn) / math.sqrt(H)
            t[f"{p}.mlp_alpha"] = u(H) * std * 4.0
        else:
            t[f"{m}.q_proj.weight"] = mat(nh * hd, H)
            t[f"{m}.k_proj.weight"] = mat(nk * hd, H)
            t[f"{m}.v_proj.weight"] = mat(nk * hd, H)
            t[f"{m}.g_proj.weight"] = mat(nh * hd, H)
            t[f"{m}.o_proj.weight"] = mat(H, nh * hd)
            t[f"{m}.sqk"] = u(nh * hd) * std
            t[f"{m}.s_gate"] = u(nh * hd) * std
            t[f"{p}.attn_alpha"] = u(H) * std * 4.0
    out = {}
    for k, v in t.items():
        v = v.astype(np.float32)
        out[k] = bf16_round(v) if bf16_values else v
    return out


def make(seed: int = 0, bf16_values: bool = True, **params) -> tuple[dict, dict]:
    """``(tensors, config)`` in memory; params as in ``hf_config``."""
    config = hf_config(**params)
    return random_tensors(config, seed=seed, bf16_values=bf16_values), config


def train_tokenizer(vocab: int):
    """A byte-level BPE (``tokenizers.Tokenizer``) of at most ``vocab`` ids, specials first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                                  show_progress=False, min_frequency=1)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    if tok.get_vocab_size() > vocab:
        raise ValueError(f"vocab {vocab} is too small for the tokenizer's alphabet "
                         f"({tok.get_vocab_size()} ids)")
    return tok


def save_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                     dtype: str = "f32") -> None:
    """Write one safetensors file: f32 through ``safetensors.numpy``, bf16 by hand."""
    if dtype == "f32":
        from safetensors.numpy import save_file
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
                  str(path), metadata={"format": "pt"})
        return
    if dtype != "bf16":
        raise ValueError(f"dtype {dtype!r}: want f32 or bf16")
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for k in sorted(tensors):
        raw = (np.ascontiguousarray(tensors[k], dtype=np.float32).view(np.uint32) >> 16)
        raw = raw.astype("<u2").tobytes()
        header[k] = {"dtype": "BF16", "shape": list(tensors[k].shape),
                     "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def build(out_dir: str | os.PathLike, *, seed: int = 0, shards: int = 1, dtype: str = "f32",
          chat_template: str | None = "file", tokenizer: bool = True, bf16_values: bool = True,
          **params) -> tuple[dict, dict]:
    """Write a tiny HF Dory directory; returns ``(tensors, config)`` (values as stored)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if dtype == "bf16":
        bf16_values = True
    tensors, config = make(seed=seed, bf16_values=bf16_values, **params)
    eos_id = 0
    if tokenizer:
        tok = train_tokenizer(config["vocab_size"])
        tok.save(str(out / "tokenizer.json"))
        eos_id = tok.token_to_id("<|endoftext|>")
        tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                "bos_token": None, "pad_token": "<|endoftext|>", "model_max_length": 512}
        if chat_template == "config":
            tcfg["chat_template"] = CHATML
        (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
        if chat_template == "file":
            (out / "chat_template.jinja").write_text(CHATML)
    config["eos_token_id"] = eos_id
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos_id]}))
    names = list(tensors)
    if shards <= 1:
        save_safetensors(out / "model.safetensors", tensors, dtype)
    else:
        weight_map = {}
        for s in range(shards):
            part = names[s::shards]
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            save_safetensors(out / fname, {k: tensors[k] for k in part}, dtype)
            weight_map.update({k: fname for k in part})
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    return tensors, config
