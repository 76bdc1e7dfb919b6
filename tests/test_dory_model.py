"""The Dory forward (cortiq.models.dory) through cortiq.LLM sessions, against the
independent float64 reference (tests/reference/dory_numpy.py) on tiny random
Hugging Face checkpoints converted by cortiq's converter.

Tolerances:
* F32_ABS = 1e-4: the bar for float32 weights. Measured ~4e-6: float32
  activations against float64, logits of size ~1-5.
* Q_ABS = 1e-3: quantized weights against the reference run on the dequantized
  weights; only activation rounding differs, as for f32 (the weights are identical).
* CHUNK_ABS = 1e-5: the same model fed in different chunkings (per_loop); matmat and
  matvec sum in different orders.
"""
import os
import sys

import numpy as np
import pytest

import cortiq
from cortiq.errors import ConfigError
from cortiq.runtime.llm import LLM
from cortiq.models import dory as dory_mod

sys.path.insert(0, os.path.dirname(__file__))
from reference import dory_numpy as R
from reference import hf_tiny

F32_ABS = 1e-4
Q_ABS = 1e-3
CHUNK_ABS = 1e-5

from cortiq.convert import from_hf as convert  # noqa: E402


def build_model(tmp_path_factory, name, quant="f32", **params):
    d = tmp_path_factory.mktemp(name)
    tensors, config = hf_tiny.build(d / "hf", **params)
    out = d / f"model-{quant}.cmf"
    convert(d / "hf", out, quant=quant, progress=False)
    return out, tensors, config


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    return build_model(tmp_path_factory, "f32", window=4, loops=2, seed=3)


def ids_for(vocab, n, seed=0):
    return [int(i) for i in np.random.default_rng(seed).integers(0, vocab, n)]


@pytest.mark.parametrize("kv_mode", ["per_loop", "last_loop"])
@pytest.mark.parametrize("loops", [1, 2, 3])
def test_parity_with_the_reference_f32(f32_model, kv_mode, loops):
    path, tensors, config = f32_model
    ref = R.DoryReference(tensors, config)
    ids = ids_for(config["vocab_size"], 40, seed=loops)  # past the window of 4
    llm = LLM(path, loops=loops, kv_mode=kv_mode)
    # a whole prompt: 64-row chunks, as the reference is told
    got = llm.session().feed(ids, want="all")
    want = ref.forward_chunked(ids, 64, loops=loops, kv_mode=kv_mode)
    assert np.abs(got - want).max() <= F32_ABS
    # token by token (decode)
    s = llm.session()
    rows = np.stack([s.feed([i], want="last") for i in ids])
    want1 = ref.forward_chunked(ids, 1, loops=loops, kv_mode=kv_mode)
    assert np.abs(rows - want1).max() <= F32_ABS
    assert (rows.argmax(axis=1) == want1.argmax(axis=1)).all()


@pytest.mark.parametrize("quant", ["q8_row", "q8_2f", "q4_tiled", "bf16", "f16"])
def test_parity_quantized_against_dequantized_reference(tmp_path_factory, quant):
    path, _, config = build_model(tmp_path_factory, f"q-{quant}", quant=quant, window=3,
                                  loops=2, seed=7)
    llm = LLM(path, precision="exact")  # parity: float32 activations (auto: int8 for q4)
    ref = R.DoryReference.from_cmf_file(llm.file)
    ids = ids_for(config["vocab_size"], 20, seed=1)
    got = llm.session().feed(ids, want="all")
    want = ref.forward_chunked(ids, 64)
    assert np.abs(got - want).max() <= Q_ABS


def test_chunks_give_the_same_logits_past_the_window(f32_model):
    path, _, config = f32_model
    llm = LLM(path, kv_mode="per_loop")
    ids = ids_for(config["vocab_size"], 23, seed=5)
    outs = []
    for chunk in (1, 4, 64):
        s = llm.session()
        for a in range(0, len(ids), chunk):
            lg = s.feed(ids[a:a + chunk], want="last")
        outs.append(lg)
    assert np.abs(outs[0] - outs[1]).max() <= CHUNK_ABS
    assert np.abs(outs[0] - outs[2]).max() <= CHUNK_ABS


def test_last_loop_keeps_one_slot_per_layer_and_rewrites_in_place(f32_model):
    path, _, config = f32_model
    per = LLM(path, kv_mode="per_loop", loops=3)
    last = LLM(path, kv_mode="last_loop", loops=3)
    ids = ids_for(config["vocab_size"], 6)
    sp, sl = per.session(), last.session()
    sp.feed(ids, want="none")
    sl.feed(ids, want="none")
    m = last.model
    slots_last = [len(r) for r in sl._state.slots]
    assert slots_last == [1] * m.attn_layers
    slots_per = [len(r) for r in sp._state.slots]
    rec = [w.ordinal for li, w in enumerate(m.layers)
           if isinstance(w, dory_mod.AttnWeights) and m.n_in <= li < m.n_in + m.n_rec]
    assert all(slots_per[o] == 3 for o in rec) and sum(slots_per) > sum(slots_last)
    # rows are rewritten, not appended: a full layer holds exactly one row per position
    full = [w for w in m.layers if isinstance(w, dory_mod.AttnWeights) and not w.sliding]
    for w in full:
        assert sl._state.slots[w.ordinal][0].n == len(ids)
    # one chunk of last_loop equals per_loop
    a = per.session().feed(ids, want="all")
    b = last.session().feed(ids, want="all")
    assert np.abs(a - b).max() <= CHUNK_ABS


@pytest.mark.parametrize("kv_mode", ["per_loop", "last_loop"])
def test_rollback_then_refeed_equals_a_straight_run(f32_model, kv_mode):
    path, _, config = f32_model
    llm = LLM(path, kv_mode=kv_mode)
    ids = ids_for(config["vocab_size"], 30, seed=9)
    s = llm.session()
    straight = [s.feed([i], want="last") for i in ids]
    s2 = llm.session()
    for i in ids[:25]:
        s2.feed([i])
    s2.rollback(12)  # far past the sliding window: the session re-reads the prefix
    assert s2.pos == 12
    got = [s2.feed([i], want="last") for i in ids[12:]]
    np.testing.assert_allclose(np.stack(got), np.stack(straight[12:]), atol=CHUNK_ABS)
    s3 = llm.session()
    for i in ids[:25]:
        s3.feed([i])
    s3.rollback(23)  # a short rollback the window still covers: done in place
    got = [s3.feed([i], want="last") for i in ids[23:]]
    np.testing.assert_allclose(np.stack(got), np.stack(straight[23:]), atol=CHUNK_ABS)


def test_want_modes_and_logits(f32_model):
    path, _, config = f32_model
    s = LLM(path).session()
    ids = ids_for(config["vocab_size"], 5)
    assert s.feed(ids[:2], want="none") is None
    with pytest.raises(cortiq.CortiqError, match="no logits"):
        s.logits()
    last = s.feed(ids[2:], want="last")
    assert last.shape == (config["vocab_size"],) and last.dtype == np.float32
    assert s.logits() is not None and s.pos == 5
    allr = LLM(path).session().feed(ids, want="all")
    assert allr.shape == (5, config["vocab_size"])
    np.testing.assert_allclose(allr[-1], last, atol=CHUNK_ABS)
    with pytest.raises(ValueError, match="want must be"):
        s.feed(ids, want="some")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        s.feed([config["vocab_size"]])


def test_conf_gate_bounds(f32_model):
    path, tensors, config = f32_model
    ref = R.DoryReference(tensors, config)
    ids = ids_for(config["vocab_size"], 12, seed=4)
    # threshold 1.0: no token is ever sure enough, every token runs both loops
    s = LLM(path, kv_mode="last_loop", loops=2, gate="conf:1.0").session()
    rows = np.stack([s.feed([i]) for i in ids])
    want2 = ref.forward_chunked(ids, 1, loops=2, kv_mode="last_loop")
    assert np.abs(rows - want2).max() <= F32_ABS
    # a threshold every token passes: each leaves after its first pass (= one loop)
    s = LLM(path, kv_mode="last_loop", loops=2, gate="conf:1e-9").session()
    rows = np.stack([s.feed([i]) for i in ids])
    want1 = ref.forward_chunked(ids, 1, loops=1, kv_mode="last_loop")
    assert np.abs(rows - want1).max() <= F32_ABS
    assert s._state.gate_one == len(ids)


def test_top_prob():
    lg = np.full(100, -30.0, np.float32)
    lg[7] = 30.0
    assert dory_mod.top_prob(lg) > 0.999
    assert abs(dory_mod.top_prob(np.array([1.0, 1.0], np.float32)) - 0.5) < 1e-6


def test_bad_options_name_the_option(f32_model, monkeypatch):
    path, _, _ = f32_model
    with pytest.raises(ConfigError, match="kv_mode"):
        LLM(path, kv_mode="every_loop")
    with pytest.raises(ConfigError, match="loops"):
        LLM(path, loops=17)
    with pytest.raises(ConfigError, match="gate"):
        LLM(path, gate="sometimes")
    monkeypatch.setenv("CORTIQ_DORY_LOOPS", "x")
    with pytest.raises(ConfigError, match="CORTIQ_DORY_LOOPS"):
        LLM(path)
    monkeypatch.setenv("CORTIQ_DORY_LOOPS", "3")
    assert LLM(path).model.loops == 3
    assert LLM(path, loops=1).model.loops == 1  # a keyword beats the variable


def test_recon_gate_file_errors(f32_model, tmp_path):
    path, _, _ = f32_model
    bad = tmp_path / "router.bin"
    np.array([2, 5, 1, 2], "<f4").tofile(bad)
    with pytest.raises(ConfigError, match="router|recon"):
        LLM(path, kv_mode="last_loop", gate=f"recon:{bad}:0.5")
    with pytest.raises(ConfigError, match="cannot read"):
        LLM(path, kv_mode="last_loop", gate=f"recon:{tmp_path / 'missing'}:0.5")


@pytest.fixture(scope="module")
def quant_models(tmp_path_factory):
    return {q: build_model(tmp_path_factory, f"fused_{q}", quant=q, window=4, loops=2, seed=3)
            for q in ("q8_row", "q4_block")}


@pytest.mark.parametrize("quant,opts", [
    ("f32", dict(kv_mode="per_loop", loops=2)),
    ("f32", dict(kv_mode="last_loop", loops=3)),
    ("f32", dict(kv_mode="last_loop", loops=2, gate="conf:0.3")),
    ("f32", dict(kv_mode="per_loop", loops=2, full_window=6)),
    ("f32", dict(kv_mode="last_loop", loops=3, prompt_loops=1, full_window=9)),
    ("q8_row", dict(kv_mode="per_loop", loops=2, precision="exact")),
    ("q8_row", dict(kv_mode="last_loop", loops=2, precision="int8")),
    ("q4_block", dict(kv_mode="last_loop", loops=3, precision="auto", full_window=6)),
    ("q4_block", dict(kv_mode="per_loop", loops=2, precision="exact")),
])
def test_fused_decode_rows_equal_the_general_path(f32_model, quant_models, quant, opts):
    """A decode step runs each sub-layer as one fused kernel call (dory_attn_row,
    dory_mlp_row): bit for bit what the general path (`_attn`, `_mlp`: the readable
    statement of the math) computes, cache rows included, for every KV mode, window,
    gate, stored dtype and precision."""
    path, _, config = f32_model
    if quant != "f32":
        path = quant_models[quant][0]
    ids = ids_for(config["vocab_size"], 30, seed=11)
    got = []
    for fused in (True, False):
        llm = LLM(path, **opts)
        llm.model.fused_rows = fused
        s = llm.session()
        rows = [s.feed(ids[:5], want="last")] + [s.feed([i], want="last") for i in ids[5:]]
        rows.append(s.feed(ids[:3], want="all")[-1])  # a chunk after decoding
        rows.append(s.feed([ids[0]], want="last"))
        got.append(np.stack(rows))
        st = s._state
        got.append(np.concatenate([sl.k[:sl.n].ravel() for row in st.slots for sl in row]))
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_array_equal(got[1], got[3])


@pytest.mark.parametrize("kv_mode", ["per_loop", "last_loop"])
def test_conf_gate_with_exits_and_second_passes(f32_model, kv_mode):
    """Tokens that leave after one pass and tokens that run two share a sequence: each
    token's logits are the reference's for the passes it ran, and under per_loop a
    later token's second pass reads, for an exited position, that position's first-pass
    keys (the reference's `carry`)."""
    path, tensors, config = f32_model
    ref = R.DoryReference(tensors, config)
    ids = ids_for(config["vocab_size"], 90, seed=5)
    s = LLM(path, kv_mode=kv_mode, loops=2, gate="conf:0.3").session()
    cache = ref.new_cache(kv_mode, carry=True)
    passes = []

    def feed(piece):
        one = s._state.gate_one
        got = s.feed(piece, want="all")
        n = 2 if len(piece) > 1 or s._state.gate_one == one else 1
        want = ref.step(cache, piece, n)
        assert np.abs(got - want).max() <= F32_ABS, (len(passes), n)
        assert (got.argmax(axis=1) == want.argmax(axis=1)).all()
        passes.append(n)

    feed(ids[:64])                     # the prompt, then generated tokens: the gate
    for i in ids[64:]:
        feed([i])
    assert 1 in passes[1:] and 2 in passes[1:], passes


def test_far_field_gate_under_per_loop_is_refused(f32_model):
    path, _, _ = f32_model
    with pytest.raises(ConfigError, match="last_loop"):
        LLM(path, kv_mode="per_loop", loops=2, gate="conf:0.3", o1="4,2,1,24")
    LLM(path, kv_mode="last_loop", loops=2, gate="conf:0.3", o1="4,2,1,24")


def test_conf_gate_reads_generated_tokens_only(f32_model):
    """Prompt rows run every pass however the prompt is cut (a 65-row prompt's
    one-row last chunk, a one-id prompt piece); a generated token meets the gate."""
    path, _, config = f32_model
    llm = LLM(path, kv_mode="per_loop", loops=2, gate="conf:1e-9")  # every probe exits
    ids = ids_for(config["vocab_size"], 66, seed=8)
    s = llm.session()
    s.feed(ids[:65], "none")
    s.feed(ids[65:], "last", prompt=True)
    assert s._state.gate_tokens == 0
    whole = llm.session().feed(ids, "last")
    assert np.abs(s.logits() - whole).max() <= CHUNK_ABS
    s.feed([3], "last", prompt=False)
    assert (s._state.gate_tokens, s._state.gate_one) == (1, 1)
