"""Greedy decoding chained on a model's device (`cortiq.runtime.chained`), through the
runtime, on a NumPy model whose `greedy_chain` behaves as the GPU models' does: the
argmax over its whole (padded) vocabulary, one pass run ahead of the consumer where it
rolls back, a refusal of non-finite rows.

Every generation is compared with the same request on the same model without the
chain (the feed-and-sample loop): tokens, text, finish reason, and what the session
holds afterwards. The GPU models' own chains are tested in test_gpu*.py.
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

import cortiq
from cortiq.errors import ConfigError, CortiqError, ModelError
from cortiq.models.base import Capabilities
from cortiq.runtime import chained
from cortiq.runtime.generation import Generation, Result
from cortiq.runtime.sampling import SamplingParams

sys.path.insert(0, os.path.dirname(__file__))
import batch_models as BM
from test_model_protocol import RecurrentToy

TOKENIZER_VOCAB = 80          # the model's ids 80..95 are a padded tail the host never samples
GREEDY = dict(temperature=0, repetition_penalty=1.0)
PROMPT = [5, 6, 7, 8]


class ChainToy(RecurrentToy):
    """RecurrentToy with a device-like `greedy_chain`."""

    def __init__(self, rollback=True, seed=0, nan_at=None, delay=0.0):
        super().__init__(Capabilities(rollback=rollback, greedy_chain=True), seed=seed,
                         delay=delay)
        self.taken = 0              # tokens the chains yielded
        self.ahead_undone = 0       # passes run ahead and forgotten on close
        self.nan_at = nan_at        # a position whose row is made NaN

    def _run(self, st, ids, want):
        out = super()._run(st, ids, want)
        if self.nan_at is not None and len(st["h"]) - 2 >= self.nan_at and want != "none":
            out = np.full_like(out, np.nan)
        return out

    def greedy_chain(self, st, first, limit=None):
        def one(tok):
            row = self._run(st, [tok], "last")
            if not np.isfinite(row).all():
                raise ModelError("non-finite logits")
            return int(np.argmax(row))            # the whole vocabulary, as on a device
        ahead = self.capabilities.rollback
        nxt = one(int(first))
        pending = None
        try:
            while limit is None or self.taken < limit:
                tok = nxt
                if ahead:
                    pending = nxt = one(tok)      # the next pass, before this one is taken
                self.taken += 1
                yield tok
                if not ahead:
                    nxt = one(tok)
                pending = None
        finally:
            if pending is not None:
                self.ahead_undone += 1
                del st["h"][-1:]


def _pair(toy_kw=None, max_batch=1, vocab=TOKENIZER_VOCAB):
    toy = ChainToy(**(toy_kw or {}))
    plain = RecurrentToy(Capabilities(rollback=toy.capabilities.rollback),
                         seed=(toy_kw or {}).get("seed", 0))
    tok = BM.tokenizer_json(vocab)
    return (toy, cortiq.LLM.from_model(toy, tokenizer=tok, max_batch=max_batch),
            cortiq.LLM.from_model(plain, tokenizer=tok, max_batch=max_batch))


def _run(llm, session, **kw):
    res = llm.create_completion(PROMPT, session=session, **{**GREEDY, **kw})
    choice = res["choices"][0]
    return choice["text"], choice["finish_reason"], session.ids


@pytest.mark.parametrize("max_batch", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chain_gives_the_sampled_tokens(max_batch, seed):
    """The chain's tokens equal the feed-and-sample loop's, with tokens in the padded
    tail (which the host never picks) sampled on the host instead."""
    toy, llm, ref = _pair({"seed": seed}, max_batch)
    with llm, ref:
        got = _run(llm, llm.session(), max_tokens=40)
        want = _run(ref, ref.session(), max_tokens=40)
        assert got == want
        assert toy.taken > 0
        assert all(t < TOKENIZER_VOCAB for t in got[2])


def test_chain_met_the_padded_tail():
    """Some seed's argmax lands in the tail during the test above (else the fallback
    went untested); the rows there were sampled on the host."""
    hits = 0
    for seed in range(3):
        toy = ChainToy(seed=seed)
        st = toy.new_state()
        toy._run(st, PROMPT[:-1], "none")
        hits += sum(t >= TOKENIZER_VOCAB for t in toy.greedy_chain(st, PROMPT[-1], 40))
    assert hits > 0


@pytest.mark.parametrize("cut", [1, 5, 17])
def test_stop_string_mid_chain_leaves_the_loops_state(cut):
    """A stop string met part way through: same text and finish reason, and the session
    holds the same ids (the stopping token not fed), the pass run ahead forgotten."""
    toy, llm, ref = _pair()
    with llm, ref:
        full = ref.generate(PROMPT, max_tokens=30, **GREEDY)
        stop = full.split()[cut]
        got = _run(llm, llm.session(), max_tokens=30, stop=[stop])
        want = _run(ref, ref.session(), max_tokens=30, stop=[stop])
        assert got == want and got[1] == "stop"
        assert toy.ahead_undone > 0
        # the session goes on from there as the loop's would
        s1, s2 = llm.session(), ref.session()
        _run(llm, s1, max_tokens=30, stop=[stop])
        _run(ref, s2, max_tokens=30, stop=[stop])
        assert np.array_equal(s1.feed([9], want="last"), s2.feed([9], want="last"))


def test_without_rollback_the_chain_runs_nothing_ahead():
    """A model that cannot roll back chains one pass at a time (nothing to undo) and
    only where its vocabulary has no tail."""
    toy, llm, ref = _pair({"rollback": False}, vocab=BM.VOCAB)
    with llm, ref:
        full = ref.generate(PROMPT, max_tokens=20, **GREEDY)
        stop = full.split()[6]
        assert _run(llm, llm.session(), max_tokens=20, stop=[stop]) == \
            _run(ref, ref.session(), max_tokens=20, stop=[stop])
        assert toy.taken > 0 and toy.ahead_undone == 0
    toy, llm, _ = _pair({"rollback": False})           # tail, no rollback: no chain
    with llm:
        llm.create_completion(PROMPT, max_tokens=10, **GREEDY)
        assert toy.taken == 0


@pytest.mark.parametrize("kw", [dict(repetition_penalty=1.1), dict(logprobs=1),
                                dict(logit_bias={7: 1.0}), dict(temperature=0.5, seed=3),
                                dict(stopping_criteria=lambda ids, scores: False)])
def test_requests_that_read_the_logits_do_not_chain(kw):
    toy, llm, ref = _pair()
    with llm, ref:
        args = {**GREEDY, **kw}
        if "stopping_criteria" in args:
            got = llm.generate(PROMPT, max_tokens=12, **args)
            want = ref.generate(PROMPT, max_tokens=12, **args)
        else:
            got = llm.create_completion(PROMPT, max_tokens=12, **args)["choices"][0]["text"]
            want = ref.create_completion(PROMPT, max_tokens=12, **args)["choices"][0]["text"]
        assert got == want
        assert toy.taken == 0


def test_non_finite_logits_in_the_chain_are_refused():
    toy, llm, _ = _pair({"nan_at": len(PROMPT) + 6})
    with llm:
        s = llm.session()
        with pytest.raises(ModelError):
            llm.create_completion(PROMPT, max_tokens=20, session=s, **GREEDY)
        assert toy.taken > 0
        assert s.pos == 0           # emptied: its state no longer matched its ids


def test_closing_a_stream_mid_chain_frees_the_session():
    toy, llm, ref = _pair()
    with llm, ref:
        s = llm.session()
        stream = llm.create_completion(PROMPT, max_tokens=30, session=s, stream=True, **GREEDY)
        taken = [next(stream)["choices"][0]["text"] for _ in range(4)]
        stream.close()
        assert toy.taken >= 3
        r = ref.session()
        _run(ref, r, max_tokens=30)
        n = len(s.ids)
        assert s.ids == r.ids[:n] and len(PROMPT) < n < len(r.ids)
        # every token shown is held but the last, which was not fed
        assert [f"w{t}" for t in s.ids[len(PROMPT):]] == "".join(taken).split()[:-1]
        s.feed([9])                 # the chain let go of the session's lock


def test_a_request_arriving_ends_the_chain_and_both_batch():
    """Two requests, the second arriving while the first runs chained: each equals what
    it gives alone, and the scheduler went back to shared forwards."""
    toy, llm, ref = _pair({"delay": 0.002}, max_batch=4)
    with llm, ref:
        want = [ref.generate(p, max_tokens=40, **GREEDY) for p in (PROMPT, [20, 21])]
        out: dict = {}
        started = threading.Event()

        def first():
            pieces = []
            for piece in llm.generate(PROMPT, max_tokens=40, stream=True, **GREEDY):
                pieces.append(piece)
                started.set()
            out[0] = "".join(pieces)
        t = threading.Thread(target=first)
        t.start()
        started.wait(30)
        out[1] = llm.generate([20, 21], max_tokens=40, **GREEDY)
        t.join()
        assert [out[0], out[1]] == want
        assert toy.taken > 0
        assert any(len(c) > 1 for c in toy.calls), "the requests never shared a forward"


def test_session_and_generation_refuse_what_they_cannot_chain():
    plain = RecurrentToy()
    with cortiq.LLM.from_model(plain, tokenizer=BM.tokenizer_json()) as llm:
        s = llm.session()
        with pytest.raises(CortiqError, match="does not decode greedy"):
            next(s.greedy_chain(5))
        gen = Generation(llm.tokenizer, PROMPT, SamplingParams(temperature=0.7), 5, None,
                         Result())
        assert not gen.plain_argmax
        with pytest.raises(ConfigError, match="not plain argmax"):
            gen.take(5)
        gen = Generation(llm.tokenizer, PROMPT, SamplingParams.greedy(), 5, None, Result())
        assert gen.plain_argmax
        with pytest.raises(ValueError, match="outside the vocabulary"):
            gen.take(BM.VOCAB)
        assert not chained.can_chain(s, gen)        # no token chosen yet, no chain
