"""What a Llama-family GGUF file means in cortiq's terms: the CMF ``arch`` record from
its metadata, HF tensor names from ggml's, the q/k row order, and a tokenizer.json and
chat bundle from its ``tokenizer.*`` keys. Used by `cortiq.gguf.file` (running a GGUF
file as it is) and `cortiq.convert.gguf_import` (writing it as CMF).

* metadata -> the CMF ``arch`` record: ``general.architecture`` ``llama`` (Llama and
  Mistral files), ``qwen2``, ``qwen3``; ``{arch}.embedding_length``, ``block_count``,
  ``feed_forward_length``, ``attention.head_count(_kv)``, ``attention.key_length``,
  ``attention.layer_norm_rms_epsilon``, ``attention.sliding_window``,
  ``rope.freq_base``, ``rope.scaling.{type,factor,original_context_length}``; the
  ``rope_freqs.weight`` tensor (Llama-3's per-frequency divisors) is read by the callers.
* tensor names -> HF names (`hf_name`). llama.cpp stores Llama's q/k rows (weights and
  biases) permuted for its interleaved rope (`PERMUTED`); `unpermute_rows` puts them
  back in HF's half-split order (a row permutation, so it applies to quantized rows).
* the tokenizer -> a ``tokenizers`` tokenizer.json: ``tokenizer.ggml.model`` ``gpt2``
  (byte-level BPE from ``tokens`` + ``merges``, the pre-tokenizer regex chosen by
  ``tokenizer.ggml.pre``) or ``llama`` (SentencePiece BPE with byte fallback; merges
  rebuilt from ``tokens`` + ``scores``, the way HF converts SentencePiece models);
  control and user-defined tokens become added tokens; BOS is prepended when
  ``tokenizer.ggml.add_bos_token`` says so; ``tokenizer.chat_template`` and the
  BOS/EOS/EOT/padding ids go into the chat bundle.
"""
from __future__ import annotations

import json
import math
import re
import warnings
from typing import Any

import numpy as np

from ..cmf.schema import CHAT_END_TOKENS
from ..errors import ConfigError, FormatError
from ..models import builtin_spec

#: archs whose q/k rows llama.cpp's converter permutes (interleaved rope)
PERMUTED = ("llama", "mistral")

_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_LAYER = {"attn_norm.weight": "input_layernorm.weight",
          "ffn_norm.weight": "post_attention_layernorm.weight",
          "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
          "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
          "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
          "attn_output.weight": "self_attn.o_proj.weight",
          "attn_output.bias": "self_attn.o_proj.bias",
          "attn_q_norm.weight": "self_attn.q_norm.weight",
          "attn_k_norm.weight": "self_attn.k_norm.weight",
          "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
          "ffn_down.weight": "mlp.down_proj.weight", "ffn_gate.bias": "mlp.gate_proj.bias",
          "ffn_up.bias": "mlp.up_proj.bias", "ffn_down.bias": "mlp.down_proj.bias"}
_BLK = re.compile(r"blk\.(\d+)\.(.+)")

#: pre-tokenizer regexes by tokenizer.ggml.pre (llama.cpp's names)
_GPT2_RE = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE = {"default": _GPT2_RE, "gpt-2": _GPT2_RE, "gpt2": _GPT2_RE, "llama-bpe": _LLAMA3_RE,
        "llama3": _LLAMA3_RE, "smaug-bpe": _LLAMA3_RE, "qwen2": _QWEN2_RE,
        "deepseek-r1-qwen": _QWEN2_RE}
_TOKEN_CONTROL, _TOKEN_USER = 3, 4


def architectures() -> tuple[str, ...]:
    """The GGUF ``general.architecture`` values imported: the Llama family's arch_names
    (the registry's, `cortiq.models.SPECS`); a file keeps its name as its arch_name."""
    return builtin_spec("llama").names


# ---- metadata -----------------------------------------------------------------------
class Meta:
    """The key/value metadata of a GGUF file as Python values."""

    def __init__(self, values: dict, path: str = "GGUF"):
        self.values, self.path = values, path

    def get(self, key, default=None):
        return self.values.get(key, default)

    def need(self, key):
        v = self.values.get(key)
        if v is None:
            raise FormatError(f"{self.path}: GGUF metadata {key}: missing (required)")
        return v


def arch_from_gguf(meta: Meta, shapes: dict) -> tuple[dict, str]:
    """(CMF arch record, the GGUF architecture name) from the metadata and the GGUF
    tensors' row-major shapes (name -> shape)."""
    g = meta.need("general.architecture")
    if g not in architectures():
        raise ConfigError(f"GGUF metadata general.architecture: {g!r}; cortiq imports "
                          f"{', '.join(architectures())}")
    p = f"{g}."

    def pos_int(key, default=None):
        v = meta.get(p + key, default)
        if v is None:
            raise FormatError(f"{meta.path}: GGUF metadata {p}{key}: missing (required)")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FormatError(f"{meta.path}: GGUF metadata {p}{key}: {v!r} is not a "
                              "positive integer")
        return int(v)

    def number(key, default, positive=False):
        """A finite real metadata value, >= 0 (> 0 if positive): a NaN epsilon or a zero
        rotary base would otherwise show only as non-finite logits later."""
        v = meta.get(p + key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < 0 or (positive and v == 0):
            raise FormatError(f"{meta.path}: GGUF metadata {p}{key}: {v!r} is not a finite "
                              f"number {'> 0' if positive else '>= 0'}")
        return float(v)

    hidden, n = pos_int("embedding_length"), pos_int("block_count")
    nh = pos_int("attention.head_count")
    nk = pos_int("attention.head_count_kv", nh)
    hd = pos_int("attention.key_length", hidden // nh)
    if pos_int("attention.value_length", hd) != hd:
        raise ConfigError(f"GGUF metadata {p}attention.value_length: differs from key_length")
    rd = meta.get(p + "rope.dimension_count", hd)
    if rd != hd:
        raise ConfigError(f"GGUF metadata {p}rope.dimension_count: {rd}; cortiq rotates "
                          f"whole heads ({hd})")
    emb = shapes.get("token_embd.weight")
    if emb is None or len(emb) != 2:
        raise FormatError(f"{meta.path}: GGUF tensor token_embd.weight: missing or not a "
                          "matrix")
    vocab = int(meta.get(p + "vocab_size") or emb[0])
    window = meta.get(p + "attention.sliding_window")
    if window:      # 0: no window
        window = pos_int("attention.sliding_window")
    arch = {"arch_name": g, "hidden_size": hidden,
            "intermediate_size": pos_int("feed_forward_length"), "num_layers": n,
            "num_attention_heads": nh, "num_kv_heads": nk, "head_dim": hd, "vocab_size": vocab,
            "max_position_embeddings": pos_int("context_length", 4096),
            "layer_types": ["SlidingAttention" if window else "FullAttention"] * n,
            "rms_norm_eps": number("attention.layer_norm_rms_epsilon", 1e-6),
            "rope_theta": number("rope.freq_base", 10000.0, positive=True),
            "tie_word_embeddings": "output.weight" not in shapes}
    if window:
        arch["sliding_window"] = int(window)
    kind = meta.get(p + "rope.scaling.type", "none")
    factor = number("rope.scaling.factor", 1.0) or 1.0
    if kind == "linear" and factor != 1.0:
        arch["rope_freq_factors"] = [factor] * (hd // 2)
    elif kind == "yarn":
        if not meta.get(p + "rope.scaling.original_context_length"):
            raise ConfigError(f"GGUF metadata {p}rope.scaling.original_context_length: "
                              "missing (required for yarn)")
        orig = pos_int("rope.scaling.original_context_length")
        af = number("rope.scaling.attn_factor", 0.0)
        arch["yarn"] = {"factor": factor, "original_max_position_embeddings": orig,
                        "beta_fast": number("rope.scaling.yarn_beta_fast", 32.0),
                        "beta_slow": number("rope.scaling.yarn_beta_slow", 1.0),
                        "attention_factor": float(af) if af else
                        (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)}
    elif kind not in ("none", "linear", None):
        raise ConfigError(f"GGUF metadata {p}rope.scaling.type: {kind!r}; cortiq supports "
                          "none, linear and yarn")
    return arch, g


# ---- tokenizer ----------------------------------------------------------------------
def _spm_merges(tokens: list[str], scores, skip=()) -> list[list[str]]:
    """Merges of a SentencePiece BPE vocabulary: every split of a piece into two pieces,
    ranked by the merged piece's score (higher first), then by the ids involved. Ids in
    `skip` (control, user-defined and byte tokens) take no part."""
    skip = set(skip)
    vocab = {t: i for i, t in enumerate(tokens) if i not in skip}
    found = []
    for piece, pid in vocab.items():
        for k in range(1, len(piece)):
            a, b = piece[:k], piece[k:]
            if a in vocab and b in vocab:
                found.append((-float(scores[pid]) if scores is not None else pid, pid,
                              vocab[a], vocab[b], a, b))
    found.sort()
    return [[a, b] for *_, a, b in found]


def tokenizer_from_gguf(meta: Meta) -> tuple[bytes | None, dict | None]:
    """(tokenizer.json bytes, chat bundle) from the tokenizer.* metadata, or (None, None)
    when the file carries no vocabulary."""
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if model is None or tokens is None:
        return None, None
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    scores = meta.get("tokenizer.ggml.scores")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == _TOKEN_CONTROL}
             for i, t in enumerate(tokens) if types[i] in (_TOKEN_CONTROL, _TOKEN_USER)]
    tok: dict[str, Any]
    if model == "gpt2":
        merges = meta.get("tokenizer.ggml.merges") or []
        pre = meta.get("tokenizer.ggml.pre", "default")
        regex = _PRE.get(pre)
        if regex is None:
            warnings.warn(f"GGUF tokenizer.ggml.pre {pre!r}: not a pre-tokenizer cortiq "
                          "knows; using GPT-2's split", RuntimeWarning, stacklevel=3)
            regex = _GPT2_RE
        tok = {"normalizer": None,
               "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                   {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
                    "invert": False},
                   {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False}]},
               "decoder": {"type": "ByteLevel", "add_prefix_space": False,
                           "trim_offsets": False, "use_regex": False},
               "model": {"type": "BPE", "dropout": None, "unk_token": None,
                         "continuing_subword_prefix": None, "end_of_word_suffix": None,
                         "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                         "vocab": {t: i for i, t in enumerate(tokens)},
                         "merges": [m.split(" ", 1) for m in merges]}}
        add_bos_default = False
    elif model == "llama":
        unk = meta.get("tokenizer.ggml.unknown_token_id", 0)
        special = [i for i, ty in enumerate(types) if ty in (_TOKEN_CONTROL, _TOKEN_USER, 6)]
        tok = {"normalizer": {"type": "Sequence", "normalizers": [
                   {"type": "Prepend", "prepend": "\u2581"},
                   {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
               "pre_tokenizer": None,
               "decoder": {"type": "Sequence", "decoders": [
                   {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                   {"type": "ByteFallback"}, {"type": "Fuse"},
                   {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
               "model": {"type": "BPE", "dropout": None,
                         "unk_token": tokens[unk] if 0 <= unk < len(tokens) else None,
                         "continuing_subword_prefix": None, "end_of_word_suffix": None,
                         "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                         "vocab": {t: i for i, t in enumerate(tokens)},
                         "merges": _spm_merges(tokens, scores, special)}}
        add_bos_default = True
    else:
        raise ConfigError(f"GGUF metadata tokenizer.ggml.model: {model!r}; cortiq imports "
                          "gpt2 (BPE) and llama (SentencePiece) vocabularies")
    add_bos = meta.get("tokenizer.ggml.add_bos_token", add_bos_default)
    post = None
    if add_bos and bos is not None:
        b = tokens[bos]
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": b, "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": b, "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {b: {"id": b, "ids": [bos], "tokens": [b]}}}
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "post_processor": post, **tok}
    template = meta.get("tokenizer.chat_template")
    bundle: dict = {}
    if template:
        bundle["chat_template"] = template
    eos_ids = [int(eos)] if eos is not None else []
    eot = meta.get("tokenizer.ggml.eot_token_id")
    if eot is not None:
        eos_ids.append(int(eot))
    index = {t: i for i, t in enumerate(tokens)}
    for t in CHAT_END_TOKENS:
        if template and t in template and t in index:
            eos_ids.append(index[t])
    bundle["eos_token_ids"] = list(dict.fromkeys(eos_ids))
    if bos is not None:
        bundle["bos_token_id"] = int(bos)
    pad = meta.get("tokenizer.ggml.padding_token_id")
    if pad is not None:
        bundle["pad_token_id"] = int(pad)
    return json.dumps(doc, ensure_ascii=False).encode("utf-8"), bundle


# ---- tensors ------------------------------------------------------------------------
def hf_name(gguf_name: str) -> str | None:
    """The HF/CMF name of a GGUF tensor; None for ones the model recomputes."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    if gguf_name == "rope_freqs.weight":
        return None
    m = _BLK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}"
    raise ConfigError(f"GGUF tensor {gguf_name}: not a Llama-family tensor cortiq knows")


def unpermute_rows(a: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (pairs interleaved per head) back to HF's (halves)."""
    rows = a.shape[0]
    hd = rows // n_heads
    return a.reshape(n_heads, hd // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)




def permuted_heads(gguf_arch: str, arch: dict, hf: str) -> int | None:
    """The head count whose rows llama.cpp permuted in tensor `hf` (the q/k weights and
    biases of a `PERMUTED` arch), None for a tensor stored in HF's order."""
    if gguf_arch not in PERMUTED:
        return None
    if hf.endswith(("q_proj.weight", "q_proj.bias")):
        return int(arch["num_attention_heads"])
    if hf.endswith(("k_proj.weight", "k_proj.bias")):
        return int(arch["num_kv_heads"])
    return None
