"""Parity of cortiq's DeepSeek-V4 with transformers' DeepseekV4ForCausalLM.

cortiq decodes token by token (its only path); HF runs the full sequence at once
(logits row t predicts token t+1). Two tiny random configurations where every feature
fires within 40 tokens (see tests/reference/hf_dsv4.py): the sliding window slides,
ratio-4 layers run the overlapping compressor and the indexer with index_topk below the
number of entries, a plain-ratio layer, hash layers, YaRN, a biting swiglu clamp.

Tolerances:
* F32_TOL = 1e-4 on float32 weights: both sides compute in float32; the observed gap is
  a few 1e-6 (different summation orders), 1e-4 leaves room for top-k margins.
* Q8_TOL = 1e-3 on q8_row weights, against HF run on the dequantized weights (so the
  quantization error itself is not measured, only the arithmetic).
The indexer uses 16 heads so that no two compressed entries tie at an exact 0 score
(all heads relu'd away): cortiq breaks ties to the lower index as the reference engine
(cortiq-engine 0.8.64) specifies, torch.topk does not promise any order, and an exact tie
would pick different entries.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import optional

torch, transformers = optional.need("torch", "torch", "transformers")
optional.need_that("torch", hasattr(transformers, "DeepseekV4ForCausalLM"),
                   "transformers has no DeepseekV4ForCausalLM (needs >= 5.23)")
from reference import hf_dsv4 as H  # noqa: E402

import cortiq  # noqa: E402
import cortiq.cmf  # noqa: E402
import cortiq.convert  # noqa: E402
from cortiq.convert import hf_deepseek_v4 as C  # noqa: E402

F32_TOL = 1e-4
Q8_TOL = 1e-3
N_TOK = 40

CONFIGS = {
    "a": {},
    "b": dict(vocab_size=80, hidden_size=64, num_hidden_layers=6, num_attention_heads=8,
              head_dim=32, qk_rope_head_dim=16, q_lora_rank=32, o_groups=4, o_lora_rank=8,
              n_routed_experts=12, num_experts_per_tok=3, moe_intermediate_size=24,
              layer_types=["compressed_sparse_attention", "sliding_attention",
                           "heavily_compressed_attention", "compressed_sparse_attention",
                           "heavily_compressed_attention", "sliding_attention"],
              compress_rates={"compressed_sparse_attention": 4,
                              "heavily_compressed_attention": 6},
              mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 3, sliding_window=5,
              index_topk=2, index_head_dim=16, swiglu_limit=0.4, hc_mult=3,
              routed_scaling_factor=2.0),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, tmp_path_factory):
    cfg = H.tiny_config(**CONFIGS[request.param])
    model = H.build(cfg, seed=7 + ord(request.param))
    d = tmp_path_factory.mktemp(f"dsv4_{request.param}")
    H.save(model, d / "hf")
    ids = H.sequence(cfg.vocab_size, N_TOK, seed=3)
    return cfg, model, d, ids


def _cortiq_logits(path, ids):
    llm = cortiq.LLM(path)
    try:
        return llm.session().feed(ids, want="all").astype(np.float64)
    finally:
        llm.close()


def test_features_fire(case):
    cfg, model, _d, ids = case
    assert cfg.sliding_window < N_TOK
    rates = cfg.compress_rates
    assert "compressed_sparse_attention" in cfg.layer_types
    assert "heavily_compressed_attention" in cfg.layer_types
    assert rates["heavily_compressed_attention"] != 4
    assert cfg.index_topk < N_TOK // rates["compressed_sparse_attention"]
    assert "hash_moe" in cfg.mlp_layer_types and "moe" in cfg.mlp_layer_types
    # the clamp bites: some expert pre-activation leaves [-limit, limit]
    seen = []
    hooks = [layer.mlp.shared_experts.up_proj.register_forward_hook(
        lambda m, i, o: seen.append(float(o.abs().max()))) for layer in model.model.layers]
    H.full_logits(model, ids)
    for h in hooks:
        h.remove()
    assert max(seen) > cfg.swiglu_limit


def test_parity_f32(case):
    _cfg, model, d, ids = case
    out = d / "f32.cmf"
    cortiq.convert.from_hf(d / "hf", out, quant="f32", progress=False)
    got = _cortiq_logits(out, ids)
    ref = H.full_logits(model, ids)
    diff = np.abs(got - ref).max()
    print(f"parity f32: max |diff| {diff:.3g}")
    assert diff <= F32_TOL, f"max |logit diff| {diff:.3g}"
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_parity_q8_row(case, tmp_path):
    _cfg, model, d, ids = case
    out = d / "q8.cmf"
    cortiq.convert.from_hf(d / "hf", out, quant="q8_row", progress=False)
    # HF on the dequantized weights: rewrite the checkpoint with the values cortiq reads.
    from safetensors.torch import save_file
    from cortiq.convert._safetensors import open_checkpoint
    shards = open_checkpoint(d / "hf")
    f = cortiq.cmf.open(out)
    tensors = {}
    for name, sh in shards.items():
        c = C.cmf_name(name)
        if c is None:
            continue
        raw = C._load(sh, name)
        if name.endswith("tid2eid"):
            tensors[name] = torch.from_numpy(raw.astype(np.int64))
        else:
            tensors[name] = torch.from_numpy(np.ascontiguousarray(f.tensor(c), np.float32).reshape(raw.shape))
    f.close()
    qd = tmp_path / "hfq"
    qd.mkdir()
    save_file(tensors, str(qd / "model.safetensors"), metadata={"format": "pt"})
    (qd / "config.json").write_text((d / "hf" / "config.json").read_text())
    hq = transformers.DeepseekV4ForCausalLM.from_pretrained(qd, dtype=torch.float32).eval()
    if hasattr(hq, "set_experts_implementation"):   # transformers without it: eager already
        hq.set_experts_implementation("eager")
    ref = H.full_logits(hq, ids)
    got = _cortiq_logits(out, ids)
    diff = np.abs(got - ref).max()
    print(f"parity q8_row: max |diff| {diff:.3g}")
    assert diff <= Q8_TOL, f"max |logit diff| {diff:.3g}"
    assert (got.argmax(1) == ref.argmax(1)).all()
    # and quantization actually changed something
    assert np.abs(ref - H.full_logits(model, ids)).max() > 1e-5


def test_converter_header(case):
    cfg, _model, d, _ids = case
    arch = C.arch_from_hf_config(json.loads((d / "hf" / "config.json").read_text()))
    assert arch["arch_name"] == "deepseek_v4"
    assert arch["deepseek_v4"]["yarn"]["factor"] == 16.0
    assert arch["moe"]["num_experts"] == cfg.n_routed_experts
