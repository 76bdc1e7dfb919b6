"""benchmarks/_bench_dsv4.py's release-layout path on a tiny geometry: the random model
written in DeepSeek's layout converts, its requantization is measured, and the exact
conversion decodes like the model written straight to CMF (the same weights after the
FP8/FP4 round trip are close to, not equal to, the float ones)."""
import argparse
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _bench_dsv4 as B

from cortiq import cmf
from cortiq.convert import hf_deepseek_v4 as C

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
    assert B.llama_cpp_available(str(tmp_path / "nowhere")).startswith("llama.cpp peer skipped")


def _llama_cpp_src():
    src = os.environ.get("LLAMA_CPP_SRC")
    if importlib.util.find_spec("llama_cpp") is None or not src:
        pytest.skip("the llama.cpp peer needs llama-cpp-python and $LLAMA_CPP_SRC")
    if B.llama_cpp_available(src):
        pytest.skip(B.llama_cpp_available(src))
    return src


def _expected_touched(rel, g):
    """Bytes per token of llama.cpp's conversion, from the release header alone: FP8 weights
    become Q8_0 (34 bytes per 32), FP4 experts MXFP4 (the same 17 bytes per 32 as packed
    codes + E8M0 scales), BF16 / F32 / I32 stay; one row of the embedding and of tid2eid,
    top_k / n_experts of each layer's routed experts, no hash-layer gate bias."""
    import json
    import struct
    with open(Path(rel) / "model.safetensors", "rb") as f:
        h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    h.pop("__metadata__")
    size = {"BF16": 2, "F32": 4, "I32": 4}
    total, experts = 0, {}
    for name, t in h.items():
        shape, dt = t["shape"], t["dtype"]
        n = int(np.prod(shape))
        if ".ffn.experts." in name:
            layer, proj = name.split(".")[1], name.split(".")[4]
            experts[layer, proj] = experts.get((layer, proj), 0) + n  # codes + scales, 1 B each
        elif dt == "F8_E8M0" or (name.endswith("gate.bias") and int(name.split(".")[1]) < 2):
            continue
        elif dt == "F8_E4M3":
            total += n // 32 * 34
        elif name == "embed.weight" or name.endswith("tid2eid"):
            total += shape[1] * size[dt]
        else:
            total += n * size[dt]
    return total + sum(b * g["top_k"] // g["experts"] for b in experts.values())


def test_llama_cpp_conversion_and_accounting(tmp_path):
    src = _llama_cpp_src()
    p = argparse.ArgumentParser()
    B.add_args(p)
    tiny = TINY[:]
    tiny[tiny.index("--vocab") + 1] = "512"  # room for the tokenizer llama.cpp's converter reads
    a = p.parse_args(tiny + ["--hca-ratio", "128"])
    g = B.geometry(a)
    assert g["ratios"] == [0, 4, 128, 4]
    rel = B.write_release(tmp_path / "rel", g)
    gg = str(tmp_path / "m.gguf")
    B.llama_cpp_convert(src, rel, gg)
    assert B.gguf_touched_bytes(gg, src, g["top_k"], g["experts"]) == _expected_touched(rel, g)

