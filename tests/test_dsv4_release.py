"""DeepSeek-V4 checkpoints in DeepSeek's release layout (FP8 block-scaled weights, FP4
routed experts, reference names and config keys) -> CMF.

Part 1 needs no torch: the micro-float decoders on exact values and against ml_dtypes (which
encodes the release checkpoints of reference.dsv4_release), the converter on the
reference engine's toy written in the release layout, malformed checkpoints refused by name.
Part 2 builds the release layout from tiny random transformers models (the weights
quantized to FP8 blocks / FP4 rows here) and runs transformers on the dequantized
values as the reference.

Tolerances:
* F32_TOL = 1e-4: ``--quant f32`` stores the release values exactly, so only float32
  summation order differs from transformers (observed: a few 1e-6).
* ARITH_TOL = 1e-3: a requantized file against transformers run on the values that file
  stores: the arithmetic alone, as in test_dsv4_parity.
* Requantization itself (the values a q8 / q4 file stores against the release values),
  relative Frobenius error per expert plane: q8_row <= 1 %, q4tp <= 12 %, q2tp <= 55 %
  (E2M1 codes on a per-32 power-of-two scale are not on q4tp's per-tile f16 ladder).
  Its effect on the logits is printed, not bounded: in a tiny random model a 0.7 %
  weight change already flips router and indexer top-k choices (q8_row: max |diff| ~20 %
  of the logit range, ~80 % argmax agreement), which says nothing about the converter.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

import cortiq
from cortiq import cmf
from cortiq.convert import hf_deepseek_v4 as C
from cortiq.convert import microfloat as M
from cortiq.errors import ConfigError, CortiqError, FormatError

sys.path.insert(0, os.path.dirname(__file__))
from reference import dsv4_release as R
from reference.dsv4_toy import tokenizer_json, toy_tensors
from test_dsv4_convert import HF_CONFIG, IDS
import optional

F32_TOL = 1e-4
ARITH_TOL = 1e-3


# ------------------------------------------------------------------ decoders

def test_e4m3_table_by_hand():
    assert M.E4M3[0x00] == 0 and M.E4M3[0x38] == 1.0 and M.E4M3[0x7E] == 448.0
    assert M.E4M3[0x01] == 2.0 ** -9 and M.E4M3[0x08] == 2.0 ** -6      # subnormal, min normal
    assert M.E4M3[0xB8] == -1.0 and M.E4M3[0x3C] == 1.5
    assert np.isnan(M.E4M3[0x7F]) and np.isnan(M.E4M3[0xFF])
    assert np.isfinite(M.E4M3[:127]).all() and (np.diff(M.E4M3[:127]) > 0).all()


def test_e2m1_and_e8m0_by_hand():
    assert list(M.E2M1[:8]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert list(M.E2M1[8:]) == [-0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    # element 2i in the low nibble
    assert list(M.e2m1_unpack(np.array([[0x71, 0x9F]], np.uint8))[0]) == [0.5, 6, -6, -0.5]
    assert M.E8M0[127] == 1.0 and M.E8M0[0] == 2.0 ** -127 and M.E8M0[254] == 2.0 ** 127
    assert np.isnan(M.E8M0[255])


def test_decoders_match_torch():
    torch = optional.need("torch", "torch")
    c = torch.arange(256, dtype=torch.uint8)
    for dt, table in ((torch.float8_e4m3fn, M.E4M3), (torch.float8_e8m0fnu, M.E8M0)):
        ref = c.view(dt).float().numpy()
        np.testing.assert_array_equal(np.isnan(ref), np.isnan(table))
        np.testing.assert_array_equal(ref[~np.isnan(ref)], table[~np.isnan(table)])
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(50000) * np.exp(rng.uniform(-14, 7, 50000))).astype(np.float32)
    mid = (M.E4M3[:126] + M.E4M3[1:127]) / 2          # every tie
    x = np.concatenate([x, mid, -mid, [1e4, -1e4, 0.0, -0.0]]).astype(np.float32)
    ref = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(M.f32_to_e4m3(x), ref)


def test_micro_floats_match_ml_dtypes():
    """Every code of the three tables, and the encoders on random values and on every tie
    between neighbouring codes, against ml_dtypes (an independent transcription of the OCP
    formats); the block/group encoders against the reference's ml_dtypes ones, byte for byte."""
    md = optional.need("extras", "ml_dtypes")
    for dt, table in ((md.float8_e4m3fn, M.E4M3), (md.float8_e8m0fnu, M.E8M0)):
        ref = np.arange(256, dtype=np.uint8).view(dt).astype(np.float32)
        np.testing.assert_array_equal(ref, table)       # NaN where NaN, -0 equal to 0
        num = ~np.isnan(ref)                              # a NaN's sign is no matter
        np.testing.assert_array_equal(np.signbit(ref[num]), np.signbit(table[num]))
    e2m1 = np.arange(16, dtype=np.uint8).view(md.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(e2m1, M.E2M1)
    np.testing.assert_array_equal(np.signbit(e2m1), np.signbit(M.E2M1))
    rng = np.random.default_rng(3)
    for enc, dt, pos, top in ((M.f32_to_e4m3, md.float8_e4m3fn, M.E4M3[:127], 448.0),
                              (M.f32_to_e2m1, md.float4_e2m1fn, M.E2M1[:8], 6.0)):
        x = (rng.standard_normal(20000) * np.exp(rng.uniform(-14, 7, 20000))).astype(np.float32)
        mid = (pos[:-1] + pos[1:]) / 2
        x = np.concatenate([x, mid, -mid, pos, -pos]).astype(np.float32)
        x = x[np.abs(x) <= top]                          # ml_dtypes' e4m3fn overflows to NaN
        np.testing.assert_array_equal(enc(x), x.astype(dt).view(np.uint8))
    w = (rng.standard_normal((130, 200)) * np.exp(rng.uniform(-9, 6, (130, 1)))).astype(np.float32)
    w[:, 40:72] = 0                                       # an all-zero FP4 group
    for mine, ref in ((M.quant_fp8_blocks(w), R.fp8_blocks(w)),
                      (M.quant_fp4_groups(w), R.fp4_groups(w))):
        np.testing.assert_array_equal(mine[0], ref[0])
        np.testing.assert_array_equal(mine[1], ref[1])
    codes, sc, values = R.fp8_blocks(w)
    np.testing.assert_array_equal(M.dequant_fp8_blocks(codes, R.e8m0(sc)), values)
    packed, sc, values = R.fp4_groups(w)
    np.testing.assert_array_equal(M.dequant_fp4_groups(packed, R.e8m0(sc)), values)


@pytest.mark.parametrize("rows,cols,block", [(300, 200, 128), (128, 128, 128), (5, 7, 4),
                                             (129, 1, 128)])
def test_fp8_blocks_ragged(rows, cols, block):
    rng = np.random.default_rng(rows)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 3, (rows, 1))).astype(np.float32)
    codes, sc = M.quant_fp8_blocks(w, block)
    assert sc.shape == (-(-rows // block), -(-cols // block))
    got = M.dequant_fp8_blocks(codes, M.E8M0[sc], block)
    for r in range(0, rows, max(1, rows // 7)):          # element by element, by the definition
        for c in range(0, cols, max(1, cols // 5)):
            assert got[r, c] == M.E4M3[codes[r, c]] * 2.0 ** (int(sc[r // block, c // block]) - 127)
    assert np.abs(got - w).max() <= np.abs(w).max() * 2 ** -3   # E4M3: 3 mantissa bits
    assert np.abs(w / np.repeat(np.repeat(M.E8M0[sc], block, 0), block, 1)[:rows, :cols]).max() <= 448


@pytest.mark.parametrize("cols", [64, 40, 2])
def test_fp4_groups_round_trip(cols):
    rng = np.random.default_rng(cols)
    w = rng.standard_normal((9, cols)).astype(np.float32)
    packed, sc = M.quant_fp4_groups(w)
    assert packed.shape == (9, cols // 2) and sc.shape == (9, -(-cols // 32))
    got = M.dequant_fp4_groups(packed, M.E8M0[sc])
    codes = np.stack([packed & 0xF, packed >> 4], axis=2).reshape(9, cols)
    want = M.E2M1[codes] * M.E8M0[sc][:, np.arange(cols) // 32]
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(np.abs(got / M.E8M0[sc][:, np.arange(cols) // 32]))) <= set(M.E2M1[:8])


# ------------------------------------------------------------------ the toy, release layout

def write_release(d, t, hf_config, shards=1, mtp=True, edit=None):
    stored, values = R.release_tensors(t, mtp=mtp)
    if edit:
        edit(stored)
    d.mkdir(parents=True, exist_ok=True)
    R.save_raw(d / "model.safetensors", stored, shards=shards)
    (d / "config.json").write_text(json.dumps(hf_config))
    (d / "tokenizer.json").write_bytes(tokenizer_json())
    return d, values


def _logits(path, ids=IDS):
    llm = cortiq.LLM(path, precision="exact")  # the arithmetic reference: float32 activations
    try:
        return llm.session().feed(ids, want="all").astype(np.float64)
    finally:
        llm.close()


@pytest.fixture(scope="module")
def toy():
    t, _arch = toy_tensors()
    return t, R.reference_config(HF_CONFIG | {"partial_rotary_factor": 0.5})


@pytest.mark.parametrize("shards", [1, 3])
def test_toy_release_f32_is_exact(tmp_path, toy, shards, capsys):
    t, cfg = toy
    d, values = write_release(tmp_path / "rel", t, cfg, shards=shards)
    out = tmp_path / "m.cmf"
    cortiq.convert.from_hf(d, out, quant="f32", progress=True)
    err = capsys.readouterr().err
    assert "skipping 2 multi-token-prediction tensors" in err
    with cmf.open(out) as f:
        assert set(f.tensors) == set(values)
        for name, v in values.items():
            got = np.asarray(f.tensor(name), np.float32).reshape(v.shape)
            np.testing.assert_array_equal(got, v, err_msg=name)
        assert f.header["provenance"]["layout"] == "release"
    # the same values written directly: the same model
    fpath = tmp_path / "direct.cmf"
    cmf.write(fpath, values, arch=C.arch_from_hf_config(cfg), quant="f32",
              tokenizer_json=tokenizer_json(), progress=False)
    np.testing.assert_allclose(_logits(out), _logits(fpath), atol=1e-6)


def test_reference_keys_alone_make_the_same_arch():
    ref = R.reference_config(HF_CONFIG | {"partial_rotary_factor": 0.5})
    assert "layer_types" not in ref
    assert C.arch_from_hf_config(ref) == C.arch_from_hf_config(HF_CONFIG)
    # DeepSeek's inference ModelArgs spelling, no model_type at all
    args = {"vocab_size": 24, "dim": 32, "moe_inter_dim": 16, "n_layers": 2, "n_hash_layers": 1,
            "n_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1, "n_activated_experts": 2,
            "score_func": "sqrtsoftplus", "route_scale": 1.0, "swiglu_limit": 10.0,
            "q_lora_rank": 16, "head_dim": 8, "rope_head_dim": 4, "norm_eps": 1e-6,
            "o_groups": 2, "o_lora_rank": 16, "window_size": 6, "compress_ratios": [0, 4, 0],
            "compress_rope_theta": 160000.0, "original_seq_len": 65536, "rope_theta": 10000.0,
            "rope_factor": 16, "beta_fast": 32, "beta_slow": 1, "index_n_heads": 2,
            "index_head_dim": 16, "index_topk": 8, "hc_mult": 4, "hc_sinkhorn_iters": 20,
            "hc_eps": 1e-6}
    assert C.is_reference_config(args)
    a, b = C.arch_from_hf_config(args), C.arch_from_hf_config(HF_CONFIG)
    for k in ("max_position_embeddings",):
        a.pop(k), b.pop(k)
    assert a == b


def test_plain_compress_ratios_pass_through():
    cfg = R.reference_config(HF_CONFIG | {"partial_rotary_factor": 0.5})
    cfg["compress_ratios"] = [0, 16, 0]
    assert C.arch_from_hf_config(cfg)["deepseek_v4"]["compress_ratios"] == [0, 16]
    for bad in ([0], [0, -4], [0, 2.5]):
        with pytest.raises(ConfigError, match="compress_ratios"):
            C.arch_from_hf_config(dict(cfg, compress_ratios=bad))


def _retype(name, **patch):
    def edit(stored):
        dt, shape, raw = stored[name]
        stored[name] = (patch.get("dtype", dt), patch.get("shape", shape), patch.get("raw", raw))
    return edit


@pytest.mark.parametrize("edit,match", [
    # a scale of the wrong shape (one block too many, as if the block were 64)
    (_retype("layers.1.attn.compressor.wgate.scale", shape=(1, 2), raw=b"\x7f\x7f"),
     r"layers\.1\.attn\.compressor\.wgate\.scale: shape \[1, 2\].*want \[1, 1\]"),
    (_retype("layers.0.ffn.experts.3.w2.scale", shape=(32, 2), raw=b"\x7f" * 64),
     r"layers\.0\.ffn\.experts\.3\.w2\.scale: shape \[32, 2\].*want \[32, 1\]"),
    (_retype("layers.0.attn.wq_a.scale", dtype="I64"), r"layers\.0\.attn\.wq_a\.scale: scale dtype I64"),
    (_retype("layers.0.attn.wq_a.weight", dtype="F8_E5M2"), r"layers\.0\.attn\.wq_a\.weight: dtype F8_E5M2"),
    (_retype("layers.0.attn.wq_a.weight", dtype="Q9"), r"layers\.0\.attn\.wq_a\.weight: dtype Q9 with a scale"),
    (_retype("layers.0.attn.wq_a.weight", shape=(16, 31)), r"layers\.0\.attn\.wq_a\.weight: data offsets"),
    (lambda s: s.pop("layers.1.attn.wo_b.scale"), r"layers\.1\.attn\.wo_b\.weight: dtype F8_E4M3 without a \.scale"),
    (lambda s: s.pop("layers.0.ffn.experts.0.w1.scale"), r"layers\.0\.ffn\.experts\.0\.w1\.weight: dtype I8 without"),
])
def test_malformed_release_is_refused_by_name(tmp_path, toy, edit, match):
    t, cfg = toy
    d, _ = write_release(tmp_path / "rel", t, cfg, edit=edit)
    with pytest.raises(CortiqError, match=match):
        cortiq.convert.from_hf(d, tmp_path / "x.cmf", progress=False)
    assert not (tmp_path / "x.cmf").exists()


@pytest.mark.parametrize("code,what", [(0x7F, "E4M3 NaN"), (None, "E8M0 scale 0xFF")])
def test_nan_codes_are_refused_and_nothing_is_written(tmp_path, toy, code, what):
    t, cfg = toy

    def edit(stored):
        if code is None:
            stored["layers.1.attn.wkv.scale"] = ("F8_E8M0", (1, 1), b"\xff")
        else:
            dt, shape, raw = stored["layers.1.attn.wkv.weight"]
            stored["layers.1.attn.wkv.weight"] = (dt, shape, bytes([code]) + raw[1:])
    d, _ = write_release(tmp_path / "rel", t, cfg, edit=edit)
    out = tmp_path / "x.cmf"
    with pytest.raises(FormatError, match=f"layers.1.attn.wkv.*{what}"):
        cortiq.convert.from_hf(d, out, progress=False)
    assert not out.exists() and not list(tmp_path.glob("x.cmf*"))


def test_float_scales_and_weight_scale_inv(tmp_path, toy):
    """scale_dtype fp32 checkpoints (and the `weight_scale_inv` spelling) hold the
    multipliers themselves."""
    t, cfg = toy

    def edit(stored):
        _dt, shape, raw = stored.pop("layers.0.attn.wq_b.scale")
        f = R.e8m0(np.frombuffer(raw, np.uint8)).astype("<f4")
        stored["layers.0.attn.wq_b.weight_scale_inv"] = ("F32", shape, f.tobytes())
    d, values = write_release(tmp_path / "rel", t, cfg, edit=edit)
    out = tmp_path / "m.cmf"
    cortiq.convert.from_hf(d, out, quant="f32", progress=False)
    with cmf.open(out) as f:
        n = "model.layers.0.self_attn.wq_b.weight"
        np.testing.assert_array_equal(np.asarray(f.tensor(n)).reshape(values[n].shape), values[n])


def test_f4_dtype_weights(tmp_path, toy):
    """torch's float4_e2m1fn_x2 is saved as safetensors F4 with the logical shape."""
    t, cfg = toy

    def edit(stored):
        for n in [k for k in stored if k.endswith(".weight") and stored[k][0] == "I8"]:
            _dt, (r, pc), raw = stored[n]
            stored[n] = ("F4", (r, 2 * pc), raw)
    d, values = write_release(tmp_path / "rel", t, cfg, edit=edit)
    out = tmp_path / "m.cmf"
    cortiq.convert.from_hf(d, out, quant="f32", progress=False)
    stored = _stored_values(out)
    n = "model.layers.1.mlp.experts.6.down_proj.weight"
    np.testing.assert_array_equal(stored[n], values[n])


def test_payloads_are_checked_by_the_writer(tmp_path):
    from cortiq.cmf.writer import Payload
    from cortiq.convert.scaled_weights import exact_vbit5
    arch = toy_tensors()[1]
    packed, sc, values = R.fp4_groups(np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64))
    good = exact_vbit5(packed, R.e8m0(sc))
    bad = Payload(good.data[:-1], "vbit", good.shape)
    with pytest.raises(ValueError, match="'w'"):
        cmf.write(tmp_path / "a.cmf", [("w", bad)], arch=arch, progress=False)
    with pytest.raises(ValueError, match="q8_row payload is 3 bytes"):
        cmf.write(tmp_path / "b.cmf", [("w", Payload(b"abc", "q8_row", (4, 64)))], arch=arch,
                  progress=False)
    assert not list(tmp_path.iterdir())
    cmf.write(tmp_path / "c.cmf", [("w", good)], arch=arch, progress=False)
    with cmf.open(tmp_path / "c.cmf") as f:
        np.testing.assert_array_equal(np.asarray(f.tensor("w")).reshape(4, 64), values)
    with pytest.raises(ConfigError, match="no exact f16 half"):
        exact_vbit5(packed, np.full(sc.shape, 2.0 ** -30, np.float32), "w")


def test_experts_quant_option(tmp_path, toy):
    t, cfg = toy
    d, _ = write_release(tmp_path / "rel", t, cfg)
    from cortiq.serve.cli import main
    out = tmp_path / "o.cmf"
    assert main(["convert", str(d), str(out), "--quant", "q8_row",
                 "--experts-quant", "q4_block,q8_row", "--quiet"]) == 0
    with cmf.open(out) as f:
        dts = {n: i.dtype for n, i in f.tensors.items()}
    assert dts["model.layers.0.self_attn.wq_a.weight"] == "q8_row"
    assert dts["model.layers.1.mlp.experts.5.gate_proj.weight"] == "q4_block"
    assert dts["model.layers.1.mlp.experts.5.up_proj.weight"] == "q4_block"
    assert dts["model.layers.1.mlp.experts.5.down_proj.weight"] == "q8_row"
    assert dts["model.layers.1.mlp.shared_expert.gate_proj.weight"] == "q8_row"
    assert main(["convert", str(d), str(tmp_path / "p.cmf"), "--experts-quant", "q5",
                 "--quiet"]) == 1
    assert not (tmp_path / "p.cmf").exists()


# ------------------------------------------------------------------ against transformers

def _hf():
    torch, transformers = optional.need("torch", "torch", "transformers")
    optional.need_that("torch", hasattr(transformers, "DeepseekV4ForCausalLM"),
                       "transformers has no DeepseekV4ForCausalLM (needs >= 5.23)")
    return torch


#: hidden 160 and q_lora_rank 136: FP8 tiles ragged on both axes (128 + 32, 128 + 8);
#: expert widths multiples of 32 so q4tp / q2tp apply
RELEASE_CFG = dict(hidden_size=160, q_lora_rank=136, head_dim=32, qk_rope_head_dim=16,
                   moe_intermediate_size=32, o_lora_rank=16)
N_TOK = 40


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    torch = _hf()
    from reference import hf_dsv4 as H
    cfg = H.tiny_config(**RELEASE_CFG)
    model = H.build(cfg, seed=11)
    root = tmp_path_factory.mktemp("dsv4_release")
    H.save(model, root / "hf")
    # the CMF-named float32 tensors of that model, through the transformers-layout path
    _, _, items, shards, _ = C.plan(root / "hf")
    t = {name: np.asarray(load(), np.float32) for name, load, _ in items}
    for s in set(shards.values()):
        s.close()
    cfgd = json.loads((root / "hf" / "config.json").read_text())
    d, values = write_release(root / "rel", t, R.reference_config(cfgd), shards=2)
    H.tokenizer_files(d, cfg.vocab_size)
    ref_model = _with_values(model, values, torch)
    ids = H.sequence(cfg.vocab_size, N_TOK, seed=5)
    return d, values, ref_model, ids, H


def _with_values(model, values, torch):
    """A copy of `model` whose parameters hold `values` (CMF names)."""
    import copy
    m = copy.deepcopy(model)
    sd = m.state_dict()
    with torch.no_grad():
        for name, p in sd.items():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                li = name.split(".")[2]
                base = f"model.layers.{li}.mlp.experts"
                E = p.shape[0]
                if name.endswith("gate_up_proj"):
                    v = np.stack([np.concatenate([values[f"{base}.{e}.gate_proj.weight"],
                                                  values[f"{base}.{e}.up_proj.weight"]]) for e in range(E)])
                else:
                    v = np.stack([values[f"{base}.{e}.down_proj.weight"] for e in range(E)])
                p.copy_(torch.from_numpy(v))
                continue
            c = C.cmf_name(name)
            if c is None or c.endswith("tid2eid") or c not in values:
                continue
            p.copy_(torch.from_numpy(np.ascontiguousarray(values[c])).reshape(p.shape))
    return m


def _stored_values(path):
    with cmf.open(path) as f:
        return {n: np.asarray(f.tensor(n), np.float32).reshape(f.tensors[n].shape) for n in f.tensors}


def test_release_f32_matches_transformers_at_every_position(release, tmp_path):
    d, values, ref_model, ids, H = release
    out = tmp_path / "f32.cmf"
    cortiq.convert.from_hf(d, out, quant="f32", progress=False)
    stored = _stored_values(out)
    for n, v in values.items():
        np.testing.assert_array_equal(stored[n], v, err_msg=n)
    ref = H.full_logits(ref_model, ids)
    got = _logits(out, ids)
    diff = np.abs(got - ref).max(axis=1)
    print(f"release f32: max |diff| {diff.max():.3g}")
    assert (diff <= F32_TOL).all(), f"positions {np.nonzero(diff > F32_TOL)[0]}: {diff.max():.3g}"
    assert (got.argmax(1) == ref.argmax(1)).all()


def _plane_errors(stored, values):
    err = {}
    for n, v in values.items():
        if C._EXPERT.fullmatch(n):
            err[n] = float(np.linalg.norm(stored[n] - v) / np.linalg.norm(v))
    return err


@pytest.mark.parametrize("quant,experts,plane_tol", [
    ("q8_row", None, 0.01),
    ("q8_2f", "q4tp", 0.12),
    ("q8_row", "q2tp,q4tp", 0.55),
])
def test_requantized_release(release, tmp_path, quant, experts, plane_tol):
    torch = _hf()
    d, values, ref_model, ids, H = release
    out = tmp_path / "q.cmf"
    cortiq.convert.from_hf(d, out, quant=quant, experts_quant=experts, progress=False)
    stored = _stored_values(out)
    with cmf.open(out) as f:
        dts = {i.dtype for n, i in f.tensors.items() if C._EXPERT.fullmatch(n)}
    assert dts == set((experts or quant).split(","))
    # the arithmetic: transformers on exactly the values the file stores
    got = _logits(out, ids)
    arith = H.full_logits(_with_values(ref_model, stored, torch), ids)
    assert np.abs(got - arith).max() <= ARITH_TOL
    # what requantization costs, per expert plane and on the logits
    pe = _plane_errors(stored, values)
    ref = H.full_logits(ref_model, ids)
    rel = np.abs(got - ref).max() / (ref.max() - ref.min())
    agree = float((got.argmax(1) == ref.argmax(1)).mean())
    print(f"{quant}/{experts}: plane rel err median {np.median(list(pe.values())):.3g} "
          f"max {max(pe.values()):.3g}; logits max |diff| / range {rel:.3g}, argmax {agree:.0%}")
    assert max(pe.values()) <= plane_tol
    assert min(pe.values()) > 0          # requantization did change the experts


def test_exact_experts_store_the_release_values_bit_for_bit(release, tmp_path):
    """E2M1 x E8M0 maps losslessly onto vbit at 5 bits (u = 15 + 2 * code value, f16
    scale = E8M0 / 2): with ``--experts-quant exact`` the routed experts keep the
    release values exactly."""
    d, values, ref_model, ids, H = release
    out = tmp_path / "x.cmf"
    cortiq.convert.from_hf(d, out, quant="f32", experts_quant="exact", progress=False)
    with cmf.open(out) as f:
        assert {i.dtype for n, i in f.tensors.items() if C._EXPERT.fullmatch(n)} == {"vbit"}
    stored = _stored_values(out)
    for n, v in values.items():
        np.testing.assert_array_equal(stored[n], v, err_msg=n)
    ref = H.full_logits(ref_model, ids)
    assert np.abs(_logits(out, ids) - ref).max() <= F32_TOL


def test_exact_experts_need_fp4(tmp_path, toy):
    t, cfg = toy   # the toy's down_proj has 16 columns: vbit needs 32
    d, _ = write_release(tmp_path / "rel", t, cfg)
    with pytest.raises(ConfigError, match=r"mlp\.experts\.0\.down_proj\.weight.*multiple of 32"):
        cortiq.convert.from_hf(d, tmp_path / "x.cmf", experts_quant="q4tp,exact", progress=False)
    hf = tmp_path / "hf"
    from test_dsv4_convert import hf_checkpoint
    hf_checkpoint(hf, "ref")
    with pytest.raises(ConfigError, match="FP4"):
        cortiq.convert.from_hf(hf, tmp_path / "y.cmf", experts_quant="exact", progress=False)


def test_release_written_by_torch_safetensors(release, tmp_path):
    """The same checkpoint through safetensors.torch (float8_e4m3fn, float8_e8m0fnu, int8
    tensors): another writer's headers and offsets."""
    torch = _hf()
    from safetensors.torch import save_file
    d, values, _ref_model, _ids, _H = release
    from cortiq.convert._safetensors import open_checkpoint
    shards = open_checkpoint(d)
    tdt = {"F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.float8_e8m0fnu, "I8": torch.int8,
           "I32": torch.int32, "F32": torch.float32, "BF16": torch.bfloat16}
    tensors = {}
    for n, sh in shards.items():
        raw = np.array(sh.raw(n))
        tensors[n] = torch.from_numpy(raw.view(np.uint8).copy()).view(tdt[sh.dtype(n)]).reshape(raw.shape)
    for s in set(shards.values()):
        s.close()
    td = tmp_path / "torch"
    td.mkdir()
    save_file(tensors, str(td / "model.safetensors"), metadata={"format": "pt"})
    (td / "config.json").write_text((d / "config.json").read_text())
    out = tmp_path / "t.cmf"
    cortiq.convert.from_hf(td, out, quant="f32", progress=False)
    stored = _stored_values(out)
    for n, v in values.items():
        np.testing.assert_array_equal(stored[n], v, err_msg=n)


def test_a_weight_the_config_does_not_fit_is_refused(tmp_path, toy):
    t, cfg = toy
    t = dict(t)
    for e in range(8):   # every expert of layer 1 one row short: consistent with its scale
        n = f"model.layers.1.mlp.experts.{e}.up_proj.weight"
        t[n] = t[n][:-1]
    d, _ = write_release(tmp_path / "rel", t, cfg)
    with pytest.raises(ConfigError, match=r"layers\.1\.ffn\.experts\.\d\.w3\.weight: shape \[15, 32\], the config says \[16, 32\]"):
        cortiq.convert.from_hf(d, tmp_path / "x.cmf", progress=False)
