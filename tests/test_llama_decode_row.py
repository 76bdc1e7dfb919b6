"""The fused decode rows of the Llama family (`llama_attn_row`, `llama_mlp_row`, taken by
`LlamaModel._decode_row` for one generated token of one sequence) against the general
path (`LlamaModel._stack`, one kernel call per operation): the same logits and the same
KV cache bit for bit, over biases, q/k norms, a sliding layer whose cache is trimmed,
both rotary layouts, dtypes, precisions and kernel tables; and bad arguments refused
with a clear error."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import cortiq
from cortiq.kernels import _kernels as K
from cortiq.models import llama as L

sys.path.insert(0, os.path.dirname(__file__))
import batch_models as BM


def _write(path, quant, interleaved):
    t, arch = BM.llama_tensors(seed=3)
    arch["rope_interleaved"] = interleaved
    cortiq.cmf.write(path, t, arch=arch, quant=quant, tokenizer_json=BM.tokenizer_json(),
                     progress=False)
    return str(path)


def _run(model, general: bool, prompt, steps: int):
    """Logits of `prompt` then of `steps` greedy tokens, and the caches at the end."""
    st = model.new_state()
    out = [model.forward(st, prompt, "last", prompt=True)]
    tok = int(np.argmax(out[-1]))
    for _ in range(steps):
        if general:                       # the general path for the same row
            h = model._stack([st], [np.array([tok])], [False])
            row = K.rmsnorm(h, model.norm, model.cfg.eps)
            out.append(model.head.matvec_batch(row)[0])
        else:
            out.append(model.forward(st, [tok], "last", prompt=False))
        tok = int(np.argmax(out[-1]))
    caches = [(c.k[:c.n].copy(), c.v[:c.n].copy(), c.first) for c in st.caches]
    return out, caches


@pytest.mark.parametrize("quant,precision", [("f32", "exact"), ("q8_row", "exact"),
                                             ("q8_row", "int8")])
@pytest.mark.parametrize("interleaved", [False, True])
def test_fused_decode_row_is_the_general_path(tmp_path, isa, quant, precision, interleaved):
    path = _write(tmp_path / "m.cmf", quant, interleaved)
    with cortiq.cmf.open(path) as f:
        m = L.LlamaModel(f)
        for t in m.matrices():
            t.precision = precision
        # the window of the sliding layer is 7: 20 steps trim its cache twice
        prompt = [5, 9, 17, 33, 2, 60, 41, 7, 11]
        fused, fc = _run(m, False, prompt, 20)
        general, gc = _run(m, True, prompt, 20)
    for i, (a, b) in enumerate(zip(fused, general)):
        assert np.array_equal(a, b), f"step {i}: max diff {np.abs(a - b).max()}"
    assert any(first > 0 for _, _, first in fc)       # a trim happened
    for (k1, v1, f1), (k2, v2, f2) in zip(fc, gc):
        assert f1 == f2 and np.array_equal(k1, k2) and np.array_equal(v1, v2)


def test_fused_decode_row_refuses_bad_arguments(tmp_path):
    path = _write(tmp_path / "m.cmf", "f32", False)
    with cortiq.cmf.open(path) as f:
        m = L.LlamaModel(f)
        st = m.new_state()
        m.forward(st, [5, 9, 17], "last", prompt=True)
        Lr, fused, cache = m.layers[0], m._fused[0], st.caches[0]
        qkv, wo, biases, gate_up, wdown, mlp_biases = fused
        h = np.ones(m.cfg.hidden, np.float32)
        cos, sin = m.rope(st.pos, 1)
        scratch = np.empty(m._row_scratch, np.float32)
        row = cache.free_row()

        def attn(**over):
            a = dict(qkv=qkv, wo=wo, h=h, w_norm=Lr.attn_norm, biases=biases,
                     q_norm=Lr.q_norm, k_norm=Lr.k_norm, cos=cos[0], sin=sin[0],
                     interleaved=False, keys=cache.k, vals=cache.v, row=row,
                     first=cache.first, pos=st.pos, window=Lr.window,
                     scale=m.attn_scale, scratch=scratch, eps=m.cfg.eps)
            a.update(over)
            return K.llama_attn_row(*a.values())
        with pytest.raises(ValueError, match="not cache row"):
            attn(row=row + 1)
        with pytest.raises(ValueError, match="4 biases"):
            attn(biases=biases[:3])
        with pytest.raises(ValueError, match="scratch must hold at least"):
            attn(scratch=scratch[:10])
        with pytest.raises(ValueError, match="must not overlap"):
            attn(scratch=cache.k.reshape(-1))
        with pytest.raises(TypeError, match="h must be a float32"):
            attn(h=h.astype(np.float64))
        with pytest.raises(ValueError, match="3 matrices expected"):
            attn(qkv=qkv[:2])
        with pytest.raises(ValueError, match="3 biases"):
            K.llama_mlp_row(gate_up, wdown, h, Lr.mlp_norm, mlp_biases[:2], m._ones,
                            scratch, m.cfg.eps)
        with pytest.raises(ValueError, match="ones must hold"):
            K.llama_mlp_row(gate_up, wdown, h, Lr.mlp_norm, mlp_biases, m._ones[:5],
                            scratch, m.cfg.eps)
        assert np.array_equal(h, np.ones(m.cfg.hidden, np.float32))   # nothing ran
