"""cortiq.LLM end to end on a tiny converted Dory.

A tiny HF Dory checkpoint (tests/reference/hf_tiny.py) is converted with
cortiq.convert.from_hf; the file carries the tokenizer and the chat bundle the
converter wrote. Two engines:

* the float64 NumPy reference forward (tests/reference/dory_numpy.py) with its real
  sliding-window KV cache, wrapped in the model protocol -- checks that session reuse
  (rollback to the common prefix) gives what a fresh session gives on a real Dory
  cache, always runs;
* cortiq's own DoryModel via `cortiq.LLM(path)` once src/cortiq/models/dory/model.py exists:
  greedy tokens equal the reference's.
"""
import os
import sys

import numpy as np
import pytest

import cortiq
from cortiq.models.base import Capabilities, ModelBase

sys.path.insert(0, os.path.dirname(__file__))
from reference import hf_tiny
from reference.dory_numpy import DoryReference

CHAT = [{"role": "user", "content": "the quick brown fox"}]


class RefModel(ModelBase):
    arch = "dory"
    capabilities = Capabilities(rollback=True)

    def __init__(self, cf):
        self.ref = DoryReference.from_cmf_file(cf)
        self.vocab = int(cf.arch["vocab_size"])

    def new_state(self):
        return self.ref.new_cache()

    def forward_batch(self, states, ids_list, wants, prompts):
        return [self._run(st, ids, want) for st, ids, want in zip(states, ids_list, wants)]

    def _run(self, state, ids, want):
        out = self.ref.step(state, [int(i) for i in ids]).astype(np.float32)
        return None if want == "none" else (out[-1] if want == "last" else out)

    def can_rollback(self, state, n):
        return True

    def rollback(self, state, n):
        state.rollback(n)


@pytest.fixture(scope="module")
def dory_path(tmp_path_factory):
    from cortiq.convert import from_hf
    d = tmp_path_factory.mktemp("dory")
    hf_tiny.build(d / "hf", window=3, dtype="bf16")     # written by hand: no safetensors
    out = d / "tiny.cmf"
    from_hf(d / "hf", out, quant="f32", progress=False)
    return str(out)


@pytest.fixture(scope="module")
def ref_llm(dory_path):
    cf = cortiq.cmf.open(dory_path)
    llm = cortiq.LLM.from_model(RefModel(cf), tokenizer=cf.tokenizer_json(),
                                tokenizer_config=cf.tokenizer_config, name="tiny")
    yield llm
    cf.close()


def test_reference_dory_session_reuse_equals_fresh(ref_llm):
    kw = dict(max_tokens=6, temperature=0.9, seed=4)
    s = ref_llm.session()
    r1 = ref_llm.create_chat_completion(CHAT, session=s, **kw)
    turn2 = CHAT + [r1["choices"][0]["message"], {"role": "user", "content": "the lazy dog"}]
    reused = ref_llm.create_chat_completion(turn2, session=s, **kw)
    fresh = ref_llm.create_chat_completion(turn2, session=ref_llm.session(), **kw)
    assert reused["choices"] == fresh["choices"]
    # The window is 3 keys: the reused prefix is longer than it, and still exact.
    assert reused["usage"]["prompt_tokens_details"]["cached_tokens"] > 3


def test_cortiq_dory_matches_the_reference(dory_path, ref_llm):
    with cortiq.LLM(dory_path) as llm:
        assert llm.arch == "dory"
        kw = dict(max_tokens=8, temperature=0, repetition_penalty=1.0)
        got = llm.create_chat_completion(CHAT, **kw)
        want = ref_llm.create_chat_completion(CHAT, **kw)
        assert got["choices"][0]["message"] == want["choices"][0]["message"]
        s = llm.session()
        llm.generate("the quick brown fox", max_tokens=4, session=s, **{
            k: v for k, v in kw.items() if k != "max_tokens"})
        again = llm.create_completion("the quick brown dog", max_tokens=4, session=s,
                                      temperature=0, repetition_penalty=1.0)
        fresh = llm.create_completion("the quick brown dog", max_tokens=4,
                                      session=llm.session(), temperature=0,
                                      repetition_penalty=1.0)
        assert again["choices"] == fresh["choices"]


def test_cortiq_dory_loads_skill_replacements(dory_path, tmp_path):
    """A skill's lm_head replacement reaches DoryModel's QTensor loading (OverlayFile)."""
    rng = np.random.default_rng(0)
    with cortiq.cmf.open(dory_path) as cf:
        tensors = [(n, cf.tensor(n)) for n in cf.names()]
        head = dict(tensors)["lm_head.weight"]
        new_head = rng.standard_normal(head.shape).astype(np.float32) * head.std()
        p = tmp_path / "skills.cmf"
        cortiq.cmf.write(p, tensors + [("skill.sql.lm_head.weight", new_head)],
                         arch=cf.arch, quant="f32", tokenizer_json=cf.tokenizer_json(),
                         tokenizer_config=cf.tokenizer_config, skills=[{"id": "sql"}],
                         progress=False)
    with cortiq.LLM(p) as base, cortiq.LLM(p, skill="sql") as sql, \
            cortiq.LLM(p, skill={"sql": 0.5}) as half:
        np.testing.assert_array_equal(base.model.head_w.dequantize(), head)
        np.testing.assert_array_equal(sql.model.head_w.dequantize(), new_head)
        np.testing.assert_array_equal(half.model.head_w.dequantize(), np.float32(0.5) * new_head)
        ids = base.tokenize("the quick brown fox")
        assert not np.array_equal(base.session().feed(ids), sql.session().feed(ids))
    with pytest.raises(cortiq.ConfigError, match="task='coding'.*dory.*no MoE"):
        cortiq.LLM(p, task="coding")


def test_cortiq_dory_four_threads_equal_serial(dory_path):
    import threading
    prompts = ["the quick brown fox", "hello world", "the lazy dog", "sliding window"]
    with cortiq.LLM(dory_path) as llm:
        kw = dict(max_tokens=6, temperature=0.8)
        serial = [llm.generate(p, seed=i, **kw) for i, p in enumerate(prompts)]
        out = [None] * 4
        barrier = threading.Barrier(4)

        def work(i):
            barrier.wait(timeout=30)
            out[i] = llm.generate(prompts[i], seed=i, **kw)
        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert out == serial
