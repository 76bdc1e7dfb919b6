"""Strict typing of the CMF header JSON, emulating the Rust reader's serde structs
(docs/cmf-format.md §4, §9, §11).

serde semantics reproduced here:
  * integer fields must be JSON integers in range (u32 / u64): 64.0 and true are refused;
  * number fields take integers or floats (never bool, never NaN/Infinity: not JSON);
  * required keys must be present and non-null; `null` only for Option fields;
    defaulted fields (incl. the list fields skills, layer_types, eos_token_ids, layers)
    may be absent but not null;
  * enum strings match exactly;
  * duplicate keys are refused (everywhere); unknown keys are ignored.

A schema is a dict key -> (type, mode) with mode REQ, DEF (default) or OPT (Option).
Types: "u32", "u64", "num", "bool", "str", "any", ("enum", {...}), ("list", T),
("obj", schema).
"""
from __future__ import annotations

import json

REQ, DEF, OPT = "required", "default", "optional"
U32_MAX = 2 ** 32 - 1
U64_MAX = 2 ** 64 - 1

QUANT_LABELS = ("Q8_ROW", "Q4_BLOCK", "Q8_2F", "VBIT", "BF16", "F16", "F32")
LAYER_TYPES = ("FullAttention", "SlidingAttention", "LinearAttention", "ShortConv", "Kda")


def _obj(**fields):
    return ("obj", fields)


YARN = _obj(factor=("num", REQ), original_max_position_embeddings=("u64", REQ),
            beta_fast=("num", DEF), beta_slow=("num", DEF), attention_factor=("num", DEF),
            mscale_all_dim=("num", OPT))
MLA = _obj(kv_lora_rank=("u64", REQ), qk_rope_head_dim=("u64", REQ),
           qk_nope_head_dim=("u64", REQ), v_head_dim=("u64", REQ), q_lora_rank=("u64", OPT),
           nope=("bool", DEF))
MTP = _obj(num_layers=("u64", REQ), share_lm_head=("bool", DEF), share_embed=("bool", DEF))
MOE = _obj(num_experts=("u64", REQ), top_k=("u64", REQ), moe_intermediate_size=("u64", REQ),
           norm_topk_prob=("bool", DEF), shared_expert_intermediate_size=("u64", OPT),
           router_sigmoid=("bool", DEF), routed_scaling_factor=("num", OPT),
           router_resonance=("bool", DEF))
LINEAR_CORE = _obj(kind=("str", REQ), num_heads=("u64", REQ), value_head_dim=("u64", REQ),
                   nphase=("u64", OPT))
G3N = _obj(altup_num_inputs=("u64", REQ), laurel_rank=("u64", REQ), ple_dim=("u64", REQ),
           ple_vocab=("u64", REQ), num_kv_shared_layers=("u64", REQ),
           activation_sparsity=(("list", "num"), REQ))

ARCH = _obj(
    arch_name=("str", REQ), hidden_size=("u64", REQ), intermediate_size=("u64", REQ),
    num_layers=("u64", REQ), num_attention_heads=("u64", REQ), num_kv_heads=("u64", REQ),
    head_dim=("u64", REQ), vocab_size=("u64", REQ), max_position_embeddings=("u64", REQ),
    layer_types=(("list", ("enum", LAYER_TYPES)), DEF), rms_norm_eps=("num", REQ),
    norm_style=(("enum", ("qwen", "gemma")), DEF), rope_theta=("num", DEF),
    tie_word_embeddings=("bool", DEF), partial_rotary_factor=("num", DEF),
    hidden_act=(("enum", ("silu", "gelu_tanh", "situ")), DEF), embed_multiplier=("num", DEF),
    attn_v_norm=("bool", DEF), num_loops=("u64", DEF), loop_final_norm=("bool", DEF),
    yarn=(YARN, OPT), attention_heads_per_layer=(("list", "u64"), OPT),
    query_pre_attn_scalar=("num", OPT), sliding_window=("u64", OPT),
    sliding_window_pattern=("u64", OPT), rope_local_base_freq=("num", OPT),
    local_partial_rotary_factor=("num", OPT), global_head_dim=("u64", OPT),
    num_global_kv_heads=("u64", OPT), global_partial_rotary_factor=("num", OPT),
    final_logit_softcapping=("num", OPT), attn_logit_softcapping=("num", OPT),
    mla=(MLA, OPT), activation_situ_beta=("num", OPT),
    activation_situ_linear_beta=("num", OPT), mtp=(MTP, OPT), moe=(MOE, OPT),
    linear_core=(LINEAR_CORE, OPT), head_clusters=("u64", OPT),
    linear_conv_kernel_dim=("u64", OPT), linear_num_key_heads=("u64", OPT),
    linear_num_value_heads=("u64", OPT), linear_key_head_dim=("u64", OPT),
    linear_value_head_dim=("u64", OPT), rope_freq_factors=(("list", "num"), OPT),
    logit_multiplier=("num", OPT), g3n=(G3N, OPT), kda_gate_lower_bound=("num", OPT),
)

#: End-of-turn markers of common chat formats, added to the stop ids when the template
#: uses them and the tokenizer knows them.
CHAT_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_turn|>",
                   "<|endoftext|>", "</s>")
TOKENIZER_CONFIG = _obj(chat_template=("str", OPT), eos_token_ids=(("list", "u32"), DEF),
                        bos_token_id=("u32", OPT), pad_token_id=("u32", OPT))
SELECTION = _obj(metric=("str", REQ), phi_layer=("u64", REQ), mean=("str", REQ),
                 basis=("str", REQ), rank=("u64", REQ), err_mean=("num", OPT),
                 err_std=("num", OPT), holdout=("str", OPT), holdout_n=("u64", OPT))
SKILL = _obj(id=("str", REQ), name=("str", OPT), layers=(("list", "u64"), DEF),
             selection=(SELECTION, OPT), input_mask_task=("str", OPT), quality=("any", OPT),
             base_dir_hash=("str", OPT), base_arch=("any", OPT), task=("any", OPT),
             provenance=("any", OPT))
SHARD = _obj(no=("u64", REQ), count=("u64", REQ))
CALIBRATION = _obj(temperature=("num", REQ), ece_before=("num", OPT), ece_after=("num", OPT))
ROUTING = _obj(temperature=("num", REQ), novelty_theta=("num", REQ), samples=("u64", REQ),
               target_fpr=("num", REQ))
SECTION_HASHES = _obj(masks=("str", OPT), vocab=("str", OPT), index=("str", OPT))

HEADER = _obj(
    format=("str", DEF), version=("u32", REQ), arch=(ARCH, REQ),
    quant_type=(("enum", QUANT_LABELS), REQ), provenance=("any", OPT),
    tokenizer_config=(TOKENIZER_CONFIG, OPT), section_hashes=(SECTION_HASHES, OPT),
    skills=(("list", SKILL), DEF), shard=(SHARD, OPT), calibration=(CALIBRATION, OPT),
    routing=(ROUTING, OPT),
)

MASK_QUALITY = _obj(metric=("str", REQ), value=("num", REQ), baseline_dense=("num", OPT),
                    n_samples=("u32", OPT), dataset_sha256=("str", OPT))
MASK_RECORD = _obj(task_id=("u32", REQ), name=("str", REQ), description=("str", OPT),
                   sparsity=("num", REQ), quality=(MASK_QUALITY, OPT), parent=("str", OPT),
                   priority=(("enum", ("Fallback", "Normal", "Primary")), REQ),
                   has_hot_pack=("bool", DEF), has_expert_fields=("bool", DEF),
                   blob_off=("u64", REQ), blob_len=("u64", REQ))
MASKS_META = _obj(default_task=("str", REQ), masks=(("list", MASK_RECORD), REQ))


class SchemaError(ValueError):
    """A value does not have the type the schema asks for; .path names the field."""

    def __init__(self, path: str, msg: str):
        super().__init__(f"{path}: {msg}" if path else msg)
        self.path = path


def _no_dups(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise SchemaError("", f"duplicate key {k!r}")
        d[k] = v
    return d


def _no_constant(name):
    raise SchemaError("", f"{name} is not valid JSON")


def _finite_float(s: str) -> float:
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise SchemaError("", f"number {s[:40]} is out of range")
    return v


def _check_strings(obj) -> None:
    """serde_json refuses lone surrogates (\\ud800); Python's json lets them through."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise SchemaError("", "string holds a lone surrogate escape") from None
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def loads_strict(text: bytes | str):
    """json.loads refusing duplicate keys, NaN/Infinity, out-of-range floats and lone
    surrogates (serde_json semantics)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        obj = json.loads(text, object_pairs_hook=_no_dups, parse_constant=_no_constant,
                         parse_float=_finite_float)
    except RecursionError:  # serde_json also stops at a nesting limit (128)
        raise SchemaError("", "JSON nested too deeply") from None
    _check_strings(obj)
    return obj


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def check(value, typ, path: str = "") -> None:
    """Raise SchemaError when `value` does not deserialize as `typ`."""
    if typ == "any":
        return
    if typ in ("u32", "u64"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise SchemaError(path, f"expected an integer, got {_kind(value)} ({value!r})")
        top = U32_MAX if typ == "u32" else U64_MAX
        if not 0 <= value <= top:
            raise SchemaError(path, f"integer {value} out of range for {typ}")
        return
    if typ == "num":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(path, f"expected a number, got {_kind(value)}")
        return
    if typ == "bool":
        if not isinstance(value, bool):
            raise SchemaError(path, f"expected a boolean, got {_kind(value)}")
        return
    if typ == "str":
        if not isinstance(value, str):
            raise SchemaError(path, f"expected a string, got {_kind(value)}")
        return
    kind, arg = typ
    if kind == "enum":
        if not isinstance(value, str) or value not in arg:
            raise SchemaError(path, f"expected one of {', '.join(arg)}, got {value!r}")
    elif kind == "list":
        if not isinstance(value, list):
            raise SchemaError(path, f"expected a list, got {_kind(value)}")
        for i, item in enumerate(value):
            check(item, arg, f"{path}[{i}]")
    elif kind == "obj":
        if not isinstance(value, dict):
            raise SchemaError(path, f"expected an object, got {_kind(value)}")
        for key, (ftyp, mode) in arg.items():
            sub = f"{path}.{key}" if path else key
            if key not in value:
                if mode == REQ:
                    raise SchemaError(sub, "missing required field")
                continue
            v = value[key]
            if v is None:
                if mode == OPT:
                    continue
                raise SchemaError(sub, "null is not allowed here")
            check(v, ftyp, sub)
    else:  # pragma: no cover - schema bug
        raise AssertionError(typ)
