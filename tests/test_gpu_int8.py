"""The decode matvec on int8 activations (precision "int8" on the GPU, matvec1.wgsl's
I8 variant) against a NumPy transcription of the CPU's activation quantization, and a
GPU model switched to it against the same model on the CPU at precision "int8".

Runs on any adapter (llvmpipe in CI; CORTIQ_REQUIRE_GPU=1 fails instead of skipping).
"""

import numpy as np
import pytest

from attention_records import split_records
from batch_models import alone_then_rewound
from gpu_buffers import run_read
from cortiq.cmf.testing import qtensor_from_f32

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _q8_row(rng, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[rng.random((rows, cols)) < 0.05] = 0.0
    return qtensor_from_f32(w, "q8_row")


def _int8_product(qt, x):
    """y = W x with x quantized per 32 columns as the CPU's int8 activations are:
    d = max|x| / 127, q = round-half-even(x * (127 / max|x|)), integer dots per group."""
    rows, cols = qt.shape
    raw = qt.raw
    codes = raw[:rows * cols].view(np.int8).reshape(rows, cols).astype(np.int64)
    rs = raw[rows * cols:rows * cols + 2 * rows].view(np.float16).astype(np.float64)
    g = np.asarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(g).max(1)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(g * inv[:, None]).astype(np.int64)
    d = (amax / np.float32(127)).astype(np.float64)
    sums = (codes.reshape(rows, -1, 32) * q[None]).sum(2)
    return (sums * d[None]).sum(1) * rs


@pytest.mark.parametrize("shape", [(37, 96), (5, 1056), (9, 4160), (300, 64)])
@pytest.mark.parametrize("subgroups", [False, True])
def test_int8_decode_matvec_matches_the_quantized_reference(dev, shape, subgroups, monkeypatch):
    from cortiq.gpu import kernels
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    if subgroups and not dev.subgroups:
        pytest.skip("the adapter offers no subgroups")
    monkeypatch.setattr(kernels, "MATVEC_SUBGROUPS", subgroups)
    rng = np.random.default_rng(shape[1])
    qt = _q8_row(rng, *shape)
    x = rng.standard_normal(shape[1]).astype(np.float32)
    x[:32] = 0.0                                   # an all-zero group: d = 0, q = 0
    x[40] = 25.0                                   # one group dominated by an outlier
    got = matvec_once(dev, [GpuMatrix(dev, qt)], x[None], int8=True)[0]
    want = _int8_product(qt, x)
    assert _rel(got, want) < 1e-5
    exact = qt.matvec(x)
    assert _rel(got, exact) > 1e-5                 # it did take the quantized input
    cpu = qtensor_from_f32(qt.dequantize(), "q8_row")
    cpu.precision = "int8"
    assert _rel(got, cpu.matvec(x)) < 1e-4


@pytest.mark.parametrize("cols", [1056, 2080])
def test_int8_fused_residual_long_rows(dev, cols):
    """The fused residual (PRO 4) on int8 activations over rows of several of its
    quantizer's 1024-column rounds, the last one partial: the product and the
    written-back residual as on the short rows."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(cols)
    a = _q8_row(rng, 19, cols)

    def jn(v):
        return v / np.sqrt((v * v).sum() + 1e-6)
    x, o = (rng.standard_normal((2, cols)) * [[3.0], [0.5]]).astype(np.float32)
    alpha = rng.random(cols).astype(np.float32)
    want_x = jn(jn(x) + alpha * (jn(o) - jn(x)))
    back: list = []
    got = matvec_once(dev, [GpuMatrix(dev, a)], x[None], pro=4, x2=o[None], va=alpha,
                      residual_out=back, int8=True)[0]
    assert _rel(got, _int8_product(a, want_x)) < 1e-4
    assert _rel(back[0], want_x) < 1e-6


def test_int8_input_stages_and_fused_groups(dev):
    """The input stages feed the quantizer what they feed the float path: gated input
    (1), SwiGLU (2), the fused residual (4, its written-back x stays float32); a group of
    two matrices; a non-q8_row part keeps the float32 product."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(7)
    cols = 96

    def jn(v):
        return v / np.sqrt((v * v).sum() + 1e-6)
    a, b = _q8_row(rng, 21, cols), _q8_row(rng, 12, cols)
    ga, gb = GpuMatrix(dev, a), GpuMatrix(dev, b)
    y, gate = rng.standard_normal((2, cols)).astype(np.float32)
    s = rng.random(cols).astype(np.float32)
    z = y / (1 + np.exp(-(gate * s)))
    got = matvec_once(dev, [ga, gb], y[None], pro=1, x2=gate[None], va=s, int8=True)[0]
    want = np.concatenate([_int8_product(a, z), _int8_product(b, z)]) / np.sqrt((z * z).sum() + 1e-6)
    assert _rel(got, want) < 1e-5
    gu = rng.standard_normal(2 * cols).astype(np.float32)
    sa, sb = rng.random(cols).astype(np.float32), rng.random(cols).astype(np.float32)
    u, v = gu[:cols] * sa, gu[cols:] * sb
    m = u / (1 + np.exp(-u)) * v
    got = matvec_once(dev, [ga], gu[None], pro=2, x2_off=cols, va=sa, vb=sb, int8=True)[0]
    assert _rel(got, _int8_product(a, m) / np.sqrt((m * m).sum() + 1e-6)) < 1e-5
    x, o = (rng.standard_normal((2, cols)) * [[3.0], [0.5]]).astype(np.float32)
    alpha = rng.random(cols).astype(np.float32)
    want_x = jn(jn(x) + alpha * (jn(o) - jn(x)))
    back: list = []
    got = matvec_once(dev, [ga], x[None], pro=4, x2=o[None], va=alpha, residual_out=back,
                      int8=True)[0]
    # the quantizer sees the residual before its norm: the same groups up to the scale
    assert _rel(got, _int8_product(a, want_x)) < 1e-4
    assert _rel(back[0], want_x) < 1e-6
    g = (rng.random(cols) + 0.5).astype(np.float32)
    r = x + o
    h = r * g / np.sqrt((r * r).mean() + 1e-5)
    back = []
    got = matvec_once(dev, [ga], x[None], pro=6, x2=o[None], va=g, eps=1e-5,
                      residual_out=back, int8=True)[0]
    assert _rel(got, _int8_product(a, h)) < 1e-4    # Llama's residual and RMSNorm
    assert np.array_equal(back[0], r)
    got = matvec_once(dev, [ga], gu[None], pro=7, x2_off=cols, int8=True)[0]
    silu = gu[:cols] / (1 + np.exp(-gu[:cols])) * gu[cols:]
    assert _rel(got, _int8_product(a, silu)) < 1e-4     # plain SwiGLU, no norm
    f16 = qtensor_from_f32(rng.standard_normal((7, cols)).astype(np.float32), "f16")
    got = matvec_once(dev, [GpuMatrix(dev, f16)], y[None], int8=True)[0]
    assert _rel(got, f16.matvec(y)) < 1e-5


@pytest.mark.parametrize("subgroups", [True, False])
def test_int8_input_staged_once(dev, monkeypatch, subgroups):
    """A decode product whose int8 input is staged by a pass of its own (QOUT, 1024
    columns a workgroup) and read by every workgroup of the product (QIN) gives what the
    product staging in each workgroup gives: every input stage but PRO 4, lengths of one
    and of several QOUT workgroups, a fused group; the residual written back bit for
    bit. PRO 4 is refused."""
    from cortiq.errors import ConfigError
    from cortiq.gpu import kernels
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    if subgroups and not dev.subgroups:
        pytest.skip("the adapter offers no subgroups")
    monkeypatch.setattr(kernels, "MATVEC_SUBGROUPS", subgroups)
    rng = np.random.default_rng(77)
    for cols in (96, 1056, 3104):
        qts = [_q8_row(rng, r, cols) for r in (19, 8)]
        mats = [GpuMatrix(dev, q) for q in qts]
        x, o, gate = rng.standard_normal((3, cols)).astype(np.float32)
        x[5:37] = 0.0                               # an all-zero group
        x[900 % cols] = 60.0                        # an outlier
        g, sa, sb = (rng.random((3, cols)) + 0.5).astype(np.float32)
        gu = rng.standard_normal(2 * cols).astype(np.float32)
        cases = [(x[None], {}), (x[None], dict(pro=1, x2=gate[None], va=g)),
                 (gu[None], dict(pro=2, x2_off=cols, va=sa, vb=sb)),
                 (x[None], dict(pro=6, x2=o[None], va=g, eps=1e-5)),
                 (gu[None], dict(pro=7, x2_off=cols))]
        for X, kw in cases:
            backs: list = [[], []]
            got = [matvec_once(dev, mats, X, int8=True, once=once, residual_out=back, **kw)
                   for once, back in ((False, backs[0]), (True, backs[1]))]
            assert _rel(got[1], got[0]) < 1e-6, kw.get("pro", 0)
            if not kw:
                want = np.concatenate([_int8_product(m, x) for m in qts])
                assert _rel(got[1], want) < 1e-5
            if backs[0]:
                assert np.array_equal(backs[1][0], backs[0][0])
    nh, hd, splits = 4, 32, 7
    qt = _q8_row(rng, 20, nh * hd)
    rec, y = split_records(rng, nh, hd, splits)
    got = matvec_once(dev, [GpuMatrix(dev, qt)], rec, pro=5, hd=hd, splits=splits,
                      int8=True, once=True)[0]
    assert _rel(got, _int8_product(qt, y)) < 1e-4
    with pytest.raises(ConfigError, match="staged by a pass"):
        matvec_once(dev, [GpuMatrix(dev, qt)], rec[:, :nh * hd], pro=4, x2=rec[:, :nh * hd],
                    va=np.ones(nh * hd, np.float32), int8=True, once=True)


@pytest.mark.parametrize("variant", [{"MATVEC_UNROLL": 8}, {"MATVEC_SUBGROUPS": False},
                                     {"MATVEC_SUBGROUPS": False, "RPW1_ROWS": 2}])
def test_int8_matvec_variants_agree(dev, monkeypatch, variant):
    """The int8 decode matvec's variants (eight loads in flight a lane; the shared-memory
    tree's reduction instead of subgroups where the adapter offers them; with it, two
    rows a lane in turn) give the default's products, with the residual-norm and SwiGLU
    input stages and lengths over several 1024-column rounds."""
    from cortiq.gpu import kernels
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(40)
    default = {k: getattr(kernels, k) for k in variant}
    for cols in (96, 2080):
        ga = GpuMatrix(dev, _q8_row(rng, 23, cols))
        x, o = rng.standard_normal((2, cols)).astype(np.float32)
        g = (rng.random(cols) + 0.5).astype(np.float32)
        gu = rng.standard_normal(2 * cols).astype(np.float32)
        runs = []
        for settings in (default, variant):
            for k, v in settings.items():
                monkeypatch.setattr(kernels, k, v)
            runs.append([matvec_once(dev, [ga], x[None], int8=True)[0],
                         matvec_once(dev, [ga], x[None], pro=6, x2=o[None], va=g, eps=1e-5,
                                     int8=True)[0],
                         matvec_once(dev, [ga], gu[None], pro=7, x2_off=cols, int8=True)[0]])
        for a, b in zip(*runs):
            assert _rel(b, a) < 1e-6


def test_int8_merged_attention_input(dev):
    """PRO 5 on int8 activations: the merged split-attention records are quantized as
    they are, with no norm (PRO 3 would normalise them)."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(12)
    nh, hd = 4, 32
    qt = _q8_row(rng, 17, nh * hd)
    for splits in (3, 6):       # a remainder of the four splits read at once, and both
        rec, y = split_records(rng, nh, hd, splits)
        got = matvec_once(dev, [GpuMatrix(dev, qt)], rec, pro=5, hd=hd,
                          splits=splits, int8=True)[0]
        assert _rel(got, _int8_product(qt, y)) < 1e-4
        assert _rel(got, qt.matvec(y)) > 1e-5               # it did take the int8 path


def test_dory_model_switches_to_int8_in_place(dev):
    """set_precision("int8") switches a loaded GPU model's recorded decode products; its
    decode logits then follow the CPU model at "int8"; "exact" switches them back."""
    from cortiq import cmf
    from cortiq.demo import demo_path
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    f = cmf.open(demo_path())
    host = DoryModel(f)
    g = to_device(host, dev)
    ids = np.array([3, 17, 200, 5, 9, 41], np.int64)
    st = g.new_state()
    g.forward(st, ids[:-1], prompt=True)
    exact = g.forward(st, ids[-1:])
    assert g.set_precision("int8") > 0
    g.rollback(st, ids.size - 1)
    quant = g.forward(st, ids[-1:])
    assert 1e-6 < _rel(quant, exact) < 5e-2
    host.set_precision("int8")
    cs = host.new_state()
    host.forward(cs, ids[:-1], prompt=True)
    cpu = host.forward(cs, ids[-1:])
    assert _rel(quant, cpu) < 2e-2
    assert g.set_precision("exact") > 0
    g.rollback(st, ids.size - 1)
    assert _rel(g.forward(st, ids[-1:]), exact) < 1e-6
    f.close()


def test_int8_batches_equal_each_sequence_alone(dev, monkeypatch):
    """Under int8 activations a batch's decode rows go through the int8 rows matvec (each
    product's rows quantized once, quantrows.wgsl) and give what each sequence gives
    alone within float rounding, greedy tokens the same."""
    from cortiq import cmf
    from cortiq.demo import demo_path
    from cortiq.gpu import to_device
    from cortiq.models.dory import DoryModel
    f = cmf.open(demo_path())
    g = to_device(DoryModel(f), dev)
    g.set_precision("int8")
    prompts = [np.array([3, 17, 200]), np.array([5, 9]), np.array([41, 2, 8, 13])]
    states, alone = alone_then_rewound(g, prompts, 7)
    calls: list = []
    rows = g.forward_rows
    monkeypatch.setattr(g, "forward_rows", lambda *a: calls.append(len(a[0])) or rows(*a))
    got = g.forward_batch(states, [[7]] * 3, ["last"] * 3)
    assert calls == [3]
    assert any(d.name == "quantrows" for d in g._rows.head)
    for a, b in zip(alone, got):
        assert _rel(b, a) < 1e-4
        assert np.argmax(a) == np.argmax(b)
    g.set_precision("exact")           # the rows products are made again, float32
    exact = g.forward_batch(states, [[7]] * 3, ["last"] * 3)
    assert not any(d.name == "quantrows" for d in g._rows.head)
    assert all(_rel(e, b) > 1e-6 for e, b in zip(exact, got))
    f.close()


def test_int8_rows_matvec_matches_the_quantized_reference(dev):
    """The int8 rows matvec (quantrows + matvecb's I8 variant) for 1..11 rows, against
    each row's int8 product; a non-q8_row part keeps the float32 rows matvec."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(9)
    for rows, cols, t in [(37, 96, 1), (5, 1056, 9), (40, 4160, 11)]:
        qt = _q8_row(rng, rows, cols)
        X = rng.standard_normal((t, cols)).astype(np.float32)
        X[0, :32] = 0.0
        got = matvec_once(dev, [GpuMatrix(dev, qt)], X, rows=True, int8=True)
        want = np.stack([_int8_product(qt, x) for x in X])
        assert _rel(got, want) < 1e-5
    f16 = qtensor_from_f32(rng.standard_normal((7, 96)).astype(np.float32), "f16")
    X = rng.standard_normal((3, 96)).astype(np.float32)
    got = matvec_once(dev, [GpuMatrix(dev, f16)], X, rows=True, int8=True)
    assert _rel(got, f16.matmat(X)) < 1e-5


@pytest.mark.parametrize("storage,chunk", [(49152, 1024), (32768, 1024), (16384, 512),
                                           (12288, 256), (8192 + 300, 32)])
def test_rows_chunk_fits_the_workgroup_storage(storage, chunk):
    """The int8 rows matvec's input chunk: 1024 columns (a group for each of 32 lanes)
    where the device's workgroup storage holds its ROWS_NB rows of codes and scales
    beside the reduction tree, else the largest power of two that fits."""
    from types import SimpleNamespace

    from cortiq.gpu.kernels import ROWS_NB, rows_chunk_cols
    got = rows_chunk_cols(SimpleNamespace(max_workgroup_storage=storage))
    assert got == chunk
    assert ROWS_NB * got * 9 // 8 + 4 * 256 * ROWS_NB <= storage


@pytest.mark.parametrize("subgroups", [True, False])
@pytest.mark.parametrize("tile,chunk", [(4, None), (2, None), (2, 64), (2, 32)])
def test_int8_rows_matvec_tiles(dev, monkeypatch, subgroups, tile, chunk):
    """The int8 rows matvec in R-row register tiles (matvecb_tile.wgsl), its input read
    from shared memory in chunks of the device's size or of 64 or 32 columns (many chunks, the
    last one short): one part and a fused group of parts split over bindings, row counts
    that leave a workgroup part full, 1..11 input rows (a second group of ROWS_NB), with
    subgroups and with the shared-memory tree of a device opened without them; each row
    against its int8 product. Rows not in whole tiles take the one-row kernel, with the
    same products."""
    from cortiq.gpu import Device, kernels
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    if subgroups and not dev.subgroups:
        pytest.skip("the adapter offers no subgroups")
    if not subgroups:
        monkeypatch.setenv("CORTIQ_GPU_SUBGROUPS", "0")
        dev = Device()
        assert dev.subgroups is False
    monkeypatch.setattr(kernels, "ROWS_TILE", tile)
    if chunk:
        monkeypatch.setattr(kernels, "rows_chunk_cols", lambda dev: chunk)
    made: list = []
    pipe = kernels.matvecb_tile_pipeline
    monkeypatch.setattr(kernels, "matvecb_tile_pipeline",
                        lambda *a: made.append(a[1]) or pipe(*a))
    rng = np.random.default_rng(31 + tile)
    for shapes, cols, t, limit in [([(44, 96)], 96, 1, None), ([(36, 1056)], 1056, 9, None),
                                   ([(24, 512), (8, 512), (12, 512)], 512, 11, None),
                                   ([(96, 256)], 256, 8, 96 * 258 // 2)]:
        qts = [_q8_row(rng, r, cols) for r, _c in shapes]
        X = rng.standard_normal((t, cols)).astype(np.float32)
        X[0, :32] = 0.0
        X[-1, 33] = 40.0
        mats = [GpuMatrix(dev, q, limit=limit) for q in qts]
        assert limit is None or len(mats[0].parts) == 3
        got = matvec_once(dev, mats, X, rows=True, int8=True)
        want = np.stack([np.concatenate([_int8_product(q, x) for q in qts]) for x in X])
        assert got.shape == want.shape
        assert _rel(got, want) < 1e-5
    assert made == [1, 1, 3, 3]            # parts a product: every product in tiles
    qt = _q8_row(rng, 4 * 8 + 1, 128)                # not whole tiles: the one-row kernel
    X = rng.standard_normal((5, 128)).astype(np.float32)
    got = matvec_once(dev, [GpuMatrix(dev, qt)], X, rows=True, int8=True)
    assert _rel(got, np.stack([_int8_product(qt, x) for x in X])) < 1e-5
    assert len(made) == 4


def test_rows_probe_modes_build(dev, monkeypatch):
    """benchmarks/gpu_rows_probe.py times matvecb_tile.wgsl with parts of it taken out
    (docs/PERFORMANCE.md 15.12): each mode still finds the text it replaces and gives a
    shader that builds, and the ALU probe runs, so the probe does not rot."""
    import importlib
    import sys
    from pathlib import Path

    from cortiq.gpu import kernels
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    probe = importlib.import_module("gpu_rows_probe")
    source = dev.source
    plain = source("matvecb_tile.wgsl")
    try:
        for mode in ("nodot", "poly", "nocopy", "noweights", "nocopy+noweights"):
            patched = probe._patched(plain, mode)
            assert patched != plain
            assert probe._patched(source("quantrows.wgsl"), mode) == source("quantrows.wgsl")
            monkeypatch.setattr(dev, "source", lambda name, m=mode: probe._patched(source(name), m))
            probe.forget_tiles(dev)
            assert kernels.matvecb_tile_pipeline(dev, 2) is not None
        with pytest.raises(SystemExit, match="nocopy"):
            probe._patched(probe._patched(plain, "nocopy"), "nocopy")
    finally:
        monkeypatch.setattr(dev, "source", source)
        probe.forget_tiles(dev)
    rates = probe.alu(dev, iters=4, groups=2)
    assert set(rates) == {f"{k}_gops" for k in probe.ALU_OPS}
    assert all(v > 0 for v in rates.values())
    sys.modules.pop("gpu_rows_probe", None)


@pytest.mark.parametrize("splits", [1, 3, 8])
def test_int8_merges_gated_attention_splits(dev, splits):
    """Input stage 3 (Dory's split attention merged, gated and justnormed) feeds the
    quantizer the merged values: the int8 product of the float merge, over its norm."""
    from cortiq.gpu.kernels import GpuMatrix, matvec_once
    rng = np.random.default_rng(splits)
    nh, hd = 4, 32
    w = _q8_row(rng, 21, nh * hd)
    rec, y = split_records(rng, nh, hd, splits)
    gate = rng.standard_normal(nh * hd).astype(np.float32)
    s = rng.random(nh * hd).astype(np.float32)
    z = y / (1 + np.exp(-(gate * s)))
    got = matvec_once(dev, [GpuMatrix(dev, w)], rec, pro=3, x2=gate[None],
                      va=s, hd=hd, splits=splits, int8=True)[0]
    assert _rel(got, _int8_product(w, z) / np.sqrt((z * z).sum() + 1e-6)) < 1e-5


def test_llama_int8_decode_stages_once(dev, tmp_path, monkeypatch):
    """Under int8 a Llama's decode products take their input from a pass of its own
    (the residual add and RMSNorm, SwiGLU and the split attention's merge staged once,
    `MatvecOp.staged`): logits within float rounding of the same model staging in every
    workgroup, the same greedy tokens; at "exact" those passes run no workgroup and the
    logits are the float32 model's."""
    from batch_models import llama_tensors, tokenizer_json
    from cortiq import cmf
    from cortiq.gpu import kernels
    from cortiq.gpu.llama import GpuLlamaModel
    from cortiq.models.llama import LlamaModel
    t, arch = llama_tensors(hidden=64, ffn=96, layers=2, heads=4, kv=2, hd=16, seed=11)
    t = {k: v for k, v in t.items() if "q_norm" not in k and "k_norm" not in k
         and ".bias" not in k}
    arch = {k: v for k, v in dict(arch, arch_name="llama", layer_types=None,
                                  sliding_window=None).items() if v is not None}
    path = tmp_path / "llama.cmf"
    cmf.write(path, t, arch=arch, quant="q8_row", tokenizer_json=tokenizer_json(),
              progress=False)
    f = cmf.open(str(path))
    prompt, feed = np.array([3, 17, 20, 5]), [9, 41, 2, 8, 13, 1]
    runs = {}
    for once in (False, True):
        monkeypatch.setattr(kernels, "STAGE_ONCE", once)
        g = GpuLlamaModel(LlamaModel(f), dev)
        g.set_precision("int8")
        st = g.new_state()
        g.forward(st, prompt, prompt=True)
        runs[once] = [g.forward(st, [i]) for i in feed]
        passes = [d for ds in g._static.values() for d in ds if d.name.startswith("qstage")]
        assert bool(passes) == once and all(0 not in d.dims for d in passes)
        assert g.fused_norms
    for a, b in zip(runs[False], runs[True]):
        assert _rel(b, a) < 1e-5
        assert np.argmax(a) == np.argmax(b)
    assert g.set_precision("exact") > 0
    assert all(d.dims == (0, 0, 0) for d in passes)
    g.rollback(st, prompt.size)
    exact = [g.forward(st, [i]) for i in feed]
    monkeypatch.setattr(kernels, "STAGE_ONCE", False)
    h = GpuLlamaModel(LlamaModel(f), dev)
    sh = h.new_state()
    h.forward(sh, prompt, prompt=True)
    for a, i in zip(exact, feed):
        assert _rel(a, h.forward(sh, [i])) < 1e-6
    f.close()


def _quantrows(dev, x_buf, x_stride: int, cols: int, t: int) -> np.ndarray:
    """What quantrows.wgsl writes for t rows of cols columns of x_buf (x_stride floats
    apart): a q8_row product's rows pass, run alone."""
    from cortiq.gpu.kernels import GpuMatrix, MatvecOp, ParamArena, rows_block_words
    arena = ParamArena(dev)
    op = MatvecOp(dev, [GpuMatrix(dev, _q8_row(np.random.default_rng(0), 32, cols))], arena,
                  x=x_buf, x_off=0, x_stride=x_stride, y=dev.buffer(t * 32 * 4), y_off=0,
                  y_stride=32, vbuf=dev.upload(np.zeros(4, np.float32)))
    arena.upload()
    n = t * rows_block_words(cols) * 16
    xq = dev.buffer(n, copy_src=True)
    step = dev.upload(np.array([t, 0, 0, 0], np.uint32), uniform=True)
    quant = op.dispatch_rows(step, xq)[0]
    assert quant.name == "quantrows"
    return run_read(dev, [quant], t, xq, n)


@pytest.mark.parametrize("cols", [1056, 8192 + 96])
def test_norm_and_swiglu_quantize_as_quantrows(dev, cols):
    """llama_norm_q and llama_swiglu_q (the int8 rows' passes before a product) write
    their float output as llama_norm / llama_swiglu do and its quantized rows as
    quantrows.wgsl would from those floats, bit for bit: rows of several rounds of 1024
    columns, the last one cut short."""
    from cortiq.gpu.kernels import Dispatch, ParamArena, resolve, rows_block_words, u32s
    from cortiq.gpu.llama import KERNELS, llama_pipeline
    rng = np.random.default_rng(cols)
    t, eps = 3, 1e-5
    x = rng.standard_normal((t, cols)).astype(np.float32)
    o = rng.standard_normal((t, cols)).astype(np.float32)
    w, bias = rng.standard_normal((2, cols)).astype(np.float32)
    x[1, :40] = 0.0                 # whole quantization groups of zeros
    o[1, :40] = 0.0
    x[2, 7] = 300.0                 # one group's scale set by one large value
    vb = np.concatenate([w, bias])
    n = t * rows_block_words(cols) * 16
    step = dev.upload(np.array([t, 0, 0, 0], np.uint32), uniform=True)
    arena = ParamArena(dev)
    # a workgroup a row, the residual in place; a workgroup a round, the residual from
    # the buffer's first region into its second
    p_row = arena.ref(u32s(cols, 0, 0, 1, 0, cols, 0, eps, 0, 0, 0, 0))
    p_round = arena.ref(u32s(cols, 0, 0, 1, 0, cols, 0, eps, t * cols, 0, 0, 0))
    arena.upload()
    r = x + o + bias
    want = r / np.sqrt((r.astype(np.float64) ** 2).mean(1, keepdims=True) + eps) * w
    got = {}
    for how, p, dims in (("row", p_row, (t, 1, 1)),
                         ("round", p_round, (t, (cols + 1023) // 1024, 1))):
        X = dev.upload(np.concatenate([x.ravel(), np.full(t * cols, np.nan, np.float32)]))
        Y = dev.buffer(t * cols * 4, copy_src=True)
        xq = dev.buffer(n, copy_src=True)
        norm = Dispatch(llama_pipeline(dev, "llama_norm_q"), dev.bind(
            KERNELS["llama_norm_q"], resolve([p, step, X, dev.upload(o.ravel()),
                                              dev.upload(vb), Y, xq])), dims, "llama_norm_q")
        got_q = run_read(dev, [norm], t, xq, n)
        got_y = run_read(dev, [], t, Y, t * cols * 4).view(np.float32).reshape(t, cols)
        assert _rel(got_y, want) < 1e-5
        xs = run_read(dev, [], t, X, 2 * t * cols * 4).view(np.float32).reshape(2, t, cols)
        if how == "row":
            np.testing.assert_array_equal(xs[0], r)
            assert np.isnan(xs[1]).all()
        else:       # the old residual left as it was for the row's other workgroups
            np.testing.assert_array_equal(xs[0], x)
            np.testing.assert_array_equal(xs[1], r)
        np.testing.assert_array_equal(got_q, _quantrows(dev, Y, cols, cols, t))
        got[how] = got_y, got_q
    # every workgroup of a row sums its squares in the one workgroup's order: the same bits
    np.testing.assert_array_equal(got["row"][0], got["round"][0])
    np.testing.assert_array_equal(got["row"][1], got["round"][1])

    gu = rng.standard_normal((t, 2 * cols)).astype(np.float32)
    gu[0, :64] = 0.0
    GU = dev.upload(gu.ravel())
    ps = arena.ref(u32s(cols, 0, 0xFFFFFFFF, 0))     # the gate's bias (w), none for up
    arena.upload()
    swiglu = Dispatch(llama_pipeline(dev, "llama_swiglu_q"), dev.bind(
        KERNELS["llama_swiglu_q"], resolve([ps, step, GU, dev.upload(vb), xq])),
        ((cols + 1023) // 1024, t, 1), "llama_swiglu_q")
    got_q = run_read(dev, [swiglu], t, xq, n)
    g = gu[:, :cols] + w
    want = g / (1 + np.exp(-g)) * gu[:, cols:]
    got = run_read(dev, [], t, GU, t * 2 * cols * 4).view(np.float32).reshape(t, 2 * cols)
    assert _rel(got[:, :cols], want) < 1e-5
    np.testing.assert_array_equal(got[:, cols:], gu[:, cols:])
    np.testing.assert_array_equal(got_q, _quantrows(dev, GU, 2 * cols, cols, t))


@pytest.mark.parametrize("hd,splits,quantize", [(20, 5, False), (64, 4, True)])
def test_attention_merge_over_rows(dev, hd, splits, quantize):
    """llama_attn_merge: each row's split-attention records (strided rows, the last range
    empty) merged into its attention row, as the O product's PRO 5 stage merges them;
    llama_attn_merge_q (heads of two quantization groups) the same, and the rows'
    nh * hd columns quantized as quantrows.wgsl would from the merged floats."""
    from cortiq.gpu.kernels import Dispatch, ParamArena, resolve, rows_block_words, u32s
    from cortiq.gpu.llama import KERNELS, llama_pipeline
    rng = np.random.default_rng(hd)
    nh, rows = 3, 5
    part_stride, att_stride = nh * splits * (hd + 4) + 12, nh * hd + 8
    part = np.zeros(rows * part_stride, np.float32)
    want = []
    for r in range(rows):
        rec, y = split_records(rng, nh, hd, splits)
        part[r * part_stride:r * part_stride + rec.size] = rec.ravel()
        want.append(y)
    att = dev.buffer(rows * att_stride * 4, copy_src=True)
    n = rows * rows_block_words(nh * hd) * 16
    xq = dev.buffer(n, copy_src=True)
    step = dev.upload(np.array([rows, 0, 0, 0], np.uint32), uniform=True)
    arena = ParamArena(dev)
    p = arena.ref(u32s(hd, splits, part_stride, att_stride))
    arena.upload()
    name = "llama_attn_merge_q" if quantize else "llama_attn_merge"
    res = [p, step, dev.upload(part), att] + ([xq] if quantize else [])
    d = Dispatch(llama_pipeline(dev, name), dev.bind(KERNELS[name], resolve(res)),
                 (nh, rows, 1), name)
    got_q = run_read(dev, [d], rows, xq, n)
    got = run_read(dev, [], rows, att, rows * att_stride * 4).view(np.float32).reshape(
        rows, att_stride)
    for r in range(rows):
        assert _rel(got[r, :nh * hd], want[r]) < 1e-5
    if quantize:
        np.testing.assert_array_equal(got_q, _quantrows(dev, att, att_stride, nh * hd, rows))
