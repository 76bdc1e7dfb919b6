"""Dory's far field end to end (the reference engine's far-field tests,
src/cortiq/models/dory/far_field.py hooked into src/cortiq/models/dory/model.py) on a tiny random model written
as a CMF file.

Tolerances: none but finiteness and equality -- the reference engine's tests compare RAM and file
stores bit for bit (the same arithmetic on the same rows), and the rest is bookkeeping.
"""
import os
import warnings

import numpy as np
import pytest

import cortiq.cmf
from cortiq.models import dory
from cortiq.errors import ConfigError
from cortiq.models.dory.far_field import MAX_NEAR, host_kv_bytes

PATTERN = "S-*-S-*-S-*-"
GEOM = dict(hidden=16, ffn=16, nh=4, nk=2, hd=8, vocab=11)


def write_tiny(path, *, window=5, kv="last_loop", loops=2, turbo=None, exact_weights=None,
               seed=1):
    g = GEOM
    hidden, ffn, nh, nk, hd, vocab = (g[k] for k in ("hidden", "ffn", "nh", "nk", "hd", "vocab"))
    rng = np.random.default_rng(seed)

    def r(*s):
        return ((rng.random(s, dtype=np.float32) - 0.5) * 0.7).astype(np.float32)

    t = {}
    for li, ch in enumerate(PATTERN):
        m = f"model.layers.{li}.mixer"
        if ch == "-":
            t[f"{m}.gate_proj.weight"] = r(ffn, hidden)
            t[f"{m}.up_proj.weight"] = r(ffn, hidden)
            t[f"{m}.down_proj.weight"] = r(hidden, ffn)
            t[f"{m}.suv_gate"] = np.full(ffn, 1.5 / 4, np.float32)
            t[f"{m}.suv_up"] = np.full(ffn, 1.2 / 4, np.float32)
            t[f"model.layers.{li}.mlp_alpha"] = np.full(hidden, 0.3 * 0.02 / 0.05, np.float32)
        else:
            for n, rows in (("q", nh * hd), ("k", nk * hd), ("v", nk * hd), ("g", nh * hd)):
                t[f"{m}.{n}_proj.weight"] = r(rows, hidden)
            t[f"{m}.o_proj.weight"] = r(hidden, nh * hd)
            t[f"{m}.sqk"] = np.full(nh * hd, 2 * 0.02 / np.sqrt(hd), np.float32)
            t[f"{m}.s_gate"] = np.full(nh * hd, np.sqrt(2) * 0.02 / 2, np.float32)
            t[f"model.layers.{li}.attn_alpha"] = np.full(hidden, 0.2 * 0.02 / 0.05, np.float32)
    t["model.embed_tokens.weight"] = r(vocab, hidden)
    t["lm_head.weight"] = r(vocab, hidden)
    t["lm_head.logit_scale"] = np.full(vocab, 3 * 0.02, np.float32)
    if exact_weights is not None:
        t["dory.exact.weights"] = np.asarray(exact_weights, np.float32)
    rec = {"layer_pattern": PATTERN, "n_input_layers": 4, "n_recurrent_layers": 4,
           "n_output_layers": 4, "n_recurrent_loops": loops, "recurrent_kv_cache_mode": kv,
           "sliding_window": window, "rope_theta_full": 1e7, "rope_theta_sliding": 1e4,
           "initializer_range": 0.02, "ngpt_alpha_init": 0.05, "gate_logit_scale_init": 4.0}
    if turbo is not None:
        rec["turbo"] = turbo
        for kind in ("easy", "hard"):   # a turbo file carries its router
            t[f"dory.router.{kind}.mean"] = np.zeros(hidden, np.float32)
            t[f"dory.router.{kind}.basis"] = np.eye(hidden, dtype=np.float32)[:2].copy()
    arch = {"arch_name": "dory", "hidden_size": hidden, "intermediate_size": ffn,
            "num_layers": len(PATTERN), "num_attention_heads": nh, "num_kv_heads": nk,
            "head_dim": hd, "vocab_size": vocab, "max_position_embeddings": 1 << 20,
            "rms_norm_eps": 1e-6,
            "dory": rec}
    cortiq.cmf.write(str(path), sorted(t.items()), arch=arch, quant="f32", progress=False,
                     dtypes={n: "f32" for n in t})
    return str(path)


N_FULL = PATTERN.count("*")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("o1") / "tiny.cmf")


@pytest.fixture
def clean_env(monkeypatch):
    for v in ("CMF_DORY_O1", "CMF_DORY_EXACT", "CMF_O1_SPILL", "CMF_DORY_LOOPS", "CMF_DORY_KV",
              "CMF_DORY_GATE", "CMF_DORY_PROMPT_LOOPS", "CMF_DORY_EXACT_FEATURES",
              "CMF_DORY_EXACT_LOG"):
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def exact_env(monkeypatch, tmp_path, budget=3):
    f = tmp_path / "exact.bin"
    np.r_[np.float32(0), np.ones(N_FULL * 2 * GEOM["nk"], np.float32)].astype("<f4").tofile(f)
    monkeypatch.setenv("CMF_DORY_EXACT", f"{f}:{budget}")


def model(path, **kw):
    return dory.DoryModel(cortiq.cmf.open(path), **kw)


def o1_slots(st):
    return [s for row in st.slots for s in row if getattr(s, "o1", None) is not None
            and s.o1.far]


IDS = [(i * 5) % 11 for i in range(700)]


def test_a_far_field_seals_and_goes_on_under_the_last_loop_cache(tiny_path, clean_env):
    m = model(tiny_path, o1=(4, 6, 0, 24))
    st = m.new_state()
    m.forward(st, IDS[:30])
    for i in range(30, 40):
        assert np.isfinite(m.forward(st, [IDS[i]])).all()
    exact, far = host_kv_bytes(st)
    assert far > 0 and exact > 0, "the full layers went over to the far field"
    for s in o1_slots(st):
        assert s.n == 0 and len(s.o1.far) == GEOM["nk"]
        f = s.o1.far[0]
        assert f.far_len() + f.win_len + f.sink_len == f.rows_seen == 40
    before = far
    for i in range(40, 60):
        m.forward(st, [IDS[i]])
    assert host_kv_bytes(st)[1] == before, "constant far-field memory"


def test_restep_under_last_loop_equals_a_single_pass_rewrite(tiny_path, clean_env):
    """A token's second pass rewrites its row: the far state ends as if the row had been
    stepped once with the last pass's keys (one row per head per position)."""
    m = model(tiny_path, o1=(4, 6, 0, 24))
    st = m.new_state()
    m.forward(st, IDS[:64])
    m.forward(st, IDS[64:66])      # a two-row chunk: snapshot/restore between passes
    m.forward(st, IDS[66:67])      # one row: restep
    for s in o1_slots(st):
        f = s.o1.far[0]
        assert f.rows_seen == 67 and f.far_len() == 67 - 6


def test_a_prompt_keeps_its_chosen_rows_past_the_seal(tiny_path, clean_env, tmp_path):
    exact_env(clean_env, tmp_path, budget=3)
    m = model(tiny_path, o1="4,6,1,24")
    st = m.new_state()
    m.forward(st, IDS[:40])
    seen = 0
    for s in o1_slots(st):
        assert not s.o1.arch and s.n == 0, "the rows are gone from the exact store"
        assert s.o1.far[0].sink_len == 4
        seen += 1
    assert seen > 0
    assert np.isfinite(m.forward(st, [3])).all()


def test_a_prompt_past_the_seal_reads_the_same_from_ram_and_from_files(
        tiny_path, clean_env, tmp_path):
    exact_env(clean_env, tmp_path, budget=3)
    spill = tmp_path / "spill"
    got = []
    for sp in (None, str(spill)):
        m = model(tiny_path, o1="4,6,1,24", spill=sp)
        st = m.new_state()
        got.append(m.forward(st, IDS))
        assert all(not s.o1.arch and s.o1.store is None for s in o1_slots(st))
    assert np.isfinite(got[0]).all()
    assert np.array_equal(got[0], got[1])
    assert os.listdir(spill) == [], "a store in files is gone with the rebuild"
    # the environment variable works as the keyword does
    clean_env.setenv("CMF_O1_SPILL", str(tmp_path / "spill2"))
    m = model(tiny_path, o1="4,6,1,24")
    assert np.array_equal(m.forward(m.new_state(), IDS), got[0])
    assert os.listdir(tmp_path / "spill2") == []


def test_a_spill_directory_that_cannot_be_made_leaves_the_far_field_working(
        tiny_path, clean_env, tmp_path):
    exact_env(clean_env, tmp_path, budget=3)
    f = tmp_path / "file"
    f.write_bytes(b"x")
    m = model(tiny_path, o1="4,6,1,24", spill=str(f / "no"))
    st = m.new_state()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lg = m.forward(st, IDS[:100])
    msgs = [str(w.message) for w in caught if "dory" in str(w.message)]
    assert len(msgs) == 1 and "none stays exact" in msgs[0], msgs
    assert np.isfinite(lg).all()
    assert all(not s.o1.arch for s in o1_slots(st)) and o1_slots(st)


def test_per_loop_slots_seal_each(tiny_path, clean_env):
    m = model(tiny_path, o1="4,6,1,24", kv_mode="per_loop")
    st = m.new_state()
    assert np.isfinite(m.forward(st, IDS[:50])).all()
    rec = [o for o in o1_slots(st)]
    # full layers 3 (input), 7 (recurrent: one slot per loop), 11 (output)
    assert len(rec) == 4


def test_o1_off_and_env_fallback(tiny_path, clean_env):
    m = model(tiny_path)
    assert m.o1rt is None
    clean_env.setenv("CMF_DORY_O1", "4,6,0,10")
    m = model(tiny_path)
    assert m.o1rt is not None and m.o1rt.o1.seal == 22     # at least w + sink + 16
    assert model(tiny_path, o1="off").o1rt is None
    st = m.new_state()
    m.forward(st, IDS[:40])
    assert host_kv_bytes(st)[1] > 0
    assert not m.can_rollback(st, 20) and m.can_rollback(st, 40)


def test_turbo_defaults(tmp_path, clean_env):
    turbo = {"exit_bias": 0.0, "o1": [4, 6, 1, 24], "exact_rows": 3}
    p = write_tiny(tmp_path / "turbo.cmf", turbo=turbo,
                   exact_weights=np.ones(N_FULL * 2 * GEOM["nk"], np.float32))
    m = model(p)
    assert m.o1rt is not None and m.o1rt.exact is not None and m.o1rt.exact.budget == 3
    st = m.new_state()
    assert np.isfinite(m.forward(st, IDS[:40])).all()
    assert all(s.o1.far[0].sink_len == 4 for s in o1_slots(st))
    clean_env.setenv("CMF_DORY_O1", "off")
    assert model(p).o1rt is None
    clean_env.delenv("CMF_DORY_O1")
    assert model(p, loops=2).o1rt is None        # a fixed loop count: no turbo defaults


def test_max_near_is_a_config_error(tiny_path, clean_env, tmp_path):
    exact_env(clean_env, tmp_path, budget=MAX_NEAR)
    with pytest.raises(ConfigError, match="near field"):
        model(tiny_path, o1="4,6,1,24")


def test_rollback_before_the_seal_keeps_the_query_trace_in_step(tmp_path, clean_env):
    m = model(write_tiny(tmp_path / "w50.cmf", window=50), o1="4,6,0,24")
    ref = m.new_state()
    m.forward(ref, IDS[:15])
    want = m.forward(ref, IDS[15:40])      # last_loop: the same chunks as below
    st = m.new_state()
    m.forward(st, IDS[:20])
    assert m.can_rollback(st, 15)
    m.rollback(st, 15)
    got = m.forward(st, IDS[15:40])
    assert np.abs(got - want).max() <= 1e-5
    for i in range(40, 46):                  # past the seal: the landmarks agree too
        assert np.abs(m.forward(st, [IDS[i]]) - m.forward(ref, [IDS[i]])).max() <= 1e-5


def test_a_state_dropped_before_its_rebuild_leaves_no_files(tiny_path, clean_env, tmp_path):
    exact_env(clean_env, tmp_path, budget=3)
    spill = tmp_path / "spill"
    m = model(tiny_path, o1="4,6,1,24", spill=str(spill))
    st = m.new_state()
    st.slots = [[] for _ in range(m.attn_layers)]
    m._stack(st, np.stack([m.embed.row(i) for i in IDS[:64]]), 0, 2, True)   # no forward end
    assert len(os.listdir(spill)) > 0
    del st
    import gc
    gc.collect()
    assert os.listdir(spill) == []


@pytest.mark.filterwarnings("ignore:.*no tokenizer")
def test_llm_sessions_take_the_option_and_reread_past_a_seal(tiny_path, clean_env):
    from cortiq.llm import LLM
    llm = LLM(tiny_path, o1="4,6,0,24")
    s = llm.session()
    s.feed(IDS[:30])
    s.feed(IDS[30:40])
    s.rollback(35)                      # sealed: the session reads the prefix again
    got = s.feed(IDS[35:40])
    ref = llm.session()
    for a, b in ((0, 30), (30, 35), (35, 40)):
        want = ref.feed(IDS[a:b])
    assert np.isfinite(got).all() and np.abs(got - want).max() <= 1e-5


def test_fused_decode_rows_leave_the_far_field_layers_to_it(tiny_path, clean_env):
    """With the far field on, a decode step fuses the window layers' rows only; the
    result is the general path's, bit for bit, before and after the seal."""
    got = []
    for fused in (True, False):
        m = model(tiny_path, o1=(4, 6, 0, 24))
        m.fused_rows = fused
        st = m.new_state()
        m.forward(st, IDS[:20])
        got.append(np.stack([m.forward(st, [i]) for i in IDS[20:45]]))
    assert o1_slots(st), "the full layers sealed"
    np.testing.assert_array_equal(got[0], got[1])
