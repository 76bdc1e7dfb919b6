"""Embeddings on every architecture cortiq runs: `model.final_hidden` is the head's input
(the head applied to it gives the logits `forward` gives), matches transformers'
`last_hidden_state` on the Llama family, and `LLM.embed` pools and normalises it."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import cortiq
import optional

sys.path.insert(0, os.path.dirname(__file__))
from reference.dsv4_toy import write_toy as write_dsv4_toy


def _unit(v):
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v)


def test_deepseek_v4_hidden_is_the_heads_input(tmp_path):
    llm = cortiq.LLM(write_dsv4_toy(tmp_path / "dsv4.cmf"))
    try:
        ids = [3, 7, 1, 9, 4, 2, 8, 5, 6, 0]
        m = llm.model
        h = m.final_hidden(m.new_state(), ids)
        logits = m.forward(m.new_state(), ids, "all")
        assert h.shape == (len(ids), m.cfg.dim)
        for i in range(len(ids)):
            assert np.allclose(m.head.matvec(h[i]), logits[i], atol=1e-4)
        e = llm.embed([ids, ids[:4]], pooling="mean")
        assert np.allclose(e[0], _unit(h.mean(0)), atol=1e-5)
        assert np.allclose(llm.embed([ids], pooling="last")[0], _unit(h[-1]), atol=1e-5)
        assert np.array_equal(e, llm.embed([ids, ids[:4]]))          # deterministic
    finally:
        llm.close()


@pytest.mark.parametrize("case", ["qwen3", "llama_tied_bias", "mistral"])
def test_llama_family_matches_transformers(case, tmp_path):
    torch, _ = optional.need("torch", "torch", "transformers")
    from reference import hf_llama as H
    import cortiq.convert
    model = H.build(case, seed=3)
    H.save(model, tmp_path / "hf")
    out = tmp_path / "m.cmf"
    cortiq.convert.from_hf(tmp_path / "hf", out, quant="f32", progress=False)
    ids = H.sequence(model.config.vocab_size, 24, seed=2)
    with torch.no_grad():
        ref = model.model(torch.tensor([ids]), use_cache=False).last_hidden_state[0].double()
    ref = ref.numpy()
    with cortiq.LLM(str(out)) as llm:
        h = llm.model.final_hidden(llm.model.new_state(), ids)
        assert np.abs(h - ref).max() < 1e-4
        e = llm.embed([ids], pooling="mean")[0]
        assert np.allclose(e, _unit(ref.mean(0)), atol=1e-5)
        e = llm.embed([ids], pooling="last")[0]
        assert np.allclose(e, _unit(ref[-1]), atol=1e-5)
