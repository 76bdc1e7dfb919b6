"""Write Llama-family weights as a GGUF file with the ``gguf`` package (tests, benchmarks).

``write(path, tensors, arch, ...)`` takes HF-named float32 arrays and the CMF-style
arch facts (arch_name, sizes, eps, rope) and lays them out the way llama.cpp's
converter does: ggml names, q/k rows (weights and biases) permuted for ``llama`` (interleaved rope),
``rope_freqs.weight`` for Llama-3 scaling, one GGML type per matrix (``types``: a
name -> type function), 1-D tensors F32, and a tokenizer (``gpt2`` byte-level BPE from
a ``tokenizers`` BPE tokenizer, or raw ``llama`` SentencePiece pieces/scores/types).
"""
from __future__ import annotations

import json

import numpy as np

_LAYER = {"input_layernorm.weight": "attn_norm.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
          "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
          "self_attn.o_proj.weight": "attn_output.weight",
          "self_attn.o_proj.bias": "attn_output.bias", "mlp.gate_proj.bias": "ffn_gate.bias",
          "mlp.up_proj.bias": "ffn_up.bias", "mlp.down_proj.bias": "ffn_down.bias",
          "self_attn.q_norm.weight": "attn_q_norm.weight",
          "self_attn.k_norm.weight": "attn_k_norm.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def ggml_name(hf: str) -> str:
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{_LAYER[rest]}"


def permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF's q/k row order -> llama.cpp's (as its convert_hf_to_gguf does)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def gpt2_vocab(tokenizer_json: str | bytes, vocab_size: int):
    """(tokens, types, merges) of a byte-level BPE tokenizer.json, padded to vocab_size."""
    doc = json.loads(tokenizer_json)
    vocab = doc["model"]["vocab"]
    tokens = [None] * max(vocab_size, len(vocab))
    for t, i in vocab.items():
        tokens[i] = t
    types = [1] * len(tokens)
    for a in doc.get("added_tokens") or []:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = 3 if a.get("special") else 4
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i], types[i] = f"<|unused_{i}|>", 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    return tokens, types, merges


#: byte offsets of the f16 super-block scales (d, dmin) in the block types the gguf
#: package cannot quantize
_F16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (208,), "IQ4_XS": (0,), "IQ2_XXS": (0,), "IQ2_XS": (0,),
               "IQ3_XXS": (0,)}


def random_blocks(qtype, rows: int, cols: int, seed: int = 0,
                  peak: float = 0.1) -> np.ndarray:
    """Random [rows, bytes per row] blocks of ggml type `qtype` whose f16 scales are set
    so that the largest decoded weight is about `peak` (random codes and sub-scales;
    the gguf package decodes them)."""
    import gguf
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows, cols // elems, size), dtype=np.uint8)
    fields = _F16_FIELDS[qtype.name]

    def set_scale(v):
        for off in fields:
            b[..., off:off + 2] = np.full(b.shape[:2], v, np.float16).view(np.uint8).reshape(
                *b.shape[:2], 2)
    set_scale(1.0)
    top = float(np.abs(gguf.quants.dequantize(b.reshape(rows, -1), qtype)).max())
    set_scale(peak / top)
    return b.reshape(rows, -1)


def write(path, tensors: dict, arch: dict, *, types=None, tokenizer: dict | None = None,
          chat_template: str | None = None, split_max_tensors: int = 0,
          small_first_shard: bool = False) -> list:
    """Write a GGUF file. `tensors`: HF name -> float32 array; `arch`: arch_name,
    hidden_size, intermediate_size, num_layers, num_attention_heads, num_kv_heads,
    head_dim, max_position_embeddings, rms_norm_eps, rope_theta, and optionally
    rope_freq_factors / yarn / sliding_window. `types(name, array)` -> GGMLQuantizationType.
    `tokenizer`: {"model": "gpt2", "tokens", "types", "merges", "pre", "bos", "eos",
    "add_bos"} or {"model": "llama", "tokens", "scores", "types", ...}.
    `split_max_tensors` > 0 writes a split set (the gguf package's gguf-split layout:
    ``<stem>-00001-of-0000N.gguf`` ...), `small_first_shard` with a first part holding
    only the metadata. Returns the paths written."""
    from pathlib import Path

    import gguf
    T = gguf.GGMLQuantizationType
    g = {"mistral": "llama"}.get(arch["arch_name"], arch["arch_name"])
    w = gguf.GGUFWriter(str(path), g, split_max_tensors=split_max_tensors,
                        small_first_shard=small_first_shard)
    w.add_name("cortiq test model")
    w.add_context_length(arch["max_position_embeddings"])
    w.add_embedding_length(arch["hidden_size"])
    w.add_block_count(arch["num_layers"])
    w.add_feed_forward_length(arch["intermediate_size"])
    w.add_head_count(arch["num_attention_heads"])
    w.add_head_count_kv(arch["num_kv_heads"])
    w.add_key_length(arch["head_dim"])
    w.add_value_length(arch["head_dim"])
    w.add_rope_dimension_count(arch["head_dim"])
    w.add_layer_norm_rms_eps(arch["rms_norm_eps"])
    w.add_rope_freq_base(arch["rope_theta"])
    w.add_vocab_size(tensors["model.embed_tokens.weight"].shape[0])
    if arch.get("sliding_window"):
        w.add_sliding_window(arch["sliding_window"])
    y = arch.get("yarn")
    if y:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(y["factor"])
        w.add_rope_scaling_orig_ctx_len(y["original_max_position_embeddings"])
        w.add_rope_scaling_attn_factors(y["attention_factor"])
    if tokenizer is not None:
        w.add_tokenizer_model(tokenizer["model"])
        if tokenizer.get("pre"):
            w.add_tokenizer_pre(tokenizer["pre"])
        w.add_token_list(tokenizer["tokens"])
        w.add_token_types(tokenizer["types"])
        if tokenizer.get("scores") is not None:
            w.add_token_scores(tokenizer["scores"])
        if tokenizer.get("merges"):
            w.add_token_merges(tokenizer["merges"])
        if tokenizer.get("bos") is not None:
            w.add_bos_token_id(tokenizer["bos"])
        if tokenizer.get("eos") is not None:
            w.add_eos_token_id(tokenizer["eos"])
        if tokenizer.get("add_bos") is not None:
            w.add_add_bos_token(tokenizer["add_bos"])
    if chat_template:
        w.add_chat_template(chat_template)
    if arch.get("rope_freq_factors"):
        w.add_tensor("rope_freqs.weight", np.asarray(arch["rope_freq_factors"], np.float32))
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, np.float32)
        if g == "llama" and name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias",
                                           "k_proj.bias")):
            heads = arch["num_attention_heads"] if "q_proj" in name else arch["num_kv_heads"]
            a = permute(a, heads)
        t = T.F32 if a.ndim == 1 or types is None else types(name, a)
        if t in (T.F32, T.F16):
            w.add_tensor(ggml_name(name), a.astype(np.float32 if t == T.F32 else np.float16))
        else:
            try:
                q = gguf.quants.quantize(a, t)
            except NotImplementedError:          # K-quants, IQ*: random blocks instead
                q = random_blocks(t, a.shape[0], a.shape[1], seed=len(name))
            w.add_tensor(ggml_name(name), q, raw_dtype=t)
    written = w.format_shard_names(Path(path))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


#: GGUF has no per-layer sliding schedule: the Qwen2 case runs without its sliding layer
CASE_OVERRIDES = {"qwen2": dict(use_sliding_window=False)}


def write_case(tmp_path, case: str, types, name: str = "m.gguf", seed: int = 4, **over):
    """A tiny random transformers model of `case` (tests/reference/hf_llama.py) written
    as GGUF with a trained byte-level BPE vocabulary and ChatML. Returns (model, arch,
    HF state dict as float32, tokenizers.Tokenizer, path)."""
    from cortiq.convert import hf_llama

    from . import hf_llama as H
    from . import hf_tiny
    model = H.build(case, seed=seed, **{**CASE_OVERRIDES.get(case, {}), **over})
    hf = H.save(model, tmp_path / f"hf-{name}")
    arch = hf_llama.arch_from_hf_config(json.loads((hf / "config.json").read_text()))
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()
             if not k.endswith("inv_freq")}
    if arch["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    tok = hf_tiny.train_tokenizer(model.config.vocab_size)
    tokens, types_, merges = gpt2_vocab(tok.to_str(), model.config.vocab_size)
    spec = {"model": "gpt2", "pre": "qwen2", "tokens": tokens, "types": types_,
            "merges": merges, "eos": tokens.index("<|im_end|>"), "add_bos": False}
    path = tmp_path / name
    write(path, state, arch, types=types, tokenizer=spec, chat_template=H.CHATML)
    return model, arch, state, tok, path
