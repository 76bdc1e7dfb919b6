"""The model protocol (`cortiq.models.base`) is all the runtime asks of a model.

Every built-in model satisfies `check_model`; a user model that lacks a member is
refused with a ConfigError naming it; a small numpy model written here, derived from
`ModelBase`, runs through `LLM.from_model` (generation, `feed_batch`, the scheduler)
behind a wrapper that refuses -- and records -- every attribute outside the protocol;
the scheduler and sessions follow what `capabilities` says (prompt pieces, rollback).
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

import cortiq
import cortiq.models
from cortiq.errors import ConfigError, CortiqError
from cortiq.models.base import Capabilities, ModelBase, check_model
from cortiq.runtime.session import Session

sys.path.insert(0, os.path.dirname(__file__))
import batch_models as BM
from reference.dsv4_toy import write_toy

PROTOCOL = {"arch", "vocab", "capabilities", "new_state", "forward_batch", "forward",
            "can_rollback", "rollback", "final_hidden", "set_precision", "fingerprint"}
HIDDEN = 16
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [20]]
ROLLBACK = Capabilities(rollback=True)


class RecurrentToy(ModelBase):
    """h_t = tanh(A h_{t-1} + E[id_t]); logits_t = W h_t. Its state is the list of the
    ids and hidden states, so rollback is exact at any position."""

    arch = "recurrent-toy"
    vocab = BM.VOCAB

    def __init__(self, capabilities: Capabilities = ROLLBACK, seed=0, delay=0.0):
        rng = np.random.default_rng(seed)
        self.E = rng.standard_normal((self.vocab, HIDDEN)).astype(np.float32)
        self.A = (rng.standard_normal((HIDDEN, HIDDEN)) / 4).astype(np.float32)
        self.W = rng.standard_normal((self.vocab, HIDDEN)).astype(np.float32)
        self.capabilities = capabilities
        self.calls: list[list[tuple[int, bool]]] = []   # per forward_batch: (rows, prompt)
        self.rollbacks = 0
        self.delay = delay                    # seconds a forward takes (lets requests meet)
        self._lock = threading.Lock()

    def new_state(self):
        return {"h": [np.zeros(HIDDEN, np.float32)]}

    def forward_batch(self, states, ids_list, wants, prompts):
        with self._lock:
            self.calls.append([(len(ids), bool(p)) for ids, p in zip(ids_list, prompts)])
        time.sleep(self.delay)
        return [self._run(st, ids, want) for st, ids, want in zip(states, ids_list, wants)]

    def _run(self, st, ids, want):
        rows = []
        for i in ids:
            st["h"].append(np.tanh(self.A @ st["h"][-1] + self.E[int(i)]).astype(np.float32))
            row = self.W @ st["h"][-1]
            row[:3] = -1e4                    # never the special tokens: no early stop
            rows.append(row)
        if want == "none":
            return None
        return rows[-1] if want == "last" else np.stack(rows)

    def can_rollback(self, st, n):
        return self.capabilities.rollback

    def rollback(self, st, n):
        if not self.capabilities.rollback:
            raise AssertionError("the session rolled back a model that cannot")
        self.rollbacks += 1
        del st["h"][n + 1:]

    def final_hidden(self, st, ids):
        self._run(st, ids, "none")
        return np.stack(st["h"][-len(ids):])


class ProtocolOnly:
    """`model` as the runtime may see it: the protocol's members, and nothing else (any
    other attribute raises AttributeError and is recorded in `probed`)."""

    def __init__(self, model):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "probed", set())

    def __getattribute__(self, name):
        if name in PROTOCOL:
            return getattr(object.__getattribute__(self, "_model"), name)
        if name in ("probed", "__class__"):
            return object.__getattribute__(self, name)
        object.__getattribute__(self, "probed").add(name)
        raise AttributeError(f"{name} is not part of the model protocol")


def reference_greedy(prompt, n):
    """n greedy tokens after `prompt`, straight from the toy (no runtime)."""
    m = RecurrentToy()
    st = m.new_state()
    row = m._run(st, prompt, "last")
    out = []
    for _ in range(n):
        out.append(int(np.argmax(row)))
        row = m._run(st, [out[-1]], "last")
    return out


def _llm(model, max_batch):
    return cortiq.LLM.from_model(model, tokenizer=BM.tokenizer_json(), max_batch=max_batch)


# ---- check_model ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("protocol")
    return {"llama": BM.write_llama(d / "llama.cmf"),
            "dory": BM.write_dory(str(d / "dory")),
            "deepseek_v4": str(write_toy(d / "dsv4.cmf"))}


@pytest.mark.parametrize("arch", ["llama", "dory", "deepseek_v4"])
def test_every_built_in_model_satisfies_the_protocol(files, arch):
    with cortiq.LLM(files[arch], max_batch=1) as llm:
        assert check_model(llm.model) is llm.model
        assert isinstance(llm.model, cortiq.models.base.Model)
        assert llm.model.set_precision("exact") > 0     # its matrices are the products'


def test_a_model_lacking_a_member_is_refused_naming_it():
    class NoRollback(ModelBase):
        arch = "partial"
        vocab = BM.VOCAB

        def new_state(self):
            return {}
    with pytest.raises(ConfigError, match="NoRollback .*lacks forward_batch"):
        _llm(NoRollback(), 1)

    class Bare:
        arch = "bare"
    with pytest.raises(ConfigError, match="lacks vocab, capabilities, new_state"):
        check_model(Bare())

    class WrongCaps(RecurrentToy):
        def __init__(self):
            self.capabilities = {"rollback": True}
    with pytest.raises(ConfigError, match="capabilities must be a"):
        check_model(WrongCaps())


def test_a_registered_class_is_checked_when_built(tmp_path):
    class Half:                                    # takes a file, misses the protocol
        arch = "toy"

        def __init__(self, cf):
            self.vocab = 8
    import toy_model as T
    T.write_toy(tmp_path / "toy.cmf")
    cortiq.models.register("toy", Half)
    try:
        with pytest.raises(ConfigError, match="Half is not a cortiq model: it lacks "
                                              "capabilities, new_state"):
            cortiq.LLM(str(tmp_path / "toy.cmf"))
    finally:
        T.register()


# ---- a user model through the runtime ------------------------------------------------
def test_user_model_generates_through_the_protocol_only():
    toy = RecurrentToy()
    strict = ProtocolOnly(toy)
    with _llm(strict, 1) as llm:
        for p in PROMPTS:
            got = llm.create_completion(p, max_tokens=6, temperature=0)
            assert got["usage"]["completion_tokens"] == 6
            assert llm.tokenize(got["choices"][0]["text"], add_special_tokens=False) == \
                reference_greedy(p, 6)
        # a chat turn that extends the last prompt reuses the session's prefix
        p = PROMPTS[1]
        first = llm.create_completion(p, max_tokens=3, temperature=0)
        ids = p + llm.tokenize(first["choices"][0]["text"], add_special_tokens=False)
        again = llm.create_completion(ids + [30], max_tokens=3, temperature=0)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert llm.tokenize(again["choices"][0]["text"], add_special_tokens=False) == \
            reference_greedy(ids + [30], 3)
        s1, s2 = llm.session(), llm.session()
        outs = llm.feed_batch([s1, s2], [PROMPTS[0], PROMPTS[1]], want="last", prompt=True)
        assert toy.calls[-1] == [(3, True), (5, True)]       # one call, prompts passed
        for s, p, out in zip((s1, s2), PROMPTS, outs):
            ref = Session(RecurrentToy())
            assert np.array_equal(out, ref.feed(p, want="last"))
        assert llm.embed([PROMPTS[0]]).shape == (1, HIDDEN)
        llm.precision = "exact"                             # no matrices: nothing to set
    assert strict.probed == set()


def test_user_model_runs_in_the_scheduler_through_the_protocol_only():
    toy = RecurrentToy(delay=0.01)
    strict = ProtocolOnly(toy)
    with _llm(strict, 4) as llm:
        out: dict = {}
        go = threading.Barrier(len(PROMPTS))

        def run(i):
            go.wait()
            out[i] = llm.generate(PROMPTS[i], max_tokens=8, temperature=0)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, p in enumerate(PROMPTS):
            assert llm.tokenize(out[i], add_special_tokens=False) == reference_greedy(p, 8)
    assert any(len(c) > 1 for c in toy.calls), "the requests never shared a forward"
    assert all(p == (n > 1 or p) for c in toy.calls for n, p in c)
    assert strict.probed == set()


def test_scheduler_cuts_prompts_by_the_capabilities():
    toy = RecurrentToy(Capabilities(rollback=True, batch_unit=1, prefill_cap=2))
    with _llm(toy, 4) as llm:
        assert llm.generate(PROMPTS[1], max_tokens=2, temperature=0)
    prompt_rows = [n for c in toy.calls for n, p in c if p]
    assert sum(prompt_rows) == len(PROMPTS[1]) and max(prompt_rows) == 2


def test_capabilities_max_seq_len_bounds_the_context():
    toy = RecurrentToy(Capabilities(rollback=True, max_seq_len=10))
    with _llm(toy, 1) as llm:
        assert llm.n_ctx == 10
        with pytest.raises(ConfigError, match="do not fit the context of 10"):
            llm.generate(list(range(5, 15)), max_tokens=2)


# ---- rollback follows capabilities.rollback ------------------------------------------
@pytest.mark.parametrize("rollback", [True, False])
def test_session_rolls_back_only_when_the_model_can(rollback):
    toy = RecurrentToy(Capabilities(rollback=rollback))
    s = Session(toy)
    s.prefill([5, 6, 7, 8, 9])
    rows_before = sum(n for c in toy.calls for n, _ in c)
    kept, logits = s.prefill([5, 6, 7, 40])
    rows = sum(n for c in toy.calls for n, _ in c) - rows_before
    assert s.ids == [5, 6, 7, 40]
    assert np.array_equal(logits, Session(RecurrentToy()).feed([5, 6, 7, 40]))
    if rollback:
        assert (kept, rows, toy.rollbacks) == (3, 1, 1)
    else:                                    # re-read from the start instead
        assert (kept, rows, toy.rollbacks) == (0, 4, 0)
        with pytest.raises(CortiqError, match="rollback is not supported"):
            s.rollback(2)
