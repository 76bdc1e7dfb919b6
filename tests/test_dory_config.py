"""DoryConfig (CMF header record) and DoryOptions (runtime options + CORTIQ_DORY_* env)."""
import copy
import math

import numpy as np
import pytest

from cortiq.errors import ConfigError
from cortiq.models.dory.config import (MAX_LOOPS, DoryConfig, DoryGate, DoryOptions,
                                       DoryTurbo, parse_gate)


def release_header():
    """The release geometry (docs/models/dory.md §1.4) as a CMF header."""
    return {"version": 2, "quant_type": "Q8_ROW", "arch": {
        "arch_name": "dory", "hidden_size": 2560, "intermediate_size": 7168, "num_layers": 72,
        "num_attention_heads": 16, "num_kv_heads": 4, "head_dim": 256, "vocab_size": 131072,
        "max_position_embeddings": 262144, "layer_types": [], "rms_norm_eps": 1e-6,
        "dory": {"layer_pattern": "S-S-S-*-" * 9, "n_input_layers": 16,
                 "n_recurrent_layers": 40, "n_output_layers": 16, "n_recurrent_loops": 2,
                 "recurrent_kv_cache_mode": "per_loop", "sliding_window": 1024,
                 "rope_theta_full": 1e7, "rope_theta_sliding": 1e4,
                 "initializer_range": 0.02, "ngpt_alpha_init": 0.05,
                 "gate_logit_scale_init": math.sqrt(2560)}}}


def test_release_header_parses_with_the_right_geometry():
    c = DoryConfig.from_header(release_header())
    assert (c.q_size, c.kv_size, c.group) == (4096, 1024, 4)
    assert list(c.recurrent_layers) == list(range(16, 56))
    assert len(c.attention_layers) == 36
    assert c.kv_slots(kv_mode="last_loop") == 36
    assert c.kv_slots(loops=2, kv_mode="per_loop") == 8 + 20 * 2 + 8
    assert c.turbo is None and c.attn_scale == 1 / 16


def test_round_trip_through_to_arch():
    c = DoryConfig.from_header(release_header())
    again = DoryConfig.from_arch(c.to_arch())
    assert again == c
    arch = c.to_arch()
    assert len(arch["layer_types"]) == 72 and arch["layer_types"][0] == "SlidingAttention"


def test_optional_fields_default():
    h = release_header()
    del h["arch"]["dory"]["recurrent_kv_cache_mode"]
    h["arch"]["dory"]["gate_logit_scale_init"] = None
    c = DoryConfig.from_header(h)
    assert c.recurrent_kv_cache_mode == "per_loop"
    assert c.gate_logit_scale_init == pytest.approx(math.sqrt(2560))


def mutate(path, value):
    h = release_header()
    node = h
    for k in path[:-1]:
        node = node[k]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return h


D = ("arch", "dory")
BAD = [
    (("arch", "arch_name"), "llama", "arch.arch_name"),
    (D, KeyError, "arch.dory"),
    (("arch", "hidden_size"), 2560.0, "arch.hidden_size"),
    (("arch", "hidden_size"), True, "arch.hidden_size"),
    (("arch", "num_kv_heads"), 3, "arch.num_kv_heads"),
    (("arch", "num_kv_heads"), 0, "arch.num_kv_heads"),
    (("arch", "head_dim"), 255, "arch.head_dim"),
    (("arch", "num_layers"), 71, "arch.dory.layer_pattern"),
    (("arch", "vocab_size"), KeyError, "arch.vocab_size"),
    (("arch", "max_position_embeddings"), -1, "arch.max_position_embeddings"),
    (D + ("layer_pattern",), "S-S-S-*-" * 8 + "S-S-S-*+", "arch.dory.layer_pattern"),
    (D + ("layer_pattern",), "S-S-S-*-" * 8, "arch.dory.layer_pattern"),
    (D + ("layer_pattern",), 7, "arch.dory.layer_pattern"),
    (D + ("layer_pattern",), KeyError, "arch.dory.layer_pattern"),
    (D + ("n_input_layers",), 15, "arch.dory.n_recurrent_layers"),
    (D + ("n_output_layers",), -1, "arch.dory.n_output_layers"),
    (D + ("n_recurrent_layers",), "40", "arch.dory.n_recurrent_layers"),
    (D + ("n_recurrent_loops",), 0, "arch.dory.n_recurrent_loops"),
    (D + ("n_recurrent_loops",), MAX_LOOPS + 1, "arch.dory.n_recurrent_loops"),
    (D + ("recurrent_kv_cache_mode",), "every_loop", "arch.dory.recurrent_kv_cache_mode"),
    (D + ("sliding_window",), 0, "arch.dory.sliding_window"),
    (D + ("sliding_window",), KeyError, "arch.dory.sliding_window"),
    (D + ("rope_theta_full",), 0.0, "arch.dory.rope_theta_full"),
    (D + ("rope_theta_sliding",), float("inf"), "arch.dory.rope_theta_sliding"),
    (D + ("initializer_range",), -0.02, "arch.dory.initializer_range"),
    (D + ("initializer_range",), KeyError, "arch.dory.initializer_range"),
    (D + ("ngpt_alpha_init",), "0.05", "arch.dory.ngpt_alpha_init"),
    (D + ("gate_logit_scale_init",), 0, "arch.dory.gate_logit_scale_init"),
    (D + ("turbo",), [1, 2], "arch.dory.turbo"),
    (D + ("turbo",), {"exit_bias": 0.1, "o1": [1, 2, 3]}, "arch.dory.turbo.o1"),
    (D + ("turbo",), {"o1": [32, 128, 4, 512]}, "arch.dory.turbo.exit_bias"),
    (D + ("turbo",), {"exit_bias": 0.1, "o1": [32, 8000, 4, 512], "exact_rows": 500},
     "arch.dory.turbo.exact_rows"),
]


@pytest.mark.parametrize("path,value,field", BAD, ids=[f"{b[2]}={b[1]!r}"[:60] for b in BAD])
def test_each_bad_field_is_named(path, value, field):
    with pytest.raises(ConfigError) as e:
        DoryConfig.from_header(mutate(path, value))
    assert str(e.value).startswith(field + ":"), str(e.value)


def test_window_may_be_zero_without_sliding_layers():
    h = release_header()
    h["arch"]["dory"]["layer_pattern"] = "*-" * 36
    h["arch"]["dory"]["sliding_window"] = 0
    assert DoryConfig.from_header(h).sliding_window == 0


def test_header_must_have_an_arch_object():
    with pytest.raises(ConfigError, match="^arch:"):
        DoryConfig.from_header({"version": 2})


def test_turbo_record():
    h = mutate(D + ("turbo",), {"exit_bias": -0.25, "o1": [32, 128, 4, 100], "exact_rows": 64})
    c = DoryConfig.from_header(h)
    assert c.turbo == DoryTurbo(-0.25, (32, 128, 4, 100), 64)
    assert c.turbo.seal == 128 + 4 + 16
    assert DoryConfig.from_arch(c.to_arch()) == c


def test_load_time_transforms_follow_the_seed():
    c = DoryConfig.from_header(release_header())
    raw = np.array([0.02, -0.01, 0.0], np.float32)
    np.testing.assert_allclose(c.alpha_scale(raw), np.abs(raw * 0.05 / 0.02), rtol=1e-6)
    np.testing.assert_allclose(c.sqk_scale(raw), (raw * 16 / 0.02) ** 2, rtol=1e-6)
    np.testing.assert_allclose(c.s_gate_scale(raw), (raw * 2560 ** 0.25 / 0.02) ** 2, rtol=1e-6)
    np.testing.assert_allclose(c.suv_scale(raw), raw * math.sqrt(2560), rtol=1e-6)
    np.testing.assert_allclose(c.logit_scale(raw), raw / 0.02, rtol=1e-6)
    assert c.sqk_scale(raw).dtype == np.float32


# ------------------------------------------------------------------ options

CFG = DoryConfig.from_header(release_header())
TURBO = DoryConfig.from_header(mutate(D + ("turbo",), {"exit_bias": 0.5, "o1": [32, 128, 4, 1024]}))


def test_defaults_come_from_the_file():
    r = DoryOptions().resolve(CFG, env={})
    got = (r.loops, r.kv_mode, r.gate, r.prompt_loops, r.full_window)
    assert got == (2, "per_loop", None, 0, None)


def test_environment_is_a_fallback_and_keywords_win():
    env = {"CORTIQ_DORY_LOOPS": "3", "CORTIQ_DORY_KV": "last_loop",
           "CORTIQ_DORY_GATE": "conf:0.6", "CORTIQ_DORY_PROMPT_LOOPS": "1",
           "CORTIQ_DORY_FULL_WINDOW": "4096"}
    r = DoryOptions().resolve(CFG, env=env)
    assert (r.loops, r.kv_mode, r.prompt_loops, r.full_window) == (3, "last_loop", 1, 4096)
    assert r.gate == DoryGate("conf", threshold=0.6)
    r = DoryOptions(loops=1, kv_mode="per_loop", gate="auto", prompt_loops=0,
                    full_window=64).resolve(CFG, env=env)
    assert (r.loops, r.kv_mode, r.prompt_loops, r.full_window) == (1, "per_loop", 0, 64)
    assert r.gate == DoryGate("conf", threshold=0.7)      # auto without a router


def test_turbo_defaults_unless_a_loop_count_is_fixed():
    r = DoryOptions().resolve(TURBO, env={})
    assert (r.kv_mode, r.prompt_loops) == ("last_loop", 1)
    assert r.gate == DoryGate("file", bias=0.5)
    r = DoryOptions().resolve(TURBO, env={"CORTIQ_DORY_KV": "per_loop"})
    assert r.kv_mode == "per_loop" and r.gate is None and r.prompt_loops == 1
    for fixed in (DoryOptions(loops=2).resolve(TURBO, env={}),
                  DoryOptions().resolve(TURBO, env={"CORTIQ_DORY_LOOPS": "2"})):
        assert (fixed.kv_mode, fixed.gate, fixed.prompt_loops) == ("per_loop", None, 0)
        assert fixed.fixed_loops
    assert not r.fixed_loops


def test_environment_is_read_once_into_the_options():
    env = {"CORTIQ_DORY_O1": "8,16,2,64", "CORTIQ_DORY_O1_SPILL": "/spill",
           "CORTIQ_DORY_EXACT_LOG": "", "CORTIQ_DORY_LOOPS": "2", "HOME": "/root"}
    r = DoryOptions().resolve(TURBO, env=env)
    want = {k: v for k, v in env.items() if k != "HOME"}
    env.clear()                     # a snapshot: later changes do not reach the model
    assert dict(r.env) == want and r.fixed_loops


def test_environment_defaults_to_the_process_environment(monkeypatch):
    monkeypatch.setenv("CORTIQ_DORY_KV", "last_loop")
    monkeypatch.setenv("CORTIQ_DORY_O1_SPILL", "/spill")
    r = DoryOptions().resolve(CFG)
    assert r.kv_mode == "last_loop" and r.env["CORTIQ_DORY_O1_SPILL"] == "/spill"


OPT_BAD = [
    (dict(loops=17), "loops", "0..16"),
    (dict(loops=-1), "loops", "0..16"),
    (dict(loops=1.5), "loops", "0..16"),
    (dict(kv_mode="both"), "kv_mode", "per_loop, last_loop"),
    (dict(gate="conf:2"), "gate", "(0, 1]"),
    (dict(gate="recon:x"), "gate", "recon:<file>:<bias>"),
    (dict(gate="sometimes"), "gate", "allowed"),
    (dict(prompt_loops=-2), "prompt_loops", "0..16"),
    (dict(full_window=0), "full_window", ">= 1"),
]


@pytest.mark.parametrize("kw,name,allowed", OPT_BAD, ids=[str(b[0]) for b in OPT_BAD])
def test_bad_keyword_options_name_the_option_and_what_is_allowed(kw, name, allowed):
    with pytest.raises(ConfigError) as e:
        DoryOptions(**kw)
    assert str(e.value).startswith(name + ":") and allowed in str(e.value)


ENV_BAD = [("CORTIQ_DORY_LOOPS", "17"), ("CORTIQ_DORY_LOOPS", "two"),
           ("CORTIQ_DORY_KV", "per-loop"), ("CORTIQ_DORY_GATE", "conf:x"),
           ("CORTIQ_DORY_PROMPT_LOOPS", "-1"), ("CORTIQ_DORY_FULL_WINDOW", "0")]


@pytest.mark.parametrize("var,value", ENV_BAD)
def test_bad_environment_values_name_the_variable(var, value):
    with pytest.raises(ConfigError) as e:
        DoryOptions().resolve(CFG, env={var: value})
    assert str(e.value).startswith(var + ":")


def test_gate_parser():
    want = DoryGate("recon", path="/tmp/a:b.bin", bias=-0.5)
    assert parse_gate("recon:/tmp/a:b.bin:-0.5") == want
    assert parse_gate(None) is None
    assert parse_gate(" auto ") == DoryGate("auto")


def test_options_read_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("CORTIQ_DORY_LOOPS", "4")
    assert DoryOptions().resolve(CFG).loops == 4
    cfg2 = copy.deepcopy(CFG)
    assert DoryOptions(loops=1).resolve(cfg2).loops == 1


def test_older_variable_names_still_count_with_a_deprecation_warning(monkeypatch):
    from cortiq.kernels import _config
    monkeypatch.setattr(_config, "_warned", set())
    with pytest.warns(DeprecationWarning) as rec:
        r = DoryOptions().resolve(CFG, env={"CMF_DORY_LOOPS": "3", "CMF_O1_SPILL": "/s"})
    assert sorted(str(w.message) for w in rec) == [
        "environment variable CMF_DORY_LOOPS is deprecated: set CORTIQ_DORY_LOOPS instead",
        "environment variable CMF_O1_SPILL is deprecated: set CORTIQ_DORY_O1_SPILL instead"]
    assert r.loops == 3 and r.env == {"CORTIQ_DORY_LOOPS": "3", "CORTIQ_DORY_O1_SPILL": "/s"}
    # the new name wins over the old one
    env = {"CMF_DORY_LOOPS": "3", "CORTIQ_DORY_LOOPS": "5"}
    assert DoryOptions().resolve(CFG, env=env).loops == 5
