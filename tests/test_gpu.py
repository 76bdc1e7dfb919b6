"""The WebGPU path (cortiq.gpu) against the CPU kernels and the CPU forward.

Runs on any adapter wgpu finds: in CI that is Mesa's llvmpipe (software Vulkan), on a
workstation the real GPU. Without one the tests skip, unless CORTIQ_REQUIRE_GPU=1
(set by .ci/run), which turns "no adapter" into a failure. Tolerances: docs/gpu.md.
"""

import numpy as np
import pytest
from arrays import stable_seed
from attention_records import split_records

from cortiq import cmf
from cortiq.demo import demo_path
from cortiq.errors import ConfigError
from cortiq.cmf.testing import qtensor_from_f32

pytestmark = pytest.mark.gpu

DTYPES = ["f32", "f16", "bf16", "q8_row", "q8_2f", "q4_block", "q4_tiled", "q4tp", "q2tp"]
ANY_COLS = ["f32", "f16", "bf16", "q8_row", "q8_2f", "q4_block"]   # cols % 32 != 0 allowed


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _qt(rng, dtype, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[rng.random((rows, cols)) < 0.05] = 0.0        # some zeros (q2tp's all-zero tiles too)
    if dtype == "q2tp" and rows > 1:
        w[0, :32] = 0.0
    return qtensor_from_f32(w, dtype)


# ---- each dtype's decoder: decode matvec and prompt matmat vs the CPU kernel --------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 96), (6, 256)])
def test_matvec_matches_cpu(dev, dtype, shape):
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(stable_seed(dtype, shape))
    qt = _qt(rng, dtype, *shape)
    g = GpuMatrix(dev, qt)
    X = rng.standard_normal((11, shape[1])).astype(np.float32)
    one = matvec_once(dev, [g], X[:1])[0]
    assert _rel(one, qt.matvec(X[0])) < 1e-5
    many = matvec_once(dev, [g], X)
    assert _rel(many, qt.matmat(X)) < 1e-5
    assert many.shape == (11, shape[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_matvec_long_rows(dev, dtype):
    """Rows of many chunks a lane (the decode matvec's lane-strided loop)."""
    from cortiq.gpu import kernels
    rng = np.random.default_rng(11)
    qt = _qt(rng, dtype, 5, 4160)     # 130 tiles, 260 f16 / 1040 f32 chunks a row
    x = rng.standard_normal((1, 4160)).astype(np.float32)
    got = kernels.matvec_once(dev, [kernels.GpuMatrix(dev, qt)], x)[0]
    assert _rel(got, qt.matvec(x[0])) < 1e-5
    if dtype in ("q8_row", "q4_block"):     # the prompt matmat: 64 lanes, tiles a lane
        X = rng.standard_normal((9, 4160)).astype(np.float32)
        got = kernels.matvec_once(dev, [kernels.GpuMatrix(dev, qt)], X)
        assert _rel(got, qt.matmat(X)) < 1e-5


def test_matmat_lanes_follow_the_row_length():
    """A prompt-matmat row takes as many lanes as it has 32-weight tiles (a power of
    two, at most 64); rows read weight by weight take 64."""
    from cortiq.gpu.kernels import matvec_lanes
    assert [matvec_lanes(c, True) for c in (32, 64, 96, 256, 640, 2048, 4160)] == \
        [1, 2, 4, 8, 32, 64, 64]
    assert matvec_lanes(50, False) == matvec_lanes(4160, False) == 64


@pytest.mark.parametrize("dtype", ANY_COLS)
def test_matvec_odd_columns(dev, dtype):
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(7)
    qt = _qt(rng, dtype, 19, 50)
    g = GpuMatrix(dev, qt)
    assert not g.fast
    X = rng.standard_normal((3, 50)).astype(np.float32)
    assert _rel(matvec_once(dev, [g], X[:1])[0], qt.matvec(X[0])) < 1e-5
    assert _rel(matvec_once(dev, [g], X), qt.matmat(X)) < 1e-5


@pytest.mark.parametrize("dtype", ["q8_2f", "q4tp", "q2tp", "bf16", "q4_block"])
def test_split_matrix_and_fused_group(dev, dtype, monkeypatch):
    """A matrix over the binding limit is split into row pieces; a group of matrices
    (Q|K|V|G) runs as one product: both equal the separate CPU products. Two pieces and
    one load at a time in the decode matvec: llvmpipe's compile time grows faster than
    the shader, whose every piece writes out its decoder (the four loads in flight of
    the default: test_decode_matvec_reductions_and_unroll)."""
    from cortiq.gpu import kernels
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    monkeypatch.setattr(kernels, "MATVEC_UNROLL", 1)
    rng = np.random.default_rng(3)
    a, b = _qt(rng, dtype, 45, 64), _qt(rng, "q8_row", 9, 64)
    ga = GpuMatrix(dev, a, limit=a.nbytes * 3 // 4 + 64)
    assert len(ga.parts) == 2
    gb = GpuMatrix(dev, b)
    X = rng.standard_normal((4, 64)).astype(np.float32)
    want = np.concatenate([a.matmat(X), b.matmat(X)], axis=1)
    assert _rel(matvec_once(dev, [ga, gb], X), want) < 1e-5
    assert _rel(matvec_once(dev, [ga, gb], X[:1])[0], want[0]) < 1e-5


def test_matvec_input_stages(dev):
    """The fused input transforms: gated attention output and SwiGLU, each justnormed."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(5)
    w = _qt(rng, "q8_row", 33, 64)
    g = GpuMatrix(dev, w)
    y = rng.standard_normal((3, 64)).astype(np.float32)
    gate = rng.standard_normal((3, 64)).astype(np.float32)
    s = rng.random(64).astype(np.float32)
    z = y / (1 + np.exp(-(gate * s)))
    z /= np.sqrt((z * z).sum(-1, keepdims=True) + 1e-6)
    for rows in (1, 3):
        got = matvec_once(dev, [g], y[:rows], pro=1, x2=gate[:rows], va=s)
        assert _rel(got, w.matmat(z[:rows])) < 1e-5
    gu = rng.standard_normal((3, 128)).astype(np.float32)
    sa, sb = rng.random(64).astype(np.float32), rng.random(64).astype(np.float32)
    a, b = gu[:, :64] * sa, gu[:, 64:] * sb
    m = a / (1 + np.exp(-a)) * b
    m /= np.sqrt((m * m).sum(-1, keepdims=True) + 1e-6)
    for rows in (1, 3):
        got = matvec_once(dev, [g], gu[:rows], pro=2, x2_off=64, va=sa, vb=sb)
        assert _rel(got, w.matmat(m[:rows])) < 1e-5
    scale = rng.random(33).astype(np.float32)
    got = matvec_once(dev, [g], y[:1], out_scale=scale)[0]
    assert _rel(got, w.matvec(y[0]) * scale) < 1e-5


@pytest.mark.parametrize("splits", [1, 3, 8])
def test_matvec_merges_attention_splits(dev, splits):
    """PRO 3: the decode matvec's input stage merges per-(head, split) softmax partials
    [m, l, 0, 0, acc] (empty splits: m = -3e38, l = 0), gates and justnorms them."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(splits)
    nh, hd = 4, 32
    w = _qt(rng, "q8_row", 21, nh * hd)
    g = GpuMatrix(dev, w)
    rec, y = split_records(rng, nh, hd, splits)
    gate = rng.standard_normal(nh * hd).astype(np.float32)
    s = rng.random(nh * hd).astype(np.float32)
    z = y / (1 + np.exp(-(gate * s)))
    z /= np.sqrt((z * z).sum() + 1e-6)
    got = matvec_once(dev, [g], rec, pro=3, x2=gate[None], va=s, hd=hd,
                      splits=splits)[0]
    assert _rel(got, w.matvec(z)) < 1e-5


@pytest.mark.parametrize("dtype,splits", [("q8_row", 1), ("f16", 4), ("q4tp", 7)])
def test_matvec_merges_attention_splits_plain(dev, dtype, splits):
    """PRO 5: the input stage merges the split records as PRO 3 does but applies neither
    gate nor norm (the Llama family's O product after a split attention)."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(30 + splits)
    nh, hd = 4, 32
    w = _qt(rng, dtype, 19, nh * hd)
    rec, y = split_records(rng, nh, hd, splits)
    got = matvec_once(dev, [GpuMatrix(dev, w)], rec, pro=5, hd=hd, splits=splits)[0]
    assert _rel(got, w.matvec(y)) < 1e-5


@pytest.mark.parametrize("dtype,cols", [("q8_row", 96), ("f16", 96), ("q4tp", 96),
                                        ("q8_row", 1104), ("q4tp", 1088)])
def test_matvec_fused_residual(dev, dtype, cols):
    """PRO 4: the nGPT residual justnorm(x^ + alpha (o^ - x^)) staged as the product's
    input (the rownorm pass it replaces), and written back for the next sub-layer; rows
    shorter than the workgroup's 256 lanes and rows of several columns a lane, the last
    round partial."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(21)
    w = _qt(rng, dtype, 41, cols)
    x, o = (rng.standard_normal((2, cols)) * [[3.0], [0.5]]).astype(np.float32)
    alpha = rng.random(cols).astype(np.float32)

    def jn(v):
        return v / np.sqrt((v * v).sum() + 1e-6)
    want_x = jn(jn(x) + alpha * (jn(o) - jn(x)))
    back: list = []
    got = matvec_once(dev, [GpuMatrix(dev, w)], x[None], pro=4, x2=o[None], va=alpha,
                      residual_out=back)[0]
    assert _rel(got, w.matvec(want_x)) < 1e-5
    assert _rel(back[0], want_x) < 1e-6


@pytest.mark.parametrize("dtype,cols", [("q8_row", 96), ("f16", 200), ("q4tp", 64),
                                        ("f32", 1100)])
def test_matvec_llama_residual_norm(dev, dtype, cols):
    """PRO 6: the Llama residual r = x + o and its RMSNorm with weight staged as the
    product's input (the llama_norm pass it replaces), r written back for the next
    sub-layer."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(cols)
    w = _qt(rng, dtype, 37, cols)
    x, o = (rng.standard_normal((2, cols)) * [[4.0], [0.5]]).astype(np.float32)
    g = (rng.random(cols) + 0.5).astype(np.float32)
    r = x + o
    h = r / np.sqrt((r.astype(np.float64) ** 2).mean() + 1e-5) * g
    back: list = []
    got = matvec_once(dev, [GpuMatrix(dev, w)], x[None], pro=6, x2=o[None], va=g,
                      eps=1e-5, residual_out=back)[0]
    assert _rel(got, w.matvec(h.astype(np.float32))) < 1e-5
    assert np.array_equal(back[0], r)


@pytest.mark.parametrize("dtype", ["q8_row", "f16"])
def test_matvec_plain_swiglu(dev, dtype):
    """PRO 7: silu(gate) * up of the gate|up output as the product's input (the
    llama_swiglu pass it replaces), no norm."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(3)
    cols = 160
    w = _qt(rng, dtype, 29, cols)
    gu = (rng.standard_normal(2 * cols) * 3).astype(np.float32)
    m = gu[:cols] / (1 + np.exp(-gu[:cols])) * gu[cols:]
    got = matvec_once(dev, [GpuMatrix(dev, w)], gu[None], pro=7, x2_off=cols)[0]
    assert _rel(got, w.matvec(m.astype(np.float32))) < 1e-5


def test_merge_input_stage_refuses_bad_shapes(dev):
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    g = GpuMatrix(dev, _qt(np.random.default_rng(1), "q8_row", 5, 64))
    with pytest.raises(ConfigError, match="PRO 3"):
        matvec_once(dev, [g], np.zeros((1, 64 * 2), np.float32), pro=3, hd=48, splits=2)
    with pytest.raises(ConfigError, match="PRO 5"):     # 2 heads x 200 splits: 400 records
        matvec_once(dev, [g], np.zeros((1, 64), np.float32), pro=5, hd=32, splits=200)


# ---- the whole Dory forward ----------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_file():
    f = cmf.open(demo_path())
    yield f
    f.close()


@pytest.mark.parametrize("opts", [{}, {"kv_mode": "last_loop", "full_window": 24}])
def test_dory_logits_match_cpu(dev, demo_file, opts):
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    host = DoryModel(demo_file, **opts)
    g = to_device(host, dev)
    ids = np.random.default_rng(2).integers(0, host.vocab, 70)   # two chunks
    a = host.forward(host.new_state(), ids, "all")
    b = g.forward(g.new_state(), ids, "all")
    assert b.shape == a.shape
    assert _rel(b, a) < 1e-3
    sc, sg = host.new_state(), g.new_state()
    host.forward(sc, ids[:66], "none")
    assert g.forward(sg, ids[:66], "none") is None
    for i in ids[66:]:   # decode rows, through the sliding ring
        assert _rel(g.forward(sg, [int(i)]), host.forward(sc, [int(i)])) < 1e-3


@pytest.mark.parametrize("splits", [1, 5, 64])
def test_attention_splits_match_cpu(dev, demo_file, splits):
    """Decode rows with the attention split over key ranges (more splits than keys at
    the first positions: empty splits) equal the host forward; 64 is clamped to 256 / nh."""
    from cortiq.gpu.dory import GpuDoryModel
    from cortiq.models.dory import DoryModel
    host = DoryModel(demo_file)
    g = GpuDoryModel(host, dev, attn_splits=splits)
    assert g.splits == min(splits, 256 // g.nh)
    ids = np.random.default_rng(12).integers(0, host.vocab, 9)
    sc, sg = host.new_state(), g.new_state()
    for i in ids:
        assert _rel(g.forward(sg, [int(i)]), host.forward(sc, [int(i)])) < 1e-3


def test_decode_residual_fused_or_not(dev, demo_file):
    """Decode rows with each residual taken by the next product's input stage (the
    default) and with a rownorm pass a residual: both equal the host forward, and the
    fused program has fewer dispatches."""
    from cortiq.gpu.dory import GpuDoryModel
    from cortiq.models.dory import DoryModel
    host = DoryModel(demo_file, kv_mode="last_loop")
    counts = []
    for fuse in (True, False):
        g = GpuDoryModel(host, dev, fuse_residual=fuse)
        assert g.fuse_residual is fuse
        ids = np.random.default_rng(13).integers(0, host.vocab, 5)
        sc, sg = host.new_state(), g.new_state()
        host.forward(sc, ids[:3], "none")
        g.forward(sg, ids[:3], "none")
        for i in ids[3:]:
            assert _rel(g.forward(sg, [int(i)]), host.forward(sc, [int(i)])) < 1e-3
        counts.append(g.dispatches_per_token)
    assert counts[0] < counts[1]


@pytest.mark.parametrize("opts,splits", [({}, None),
                                         ({"kv_mode": "last_loop", "full_window": 24}, 1)])
def test_decode_qk_prep_fused_matches_cpu(dev, demo_file, opts, splits):
    """Decode rows whose attention dispatch does qk_prep's work (attention_qk, the
    default) equal the host forward at the first positions (empty splits), across the
    sliding window's and the ring's wrap-around, in both KV modes; the k/v rows it
    writes are the ones a later prompt chunk reads; and the program has one dispatch
    fewer per attention sub-layer than with the qk_prep pass."""
    from cortiq.gpu.dory import GpuDoryModel
    from cortiq.models.dory import DoryModel
    from cortiq.models.dory.model import HOST_CHUNK
    host = DoryModel(demo_file, **opts)
    rng = np.random.default_rng(21)
    ids = rng.integers(0, host.vocab, host.window + HOST_CHUNK + 6)
    fused = GpuDoryModel(host, dev, attn_splits=splits)
    plain = GpuDoryModel(host, dev, attn_splits=splits, fuse_qk=False)
    assert fused.fuse_qk and not plain.fuse_qk
    sc, sf, sp = host.new_state(), fused.new_state(), plain.new_state()
    for i in ids[:3]:               # decode rows from position 0
        a = host.forward(sc, [int(i)])
        assert _rel(fused.forward(sf, [int(i)]), a) < 1e-3
        plain.forward(sp, [int(i)])
    start = host.window + HOST_CHUNK - 3    # a sliding ring has window + HOST_CHUNK rows
    for m in (host, fused, plain):
        m.forward({host: sc, fused: sf, plain: sp}[m], ids[3:start], "none")
    for i in ids[start:-3]:
        a = host.forward(sc, [int(i)])
        b = fused.forward(sf, [int(i)])
        assert _rel(b, a) < 1e-3
        assert _rel(b, plain.forward(sp, [int(i)])) < 1e-5
    # a prompt chunk (qk_prep and the plain attention) reads the rows decode rows wrote
    assert _rel(fused.forward(sf, ids[-3:], "all"), host.forward(sc, ids[-3:], "all")) < 1e-3
    attn_runs = sum(1 for li, w in enumerate(host.layers) if hasattr(w, "sliding")
                    for _ in range(host.loops if host.n_in <= li < host.n_in + host.n_rec
                                   else 1))
    assert plain.dispatches_per_token - fused.dispatches_per_token == attn_runs


def test_attention_splits_option_errors(dev, demo_file, monkeypatch):
    from cortiq.gpu.dory import GpuDoryModel
    from cortiq.models.dory import DoryModel
    host = DoryModel(demo_file)
    with pytest.raises(ConfigError, match="splits"):
        GpuDoryModel(host, dev, attn_splits=0)
    monkeypatch.setenv("CORTIQ_GPU_ATTN_SPLITS", "many")
    with pytest.raises(ConfigError, match="CORTIQ_GPU_ATTN_SPLITS"):
        GpuDoryModel(host, dev)
    monkeypatch.setenv("CORTIQ_GPU_ATTN_SPLITS", "2")
    assert GpuDoryModel(host, dev).splits == 2


def test_greedy_tokens_identical(dev, demo_file):
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    host = DoryModel(demo_file)
    g = to_device(host, dev)
    ids = np.random.default_rng(4).integers(0, host.vocab, 12)
    sc, sg = host.new_state(), g.new_state()
    want = [int(np.argmax(host.forward(sc, ids)))]
    got = [g.forward_greedy(sg, ids)]
    for _ in range(31):
        want.append(int(np.argmax(host.forward(sc, [want[-1]]))))
        got.append(g.forward_greedy(sg, [got[-1]]))
    assert got == want
    s2 = g.new_state()
    g.forward(s2, ids[:-1], "none")
    assert g.decode_greedy(s2, int(ids[-1]), 32) == want


def test_conf_gate_matches_cpu(dev, demo_file):
    """gate="conf:T": probes, exits and second passes as on the host."""
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    host = DoryModel(demo_file, gate="conf:0.3", kv_mode="last_loop")
    g = to_device(host, dev)
    ids = np.random.default_rng(9).integers(0, host.vocab, 6)
    sc, sg = host.new_state(), g.new_state()
    host.forward(sc, ids[:5], "none")
    g.forward(sg, ids[:5], "none")
    # a one-row prompt piece is a prompt row: never gated, on either device
    assert _rel(g.forward(sg, ids[5:], prompt=True), host.forward(sc, ids[5:], prompt=True)) < 1e-3
    assert sg.gate_tokens == sc.gate_tokens == 0
    tok_c = tok_g = int(ids[-1])
    for _ in range(12):
        a, b = host.forward(sc, [tok_c]), g.forward(sg, [tok_g])
        assert _rel(b, a) < 1e-3
        tok_c, tok_g = int(np.argmax(a)), int(np.argmax(b))
    assert (sg.gate_tokens, sg.gate_one) == (sc.gate_tokens, sc.gate_one)
    assert 0 < sg.gate_one < sg.gate_tokens    # both branches ran


def test_rollback_on_device(dev, demo_file):
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    host = DoryModel(demo_file)
    g = to_device(host, dev)
    ids = np.random.default_rng(6).integers(0, host.vocab, 40)
    st = g.new_state()
    g.forward(st, ids, "none")
    assert g.can_rollback(st, 30)
    g.rollback(st, 30)
    assert st.pos == 30
    got = g.forward(st, ids[30:34], "all")
    ref = host.forward(host.new_state(), ids[:34], "all")[30:]
    assert _rel(got, ref) < 1e-3
    # far beyond the sliding ring: refused in place (Session re-reads instead)
    long = np.random.default_rng(8).integers(0, host.vocab, host.window + 66)
    st = g.new_state()
    g.forward(st, long, "none")
    assert not g.can_rollback(st, 5)
    with pytest.raises(Exception, match="cannot roll back"):
        g.rollback(st, 5)


def test_llm_sessions_and_chat_reuse(dev):
    from cortiq.runtime.llm import LLM
    cpu = LLM(device="cpu", seed=1)
    gpu = LLM(device="gpu", seed=1)
    assert gpu.device == "gpu" and type(gpu.model).__name__ == "GpuDoryModel"
    kw = dict(max_tokens=8, temperature=0)
    assert gpu.generate("def add(a, b):", **kw) == cpu.generate("def add(a, b):", **kw)
    msgs = [{"role": "user", "content": "What is a list?"}]
    r1 = gpu.create_chat_completion(msgs, max_tokens=4, temperature=0)
    msgs2 = msgs + [r1["choices"][0]["message"], {"role": "user", "content": "And a dict?"}]
    r2 = gpu.create_chat_completion(msgs2, max_tokens=4, temperature=0)   # reuses the prefix
    c2 = cpu.create_chat_completion(msgs2, max_tokens=4, temperature=0)
    assert r2["choices"][0]["message"]["content"] == c2["choices"][0]["message"]["content"]
    s = gpu.session()
    s.feed(gpu.tokenize("import os"), want="none")
    s.rollback(1)
    assert s.pos == 1


# ---- errors --------------------------------------------------------------------------------
def test_device_option_errors(monkeypatch):
    from cortiq.gpu.device import resolve_device
    from cortiq.runtime.llm import LLM
    with pytest.raises(ConfigError, match="device"):
        LLM(device="tpu")
    monkeypatch.setenv("CORTIQ_DEVICE", "cpu")
    assert resolve_device(None) == "cpu"
    monkeypatch.setenv("CORTIQ_DEVICE", "nonsense")
    with pytest.raises(ConfigError, match="device"):
        resolve_device(None)


def test_missing_wgpu_is_a_config_error(monkeypatch):
    import builtins

    from cortiq.gpu import device as gd
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "wgpu":
            raise ImportError("No module named 'wgpu'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake)
    monkeypatch.setattr(gd.Device, "_shared", None)
    with pytest.raises(ConfigError, match="cortiq\\[gpu\\]"):
        gd.Device()
    assert gd.resolve_device("auto") == "cpu"
    assert gd.adapters() == []


def test_unsupported_architecture_and_options(dev, demo_file, tmp_path):
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel

    class Other:
        arch = "gpt2"
    with pytest.raises(ConfigError, match="gpt2 architecture runs on the CPU only"):
        to_device(Other(), dev)
    d = DoryModel(demo_file).hidden
    router = tmp_path / "router.bin"
    np.concatenate([[1, d], np.zeros(4 * d)]).astype("<f4").tofile(router)
    with pytest.raises(ConfigError, match="last_loop"):
        to_device(DoryModel(demo_file, gate="conf:0.5", kv_mode="per_loop"), dev)
    with pytest.raises(ConfigError, match="recon early-exit gate"):
        to_device(DoryModel(demo_file, gate=f"recon:{router}:0.0"), dev)


# ---- the decode matvec's reduction and load variants ------------------------------------
@pytest.mark.parametrize("dtype,subgroups,unroll,stage",
                         [(d, False, 4, True) for d in DTYPES]
                         + [("q8_row", False, 1, True), ("q8_row", True, 1, True),
                            ("q8_row", True, 4, False), ("q8_row", False, 4, False),
                            ("q8_row", True, 4, True), ("q4_block", True, 4, True)])
def test_decode_matvec_reductions_and_unroll(dev, dtype, subgroups, unroll, stage,
                                             monkeypatch):
    """subgroupAdd (where the adapter offers subgroups) and the shared-memory tree, with
    and without a lane's four loads in flight, on rows long enough for the unrolled loop
    and its remainder, and a row count that leaves a workgroup part-empty, the plain
    product's input staged or read by each lane (the other tests run the default:
    the tree, four loads, staged)."""
    from cortiq.gpu import kernels
    monkeypatch.setattr(kernels, "MATVEC_SUBGROUPS", subgroups)
    monkeypatch.setattr(kernels, "MATVEC_UNROLL", unroll)
    monkeypatch.setattr(kernels, "MATVEC_STAGE_PLAIN", stage)
    rng = np.random.default_rng(stable_seed(dtype, unroll))
    qt = _qt(rng, dtype, 19, 2080)     # 130 q8 chunks a row: 4 * lanes a row does not divide it
    x = rng.standard_normal((1, 2080)).astype(np.float32)
    x[0, 7] = 0.0
    got = kernels.matvec_once(dev, [kernels.GpuMatrix(dev, qt)], x)[0]
    assert _rel(got, qt.matvec(x[0])) < 1e-5
    gate = rng.standard_normal((1, 2080)).astype(np.float32)
    s = rng.standard_normal(2080).astype(np.float32)
    y = x[0] / (1 + np.exp(-gate[0] * s))
    want = qt.matvec(y / np.sqrt((y * y).sum() + 1e-6))
    assert _rel(kernels.matvec_once(dev, [kernels.GpuMatrix(dev, qt)], x, pro=1, x2=gate,
                                    va=s)[0], want) < 1e-5


def test_subgroups_setting(monkeypatch):
    from cortiq.gpu import device as gd
    from cortiq.gpu import kernels

    class Dev:
        subgroups = True
    for raw, setting, used, used_i8 in (("", None, False, True), ("0", False, False, False),
                                        ("off", False, False, False), ("on", True, True, True),
                                        ("1", True, True, True)):
        monkeypatch.setenv("CORTIQ_GPU_SUBGROUPS", raw)
        assert gd.subgroups_setting() is setting
        assert kernels.matvec1_subgroups(Dev()) is used
        assert kernels.matvec1_subgroups(Dev(), int8=True) is used_i8
    monkeypatch.setattr(kernels, "MATVEC_SUBGROUPS", True)      # the module setting wins
    monkeypatch.setenv("CORTIQ_GPU_SUBGROUPS", "")
    assert kernels.matvec1_subgroups(Dev()) is True
    Dev.subgroups = False                                        # never without the feature
    assert kernels.matvec1_subgroups(Dev()) is False
    monkeypatch.setattr(kernels, "MATVEC_SUBGROUPS", None)
    assert kernels.matvec1_subgroups(Dev(), int8=True) is False
    monkeypatch.setenv("CORTIQ_GPU_SUBGROUPS", "sometimes")
    with pytest.raises(ConfigError, match="CORTIQ_GPU_SUBGROUPS"):
        gd.subgroups_setting()


def test_device_without_subgroups_runs_the_decode_matvecs(dev, monkeypatch):
    """CORTIQ_GPU_SUBGROUPS=0 opens a device without the `subgroup` feature: the decode
    matvec and the rows matvec still compile (their tree variants hold no subgroup
    builtin) and give the CPU's products."""
    from cortiq.gpu import Device, kernels
    monkeypatch.setenv("CORTIQ_GPU_SUBGROUPS", "0")
    monkeypatch.setattr(kernels, "MATVEC_SUBGROUPS", None)
    bare = Device()
    assert bare.subgroups is False
    rng = np.random.default_rng(stable_seed("no-subgroups"))
    qt = _qt(rng, "q8_row", 21, 512)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    m = kernels.GpuMatrix(bare, qt)
    assert _rel(kernels.matvec_once(bare, [m], x[:1])[0], qt.matvec(x[0])) < 1e-5
    got = kernels.matvec_once(bare, [m], x, rows=True)
    for r in range(3):
        assert _rel(got[r], qt.matvec(x[r])) < 1e-5


def test_full_layer_caches_grow_on_device(dev, demo_file, monkeypatch):
    """The full (unwindowed) layers' KV caches start small and double as positions come:
    what they held is copied, and the logits stay the CPU's across each growth."""
    from cortiq.gpu import dory as gd
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    monkeypatch.setattr(gd, "FULL_CAP0", 4)
    host = DoryModel(demo_file)
    g = to_device(host, dev)
    ids = np.random.default_rng(7).integers(0, host.vocab, 21)
    sc, sg = host.new_state(), g.new_state()
    assert _rel(g.forward(sg, ids[:9], "all"), host.forward(sc, ids[:9], "all")) < 1e-3
    for i in ids[9:]:
        assert _rel(g.forward(sg, [int(i)]), host.forward(sc, [int(i)])) < 1e-3
    assert any(not s[3] for slots in sg.slots for s in slots or ())   # full layers exist
    assert sg.full_cap == 32                # 4 -> 8 -> 16 -> 32 for 21 positions


def test_read_after_a_submission(dev):
    """Device.read(after=) returns what the indexed submission wrote, with later
    submissions already queued behind it (each read waits for its own only)."""
    src = dev.buffer(64, copy_src=True)
    stages = [dev.staging(64), dev.staging(64)]
    done = []
    for i, stage in enumerate(stages):
        dev.queue.write_buffer(src, 0, np.full(16, i + 1, np.float32))
        enc = dev.dev.create_command_encoder()
        enc.copy_buffer_to_buffer(src, 0, stage, 0, 64)
        done.append(dev.submit([enc.finish()]))
    for i, stage in enumerate(stages):
        got = dev.read(stage, 64, after=done[i]).view(np.float32)
        assert np.array_equal(got, np.full(16, i + 1, np.float32))


def test_unroll_row_loops_writes_each_row_out():
    """The rows matvec's loops over its input rows become one copy a row, t a constant
    in each (nested loops too, other identifiers that contain t untouched, each copy in
    its own scope so that its lets do not collide)."""
    from cortiq.gpu.kernels import unroll_row_loops
    code = ("a(); for (var t = 0u; t < NB; t++) { let d = p[t] + t0; "
            "for (var t = 0u; t < NB; t++) { q[t] = nt; } } b();")
    got = unroll_row_loops(code, 2)
    inner = "{ q[0u] = nt; }{ q[1u] = nt; }"
    assert got == ("a(); { let d = p[0u] + t0; " + inner + " }"
                   "{ let d = p[1u] + t0; " + inner + " } b();")
    assert unroll_row_loops("for (var t = 0u; t < nt; t++) { x[t] = 1; }", 4) == \
        "for (var t = 0u; t < nt; t++) { x[t] = 1; }"       # a bound other than NB stays


@pytest.mark.parametrize("n", [1, 7, 1024, 1025, 8191, 8193, 20011])
def test_argmax_kernel(dev, n):
    """The greedy token kernel: the first of equal largest logits, at lengths around
    its 1024 lanes; the non-finite flag for +-inf and NaN anywhere, and none for finite
    rows."""
    from cortiq.gpu.kernels import FIXED, Dispatch, ParamArena, fixed_pipeline, resolve, u32s
    rng = np.random.default_rng(n)

    def run(logits):
        arena = ParamArena(dev)
        p = arena.ref(u32s(n, 0, 0, 0))
        arena.upload()
        ids, out = dev.buffer(16, copy_src=True), dev.buffer(16, copy_src=True)
        d = Dispatch(fixed_pipeline(dev, "argmax"),
                     dev.bind(FIXED["argmax"], resolve([p, dev.upload(logits), ids, out])),
                     (1, 1, 1), "argmax")
        enc = dev.record([d])
        stage = dev.staging(16)
        enc.copy_buffer_to_buffer(out, 0, stage, 0, 16)
        dev.queue.submit([enc.finish()])
        word = dev.read(stage, 8).view(np.uint32)
        return int(word[0]), int(word[1])

    x = rng.standard_normal(n).astype(np.float32)
    assert run(x) == (int(np.argmax(x)), 0)
    if n > 2:   # ties: the lowest index wins, wherever the copies fall among the lanes
        hi = rng.choice(n, size=min(n, 3), replace=False)
        x[hi] = x.max() + 1.0
        assert run(x) == (int(hi.min()), 0)
    for bad in (np.inf, -np.inf, np.nan):
        y = x.copy()
        y[rng.integers(n)] = bad
        assert run(y)[1] == 1


@pytest.mark.parametrize("n", [5, 256, 1000, 2048, 3001])
def test_rownorm_kernel(dev, n):
    """The nGPT row steps (rownorm.wgsl) against NumPy, two rows, at lengths below,
    at and around multiples of its 256 lanes: the residual (into its own place and
    into another region) and the mix with and without its norm."""
    from cortiq.gpu.kernels import FIXED, Dispatch, ParamArena, fixed_pipeline, resolve, u32s
    rng = np.random.default_rng(n)
    t, eps, NONE = 2, 1e-6, 0xFFFFFFFF
    H0 = rng.standard_normal((4, t, n)).astype(np.float32)     # four regions of t rows
    out = rng.standard_normal((t, n)).astype(np.float32)    # the sub-layer's output
    alpha = rng.random(n).astype(np.float32)

    def run(params):
        arena = ParamArena(dev)
        p = arena.ref(u32s(*params))
        arena.upload()
        h = dev.upload(H0.copy())
        h_out = dev.buffer(H0.nbytes, copy_src=True)
        step = dev.upload(np.array([t, 0, 0, 0], np.uint32), uniform=True)
        d = Dispatch(fixed_pipeline(dev, "rownorm"), dev.bind(
            FIXED["rownorm"], resolve([p, step, h, dev.upload(out), dev.upload(alpha)])),
            (t, 1, 1), "rownorm")
        enc = dev.record([d])
        enc.copy_buffer_to_buffer(h, 0, h_out, 0, H0.nbytes)
        stage = dev.staging(H0.nbytes)
        enc.copy_buffer_to_buffer(h_out, 0, stage, 0, H0.nbytes)
        dev.queue.submit([enc.finish()])
        return dev.read(stage, H0.nbytes).view(np.float32).reshape(H0.shape)

    def jn(v):
        return v / np.sqrt((v.astype(np.float64) ** 2).sum(-1, keepdims=True) + eps)

    reg = lambda i: i * t * n   # noqa: E731
    for d2 in (NONE, 2):            # the residual, in place and into region 2
        got = run((n, 0, reg(1), NONE if d2 == NONE else reg(d2), 0, 0, 0, 0, 0, eps, 0, 0))
        xh = jn(H0[1])
        want = H0.copy()
        want[1 if d2 == NONE else d2] = jn(xh + alpha * (jn(out) - xh))
        assert _rel(got, want) < 1e-5
    for norm, b, d2 in ((1, reg(3), reg(0)), (0, NONE, NONE)):     # the mixes
        got = run((n, 1, reg(2), d2, reg(1), b, 0, 0, norm, eps, 0, 0))
        v = H0[1] + (H0[3] if b != NONE else 0)
        v = jn(v) if norm else v
        want = H0.copy()
        want[2] = v
        if d2 != NONE:
            want[0] = v
        assert _rel(got, want) < 1e-5


@pytest.mark.parametrize("hd", [8, 152])
def test_decode_attention_head_sizes(dev, tmp_path_factory, hd):
    """The decode attention's key loads (four 16-byte pieces of a key in flight, then
    one) and its values (two keys a step, then one) at a head of fewer pieces than a
    round (8) and of rounds and a tail (152), over more keys a split than a step takes:
    the logits equal the host's."""
    from batch_models import write_dory

    from cortiq.gpu.dory import GpuDoryModel
    from cortiq.models.dory import DoryModel
    path = write_dory(str(tmp_path_factory.mktemp(f"hd{hd}")), "f32", seed=hd, hidden=64,
                      heads=2, kv_heads=1, head_dim=hd, mlp=96, pattern="S-*-",
                      blocks=(1, 2, 1), vocab=300)
    host = DoryModel(cmf.open(path))
    g = GpuDoryModel(host, dev, attn_splits=2)
    sc, sg = host.new_state(), g.new_state()
    for k, i in enumerate(np.random.default_rng(hd).integers(0, host.vocab, 30)):
        got, want = g.forward(sg, [int(i)]), host.forward(sc, [int(i)])
        if k >= 26:     # 27-30 keys: 14-15 a split
            assert _rel(got, want) < 1e-3
