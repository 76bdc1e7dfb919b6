"""The reference engine's whole-stack test: a 2-layer toy (layer 0 hash-routed sliding, layer 1
overlapping compressor + indexer, score-routed) written as a CMF file, decoding ten
tokens with the cache bookkeeping the reference engine asserts. No torch needed."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import cortiq
from cortiq import cmf
from cortiq.errors import ConfigError, CortiqError

sys.path.insert(0, os.path.dirname(__file__))
from reference.dsv4_toy import write_toy


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory):
    return write_toy(tmp_path_factory.mktemp("dsv4toy") / "toy.cmf")


def test_toy_stack_decodes_ten_tokens(toy_path):
    llm = cortiq.LLM(toy_path)
    assert llm.arch == "deepseek_v4" and llm.vocab_size == 24
    model = llm.model
    st = model.new_state()
    first = None
    for step, tok in enumerate([3, 7, 1, 9, 4, 2, 8, 5, 6, 0]):
        lg = model.forward(st, [tok], "last")
        assert lg.shape == (24,) and np.isfinite(lg).all()
        assert lg.max() - lg.min() > 1e-6
        if step == 0:
            first = lg.copy()
        assert st.pos == step + 1
    assert st.window_len(0) > 0
    assert all(st.window_len(li) <= 6 for li in range(2))
    assert st.n_compressed(0) == 0
    assert st.n_compressed(1) == 2          # ten tokens at ratio 4 fold twice
    assert st.has_prev(1)
    assert st.n_index(1) == 2               # the indexer's own cache filled too
    fresh = model.new_state()
    again = model.forward(fresh, [3], "last")
    assert (again == first).all()
    llm.close()


def test_session_api_and_no_rollback(toy_path):
    llm = cortiq.LLM(toy_path)
    s = llm.session()
    all_rows = s.feed([3, 7, 1, 9], want="all")
    assert all_rows.shape == (4, 24)
    assert (s.logits() == all_rows[-1]).all()
    s2 = llm.session()
    for t in [3, 7, 1, 9]:
        s2.feed([t])
    np.testing.assert_array_equal(s2.logits(), all_rows[-1])
    assert llm.model.capabilities.rollback is False
    assert llm.model.can_rollback(s._state, 2) is False
    with pytest.raises(CortiqError, match="rollback"):
        s.rollback(2)
    with pytest.raises(CortiqError, match="rollback"):
        llm.model.rollback(s._state, 2)
    llm.close()


def test_forward_refuses_bad_feeds(toy_path):
    """A bad `want` or an id outside the vocabulary is a typed error before any token
    runs (the state does not move)."""
    llm = cortiq.LLM(toy_path)
    model = llm.model
    st = model.new_state()
    with pytest.raises(ConfigError, match="want"):
        model.forward(st, [3], "every")
    with pytest.raises(ValueError, match="token id 24 is outside the vocabulary"):
        model.forward(st, [3, 24], "last")
    assert st.pos == 0
    assert model.forward(st, [], "last").shape == (0,)      # the protocol's empty last row
    assert model.forward(st, [], "all").shape == (0, 24)
    assert model.forward(st, [3, 7], "none") is None and st.pos == 2
    llm.close()


def test_matrices_lists_every_product_matrix(toy_path):
    """`matrices()` names every matrix the model holds but the embedding (a row
    lookup, never a product), so `set_precision` reaches all of them."""
    from cortiq.models.deepseek_v4 import DeepseekV4Model
    from held_matrices import held_matrices
    cf = cmf.open(toy_path)
    model = DeepseekV4Model(cf)
    listed = {id(t.qmat) for t in model.matrices()}
    held = {id(m) for m in held_matrices(model)} - {id(model.embed.qmat)}
    assert listed == held and len(listed) == len(model.matrices())
    assert model.set_precision("int8") == len(listed)
    assert all(t.qmat.precision == "int8" for t in model.matrices())
    cf.close()


def test_task_mask_option(toy_path):
    E = 8
    mask = np.ones((2, E), bool)
    mask[1, :6] = False                      # layer 1 may only pick experts 6 and 7
    from cortiq.models.deepseek_v4 import DeepseekV4Model
    cf = cmf.open(toy_path)
    model = DeepseekV4Model(cf, task=mask)
    L1 = model.layers[1]
    assert L1.mask is not None and model.layers[0].mask is None  # hash layer untouched
    from cortiq.models import deepseek_v4 as D
    seen = []
    orig = D.route

    def spy(logits, bias=None, top_k=1, route_scale=1.0, forced=None, mask=None):
        idx, w = orig(logits, bias, top_k, route_scale, forced, mask)
        if mask is not None:
            seen.extend(int(i) for i in idx)
        return idx, w
    D.route = spy
    try:
        model.forward(model.new_state(), [1, 2, 3], "last")
    finally:
        D.route = orig
    assert seen and set(seen) <= {6, 7}
    with pytest.raises(ValueError, match="task"):
        DeepseekV4Model(cf, task=np.ones((3, E), bool))
    cf.close()


def test_generate_twice_through_the_llm(toy_path):
    """The runtime's prefix reuse must start over (no rollback) and stay deterministic."""
    llm = cortiq.LLM(toy_path, seed=0)
    a = llm.generate("w3 w4 w5", max_tokens=6, temperature=0)
    b = llm.generate("w3 w4 w5 w6", max_tokens=6, temperature=0)
    c = llm.generate("w3 w4 w5", max_tokens=6, temperature=0)
    assert isinstance(a, str) and a == c and isinstance(b, str)
    llm.close()
