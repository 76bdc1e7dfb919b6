"""GGUF files quantized by llama.cpp's own quantizer run exactly.

A random Llama-3, Qwen3 and Mistral (sliding window) is written as an F16 GGUF and
quantized to Q4_K_M by ``llama_cpp.llama_model_quantize``: the file then holds llama.cpp's
choice of types per tensor (Q4_K for most matrices, Q6_K for some v/down rows and the
output, Q5_0 / Q8_0 fallbacks where a row is not whole 256-value super-blocks), with
scales and codes from its search rather than from the ``gguf`` package. cortiq's exact
logits of that file equal transformers' float32 forward of the dequantized weights
(decoded by the ``gguf`` package) within 1e-4, for the prompt at once and one token at
a time. Needs llama-cpp-python (group ``llamacpp``).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import optional

gguf = optional.need("extras", "gguf")
torch, transformers = optional.need("torch", "torch", "transformers")
llama_cpp = optional.need("llamacpp", "llama_cpp")
from reference import gguf_llama as G  # noqa: E402
from reference import hf_llama as H  # noqa: E402
from reference.gguf_dequant import load_dequantized  # noqa: E402

import cortiq  # noqa: E402

T = gguf.GGMLQuantizationType
#: llama.h's enum llama_ftype
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15
#: rows of whole 256-value super-blocks for the K-quants; the Mistral case's attention
#: output rows (4 heads x 24 = 96 values) go to llama.cpp's fallback type
SIZES = dict(hidden_size=256, intermediate_size=512)


def _quantize(src, dst, ftype):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    assert rc == 0, f"llama_model_quantize returned {rc}"


@pytest.mark.parametrize("case", ["llama3", "qwen3", "mistral"])
def test_llama_cpp_q4_k_m_runs_exactly(tmp_path, case):
    model, _arch, _st, _tok, f16 = G.write_case(tmp_path, case, lambda n, a: T.F16, **SIZES)
    path = tmp_path / "m-q4_k_m.gguf"
    _quantize(f16, path, LLAMA_FTYPE_MOSTLY_Q4_K_M)
    kinds = load_dequantized(model, path)
    assert "Q4_K" in kinds.values() and "Q6_K" in kinds.values(), kinds
    ids = H.sequence(model.config.vocab_size, 24, seed=7)
    ref = H.full_logits(model, ids)
    with cortiq.LLM(path, precision="exact") as llm:
        got = llm.session().feed(ids, want="all")
        s = llm.session()
        step = np.stack([s.feed([i], want="last") for i in ids])
    scale = float(np.abs(ref).max())
    assert scale > 0.1                       # the check compares real logits, not zeros
    assert float(np.abs(got - ref).max()) <= 1e-4
    assert float(np.abs(step - ref).max()) <= 1e-4
