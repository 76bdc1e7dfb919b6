"""cortiq.cmf.schema: the header JSON's serde typing (docs/cmf-format.md §4, §9, §11;
independent reference: the field lists and rules below are written from the
format text, not read from the schema tables).

Every refusal is a SchemaError (a ValueError) whose .path names the field.
"""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortiq.cmf.schema import HEADER, MASKS_META, SchemaError, check, loads_strict

# §4.1: required arch keys (`layer_types` is one of the list fields with a default, §4)
ARCH_REQUIRED_INTS = ["hidden_size", "intermediate_size", "num_layers", "num_attention_heads",
                      "num_kv_heads", "head_dim", "vocab_size", "max_position_embeddings"]
ARCH = {"arch_name": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_layers": 2,
        "num_attention_heads": 4, "num_kv_heads": 2, "head_dim": 16, "vocab_size": 96,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
        "layer_types": ["FullAttention", "SlidingAttention"]}
HDR = {"version": 2, "arch": ARCH, "quant_type": "Q8_ROW"}


def hdr(**changes):
    """HDR with dotted-path changes; the value DROP removes the key."""
    h = copy.deepcopy(HDR)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = h
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is DROP:
            del node[last]
        else:
            node[last] = value
    return h


DROP = object()


def refused(value, path, match=None, schema=HEADER):
    with pytest.raises(SchemaError) as e:
        check(value, schema)
    assert isinstance(e.value, ValueError)
    assert e.value.path == path, str(e.value)
    assert str(e.value).startswith(f"{path}: ") or not path
    if match:
        assert match in str(e.value), str(e.value)


def test_valid_headers_are_accepted():
    check(HDR, HEADER)
    # the Python writer's form: explicit nulls for the optionals, provenance, skills
    full = hdr(format="cmf", tokenizer_config=None, shard=None, provenance={"x": [1, None]},
               section_hashes=None, calibration=None, routing=None, skills=[])
    check(full, HEADER)
    rich = hdr(
        arch__yarn={"factor": 4, "original_max_position_embeddings": 4096, "beta_fast": 32.0},
        arch__moe={"num_experts": 8, "top_k": 2, "moe_intermediate_size": 32,
                   "routed_scaling_factor": None},
        arch__norm_style="gemma", arch__hidden_act="gelu_tanh", arch__rope_theta=1e6,
        arch__sliding_window=7, arch__rope_freq_factors=[1, 2.5],
        tokenizer_config={"eos_token_ids": [2, 3], "bos_token_id": 1, "chat_template": "t"},
        shard={"no": 1, "count": 3},
        skills=[{"id": "math", "layers": [0, 1], "quality": "anything",
                 "selection": {"metric": "mse", "phi_layer": 1, "mean": "AA==",
                               "basis": "AA==", "rank": 0}}],
        routing={"temperature": 1, "novelty_theta": 0.5, "samples": 10, "target_fpr": 0.01})
    check(rich, HEADER)
    # defaulted and optional fields may be absent; unknown keys are ignored everywhere
    check(hdr(arch__layer_types=DROP, future_key={"a": 1}, arch__dory={"x": 1},
              arch__extra=[1.5]), HEADER)


@pytest.mark.parametrize("field", ["version", "arch", "quant_type"])
def test_required_top_level_fields(field):
    refused(hdr(**{field: DROP}), field, "missing required field")
    refused(hdr(**{field: None}), field, "null is not allowed")


@pytest.mark.parametrize("field", ["arch_name", "rms_norm_eps", *ARCH_REQUIRED_INTS])
def test_required_arch_fields(field):
    refused(hdr(**{f"arch__{field}": DROP}), f"arch.{field}", "missing required field")
    refused(hdr(**{f"arch__{field}": None}), f"arch.{field}", "null is not allowed")


@pytest.mark.parametrize("field", ARCH_REQUIRED_INTS)
@pytest.mark.parametrize("bad", [64.0, True, "64", -1, 2 ** 64, [64]])
def test_integer_fields_take_only_integers_in_range(field, bad):
    refused(hdr(**{f"arch__{field}": bad}), f"arch.{field}")


@given(st.integers(-2 ** 70, 2 ** 70))
def test_integer_ranges(v):
    arch_ok = 0 <= v <= 2 ** 64 - 1              # usize (u64)
    version_ok = 0 <= v <= 2 ** 32 - 1           # u32
    for h, path, ok in ((hdr(arch__head_dim=v), "arch.head_dim", arch_ok),
                        (hdr(version=v), "version", version_ok)):
        if ok:
            check(h, HEADER)
        else:
            refused(h, path, "out of range")


@pytest.mark.parametrize("bad", [True, "1e-5", None, [1e-5], {"v": 1}])
def test_number_fields(bad):
    check(hdr(arch__rms_norm_eps=1), HEADER)          # an integer is a number
    refused(hdr(arch__rms_norm_eps=bad), "arch.rms_norm_eps")


@pytest.mark.parametrize("path, bad", [
    ("quant_type", "q8_row"), ("quant_type", "Q4_TILED"), ("quant_type", 3),
    ("arch__norm_style", "Qwen"), ("arch__hidden_act", "gelu"),
])
def test_enum_strings_match_exactly(path, bad):
    refused(hdr(**{path: bad}), path.replace("__", "."), "expected one of")


def test_list_fields():
    refused(hdr(arch__layer_types=["FullAttention", "fullattention"]), "arch.layer_types[1]")
    refused(hdr(arch__layer_types="FullAttention"), "arch.layer_types", "expected a list")
    refused(hdr(arch__layer_types=None), "arch.layer_types", "null")   # defaulted: not null
    refused(hdr(skills=None), "skills", "null")
    refused(hdr(tokenizer_config={"eos_token_ids": None}), "tokenizer_config.eos_token_ids")
    refused(hdr(tokenizer_config={"eos_token_ids": [1, 2 ** 32]}),
            "tokenizer_config.eos_token_ids[1]", "out of range for u32")
    refused(hdr(arch__rope_freq_factors=[1.0, "2"]), "arch.rope_freq_factors[1]")


@pytest.mark.parametrize("field, bad", [("tie_word_embeddings", 1), ("attn_v_norm", "false"),
                                        ("loop_final_norm", None)])
def test_bool_and_defaulted_fields(field, bad):
    refused(hdr(**{f"arch__{field}": bad}), f"arch.{field}")


def test_nested_records_name_the_field():
    refused(hdr(arch__yarn={"original_max_position_embeddings": 4096}), "arch.yarn.factor",
            "missing")
    refused(hdr(arch__moe={"num_experts": 8, "top_k": 2.0, "moe_intermediate_size": 4}),
            "arch.moe.top_k")
    refused(hdr(arch__mla={"kv_lora_rank": 1, "qk_rope_head_dim": 1, "qk_nope_head_dim": 1}),
            "arch.mla.v_head_dim")
    refused(hdr(arch__yarn=[4]), "arch.yarn", "expected an object")
    refused(hdr(skills=[{"id": "a"}, {"name": "b"}]), "skills[1].id", "missing")
    refused(hdr(skills=[{"id": "a", "selection": {"metric": "mse", "phi_layer": 0,
                                                  "mean": "", "basis": ""}}]),
            "skills[0].selection.rank", "missing")
    refused(hdr(shard={"no": 1}), "shard.count")
    refused(hdr(routing={"temperature": 1, "novelty_theta": 1, "samples": 1.5,
                         "target_fpr": 0}), "routing.samples")
    refused(hdr(calibration={"temperature": "1"}), "calibration.temperature")
    refused([HDR], "", "expected an object")


def test_masks_meta():
    rec = {"task_id": 0, "name": "code", "sparsity": 0.5, "priority": "Primary",
           "blob_off": 0, "blob_len": 16}
    check({"default_task": "code", "masks": [rec]}, MASKS_META)
    for key, bad, path in [("priority", "primary", "masks[0].priority"),
                           ("task_id", -1, "masks[0].task_id"),
                           ("blob_len", None, "masks[0].blob_len"),
                           ("has_hot_pack", 0, "masks[0].has_hot_pack"),
                           ("quality", {"value": 1}, "masks[0].quality.metric")]:
        refused({"default_task": "code", "masks": [{**rec, key: bad}]}, path, schema=MASKS_META)
    refused({"default_task": "code"}, "masks", "missing", schema=MASKS_META)


# ---------------------------------------------------------------- loads_strict

def test_loads_strict_reads_plain_json():
    text = json.dumps(HDR)
    assert loads_strict(text) == HDR
    assert loads_strict(text.encode()) == HDR
    assert loads_strict(memoryview(b'{"a": [1, 2.5, "\\u00e9"]}')) == {"a": [1, 2.5, "é"]}


@pytest.mark.parametrize("text, match", [
    ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ('{"x": {"b": 1, "b": 1}}', "duplicate key 'b'"),
    ('[{"k": 1, "k": 1}]', "duplicate key"),
    ('{"a": NaN}', "NaN is not valid JSON"),
    ('{"a": -Infinity}', "-Infinity is not valid JSON"),
    ('{"a": 1e999}', "out of range"),
    ('{"a": "\\ud800"}', "lone surrogate"),
    ('{"\\udfff": 1}', "lone surrogate"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_loads_strict_refuses(text, match):
    with pytest.raises(SchemaError, match=match):
        loads_strict(text)


def test_loads_strict_refuses_bad_utf8_and_syntax():
    with pytest.raises(ValueError):
        loads_strict(b'{"a": "\xff"}')
    with pytest.raises(ValueError):
        loads_strict('{"a": 1,}')
    assert loads_strict('{"a": "\\ud83d\\ude00"}') == {"a": "😀"}    # a surrogate pair
