"""benchmarks/_bench_dsv4.py's release-layout path on a tiny geometry: the random model
written in DeepSeek's layout converts, its requantization is measured, and the exact
conversion decodes like the model written straight to CMF (the same weights after the
FP8/FP4 round trip are close to, not equal to, the float ones)."""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _bench_dsv4 as B  # noqa: E402

from cortiq import cmf  # noqa: E402
from cortiq.convert import hf_deepseek_v4 as C  # noqa: E402

TINY = ["--dim", "64", "--layers", "4", "--heads", "2", "--head-dim", "32", "--rope", "16",
        "--q-lora", "32", "--o-groups", "2", "--o-lora", "16", "--experts", "4", "--top-k", "2",
        "--inter", "32", "--vocab", "64", "--window", "8", "--index-heads", "2",
        "--index-head-dim", "16", "--index-topk", "2"]


def test_release_bench_machinery(tmp_path):
    p = argparse.ArgumentParser()
    B.add_args(p)
    a = p.parse_args(TINY)
    g = B.geometry(a)
    rel = B.write_release(tmp_path / "rel", g)
    out = str(tmp_path / "q.cmf")
    C.convert(rel, out, quant="q8_row", experts_quant="q4tp", progress=False)
    with cmf.open(out) as f:
        assert f.tensors["model.layers.3.mlp.experts.1.up_proj.weight"].dtype == "q4tp"
        assert f.tensors["model.layers.3.self_attn.wq_a.weight"].dtype == "q8_row"
        assert f.header["provenance"]["source_dtypes"]["fp4_e2m1_group32"] == 4 * 4 * 3
    errs = B.requant_report(rel, out)
    assert errs and all(dt == "q4tp" and 0.01 < e < 0.15 for dt, e in errs.values())
    prompt = [3, 9, 27, 17, 51, 25, 11, 33, 35, 41]
    r, agree = B.logits_report(rel, out, prompt)
    assert 0 < r < 1 and 0 <= agree <= 1
    # the exact conversion against the float model: only the FP8/FP4 rounding differs
    exact = str(tmp_path / "x.cmf")
    C.convert(rel, exact, quant="f32", progress=False)
    direct = str(tmp_path / "d.cmf")
    B.write_model(direct, g, "f32")
    a_, b_ = B.prompt_logits(exact, prompt), B.prompt_logits(direct, prompt)
    assert np.abs(a_ - b_).max() < 0.5 * (b_.max() - b_.min())
    assert "llama.cpp peer" in B.llama_cpp_peer()[1]
