"""DeepSeek-V4 on the WebGPU path (cortiq.gpu.deepseek_v4) against the CPU kernels and
the CPU forward (src/cortiq/models/deepseek_v4.py).

Each dsv4_* shader runs on its own against the kernel the CPU forward calls (odd
widths); the whole model runs on tiny DeepSeek-V4 files where every feature fires
within a few dozen tokens. Runs on any adapter (llvmpipe in CI); without one the tests
skip unless CORTIQ_REQUIRE_GPU=1. Tolerances: docs/gpu.md.
"""
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import cortiq
from cortiq.kernels import _kernels as K
from cortiq import cmf
from cortiq.errors import ConfigError, CortiqError
from cortiq.models import deepseek_v4 as D
from cortiq.models import rope
from cortiq.cmf.testing import qtensor_from_f32

sys.path.insert(0, os.path.dirname(__file__))
from reference.dsv4_toy import tokenizer_json, toy_tensors

pytestmark = pytest.mark.gpu
NONE = 0xFFFFFFFF


def _rel(a, b):
    return float(np.abs(np.asarray(a) - b).max() / max(np.abs(b).max(), 1e-30))


def _u32s(*vals):
    from cortiq.gpu.kernels import u32s
    return u32s(*vals)


def _run(dev, name, params, arrays, dims, pos=0):
    from cortiq.gpu.deepseek_v4 import run_once
    return run_once(dev, name, params, [np.ascontiguousarray(a) for a in arrays], dims, pos)


# ---- the gathered matvec: stacked experts / grouped blocks ---------------------------------
@pytest.mark.parametrize("dtype,R,C", [("f32", 7, 20), ("q8_row", 16, 16), ("q4_block", 16, 16),
                                       ("q4tp", 5, 64), ("q8_2f", 9, 48), ("bf16", 24, 96),
                                       ("vbit", 16, 32)])
def test_gather_matches_cpu(dev, dtype, R, C):
    from cortiq.gpu.deepseek_v4 import GatherOp, stack
    from cortiq.gpu.kernels import GpuMatrix, ParamArena
    rng = np.random.default_rng(R * C)
    E, ids = 5, np.array([3, 0, 4, 3], np.uint32)
    qts = [qtensor_from_f32(rng.standard_normal((R, C)).astype(np.float32), dtype)
           for _ in range(E)]
    g = GpuMatrix(dev, stack(qts, "experts"))
    wts = rng.random(ids.size).astype(np.float32)
    G = rng.standard_normal((ids.size, 2 * C)).astype(np.float32) * 2
    limit = 0.7
    for pro in (0, 3):
        xb, yb = dev.upload(G), dev.buffer(ids.size * R * 4, copy_src=True)
        vb = dev.upload(np.concatenate([ids.view(np.float32), wts]))
        a = ParamArena(dev)
        op = GatherOp(dev, [g], a, rpe=R, slots=ids.size, x=xb, x_off=0, x_stride=2 * C, y=yb,
                      y_off=0, y_stride=R, vbuf=vb, v_a=0, pro=pro, x2_off=C, limit=limit)
        a.upload()
        d = op.dispatch(dev.upload(np.array([1, 0, 0, 0], np.uint32), uniform=True))
        enc = dev.dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(d.pipeline)
        cp.set_bind_group(0, d.group)
        cp.dispatch_workgroups(*d.dims)
        cp.end()
        stage = dev.staging(ids.size * R * 4)
        enc.copy_buffer_to_buffer(yb, 0, stage, 0, ids.size * R * 4)
        dev.queue.submit([enc.finish()])
        got = dev.read(stage, ids.size * R * 4).view(np.float32).reshape(ids.size, R)
        if pro == 0:
            xs = [G[j, :C] for j in range(ids.size)]
        else:
            xs = [K.swiglu_clamp(G[j, :C].copy(), G[j, C:].copy(), limit, float(wts[j]))
                  for j in range(ids.size)]
        want = np.stack([qts[e].matvec(x) for e, x in zip(ids, xs)])
        assert _rel(got, want) < 1e-5


# ---- hyper-connections ---------------------------------------------------------------------
def _hc_params(n, hc, mode, nb, fn_off=0, post_rows=0, bcast=0):
    return _u32s(n, hc, mode, 20, 0, 0, 0, 3, 3 + nb, 0, fn_off, post_rows, 1e-6, 1e-6, 0, bcast)


def _hc_inputs(rng, hc, n):
    """A hyper-connection step's random inputs: the hc copies x0, fn, the scales, bases
    and norm weight (and V, the three packed as the kernels read them), three previous
    block outputs, post and comb (and pc0, packed)."""
    x0 = rng.standard_normal((hc, n)).astype(np.float32)
    fn = (rng.standard_normal(((2 + hc) * hc, hc * n)) * 0.05).astype(np.float32)
    sc, base = rng.random(3).astype(np.float32), rng.standard_normal((2 + hc) * hc).astype(np.float32)
    w = rng.random(n).astype(np.float32) + 0.5
    V = np.concatenate([sc, base, w]).astype(np.float32)
    ys = rng.standard_normal((3, n)).astype(np.float32)
    post0 = rng.random(hc).astype(np.float32)
    comb0 = rng.random((hc, hc)).astype(np.float32)
    pc0 = np.concatenate([post0, comb0.ravel()]).astype(np.float32)
    return x0, fn, sc, base, w, V, ys, post0, comb0, pc0


@pytest.mark.parametrize("hc,n", [(4, 37), (3, 300), (2, 257), (1, 5)])
def test_hc_step(dev, hc, n):
    """dsv4_hc (fn small enough to fuse): the mixes, the Sinkhorn split, fold and norm in
    one workgroup; with the previous block's expand or the embedding broadcast; the head's
    gate."""
    rng = np.random.default_rng(n)
    x0, fn, sc, base, w, V, ys, post0, comb0, pc0 = _hc_inputs(rng, hc, n)
    out0 = np.zeros(n, np.float32)

    def check(x_in, mix, p, x_want, head=False, pc=pc0):
        xo, out, pco = _run(dev, "dsv4_hc", p, [x_in, mix, ys, V, out0, pc], (1, 1, 1))
        assert _rel(xo[:hc * n].reshape(hc, n), x_want) < 1e-5
        if head:
            pre = K.hc_head_pre(K.hc_mixes(x_want, fn[:hc], 1e-6), float(sc[0]), base[:hc], 1e-6)
            assert _rel(out[:n], K.hc_fold(x_want, pre, w, 1e-6)) < 1e-5
            return
        folded, post, comb = K.hc_pre(x_want, fn, sc, base, w, 20, 1e-6, 1e-6)
        assert _rel(out[:n], folded) < 1e-5
        assert _rel(pco[:hc], post) < 1e-5 and _rel(pco[hc:hc + hc * hc], comb.ravel()) < 1e-5

    check(x0, fn, _hc_params(n, hc, 0, base.size, 0, 0), x0)                   # no expand
    x1 = K.hc_expand(ys.sum(0), x0, post0, comb0)
    check(x0, fn, _hc_params(n, hc, 0, base.size, 0, 3), x1)                   # fused expand
    e = np.zeros_like(x0)
    e[0] = x0[0]
    check(e, fn, _hc_params(n, hc, 0, base.size, 0, 0, 1), np.ascontiguousarray(np.broadcast_to(x0[0], x0.shape)))
    check(x0, fn, _hc_params(n, hc, 1, base.size, 0, 3), x1, head=True)        # the head


@pytest.mark.parametrize("hc,n", [(1, 37), (2, 300), (3, 517), (4, 1001)])
def test_hc_step_over_workgroups(dev, hc, n):
    """fn too large to fuse: dsv4_hc_post (the expand, or the embedding broadcast, with
    each workgroup's Gram partials) then dsv4_hc_fold over ceil(n / 256) workgroups
    (mixes from a matvec), against the CPU kernels at widths that leave the last
    workgroup partly idle."""
    rng = np.random.default_rng(hc * n)
    groups = (n + 255) // 256
    x0, fn, sc, base, w, V, ys, post0, comb0, pc0 = _hc_inputs(rng, hc, n)
    gr0 = np.full(groups * 64, np.nan, np.float32)      # every read entry must be written
    x1 = K.hc_expand(ys.sum(0), x0, post0, comb0)
    e = np.full_like(x0, np.nan)
    e[0] = x0[0]
    for x_in, bcast, want in ((x0, 0, x1), (e, 1, np.broadcast_to(x0[0], x0.shape))):
        xo, gr = _run(dev, "dsv4_hc_post", _u32s(n, hc, 3, 0, 0, 0, bcast, 0),
                      [x_in, ys, pc0, gr0], (groups, 1, 1))
        xo = xo[:hc * n].reshape(hc, n)
        assert _rel(xo, want) < 1e-5
        gram = gr[:groups * 64].reshape(groups, 64)[:, :hc * hc].sum(0).reshape(hc, hc)
        assert _rel(gram, want.astype(np.float64) @ want.T.astype(np.float64)) < 1e-5
        for mode in (0, 1):
            p = _u32s(n, hc, mode, 20, 0, 0, 0, 3, 3 + base.size, 0, groups, 0, 1e-6, 1e-6, 0, 0)
            out, pco = _run(dev, "dsv4_hc_fold", p, [xo, fn @ xo.ravel(), gr, V,
                                                     np.zeros(n, np.float32), pc0], (groups, 1, 1))
            if mode == 1:
                pre = K.hc_head_pre(K.hc_mixes(xo, fn[:hc], 1e-6), float(sc[0]), base[:hc], 1e-6)
                assert _rel(out[:n], K.hc_fold(xo, pre, w, 1e-6)) < 1e-5
                assert np.array_equal(pco[:pc0.size], pc0)       # the head leaves PC alone
                continue
            folded, post, comb = K.hc_pre(xo, fn, sc, base, w, 20, 1e-6, 1e-6)
            assert _rel(out[:n], folded) < 1e-5
            assert _rel(pco[:hc], post) < 1e-5
            assert _rel(pco[hc:hc + hc * hc], comb.ravel()) < 1e-5


# ---- RMSNorm + interleaved RoPE (+ the window ring write), two jobs a dispatch -----------
@pytest.mark.parametrize("inverse", [0, 1])
def test_norm_rope(dev, inverse):
    rng = np.random.default_rng(inverse)
    nv, width, rd, ring, pos = 3, 50, 6, 5, 13
    x = rng.standard_normal((1 + nv, width)).astype(np.float32)
    w = rng.random(width).astype(np.float32)
    c, s = rope.RopeTable(rope.inv_freq(rd, 10000.0)).at(pos)
    R = np.concatenate([c, s]).astype(np.float32)
    # job a: row 0, weighted norm + RoPE + ring write; job b: rows 1.., RoPE only
    p = (_u32s(width, 1, 0, 0, 1, rd, 0, inverse, 0, ring, 1e-6, 0)
         + _u32s(width, nv, width, NONE, 0, rd, 0, inverse, NONE, 1, 1e-6, 0) + _u32s(1, 0, 0, 0))
    a, d = _run(dev, "dsv4_rope", p, [x, w, R, np.zeros((ring, width), np.float32)],
                (1 + nv, 1, 1), pos=pos)
    want = K.rmsnorm(x[:1], w, 1e-6)
    K.rope_interleaved_tail(want, c, s, rd, bool(inverse))
    assert _rel(a[:width], want[0]) < 1e-5
    assert _rel(d[(pos % ring) * width:(pos % ring + 1) * width], want[0]) < 1e-5
    want = x[1:].copy()
    K.rope_interleaved_tail(want, c, s, rd, bool(inverse))
    assert _rel(a[width:(1 + nv) * width].reshape(nv, width), want) < 1e-5


# ---- the compressor, over several windows ----------------------------------------------
@pytest.mark.parametrize("overlap,ratio", [(True, 4), (False, 3)])
def test_compressor_matches_cpu(dev, overlap, ratio):
    rng = np.random.default_rng(ratio)
    entry, rd = 10, 4
    width = 2 * entry if overlap else entry
    ape = rng.standard_normal((ratio, width)).astype(np.float32)
    norm = rng.random(entry).astype(np.float32) + 0.5
    cp = D._Compressor(None, None, norm, ape, ratio, overlap, width, entry)
    cs = D._CompState()
    host = SimpleNamespace(cfg=SimpleNamespace(norm_eps=1e-6, rope_head_dim=rd))
    inv = rope.yarn_inv_freq(rd, 160000.0, 16.0, 65536)
    V = np.concatenate([ape.ravel(), norm]).astype(np.float32)
    st = np.zeros(2 * 2 * ratio * width, np.float32)
    cache = np.zeros((2 + 8, entry), np.float32)
    p = _u32s(width, entry, ratio, int(overlap), 0, width, 0, ape.size, rd, 0, 0, 2, 1e-6, 0, 0, 0)
    made = 0
    for pos in range(3 * ratio + 1):
        kv, g = rng.standard_normal((2, width)).astype(np.float32)
        want = D.DeepseekV4Model._compress(host, cp, cs, kv.copy(), g.copy(), pos,
                                           rope.RopeTable(inv))
        R = np.concatenate(rope.RopeTable(inv).at(max(pos + 1 - ratio, 0))).astype(np.float32)
        st, c = _run(dev, "dsv4_compress", p, [np.concatenate([kv, g]), V, R, st, cache],
                     (1, 1, 1), pos=pos)
        cache = c[:cache.size].reshape(cache.shape)
        if want is not None:
            assert _rel(cache[2 + pos // ratio], want) < 1e-5
            made += 1
    assert made == 3


# ---- the indexer's scores and top-k ------------------------------------------------------
def test_index_scores_and_select(dev):
    rng = np.random.default_rng(5)
    nh, hd, n, k, ratio = 3, 20, 11, 4, 4
    q = rng.standard_normal((nh, hd)).astype(np.float32)
    kv = rng.standard_normal((n, hd)).astype(np.float32)
    kv[7] = kv[2]                                   # a tie: the lower index wins
    hw = rng.standard_normal(nh).astype(np.float32)
    (sc,) = _run(dev, "dsv4_index_score", _u32s(nh, hd, 0, 0, 0, 0.5, 0, 0),
                 [q, hw, kv, np.zeros(n, np.float32)], (n, 1, 1))
    want = D.index_scores(q, kv, (hw * np.float32(0.5)).astype(np.float32), n)
    assert _rel(sc[:n], want) < 1e-5
    pos = n * ratio + 2                               # n entries finished
    (sel,) = _run(dev, "dsv4_index_select", _u32s(ratio, k, 0, 0),
                  [want, np.zeros(n, np.uint32)], (1, 1, 1), pos=pos)
    got = np.flatnonzero(sel[:n].view(np.uint32))
    assert got.tolist() == D.top_k_positions(want, k).tolist()


# ---- sparse attention with the sink ----------------------------------------------------
@pytest.mark.parametrize("indexed", [0, 1])
def test_sparse_attention_matches_cpu(dev, indexed):
    rng = np.random.default_rng(indexed)
    nh, hd, rd, W, ratio, pos = 3, 24, 6, 5, 4, 300      # 75 entries: a 256-row chunk + rest
    ncomp = (pos + 1) // ratio
    q = rng.standard_normal((nh, hd)).astype(np.float32)
    cache = rng.standard_normal((W + ncomp, hd)).astype(np.float32)
    sink = rng.standard_normal(nh).astype(np.float32)
    sel = (rng.random(ncomp) < 0.4).astype(np.uint32) if indexed else np.zeros(ncomp, np.uint32)
    c, s = rope.RopeTable(rope.inv_freq(rd, 10000.0)).at(pos)
    R = np.concatenate([c, s]).astype(np.float32)
    scale = hd ** -0.5
    p = _u32s(nh, hd, W, ratio, indexed, 0, 0, 0, rd, 0, float(scale), 0)
    (o,) = _run(dev, "dsv4_attend", p, [q, cache, sink, sel, R, np.zeros(nh * hd, np.float32)],
                (nh, 1, 1), pos=pos)
    comp = np.flatnonzero(sel) if indexed else np.arange(ncomp)
    idx = np.concatenate([np.arange(W), comp + W]).astype(np.int64)
    want = K.sparse_attend(q, cache, idx, sink, scale)
    K.rope_interleaved_tail(want, c, s, rd, True)
    assert _rel(o[:nh * hd].reshape(nh, hd), want) < 1e-5


# ---- routing ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["bias", "mask", "hash"])
def test_route_matches_cpu(dev, mode):
    rng = np.random.default_rng(len(mode))
    E, k, scale = 300, 6, 2.5
    logits = rng.standard_normal(E).astype(np.float32) * 3
    logits[10] = logits[20]                       # a tie
    bias = rng.standard_normal(E).astype(np.float32) * 0.1
    mask = rng.random(E) < 0.5
    table = rng.integers(0, E, (7, k)).astype(np.float32)
    V = np.concatenate([bias, mask.astype(np.float32), table.ravel()]).astype(np.float32)
    tok = 9                                        # past the table: clamps to its last row
    v_bias, v_mask, v_hash = (0, NONE, NONE) if mode == "bias" else \
        (0, E, NONE) if mode == "mask" else (NONE, NONE, 2 * E)
    p = _u32s(E, k, 0, v_bias, v_mask, v_hash, 7, 0, float(scale), 0, 0, 0)
    (out,) = _run(dev, "dsv4_route", p, [logits, V, np.array([tok, 0, 0, 0], np.uint32),
                                         np.zeros(2 * (k + 1), np.float32)], (1, 1, 1))
    forced = D.hash_route(np.rint(table).astype(np.int64), tok) if mode == "hash" else None
    idx, w = D.route(logits, bias if mode != "hash" else None, k, scale, forced,
                     mask if mode == "mask" else None)
    ids = out[:k + 1].view(np.uint32)
    assert ids[0] == E and out[k + 1] == 1.0              # slot 0: the shared expert
    assert ids[1:].tolist() == idx.tolist()
    assert _rel(out[k + 2:2 * k + 2], w) < 1e-5


# ---- the whole model --------------------------------------------------------------------
def _toy(path, quant):
    """The reference toy with every feature biting within 40 tokens: layer 0 hash-routed
    with a plain ratio-3 compressor, layer 1 the overlapping compressor and the indexer
    with index_topk 2, a small swiglu_limit, random sinks, ape and biases."""
    t, arch = toy_tensors()
    rng = np.random.default_rng(11)
    hd, dim = 8, 32
    a = "model.layers.0.self_attn.compressor"
    t[f"{a}.wkv.weight"] = (rng.standard_normal((hd, dim)) * 0.2).astype(np.float32)
    t[f"{a}.wgate.weight"] = (rng.standard_normal((hd, dim)) * 0.2).astype(np.float32)
    t[f"{a}.norm.weight"] = (rng.random(hd) + 0.5).astype(np.float32)
    t[f"{a}.ape"] = (rng.standard_normal((3, hd)) * 0.3).astype(np.float32)
    for name in list(t):
        if name.endswith(("attn_sink", "expert_bias", "compressor.ape")):
            t[name] = (rng.standard_normal(t[name].shape) * 0.3).astype(np.float32)
    arch["deepseek_v4"] = {"swiglu_limit": 0.05, "index_topk": 2}
    return _write(path, t, arch, quant)


def _write(path, t, arch, quant):
    cmf.write(path, t, arch=arch, quant=quant, tokenizer_json=tokenizer_json(), progress=False)
    return path


@pytest.fixture(scope="module")
def toys(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_dsv4")
    return {q: str(_toy(d / f"toy_{q}.cmf", q)) for q in ("f32", "q8_row", "q4_block")}


@pytest.mark.parametrize("quant,fuse", [("f32", True), ("q8_row", True), ("q4_block", True),
                                        ("q8_row", False)])
def test_whole_model_logits_match_cpu(dev, toys, quant, fuse, monkeypatch):
    from cortiq.gpu import deepseek_v4 as G
    from cortiq.gpu import to_device
    if not fuse:      # the large-model path: expand, mixes matvec and step apart; and
        monkeypatch.setattr(G, "HC_FUSE_BYTES", 0)     # caches grown (copied) 3 times
        monkeypatch.setattr(G, "CAP0", 5)
    host = D.DeepseekV4Model(cmf.open(toys[quant]))
    g = to_device(host, dev)
    assert g.fuse_hc is fuse
    ids = np.random.default_rng(1).integers(0, host.vocab, 40)
    want = host.forward(host.new_state(), ids, "all")
    st = g.new_state()
    got = g.forward(st, ids, "all")
    assert got.shape == want.shape and st.pos == ids.size
    assert st.cap == (40 if not fuse else G.CAP0)
    for r in range(ids.size):
        assert _rel(got[r], want[r]) < 1e-3, r
    assert g.kv_bytes(st) > 0
    assert g.dispatches_per_token is None or g.dispatches_per_token > 0


def test_greedy_tokens_identical(dev, toys):
    from cortiq.gpu import to_device
    host = D.DeepseekV4Model(cmf.open(toys["q8_row"]))
    g = to_device(host, dev)
    ids = [3, 7, 1, 9]
    sc, sg = host.new_state(), g.new_state()
    want = [int(np.argmax(host.forward(sc, ids)))]
    got = [g.forward_greedy(sg, ids)]
    for _ in range(31):
        want.append(int(np.argmax(host.forward(sc, [want[-1]]))))
        got.append(g.forward_greedy(sg, [got[-1]]))
    assert got == want
    s2 = g.new_state()
    g.forward(s2, ids[:-1], "none")
    assert g.decode_greedy(s2, ids[-1], 32) == want
    assert g.dispatches_per_token > 0


def test_final_hidden_and_embeddings(dev, toys):
    from cortiq.gpu import to_device
    host = D.DeepseekV4Model(cmf.open(toys["q8_row"]))
    g = to_device(host, dev)
    ids = [5, 1, 17, 2, 9, 9]
    want = host.final_hidden(host.new_state(), ids)
    got = g.final_hidden(g.new_state(), ids)
    assert got.shape == want.shape == (6, 32) and _rel(got, want) < 1e-3
    cpu = cortiq.LLM(toys["q8_row"], device="cpu")
    gpu = cortiq.LLM(toys["q8_row"], device="gpu")
    a, b = cpu.embed(["w3 w4 w5"])[0], gpu.embed(["w3 w4 w5"])[0]
    assert _rel(np.asarray(b), np.asarray(a)) < 1e-3


def test_task_mask_on_the_gpu(dev, toys):
    from cortiq.gpu import to_device
    mask = np.ones((2, 8), bool)
    mask[1, :6] = False
    host = D.DeepseekV4Model(cmf.open(toys["f32"]), task=mask)
    g = to_device(host, dev)
    ids = [1, 2, 3, 4, 5]
    assert _rel(g.forward(g.new_state(), ids), host.forward(host.new_state(), ids)) < 1e-3


TEMPLATE = ("{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
            "{% if add_generation_prompt %}w3{% endif %}")


def test_llm_sessions_rollback_and_reuse(dev, toys):
    cpu = cortiq.LLM(toys["f32"], device="cpu", seed=0, chat_template=TEMPLATE)
    gpu = cortiq.LLM(toys["f32"], device="gpu", seed=0, chat_template=TEMPLATE)
    assert type(gpu.model).__name__ == "GpuDeepSeekV4Model"
    kw = dict(max_tokens=6, temperature=0)
    for prompt in ("w3 w4 w5", "w3 w4 w5 w6", "w3 w4 w5"):     # prefix reuse starts over
        assert gpu.generate(prompt, **kw) == cpu.generate(prompt, **kw)
    msgs = [{"role": "user", "content": "w5 w6"}]
    r1 = gpu.create_chat_completion(msgs, max_tokens=4, temperature=0)
    msgs2 = msgs + [r1["choices"][0]["message"], {"role": "user", "content": "w7"}]
    r2 = gpu.create_chat_completion(msgs2, max_tokens=4, temperature=0)   # a longer prefix
    c1 = cpu.create_chat_completion(msgs, max_tokens=4, temperature=0)
    c2 = cpu.create_chat_completion(msgs2, max_tokens=4, temperature=0)
    for g, c in ((r1, c1), (r2, c2)):
        assert g["choices"][0]["message"]["content"] == c["choices"][0]["message"]["content"]
    s = gpu.session()
    rows = s.feed([3, 7, 1, 9], want="all")
    assert rows.shape == (4, 24) and (s.logits() == rows[-1]).all()
    assert gpu.model.capabilities.rollback is False and not gpu.model.can_rollback(s._state, 2)
    with pytest.raises(CortiqError, match="rollback"):
        s.rollback(2)
    with pytest.raises(CortiqError, match="rollback"):
        gpu.model.rollback(s._state, 2)
    with pytest.raises(ValueError, match="outside"):
        s.feed([24])
    gpu.close()
    cpu.close()


def test_refusals(dev, toys):
    from cortiq.gpu import to_device
    host = D.DeepseekV4Model(cmf.open(toys["f32"]))
    L = host.layers[1]
    orig = L.indexer.comp.ratio
    L.indexer.comp.ratio = orig + 1
    try:
        with pytest.raises(ConfigError, match="indexer"):
            to_device(host, dev)
    finally:
        L.indexer.comp.ratio = orig
