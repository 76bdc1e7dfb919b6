"""Decode rows of several sequences in one GPU submission (`GpuModel.forward_batch` ->
the model's `forward_rows`: Dory and the Llama family) against each sequence run on its
own, on the host and on the device.

Runs on any adapter wgpu finds (Mesa's llvmpipe in CI); skips without one unless
CORTIQ_REQUIRE_GPU=1. Tolerances: docs/gpu.md (1e-3 relative against the CPU forward).
"""

import threading

import numpy as np
import pytest
from arrays import stable_seed
from batch_models import alone_then_rewound
from gpu_buffers import run_read

from cortiq import cmf
from cortiq.demo import demo_path

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def demo_file():
    f = cmf.open(demo_path())
    yield f
    f.close()


@pytest.fixture(scope="module")
def host(demo_file):
    from cortiq.models.dory import DoryModel
    return DoryModel(demo_file)


@pytest.fixture(scope="module")
def gpu(dev, host):
    from cortiq.gpu import to_device
    return to_device(host, dev)


class _CountRows:
    """Wraps a model's forward_rows to count the rows each call carried."""

    def __init__(self, model, monkeypatch):
        self.calls: list[int] = []
        real = model.forward_rows

        def spy(states, tokens, wants):
            self.calls.append(len(states))
            return real(states, tokens, wants)
        monkeypatch.setattr(model, "forward_rows", spy)


@pytest.mark.parametrize("b", [1, 4])
def test_rows_equal_each_sequence_alone(host, gpu, b, monkeypatch):
    """b sequences at different positions decode 8 greedy tokens as batches: each
    row's logits equal the host forward of that sequence alone, and the greedy tokens
    are the host's and the GPU's own one-sequence tokens."""
    spy = _CountRows(gpu, monkeypatch)
    rng = np.random.default_rng(100 + b)
    prompts = [rng.integers(0, host.vocab, 2 + 7 * i) for i in range(b)]
    hs = [host.new_state() for _ in range(b)]
    gs = [gpu.new_state() for _ in range(b)]
    alone = [gpu.new_state() for _ in range(b)]
    toks = []
    for p, h, g, a in zip(prompts, hs, gs, alone):
        toks.append(int(np.argmax(host.forward(h, p))))
        gpu.forward(g, p, "none")
        gpu.forward(a, p, "none")
    for _ in range(8):
        got = gpu.forward_batch(gs, [[t] for t in toks], ["last"] * b, [False] * b)
        nxt = []
        for i in range(b):
            want = host.forward(hs[i], [toks[i]])
            own = gpu.forward(alone[i], [toks[i]])
            assert got[i].shape == (host.vocab,)
            assert _rel(got[i], want) < 1e-3
            assert int(np.argmax(got[i])) == int(np.argmax(want)) == int(np.argmax(own))
            nxt.append(int(np.argmax(got[i])))
        toks = nxt
    assert [g.pos for g in gs] == [h.pos for h in hs]
    # one row alone takes the one-sequence decode path; several go through forward_rows
    assert spy.calls == ([] if b == 1 else [b] * 8)


def test_mixed_batch_any_order(host, gpu, monkeypatch):
    """Prompts, decode rows and every want in one batch, in shuffled orders: each result
    equals the host's own forward; a state left out of the batch is untouched."""
    spy = _CountRows(gpu, monkeypatch)
    rng = np.random.default_rng(7)
    n = 5
    hs = [host.new_state() for _ in range(n)]
    gs = [gpu.new_state() for _ in range(n)]
    for i in range(n):
        p = rng.integers(0, host.vocab, 3 + 4 * i)
        host.forward(hs[i], p, "none")
        gpu.forward(gs[i], p, "none")
    idle_h, idle_g = host.new_state(), gpu.new_state()
    host.forward(idle_h, [5, 6, 7], "none")
    gpu.forward(idle_g, [5, 6, 7], "none")
    kinds = [("row", "last"), ("row", "all"), ("row", "none"), ("prompt", "all"),
             ("prompt", "last")]
    for step in range(3):
        order = rng.permutation(n)
        feeds, wants, prompts = [], [], []
        for i in order:
            kind, want = kinds[(i + step) % n]
            ids = rng.integers(0, host.vocab, 1 if kind == "row" else 4)
            feeds.append(ids)
            wants.append(want)
            prompts.append(kind == "prompt")
        got = gpu.forward_batch([gs[i] for i in order], feeds, wants, prompts)
        for j, i in enumerate(order):
            want = host.forward(hs[i], feeds[j], wants[j], prompts[j])
            if wants[j] == "none":
                assert got[j] is None
            else:
                assert got[j].shape == want.shape
                assert _rel(got[j], want) < 1e-3
    assert spy.calls == [3, 3, 3]
    assert idle_g.pos == 3 and idle_g.hi == 2
    assert _rel(gpu.forward(idle_g, [9]), host.forward(idle_h, [9])) < 1e-3


def test_rows_across_the_ring_and_the_options(dev, demo_file):
    """last_loop caches with prompt_loops (rows wanting nothing run fewer passes: a
    submission of their own) and a full_window ring; rows past the sliding ring's
    wrap-around."""
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    from cortiq.models.dory.model import HOST_CHUNK
    h = DoryModel(demo_file, kv_mode="last_loop", prompt_loops=1, full_window=24)
    g = to_device(h, dev)
    rng = np.random.default_rng(31)
    lens = [h.window + HOST_CHUNK - 2, 5]      # a ring about to wrap
    hs = [h.new_state() for _ in lens]
    gs = [g.new_state() for _ in lens]
    for n, hst, gst in zip(lens, hs, gs):
        p = rng.integers(0, h.vocab, n)
        h.forward(hst, p, "none")
        g.forward(gst, p, "none")
    for step in range(6):
        toks = rng.integers(0, h.vocab, len(lens))
        wants = ["none" if (i + step) % 3 == 0 else "last" for i in range(len(lens))]
        got = g.forward_batch(gs, [[int(t)] for t in toks], wants, [False] * len(lens))
        for i, (hst, t) in enumerate(zip(hs, toks)):
            want = h.forward(hst, [int(t)], wants[i], False)
            if want is None:
                assert got[i] is None
            else:
                assert _rel(got[i], want) < 1e-3
    assert [s.pos for s in gs] == [n + 6 for n in lens]


def test_rows_through_the_prompt_matmat(dev, demo_file):
    """rows_matvec=False: the rows' products run the prompt matmat, with the same
    results; fuse_qk=False: each row's qk_prep runs as a pass of its own."""
    from cortiq.gpu.dory import GpuDoryModel
    from cortiq.models.dory import DoryModel
    h = DoryModel(demo_file, loops=3)
    g = GpuDoryModel(h, dev, rows_matvec=False, fuse_qk=False)
    rng = np.random.default_rng(17)
    hs, gs = [h.new_state() for _ in range(3)], [g.new_state() for _ in range(3)]
    for i, (hst, gst) in enumerate(zip(hs, gs)):
        p = rng.integers(0, h.vocab, 2 + 3 * i)
        h.forward(hst, p, "none")
        g.forward(gst, p, "none")
    for _ in range(3):
        toks = [int(t) for t in rng.integers(0, h.vocab, 3)]
        got = g.forward_batch(gs, [[t] for t in toks], ["last"] * 3, [False] * 3)
        for i in range(3):
            assert _rel(got[i], h.forward(hs[i], [toks[i]])) < 1e-3
    assert g._rows is not None and not g._rows.matvec


DTYPES = ["f32", "f16", "bf16", "q8_row", "q8_2f", "q4_block", "q4_tiled", "q4tp", "q2tp"]


@pytest.mark.parametrize("dtype,subgroups", [(d, False) for d in DTYPES]
                         + [(d, True) for d in ("q8_row", "q4_block")])
def test_rows_matvec_matches_cpu(dev, dtype, subgroups, monkeypatch):
    """The rows matvec (matvecb.wgsl) against the CPU matmat: one row, a few, more
    than a workgroup's 8 (a second z slice), rows of many chunks a lane; a fused group
    of two matrices, this dtype's the second (its decoder bound to the second weight
    binding); with subgroupAdd and with the shared-memory tree. The fused group runs at
    two rows a workgroup: the production eight written out, for every dtype's pair, is
    most of what llvmpipe would spend on this test compiling."""
    from arrays import stable_seed

    from cortiq.cmf.testing import qtensor_from_f32
    from cortiq.gpu import kernels
    if subgroups and not dev.subgroups:
        pytest.skip("the adapter offers no subgroups")
    monkeypatch.setattr(kernels, "MATVEC_SUBGROUPS", subgroups)
    rng = np.random.default_rng(stable_seed(dtype, str(subgroups)))
    for rows, cols, t in [(37, 96, 1), (6, 256, 3), (19, 1056, 11)]:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        w[rng.random((rows, cols)) < 0.05] = 0.0
        qt = qtensor_from_f32(w, dtype)
        x = rng.standard_normal((t, cols)).astype(np.float32)
        got = kernels.matvec_once(dev, [kernels.GpuMatrix(dev, qt)], x, rows=True)
        assert got.shape == (t, rows)
        assert _rel(got, qt.matmat(x)) < 1e-5
    a = qtensor_from_f32(rng.standard_normal((5, 64)).astype(np.float32), "q8_row")
    b = qtensor_from_f32(rng.standard_normal((9, 64)).astype(np.float32), dtype)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    monkeypatch.setattr(kernels, "ROWS_NB", 2)
    got = kernels.matvec_once(dev, [kernels.GpuMatrix(dev, a), kernels.GpuMatrix(dev, b)], x,
                              rows=True)
    assert _rel(got, np.concatenate([a.matmat(x), b.matmat(x)], axis=1)) < 1e-5


def test_rows_matvec_refuses_an_input_stage(dev):
    from cortiq.cmf.testing import qtensor_from_f32
    from cortiq.errors import ConfigError
    from cortiq.gpu import kernels
    g = kernels.GpuMatrix(dev, qtensor_from_f32(np.ones((4, 64), np.float32), "q8_row"))
    with pytest.raises(ConfigError, match="rows matvec"):
        kernels.matvec_once(dev, [g], np.ones((2, 128), np.float32), pro=2,
                            va=np.ones(64), vb=np.ones(64), x2_off=64, rows=True)


def test_rollback_after_rows(host, gpu):
    """A sequence rolled back after batched rows re-reads its positions as the host."""
    rng = np.random.default_rng(41)
    ids = rng.integers(0, host.vocab, 12)
    gs = [gpu.new_state(), gpu.new_state()]
    for s in gs:
        gpu.forward(s, ids[:6], "none")
    for t in ids[6:10]:
        gpu.forward_batch(gs, [[int(t)], [int(t)]], ["none", "none"], [False, False])
    gpu.rollback(gs[0], 7)
    got = gpu.forward_batch(gs, [[int(ids[7])], [int(ids[10])]], ["last", "last"],
                            [False, False])
    want0 = host.forward(host.new_state(), ids[:8], "all")[-1]
    want1 = host.forward(host.new_state(), ids[:11], "all")[-1]
    assert _rel(got[0], want0) < 1e-3
    assert _rel(got[1], want1) < 1e-3


def test_gate_rows_run_alone(dev, demo_file, monkeypatch):
    """Under the conf gate (decided per token on the host) decode rows are not batched,
    and the batch still equals the host."""
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    h = DoryModel(demo_file, gate="conf:0.3", kv_mode="last_loop")
    g = to_device(h, dev)
    spy = _CountRows(g, monkeypatch)
    rng = np.random.default_rng(5)
    hs, gs = [h.new_state(), h.new_state()], [g.new_state(), g.new_state()]
    for hst, gst in zip(hs, gs):
        p = rng.integers(0, h.vocab, 4)
        h.forward(hst, p, "none")
        g.forward(gst, p, "none")
    toks = [int(t) for t in rng.integers(0, h.vocab, 2)]
    got = g.forward_batch(gs, [[t] for t in toks], ["last", "last"], [False, False])
    for i in range(2):
        assert _rel(got[i], h.forward(hs[i], [toks[i]])) < 1e-3
    assert spy.calls == []


def test_batch_refuses_bad_input(gpu):
    s = gpu.new_state()
    with pytest.raises(ValueError, match="twice"):
        gpu.forward_batch([s, s], [[1], [2]], ["last", "last"], [False, False])
    with pytest.raises(ValueError, match="wants"):
        gpu.forward_batch([s], [[1]], [], [False])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gpu.forward_batch([s, gpu.new_state()], [[1], [gpu.vocab]], ["last", "last"],
                          [False, False])
    assert s.pos == 0


def test_llm_concurrent_sessions_through_the_scheduler(dev, monkeypatch):
    """LLM(device="gpu", max_batch=4): concurrent greedy generations give what each
    gives alone, and the scheduler's steps carried decode rows of several sessions
    through forward_rows."""
    from cortiq.runtime.llm import LLM
    serial = LLM(device="gpu", max_batch=1)
    llm = LLM(device="gpu", max_batch=4)
    spy = _CountRows(llm.model, monkeypatch)
    prompts = ["def add(a, b):", "import os", "class Point:", "x = [1, 2"]
    want = [serial.generate(p, max_tokens=6, temperature=0) for p in prompts]
    got: list = [None] * len(prompts)

    def run(i):
        got[i] = llm.generate(prompts[i], max_tokens=6, temperature=0)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want
    assert max(spy.calls, default=0) > 1
    serial.close()
    llm.close()


def _llama_file(tmp_path_factory, name, hd=16):
    """A small Llama-family file: qwen3 (GQA 4/2, q/k/v biases, q/k norms, a window-7
    layer), qwen2 (biases, no norms) or mistral (every layer a window of 5)."""
    from batch_models import llama_tensors, tokenizer_json
    t, arch = llama_tensors(hidden=64, ffn=96, layers=2, heads=4, kv=2, hd=hd, seed=9)
    if name == "qwen2":
        t = {k: v for k, v in t.items() if "_norm." not in k or "layernorm" in k}
        arch = dict(arch, arch_name="qwen2", layer_types=None, sliding_window=None)
    elif name == "mistral":
        t = {k: v for k, v in t.items() if "q_norm" not in k and "k_norm" not in k
             and ".bias" not in k}
        arch = dict(arch, arch_name="mistral", sliding_window=5,
                    layer_types=["SlidingAttention"] * 2)
    arch = {k: v for k, v in arch.items() if v is not None}
    path = tmp_path_factory.mktemp("rows") / f"{name}-{hd}.cmf"
    cmf.write(path, t, arch=arch, quant="q8_row", tokenizer_json=tokenizer_json(),
              progress=False)
    return cmf.open(str(path))


@pytest.mark.parametrize("name,fuse_qk,splits,group", [
    ("qwen3", True, None, None), ("qwen3", True, None, 2), ("qwen2", True, None, None),
    ("mistral", False, 1, None), ("qwen3", False, 4, None)])
def test_llama_rows_equal_each_sequence_alone(dev, tmp_path_factory, name, fuse_qk, splits,
                                              group, monkeypatch):
    """Llama-family decode rows of three sequences at different positions (one past its
    window), in shuffled batches with every want and a prompt among them: each result
    equals the host's forward of that sequence alone, greedy tokens equal, a state
    outside the batch is untouched, and a sequence rolled back between batches re-reads
    its positions as the host. fuse_qk=False: each row's llama_qk runs as a pass;
    splits: each row's attention split into the model's key ranges (most of them empty
    at these positions) and merged over the rows, or unsplit (1); a split attention with
    llama_qk's work in it runs a dispatch a group of rows (group: rows a dispatch, 2
    leaves a group of one)."""
    from cortiq.gpu import llama
    from cortiq.gpu.llama import GpuLlamaModel
    from cortiq.models.llama import LlamaModel
    if group:
        monkeypatch.setattr(llama, "ROWS_ATTN_GROUP", group)
    f = _llama_file(tmp_path_factory, name)
    h = LlamaModel(f)
    g = GpuLlamaModel(h, dev, fuse_qk=fuse_qk, attn_splits=splits)
    assert g.batch_rows > 1
    assert (g.splits > 1) == (splits != 1)
    spy = _CountRows(g, monkeypatch)
    rng = np.random.default_rng(stable_seed(name))
    n = 3
    hs, gs = [h.new_state() for _ in range(n)], [g.new_state() for _ in range(n)]
    for i in range(n):
        p = rng.integers(0, h.vocab, 2 + 4 * i)
        h.forward(hs[i], p, "none")
        g.forward(gs[i], p, "none")
    idle_h, idle_g = h.new_state(), g.new_state()
    h.forward(idle_h, [4, 5], "none")
    g.forward(idle_g, [4, 5], "none")
    wants = ["last", "all", "none"]
    for step in range(5):
        if step == 3:       # roll one sequence back between batches
            h.rollback(hs[1], hs[1].pos - 2)
            g.rollback(gs[1], gs[1].pos - 2)
        order = rng.permutation(n)
        feeds = [rng.integers(0, h.vocab, 3 if (step == 2 and i == 0) else 1) for i in order]
        ws = [wants[(i + step) % 3] if feeds[j].size == 1 else "last"
              for j, i in enumerate(order)]
        prompts = [feeds[j].size > 1 for j in range(n)]
        got = g.forward_batch([gs[i] for i in order], feeds, ws, prompts)
        for j, i in enumerate(order):
            want = h.forward(hs[i], feeds[j], ws[j], prompts[j])
            if want is None:
                assert got[j] is None
                continue
            assert got[j].shape == want.shape
            assert _rel(got[j], want) < 1e-3
            assert int(np.argmax(got[j].ravel())) == int(np.argmax(want.ravel()))
    assert [s.pos for s in gs] == [s.pos for s in hs]
    assert max(spy.calls) > 1
    together = g._rows._attn_now
    if g.splits > 1 and fuse_qk:    # the last batch's rows in groups, every layer
        rows = sum(f.size == 1 for f in feeds)
        assert len(together) == len(g.lw) * -(-rows // (group or llama.ROWS_ATTN_GROUP))
        assert {d.name for d in together.values()} == {"llama_attn_rows_qk"}
    else:
        assert not together
    assert idle_g.pos == 2
    assert _rel(g.forward(idle_g, [9]), h.forward(idle_h, [9])) < 1e-3
    f.close()


@pytest.mark.parametrize("hd,group,range_keys,heads,gqa", [
    (16, None, 32, 4, True), (160, 2, 0, 4, True), (16, None, 64, 6, True),
    (32, None, 32, 8, True), (16, None, 32, 4, False)])
def test_llama_rows_attention_over_many_keys(dev, tmp_path_factory, hd, group, range_keys,
                                             heads, gqa, monkeypatch):
    """The rows' split attention where key ranges span several tiles of keys (up to four
    ranges over 43-104 keys), the middle layer windowed: three sequences' decode rows in
    one rows dispatch (or groups of two and one), for three steps, equal the host's
    forward of each sequence alone. hd 16: fewer 16-byte pieces a key than a key's lanes;
    hd 160: five a lane (the loop after the first four). range_keys (ROWS_RANGE_KEYS): 0
    cuts every row into all four ranges; 32 and 64 into as many as leave each range that
    many keys (1 to 4, three ranges among them), the rest written empty, as the last
    layer's records show. gqa (ROWS_ATTN_GQA): a workgroup takes each KV head's 2, 3 or
    4 query heads; else one."""
    from batch_models import llama_tensors, tokenizer_json

    from cortiq.gpu import llama
    from cortiq.gpu.llama import GpuLlamaModel
    from cortiq.models.llama import LlamaModel
    if group:
        monkeypatch.setattr(llama, "ROWS_ATTN_GROUP", group)
    monkeypatch.setattr(llama, "ROWS_RANGE_KEYS", range_keys)
    monkeypatch.setattr(llama, "ROWS_ATTN_GQA", gqa)
    t, arch = llama_tensors(hidden=64, ffn=96, layers=3, heads=heads, kv=2, hd=hd, seed=hd)
    path = tmp_path_factory.mktemp("rows_keys") / f"hd{hd}h{heads}.cmf"
    cmf.write(path, t, arch={k: v for k, v in arch.items() if v is not None}, quant="q8_row",
              tokenizer_json=tokenizer_json(), progress=False)
    f = cmf.open(str(path))
    h = LlamaModel(f)
    g = GpuLlamaModel(h, dev, attn_splits=4)
    assert g.splits == 4
    rng = np.random.default_rng(hd)
    prompts = [rng.integers(0, h.vocab, n) for n in (70, 42, 101)]
    hs, gs = [h.new_state() for _ in prompts], [g.new_state() for _ in prompts]
    for p, hst, gst in zip(prompts, hs, gs):
        h.forward(hst, p, "none")
        g.forward(gst, p, "none")
    for _step in range(3):
        toks = [[int(x)] for x in rng.integers(0, h.vocab, 3)]
        got = g.forward_batch(gs, toks, ["last"] * 3)
        for j in range(3):
            want = h.forward(hs[j], toks[j], "last")
            assert _rel(got[j], want) < 1e-3
            assert int(np.argmax(got[j])) == int(np.argmax(want))
    assert {d.name for d in g._rows._attn_now.values()} == {"llama_attn_rows_qk"}
    assert g._rows.heads == (heads // 2 if gqa else 1)
    # the last (full) layer's records: each row's first ranges hold keys, the rest none
    S = g._rows.slices
    stride, rec = S.stride["apart"], hd + 4
    parts = run_read(dev, [], 1, S.bufs["apart"], 3 * stride * 4).view(np.float32).reshape(
        3, stride)
    for j, st in enumerate(gs):
        n = st.pos          # the keys of the last step's row
        ns = 4 if not range_keys else min(4, max(1, -(-n // range_keys)))
        per = -(-n // ns)
        full = -(-n // per)
        for head in range(heads):
            ls = [parts[j, (head * 4 + s) * rec + 1] for s in range(4)]
            assert [x > 0 for x in ls] == [s < full for s in range(4)], (j, head, ls)
    f.close()


@pytest.mark.parametrize("bindings,rows", [(8, 2), (10, 3), (20, 8), (1000, 8), (5, 1)])
def test_rows_attention_group_fits_the_bindings(bindings, rows):
    """A rows attention dispatch binds four buffers and two caches a row: ROWS_ATTN_GROUP
    rows, or as many as the device's storage-buffer bindings hold (at least one)."""
    from types import SimpleNamespace

    from cortiq.gpu.llama import ROWS_ATTN_GROUP, rows_attn_group, rows_attn_kinds
    got = rows_attn_group(SimpleNamespace(max_storage_buffers=bindings))
    assert got == rows <= ROWS_ATTN_GROUP
    assert sum(k != "uniform" for k in rows_attn_kinds(got)) <= max(bindings, 6)


@pytest.mark.parametrize("gq,hd,lanes", [(1, 128, 256), (4, 128, 128), (8, 128, 128),
                                          (3, 160, 128), (2, 512, 128)])
def test_split_attention_memory_is_what_its_declarations_hold(gq, hd, lanes):
    """split_attn_bytes, by which rows_attn_heads picks the query heads a workgroup,
    is the sum of the workgroup arrays the split attention's source declares."""
    import re

    from cortiq.gpu import llama
    from cortiq.gpu.device import Device
    marks = {**llama._ONE_ROW, **llama._ROPE_CHUNK, "$KV": "read_write", "$QK": "true",
             "/*$W*/": "", **llama.split_attn_marks(gq, hd, lanes)}
    code = llama._source(Device, "llama_attn_split.wgsl", marks)
    sizes = {"f32": 4, "vec4<f32>": 16}
    decl = re.findall(r"var<workgroup> \w+: array<(f32|vec4<f32>), (\d+)>;", code)
    assert len(decl) == 9
    assert sum(sizes[t] * int(n) for t, n in decl) == llama.split_attn_bytes(gq, hd, lanes)


@pytest.mark.parametrize("heads,kv,hd,room,gqa,want", [
    (32, 8, 128, 16384, True, 4), (64, 8, 128, 16384, True, 4), (64, 8, 128, 32768, True, 8),
    (24, 8, 128, 16384, True, 3), (32, 8, 128, 16384, False, 1), (32, 32, 128, 16384, True, 1),
    (32, 4, 128, 8192, True, 1)])
def test_rows_attention_heads_fit_the_workgroup_memory(monkeypatch, heads, kv, hd, room,
                                                       gqa, want):
    """A rows attention workgroup takes the largest divisor of the GQA group whose
    arrays fit the device's workgroup memory (ROWS_ATTN_GQA off: one query head)."""
    from types import SimpleNamespace

    from cortiq.gpu import llama
    monkeypatch.setattr(llama, "ROWS_ATTN_GQA", gqa)
    got = llama.rows_attn_heads(SimpleNamespace(max_workgroup_storage=room), heads, kv, hd)
    assert got == want
    assert (heads // kv) % got == 0
    assert got == 1 or llama.split_attn_bytes(got, hd, llama.ROWS_ATTN_LANES) <= room


@pytest.mark.parametrize("hd", [16, 32])
def test_llama_int8_rows_equal_each_sequence_alone(dev, tmp_path_factory, monkeypatch, hd):
    """Under int8 activations (q8_row products) the Llama's decode rows of several
    sequences (the int8 rows matvec) give what each sequence's own int8 decode row gives,
    within float rounding, with the same greedy tokens; the passes before the products
    write their input quantized (the merge too where heads are whole quantization
    groups, hd 32), and give the bits of a quantrows pass before each product."""
    from cortiq.gpu import llama as L
    from cortiq.gpu.llama import GpuLlamaModel
    from cortiq.models.llama import LlamaModel
    f = _llama_file(tmp_path_factory, "qwen3", hd)
    g = GpuLlamaModel(LlamaModel(f), dev)
    g.set_precision("int8")
    prompts = [np.array([3, 17, 20]), np.array([5, 9]), np.array([41, 2, 8, 13, 1])]
    states, alone = alone_then_rewound(g, prompts, 7)
    got = g.forward_batch(states, [[7]] * 3, ["last"] * 3)
    # the norms and SwiGLU quantize for the products after them; O quantizes its input
    prog = g._skeleton("rows", "all")
    names = [d.name for d in prog if hasattr(d, "name")]
    assert names.count("llama_norm_q") == 2 * len(g.lw) + 1 and "llama_norm" not in names
    assert names.count("llama_swiglu_q") == len(g.lw)
    assert [d.name for d in g._rows.product("qkv_op", 0)] == ["matvecb"]
    merged = hd == 32    # the merge (the model splits its attention) quantizes for O
    assert g.splits > 1 and g._rows.merge_quantizes == merged
    assert [d.name for d in g._rows.product("o_op", 0)] == (
        ["matvecb"] if merged else ["quantrows", "matvecb"])
    for a, b in zip(alone, got):
        assert float(np.abs(a - b).max() / np.abs(a).max()) < 1e-4
        assert np.argmax(a) == np.argmax(b)
    # the same step with a quantrows pass before every product: the same bits
    for st in states:
        g.rollback(st, st.pos - 1)
    monkeypatch.setattr(L, "ROWS_QUANTIZE_IN_PASSES", False)
    g._rows = None
    again = g.forward_batch(states, [[7]] * 3, ["last"] * 3)
    assert "llama_norm_q" not in [getattr(d, "name", "") for d in g._skeleton("rows", "all")]
    for a, b in zip(got, again):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("arch", ["dory", "qwen3"])
def test_programs_submitted_in_pieces(dev, demo_file, tmp_path_factory, arch, monkeypatch):
    """A program submitted piece by piece as it is recorded (`Device.run`: here one
    dispatch, then two at a time) gives the bits of the same program in one command
    buffer: a prompt's logits, decode rows of one sequence and of several at once."""
    from cortiq.gpu import device as gd
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    from cortiq.models.llama import LlamaModel
    host = (DoryModel(demo_file) if arch == "dory"
            else LlamaModel(_llama_file(tmp_path_factory, arch)))
    g = to_device(host, dev)
    rng = np.random.default_rng(stable_seed(arch))
    prompts = [rng.integers(0, host.vocab, n) for n in (5, 9)]

    submitted = []
    real_submit = dev.submit
    monkeypatch.setattr(dev, "submit", lambda cbs: submitted.append(len(cbs))
                        or real_submit(cbs))

    def run(first, piece):
        monkeypatch.setattr(gd, "RUN_FIRST", first)
        monkeypatch.setattr(gd, "RUN_PIECE", piece)
        submitted.clear()
        sts = [g.new_state() for _ in prompts]
        out = [g.forward(st, p) for st, p in zip(sts, prompts)]
        toks = [int(np.argmax(o)) for o in out]
        out.append(g.forward(sts[0], [toks[0]]))
        out += g.forward_batch(sts, [[t] for t in toks[::-1]], ["last", "last"],
                               [False, False])
        return out, len(submitted)

    whole, n_whole = run(10 ** 6, 10 ** 6)
    pieces, n_pieces = run(1, 2)
    assert n_whole == 4 and n_pieces > 4 * 8     # one submission a feed, or many
    assert len(whole) == len(pieces) == 5
    for a, b in zip(whole, pieces):
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, b)


def test_recording_errors_still_raise(dev, demo_file):
    """A program recorded through wgpu-native's plain entry points (`Device.record`)
    still has its commands validated: a dispatch bound with another pipeline's bind
    group raises when the encoder finishes, naming the incompatible layout."""
    import wgpu
    from cortiq.gpu import to_device
    from cortiq.gpu.kernels import Dispatch
    from cortiq.models.dory import DoryModel
    g = to_device(DoryModel(demo_file), dev)
    st = g.new_state()
    g.forward(st, [1, 2, 3])
    g.forward(st, [4])                      # a decode row: its program made
    prog = list(g._decode_program)
    g.dev.record(prog, 1).finish()          # the program as made records cleanly
    fixed = [k for k, d in enumerate(prog) if not callable(d.dims) and 0 not in d.dims]
    i, j = next((i, j) for i in fixed for j in fixed
                if prog[i].pipeline is not prog[j].pipeline)
    prog[i] = Dispatch(prog[i].pipeline, prog[j].group, prog[i].dims, "mismatched")
    with pytest.raises(wgpu.GPUValidationError, match="BindGroupLayout"):
        g.dev.record(prog, 1).finish()
