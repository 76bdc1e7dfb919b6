"""Self-consistency of the float64 Dory reference (tests/reference/dory_numpy.py) and the
tiny HF checkpoint builder (tests/reference/hf_tiny.py).

Tolerances:
* SAME = 1e-10: two float64 evaluations of the same maths in a different order (masked
  matrix vs cached rows, one chunk vs many); observed ~1e-14 on logits of size ~1-5.
* DIFFERENT = 1e-4: the smallest change we accept as "observably different"; the effects
  tested (a loop more, a token inside the window, last_loop across chunks) move logits by
  1e-2 .. 1 on these models.
"""
import itertools
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from reference import dory_numpy as D
from reference import hf_tiny

SAME = 1e-10
DIFFERENT = 1e-4


def ids_for(n, vocab=96, seed=3):
    return list(np.random.default_rng(seed).integers(0, vocab, n))


@pytest.fixture(scope="module")
def tiny():
    t, c = hf_tiny.make(seed=1)
    return D.DoryReference(t, c)


def maxdiff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# ------------------------------------------------------------------ KV modes

@pytest.mark.parametrize("loops", [1, 2, 3])
@pytest.mark.parametrize("chunks", [1, 3, 5, [7, 1, 12], 20])
def test_per_loop_incremental_equals_full_forward(tiny, loops, chunks):
    ids = ids_for(20)
    full = tiny.forward(ids, loops)
    inc = tiny.forward_chunked(ids, chunks, loops, kv_mode="per_loop")
    assert inc.shape == full.shape == (20, 96)
    assert maxdiff(inc, full) < SAME


@pytest.mark.parametrize("loops", [1, 2, 3])
def test_last_loop_one_chunk_equals_full_forward(tiny, loops):
    ids = ids_for(17)
    assert maxdiff(tiny.forward_chunked(ids, 17, loops, kv_mode="last_loop"),
                   tiny.forward(ids, loops)) < SAME


@pytest.mark.parametrize("chunks", [1, 4])
def test_last_loop_with_one_loop_is_chunking_independent(tiny, chunks):
    ids = ids_for(13)
    assert maxdiff(tiny.forward_chunked(ids, chunks, 1, kv_mode="last_loop"),
                   tiny.forward(ids, 1)) < SAME


@pytest.mark.parametrize("loops", [2, 3])
def test_last_loop_depends_on_chunk_boundaries(tiny, loops):
    """Earlier chunks hold their final loop's K/V: the first chunk is exact, later ones
    see other keys than the full forward does."""
    ids = ids_for(12)
    full = tiny.forward(ids, loops)
    got = tiny.forward_chunked(ids, [5, 7], loops, kv_mode="last_loop")
    assert maxdiff(got[:5], full[:5]) < SAME
    assert maxdiff(got[5:], full[5:]) > DIFFERENT
    tok = tiny.forward_chunked(ids, 1, loops, kv_mode="last_loop")
    assert maxdiff(tok[:1], full[:1]) < SAME
    assert maxdiff(tok[1:], full[1:]) > DIFFERENT


def test_last_loop_equals_a_hand_built_cache(tiny):
    """Token 2 after a [2]-chunk, loops=2: its loop-l recurrent attention must read the
    *final* loop K/V of tokens 0-1. Rebuild that by running per_loop with a cache whose
    loop-0 slots were overwritten by the loop-1 rows."""
    ids = ids_for(3)
    want = tiny.forward_chunked(ids, [2, 1], 2, kv_mode="last_loop")[2]
    cache = tiny.new_cache("per_loop")
    tiny.step(cache, ids[:2], 2)
    c = tiny.cfg
    for (layer, loop), slot in list(cache.slots.items()):
        if loop == 1:
            s0 = cache.slots[(layer, 0)]
            s0.k, s0.v = slot.k.copy(), slot.v.copy()
    got = tiny.step(cache, ids[2:], 2)[0]
    assert c.loops == 2
    assert maxdiff(got, want) < SAME


def test_last_loop_allows_changing_the_loop_count(tiny):
    ids = ids_for(6)
    out = tiny.forward_chunked(ids, [2, 2, 2], [1, 3, 2], kv_mode="last_loop")
    assert np.isfinite(out).all()


def test_per_loop_refuses_a_deeper_loop_mid_sequence(tiny):
    cache = tiny.new_cache("per_loop")
    tiny.step(cache, ids_for(3), loops=1)
    with pytest.raises(ValueError, match="loop 1"):
        tiny.step(cache, ids_for(1), loops=2)


@pytest.mark.parametrize("kv_mode", ["per_loop", "last_loop"])
def test_rollback_keeps_the_prefix_a_new_turn_extends(tiny, kv_mode):
    """The reference engine's rollback test: 9 tokens, forget from 5, feed 5.. again (one chunk each
    time, so last_loop sees the same boundaries as the [5, 7] chunking)."""
    ids = ids_for(12)
    cache = tiny.new_cache(kv_mode)
    tiny.step(cache, ids[:9])
    cache.rollback(5)
    assert cache.pos == 5
    got = tiny.step(cache, ids[5:])
    want = tiny.forward_chunked(ids, [5, 7], kv_mode=kv_mode)[5:]
    assert maxdiff(got, want) < SAME
    fresh = tiny.new_cache(kv_mode)
    tiny.step(fresh, ids[:5])
    assert maxdiff(tiny.step(fresh, ids[5:]), got) < SAME


def test_loops_change_the_logits_and_are_bounded(tiny):
    ids = ids_for(6)
    outs = [tiny.forward(ids, n) for n in (0, 1, 2, 3)]
    for a, b in itertools.pairwise(outs):
        assert maxdiff(a, b) > DIFFERENT
    assert maxdiff(tiny.forward(ids), outs[2]) == 0.0       # config default: 2 loops
    with pytest.raises(ValueError, match="0..16"):
        tiny.forward(ids, 17)


# ------------------------------------------------------------------ windows

def one_layer(kind, window=3, seed=2, **kw):
    t, c = hf_tiny.make(seed=seed, pattern=kind, blocks=(len(kind), 0, 0), loops=1,
                        window=window, **kw)
    return D.DoryReference(t, c)


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_sliding_layer_sees_exactly_window_keys(window):
    """Query t reads keys j with t - W < j <= t (the current token counts)."""
    ref = one_layer("S", window)
    ids = ids_for(12)
    base = ref.forward(ids)
    for j in range(12):
        changed = list(ids)
        changed[j] = (changed[j] + 1) % 96
        diff = np.abs(ref.forward(changed) - base).max(axis=1)
        for t in range(12):
            inside = 0 <= t - j < window
            assert (diff[t] > DIFFERENT) == inside, (window, j, t, diff[t])


def test_stacked_sliding_layers_reach_grows_by_window_minus_one():
    """Two S layers with W = 3 reach 4 tokens back, never more."""
    ref = one_layer("S-S", 3)
    ids = ids_for(14)
    base = ref.forward(ids)
    changed = list(ids)
    changed[0] = (changed[0] + 5) % 96
    diff = np.abs(ref.forward(changed) - base).max(axis=1)
    assert (diff[:5] > DIFFERENT).all()
    assert (diff[5:] == 0).all()


def test_full_layer_sees_everything_unless_full_window():
    ref = one_layer("*")
    ids = ids_for(10)
    changed = [(ids[0] + 1) % 96] + ids[1:]
    assert (np.abs(ref.forward(changed) - ref.forward(ids)).max(axis=1) > DIFFERENT).all()
    a, b = ref.forward(ids, full_window=3), ref.forward(changed, full_window=3)
    diff = np.abs(a - b).max(axis=1)
    assert (diff[:3] > DIFFERENT).all() and (diff[3:] == 0).all()
    inc = ref.forward_chunked(ids, 2, full_window=3)
    assert maxdiff(inc, a) < SAME


def test_sliding_window_through_recurrent_loops_in_the_cache(tiny):
    """The tiny model (W = 3) decoded token by token past the window still matches."""
    ids = ids_for(30)
    assert maxdiff(tiny.forward_chunked(ids, 1, 3, kv_mode="per_loop"), tiny.forward(ids, 3)) < SAME


# ------------------------------------------------------------------ layer maths, by hand

def slow_layer_logits(t, c, ids):
    """A one-sub-layer model written with scalar loops: an independent spelling of the
    attention / MLP / residual / head formulas."""
    H = c["hidden_size"]
    nh, nk, hd = c["num_attention_heads"], c["num_key_value_heads"], c["attention_head_dim"]
    std, a0 = c["init_method_std"], c["ngpt_alpha_init"]
    g0 = c["attention_output_gate_logit_scale_init"] or math.sqrt(H)
    kind = c["hybrid_layer_pattern"]
    W = c["swa_window_size"]
    theta = c["rope_theta_2"] if kind == "S" else c["rope_theta"]
    T = len(ids)
    w = {k: v.astype(np.float64) for k, v in t.items()}
    m = "backbone.layers.0.mixer"

    def n(v):
        return v / math.sqrt(float(v @ v) + 1e-6)

    def rot(vec, p):
        out = vec.copy()
        h2 = hd // 2
        for i in range(h2):
            inv = float(np.float32(1) / np.float32(theta) ** np.float32(2 * i / hd))
            a = p * inv
            out[i] = vec[i] * math.cos(a) - vec[i + h2] * math.sin(a)
            out[i + h2] = vec[i + h2] * math.cos(a) + vec[i] * math.sin(a)
        return out

    x = [w["backbone.embeddings.weight"][i] for i in ids]
    outs = []
    if kind == "-":
        alpha = w["backbone.layers.0.mlp_alpha"]
        for p in range(T):
            a = (w[f"{m}.gate_proj.weight"] @ x[p]) * w[f"{m}.suv_gate"] * math.sqrt(H)
            b = (w[f"{m}.up_proj.weight"] @ x[p]) * w[f"{m}.suv_up"] * math.sqrt(H)
            act = np.array([ai / (1 + math.exp(-ai)) * bi for ai, bi in zip(a, b)])
            outs.append(w[f"{m}.down_proj.weight"] @ n(act))
    else:
        alpha = w["backbone.layers.0.attn_alpha"]
        K = [[n(rot((w[f"{m}.k_proj.weight"] @ x[j])[h * hd:(h + 1) * hd], j)) for h in range(nk)]
             for j in range(T)]
        Vv = [[(w[f"{m}.v_proj.weight"] @ x[j])[h * hd:(h + 1) * hd] for h in range(nk)]
              for j in range(T)]
        for p in range(T):
            qrow = w[f"{m}.q_proj.weight"] @ x[p]
            grow = w[f"{m}.g_proj.weight"] @ x[p]
            y = np.zeros(nh * hd)
            for h in range(nh):
                sq = (w[f"{m}.sqk"][h * hd:(h + 1) * hd] * math.sqrt(hd) / std) ** 2
                q = n(rot(qrow[h * hd:(h + 1) * hd], p)) * sq
                kh = h // (nh // nk)
                keys = [j for j in range(p + 1) if kind == "*" or p - j < W]
                s = [float(q @ K[j][kh]) / math.sqrt(hd) for j in keys]
                mx = max(s)
                e = [math.exp(v - mx) for v in s]
                y[h * hd:(h + 1) * hd] = sum(ei / sum(e) * Vv[j][kh] for ei, j in zip(e, keys))
            sg = (w[f"{m}.s_gate"] * math.sqrt(g0) / std) ** 2
            y = y / (1 + np.exp(-(grow * sg)))
            outs.append(w[f"{m}.o_proj.weight"] @ n(y))
    logits = []
    for p in range(T):
        a, b = n(x[p]), n(outs[p])
        h = n(a + np.abs(alpha * a0 / std) * (b - a))
        logits.append((w["lm_head.weight"] @ h) * w["lm_head.logit_scale"] / std)
    return np.array(logits)


@pytest.mark.parametrize("kind", ["S", "*", "-"])
def test_one_layer_matches_a_scalar_loop_spelling(kind):
    t, c = hf_tiny.make(seed=4, pattern=kind, blocks=(1, 0, 0), loops=1, window=3,
                        heads=4, kv_heads=2, gate_init=7.0)
    ids = ids_for(8)
    got = D.DoryReference(t, c).forward(ids, 0)
    assert maxdiff(got, slow_layer_logits(t, c, ids)) < 1e-9


def test_input_is_mixed_back_before_every_pass():
    """With no recurrent layers a pass is state = n(n(state + inp)): every loop count
    leaves the (unit) input state where it was, up to the 1e-6 epsilon."""
    t, c = hf_tiny.make(seed=5, pattern="S-S-", blocks=(2, 0, 2), loops=1, window=3)
    ref = D.DoryReference(t, c)
    ids = ids_for(5)
    h1 = ref.forward(ids, 1, return_hidden=True)
    h3 = ref.forward(ids, 3, return_hidden=True)
    h0 = ref.forward(ids, 0, return_hidden=True)
    assert maxdiff(h1, h3) < 1e-5 and maxdiff(h0, h1) < 1e-5


def test_rope_preserves_norms_and_depends_on_relative_position():
    rng = np.random.default_rng(0)
    inv = D.rope_inv_freq(8, 1e4)
    q, k = rng.normal(size=(1, 1, 8)), rng.normal(size=(1, 1, 8))
    dots = []
    for p0 in (0, 5, 40):
        rq = D.rope(q, np.array([p0 + 3]), inv)
        rk = D.rope(k, np.array([p0]), inv)
        assert abs(np.linalg.norm(rq) - np.linalg.norm(q)) < 1e-12
        dots.append(float((rq * rk).sum()))
    assert max(dots) - min(dots) < 1e-9


def test_from_cmf_names_and_arch_give_the_same_logits():
    t, c = hf_tiny.make(seed=6)
    ref = D.DoryReference(t, c)
    cmf_t = {k.replace("backbone.embeddings.", "model.embed_tokens.")
              .replace("backbone.layers.", "model.layers."): v for k, v in t.items()}
    arch = {"hidden_size": c["hidden_size"], "intermediate_size": c["intermediate_size"],
            "vocab_size": c["vocab_size"], "num_attention_heads": c["num_attention_heads"],
            "num_kv_heads": c["num_key_value_heads"], "head_dim": c["attention_head_dim"],
            "dory": {"layer_pattern": c["hybrid_layer_pattern"], "n_input_layers": 4,
                     "n_recurrent_layers": 4, "n_output_layers": 4, "n_recurrent_loops": 2,
                     "recurrent_kv_cache_mode": "per_loop",
                     "sliding_window": c["swa_window_size"],
                     "rope_theta_full": c["rope_theta"], "rope_theta_sliding": c["rope_theta_2"],
                     "initializer_range": c["init_method_std"],
                     "ngpt_alpha_init": c["ngpt_alpha_init"],
                     "gate_logit_scale_init": math.sqrt(c["hidden_size"])}}
    ids = ids_for(9)
    assert maxdiff(D.DoryReference.from_cmf(arch, cmf_t).forward(ids), ref.forward(ids)) < SAME


def test_rope_profiles_not_chars_pick_theta_in_hf_configs():
    t, c = hf_tiny.make(seed=7)
    profiles = [1 if ch == "S" else 2 for ch in c["hybrid_layer_pattern"]]
    swapped = dict(c, rope_profile_layers=profiles)
    ids = ids_for(9)
    a, b = D.DoryReference(t, swapped).forward(ids), D.DoryReference(t, c).forward(ids)
    assert maxdiff(a, b) > DIFFERENT


def test_out_of_vocab_ids_embed_as_zero_rows(tiny):
    assert np.isfinite(tiny.forward([1, 500, 2])).all()
    with pytest.raises(ValueError):
        tiny.forward([-1])


# ------------------------------------------------------------------ hf_tiny

@pytest.mark.parametrize("dtype,shards,template", [("f32", 1, "file"), ("bf16", 3, "config"),
                                                   ("f32", 2, None)])
def test_hf_tiny_writes_a_loadable_checkpoint(tmp_path, dtype, shards, template):
    tensors, config = hf_tiny.build(tmp_path, seed=0, dtype=dtype, shards=shards,
                                    chat_template=template)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "config.json" in files and "tokenizer.json" in files
    assert ("chat_template.jinja" in files) == (template == "file")
    tcfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert ("chat_template" in tcfg) == (template == "config")
    got = {}
    for f in tmp_path.glob("*.safetensors"):
        got.update(read_safetensors(f))
    assert set(got) == set(tensors)
    for k, v in tensors.items():
        assert got[k].shape == v.shape and np.array_equal(got[k], v), k
    assert json.loads((tmp_path / "config.json").read_text()) == config
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() <= config["vocab_size"]
    assert tok.token_to_id("<|im_end|>") is not None
    assert tok.decode(tok.encode("hello world").ids) == "hello world"


def read_safetensors(path):
    """An independent little reader (f32 / bf16) for the builder's files."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, info in header.items():
        if k == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[8 + n + a:8 + n + b]
        if info["dtype"] == "F32":
            arr = np.frombuffer(buf, "<f4")
        else:
            assert info["dtype"] == "BF16"
            arr = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
        out[k] = arr.reshape(info["shape"])
    return out


def test_hf_tiny_values_are_bf16_exact():
    t, _ = hf_tiny.make(seed=0)
    for k, v in t.items():
        assert np.array_equal(hf_tiny.bf16_round(v), v), k


def test_hf_tiny_refuses_counts_that_do_not_add_up():
    with pytest.raises(ValueError, match="blocks"):
        hf_tiny.hf_config(pattern="S-*-", blocks=(1, 1, 1))


def test_the_reference_imports_nothing_from_cortiq():
    import ast
    for mod in (D, hf_tiny):
        tree = ast.parse(Path(mod.__file__).read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "cortiq" for n in names), mod.__name__


from hypothesis import given, strategies as st  # noqa: E402


@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.integers(1, 3))
def test_any_chunking_agrees_under_per_loop(sizes, loops):
    ids = ids_for(sum(sizes), seed=len(sizes))
    got = _PROP_REF.forward_chunked(ids, sizes, loops, kv_mode="per_loop")
    assert maxdiff(got, _PROP_REF.forward(ids, loops)) < SAME
    last = _PROP_REF.forward_chunked(ids, sizes, loops, kv_mode="last_loop")
    assert maxdiff(last[:sizes[0]], got[:sizes[0]]) < SAME     # the first chunk is exact


_PROP_MODEL = hf_tiny.make(seed=9, pattern="S-*-S-", blocks=(2, 2, 2), window=2)
_PROP_REF = D.DoryReference(*_PROP_MODEL)
