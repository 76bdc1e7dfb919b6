"""Dory's far field end to end (the reference engine's far-field tests,
src/cortiq/models/dory/far_field.py hooked into src/cortiq/models/dory/model.py) on a tiny random model written
as a CMF file.

Tolerances: the bookkeeping tests need none but finiteness and equality -- the reference
engine's tests compare RAM and file stores bit for bit (the same arithmetic on the same
rows). The accuracy tests at the end pin the far field's logit error against exact
attention (FAR_BOUND, FAR_VS_TRUNC) and each sealed layer against a float64 transcription
of docs/nystrom.md (SPEC_TOL); their docstrings give the measured values.
"""
import os
import warnings

import numpy as np
import pytest

import cortiq.cmf
from cortiq.kernels._config import RENAMED
from cortiq.models import dory
from cortiq.errors import ConfigError
from cortiq.models.dory.config import ENV_VARS
from cortiq.models.dory.far_field import MAX_NEAR, QT_STRIDE, host_kv_bytes

PATTERN = "S-*-S-*-S-*-"
GEOM = dict(hidden=16, ffn=16, nh=4, nk=2, hd=8, vocab=11)


def write_tiny(path, *, window=5, kv="last_loop", loops=2, turbo=None, exact_weights=None,
               seed=1, qk_gain=2.0):
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
            t[f"{m}.sqk"] = np.full(nh * hd, qk_gain * 0.02 / np.sqrt(hd), np.float32)
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
    for v in ENV_VARS + tuple(RENAMED[v] for v in ENV_VARS):   # and their older names
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def exact_env(monkeypatch, tmp_path, budget=3):
    f = tmp_path / "exact.bin"
    np.r_[np.float32(0), np.ones(N_FULL * 2 * GEOM["nk"], np.float32)].astype("<f4").tofile(f)
    monkeypatch.setenv("CORTIQ_DORY_EXACT", f"{f}:{budget}")


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
    clean_env.setenv("CORTIQ_DORY_O1_SPILL", str(tmp_path / "spill2"))
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
    clean_env.setenv("CORTIQ_DORY_O1", "4,6,0,10")
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
    clean_env.setenv("CORTIQ_DORY_O1", "off")
    assert model(p).o1rt is None
    clean_env.delenv("CORTIQ_DORY_O1")
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
    rounds = m._rounds([st], [np.asarray(IDS[:64])], ["none"], [True])
    next(rounds)                             # one round, stopped before the forward's end
    rounds.close()
    assert len(os.listdir(spill)) > 0
    del st, rounds
    import gc
    gc.collect()
    assert os.listdir(spill) == []


@pytest.mark.filterwarnings("ignore:.*no tokenizer")
def test_llm_sessions_take_the_option_and_reread_past_a_seal(tiny_path, clean_env):
    from cortiq.runtime.llm import LLM
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


# ------------------------------------------------------------------ accuracy

#: Far-field accuracy cases: (prompt rows, generated tokens, o1 = (m, w, sink, seal), exact
#: rows kept). The seal falls on the prompt's end, so the landmarks span the whole prompt
#: (m_eff = prompt // 8: at least twice the head dimension -- with fewer landmarks than that
#: the far field does no better than dropping the far rows on this model); every generated
#: token is read through the far field.
FAR_CASES = {
    "short": (128, 32, (16, 16, 4, 128), 0),          # far rows 109..140
    "long": (256, 256, (32, 16, 4, 256), 0),          # far rows 237..492
    "long-exact": (256, 256, (32, 16, 4, 256), 8),    # 8 rows kept exact: far 229..484
}
#: Pinned bounds on the far field's logit error: (max |err|, mean |err|) over every
#: generated position and logit, kv modes alike (measured: see the test's docstring).
FAR_BOUND = {"short": (0.13, 0.025), "long": (0.2, 0.018), "long-exact": (0.2, 0.024)}
#: The far field's error must be at most this share of truncation's (max and mean).
FAR_VS_TRUNC = (0.25, 0.15)
FAR_IDS = np.random.default_rng(7).integers(0, GEOM["vocab"], 512).tolist()


def generated_logits(path, ids, n_prompt, **opts):
    """Logits of every token after the prompt, fed one at a time as a session decodes."""
    from cortiq.runtime.llm import LLM
    s = LLM(path, **opts).session()
    s.feed(ids[:n_prompt])
    return np.stack([s.feed([i]) for i in ids[n_prompt:]]).astype(np.float64)


def logit_errors(got, want):
    """max and mean |error|, max |error| over max |want|, top-1 agreement, the largest
    KL(want || got) of a position."""
    d = np.abs(got - want)
    lp = [x - x.max(1, keepdims=True) for x in (got, want)]
    lp = [x - np.log(np.exp(x).sum(1, keepdims=True)) for x in lp]
    kl = (np.exp(lp[1]) * (lp[1] - lp[0])).sum(1).max()
    top1 = (got.argmax(1) == want.argmax(1)).mean()
    return d.max(), d.mean(), d.max() / np.abs(want).max(), top1, kl


@pytest.fixture(scope="module")
def far_path(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("far") / "far.cmf")


@pytest.mark.filterwarnings("ignore:.*no tokenizer")
@pytest.mark.parametrize("kv", ["last_loop", "per_loop"])
@pytest.mark.parametrize("case", sorted(FAR_CASES))
def test_far_field_logits_track_exact_attention(far_path, clean_env, tmp_path, case, kv):
    """Every generated token's logits with the far field on against exact full attention
    (the same model with the far field off) over the same tokens, fed the same way: the
    prompt in one feed, then one token per feed as a session decodes.

    The model is the tiny random one of write_tiny (12 layers, 3 of them full attention,
    hd = 8, 4 query heads on 2 KV heads, 2 loops, vocabulary 11); the tokens are random, so
    the far rows carry real weight: truncating the full layers to as many exact rows as
    the far field keeps (``full_window = w + sink``) moves the logits by up to 0.84-1.33
    (mean 0.19-0.22) and changes the top token at 28-34% of the positions.

    Measured, last_loop / per_loop (identical on the ref, AVX2 and AVX-512 kernels):

    * short (seal at 128, m_eff 16, 32 steps): max |err| 0.090 / 0.099, mean 0.020 /
      0.019, relative 5%, top-1 agreement 97%, KL at most 1.3e-3;
    * long (seal at 256, m_eff 32, 256 steps): max 0.154 / 0.147, mean 0.014 / 0.013,
      relative 7%, top-1 97%, KL at most 3.2e-3;
    * long-exact (the same with 8 rows kept exact): max 0.157 / 0.160, mean 0.019 / 0.019.

    Pinned: FAR_BOUND, about 1.3x the measured values (max and mean). The result is
    deterministic and the same on every kernel table to 4 digits, so the margin is not for
    rounding (1e-6 at a layer's output, see test_far_field_layers_follow_the_spec) but for
    a legitimate change of arithmetic order; it is kept small so that gross faults land
    outside it; and the far field's error at most FAR_VS_TRUNC of truncation's (it measures
    0.07-0.12 of it).

    Faults that fail it (each planted and seen to fail): the far field never absorbing the
    seal's rows, or the decode's evictions; either absorbed twice; query landmarks of the
    wrong head; the restep pushing a row instead of rewriting it (last_loop); key or query
    landmarks from segments off by one row, key landmarks from the wrong segments, a
    query trace off by one row (short). A single wrong row (a sink, a window row, a kept
    row) costs less than the approximation itself: test_far_field_layers_follow_the_spec
    catches those."""
    n_prompt, n_gen, o1, kept = FAR_CASES[case]
    if kept:
        exact_env(clean_env, tmp_path, budget=kept)
    ids = FAR_IDS[:n_prompt + n_gen]
    _, w, sink, _ = o1
    exact = generated_logits(far_path, ids, n_prompt, kv_mode=kv)
    far = generated_logits(far_path, ids, n_prompt, kv_mode=kv, o1=o1)
    trunc = generated_logits(far_path, ids, n_prompt, kv_mode=kv, full_window=w + sink)
    got, cut = logit_errors(far, exact), logit_errors(trunc, exact)
    print(f"{case} {kv}: far field max|err| {got[0]:.4f} mean {got[1]:.4f} rel {got[2]:.4f} "
          f"top-1 {got[3]:.3f} KL {got[4]:.2e}; truncated max {cut[0]:.4f} mean {cut[1]:.4f} "
          f"top-1 {cut[3]:.3f} KL {cut[4]:.2e}")
    bound = FAR_BOUND[case]
    assert cut[0] > 4 * bound[0] and cut[1] > 4 * bound[1], ("the far rows matter", cut)
    assert got[0] <= bound[0] and got[1] <= bound[1], (got, bound)
    assert got[0] <= FAR_VS_TRUNC[0] * cut[0] and got[1] <= FAR_VS_TRUNC[1] * cut[1], (got, cut)


#: The far-field layers against the float64 transcription of docs/nystrom.md: the f32
#: streaming sums against f64, through the indefinite mixing matrix (docs/nystrom.md §1.4).
SPEC_TOL = 1e-4


def kept_rows(scores, budget, lo, hi, neighbours=2):
    """docs/nystrom.md §9: the best-scoring rows of lo..hi (ties: the earlier first), each
    with its neighbours on both sides, until ``budget`` rows are taken; ascending."""
    keep = []
    for r in sorted(range(lo, hi), key=lambda r: -scores[r]):
        for j in range(max(r - neighbours, lo), min(r + neighbours + 1, hi)):
            if len(keep) < budget and j not in keep:
                keep.append(j)
    return sorted(keep)


def spec_checker(monkeypatch, o1, kept=0, scores=None):
    """Wrap O1Runtime.attend: every sealed full layer's output against FarFieldRef over
    the rows that layer was given (the latest pass's rows at each position, as the
    last_loop cache keeps them). With ``kept`` exact rows the far field is the rebuild at
    the prompt's end: the rows in the order [sinks, kept, the rest], the kept ones picked
    from the scores in the file ``scores`` (CORTIQ_DORY_EXACT_LOG), the query trace one row in
    QT_STRIDE. Returns the list of (max |diff|, max |output|) per call."""
    from reference.nystrom_numpy import FarFieldRef
    from cortiq.models.dory import far_field
    m, w, sink, _ = o1
    seen, refs, diffs = {}, {}, []
    attend = far_field.O1Runtime.attend

    def checked(self, slot, q, k, v, pos0, overwrite, exact):
        sealed = bool(getattr(slot, "o1", None) is not None and slot.o1.far)
        q0, k0, v0 = (np.array(a, np.float32) for a in (q, k, v))
        y = np.array(attend(self, slot, q, k, v, pos0, overwrite, exact), np.float32)
        t, nh, nk = q0.shape[0], q0.shape[1], k0.shape[1]
        if id(slot) not in seen:       # rows by position: a later pass's rows replace them
            seen[id(slot)] = (slot, [np.zeros((4096,) + a.shape[1:], np.float32)
                                     for a in (q0, k0, v0)])
        qs, ks, vs = seen[id(slot)][1]
        for a, b in ((qs, q0), (ks, k0), (vs, v0)):
            a[pos0:pos0 + t] = b
        if not sealed:
            return y
        kv = [h * nk // nh for h in range(nh)]
        if id(slot) not in refs:          # sealed over the rows before its first far chunk
            order, trace, q_index = np.arange(pos0), np.arange(pos0), None
            if kept:
                sc = np.fromfile(scores, "<f4")
                keep = kept_rows(sc, kept, sink, pos0 - w)
                assert len(keep) == kept
                rest = [r for r in range(sink, pos0) if r not in keep]
                order = np.r_[np.arange(sink), keep, rest].astype(np.int64)
                trace, q_index = np.arange(0, pos0, QT_STRIDE), order // QT_STRIDE
            refs[id(slot)] = (order, [FarFieldRef(qs[trace, h], ks[order, kv[h]],
                                                  vs[order, kv[h]], m, w, sink + kept, q_index)
                                      for h in range(nh)])
        order, hr = refs[id(slot)]
        for i in range(t):
            rows = np.r_[order, np.arange(order.size, pos0 + i + 1)]
            want = np.stack([ref.read(q0[i, h], ks[rows, kv[h]], vs[rows, kv[h]])
                             for h, ref in enumerate(hr)])
            diffs.append((np.abs(y[i] - want).max(), np.abs(want).max()))
        return y

    monkeypatch.setattr(far_field.O1Runtime, "attend", checked)
    return diffs


@pytest.mark.filterwarnings("ignore:.*no tokenizer")
@pytest.mark.parametrize("kv", ["last_loop", "per_loop"])
@pytest.mark.parametrize("case", sorted(FAR_CASES))
def test_far_field_layers_follow_the_spec(far_path, clean_env, tmp_path, case, kv):
    """Each sealed full layer's output at every generated token against the float64
    transcription of docs/nystrom.md (tests/reference/nystrom_numpy.py) over the rows the
    model gave that layer: the far field is the specified approximation, row for row.
    Measured max |diff| 1.8e-6 to 4.4e-6 (outputs up to 0.26; ref and SIMD kernels
    alike); pinned at SPEC_TOL = 1e-4, the ref-vs-SIMD tolerance of tests/test_nystrom.py
    (the mixing matrix amplifies f32 rounding), 20x the measured value and still far below
    what one wrong row moves (2e-3 to 2e-2).

    test_far_field_logits_track_exact_attention's approximation error is larger than what
    one wrong row costs; this check is not. Planted and seen to fail: key landmarks from
    segments off by one row or from the wrong segments; query landmarks off by one row or
    of the wrong head; the far field never absorbing, or absorbing twice, the seal's rows
    or the decode's evictions; a sink's key or value taken from the wrong row; the window
    off by one row, or one window row lost; the kept rows left in the far field too,
    the row after each kept one kept in its place, the kept rows not counted as exact
    (long-exact); the restep pushing a row (last_loop); the seal's query trace off by one
    row."""
    n_prompt, n_gen, o1, kept = FAR_CASES[case]
    scores = tmp_path / "scores.f32"
    if kept:
        exact_env(clean_env, tmp_path, budget=kept)
        clean_env.setenv("CORTIQ_DORY_EXACT_LOG", str(scores))
    diffs = spec_checker(clean_env, o1, kept, scores)
    generated_logits(far_path, FAR_IDS[:n_prompt + n_gen], n_prompt, kv_mode=kv, o1=o1)
    d = np.array(diffs)
    # 3 full layers, the recurrent one read twice (2 loops: a restep, or a slot per loop)
    assert len(d) == 4 * n_gen, "every generated token's far-field reads"
    print(f"{case} {kv}: max |diff| {d[:, 0].max():.2e}, max |output| {d[:, 1].max():.3f}")
    assert d[:, 0].max() <= SPEC_TOL
