"""Batched forwards and the continuous-batching scheduler.

`feed_batch` must give what one-at-a-time feeds give: the same greedy tokens and
logits within REL of each sequence run alone (the batch's rows go through the
matrix-matrix kernels, a lone decode row through the matrix-vector ones: the same
weights in another summation order), for every architecture, dtype and option that
changes the forward. One sequence alone in a batch takes the unbatched path exactly.
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

import cortiq
from cortiq.runtime.batch import feed_batch
from cortiq.errors import ConfigError, CortiqError, ModelError
from cortiq.models.base import ModelBase
from cortiq.runtime.session import Session

sys.path.insert(0, os.path.dirname(__file__))
import batch_models as BM
import optional
from reference.dsv4_toy import write_toy

REL = 1e-5
LENS = [1, 5, 70, 130, 3, 40, 2, 9, 66]       # B = 9; the 70/130/66 cross a chunk


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch")
    out = {}
    for q in ("f32", "q8_row"):
        out["llama", q] = BM.write_llama(d / f"llama_{q}.cmf", q)
        out["dory", q] = BM.write_dory(str(d / "dory"), q)
        out["dsv4", q] = str(write_toy(d / f"dsv4_{q}.cmf", quant=q))
    return out


def _model(files, arch, quant, **opts):
    cf = cortiq.cmf.open(files[arch, quant])
    from cortiq.models import model_class
    return model_class(cf.arch["arch_name"])(cf, **opts)


def _check_model(m, lens, n_dec=5, want="last", seed=1):
    """Prompts of `lens` and n_dec decode steps: batched vs one at a time."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, m.vocab, n).tolist() for n in lens]
    dec = [rng.integers(3, m.vocab, n_dec).tolist() for _ in lens]
    ref = []
    for p, d in zip(prompts, dec):
        s = Session(m)
        ref.append((s.feed(p, want), [s.feed([t], "last") for t in d], s))
    ss = [Session(m) for _ in lens]
    first = feed_batch(ss, prompts, want)
    steps = [feed_batch(ss, [[d[k]] for d in dec], "last") for k in range(n_dec)]
    for i, (a, b, s) in enumerate(ref):
        assert first[i].shape == a.shape
        assert rel(first[i], a) < REL, (i, rel(first[i], a))
        for k in range(n_dec):
            assert rel(steps[k][i], b[k]) < REL, (i, k)
            assert int(np.argmax(steps[k][i])) == int(np.argmax(b[k]))
        assert ss[i].ids == s.ids
    return ss, ref


@pytest.mark.parametrize("quant", ["f32", "q8_row"])
@pytest.mark.parametrize("arch", ["llama", "dory", "dsv4"])
def test_feed_batch_equals_one_at_a_time(files, arch, quant):
    m = _model(files, arch, quant)
    lens = LENS if arch != "dsv4" else [1, 5, 20, 13, 3, 9, 2, 17, 6]
    _check_model(m, lens, want="last")
    _check_model(m, lens[:4], want="all", n_dec=2, seed=2)


@pytest.mark.parametrize("arch", ["llama", "dory", "dsv4"])
@pytest.mark.parametrize("b", [1, 2, 4])
def test_batch_sizes(files, arch, b):
    _check_model(_model(files, arch, "q8_row"), [3, 1, 8, 2][:b], n_dec=3, seed=b)


@pytest.mark.parametrize("opts", [
    {"kv_mode": "last_loop"}, {"kv_mode": "last_loop", "prompt_loops": 1},
    {"loops": 3, "full_window": 5}, {"kv_mode": "last_loop", "gate": "conf:0.2"},
    {"o1": "4,2,1,24"}], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_dory_options(files, opts):
    m = _model(files, "dory", "f32", **opts)
    ss, ref = _check_model(m, [1, 5, 70, 3, 40, 2], n_dec=6)
    if m.gate is not None:   # rows that stay and rows that exit share the steps
        got = [(s._state.gate_tokens, s._state.gate_one) for s in ss]
        assert got == [(r[2]._state.gate_tokens, r[2]._state.gate_one) for r in ref]
        assert any(0 < one < n for n, one in got)


@pytest.mark.parametrize("kv_mode", ["per_loop", "last_loop"])
def test_dory_gate_mixes_exits_and_second_passes(files, kv_mode):
    """The conf gate fires on some generated rows and not others (a prompt's one-row
    last chunk runs every pass); under per_loop a later second pass reads an exited
    row's first-pass keys."""
    m = _model(files, "dory", "f32", kv_mode=kv_mode, gate="conf:0.2")
    ss, ref = _check_model(m, [65, 1, 129, 4, 2], n_dec=8, seed=4)
    got = [(s._state.gate_tokens, s._state.gate_one) for s in ss]
    assert got == [(r[2]._state.gate_tokens, r[2]._state.gate_one) for r in ref]
    assert sum(one for _, one in got) > 0
    assert any(one < n for n, one in got)


def test_int8_rows_equal_unbatched(files):
    m = _model(files, "llama", "q8_row")
    m.set_precision("int8")
    assert m.layers[0].qkv.mats[0].int8
    _check_model(m, [4, 1, 70], n_dec=3)


def test_single_sequence_is_the_unbatched_path(files):
    m = _model(files, "dory", "q8_row")
    a, b = Session(m), Session(m)
    x = a.feed([5, 6, 7], "last")
    y = feed_batch([b], [[5, 6, 7]])[0]
    assert np.array_equal(x, y)
    assert np.array_equal(a.feed([9]), feed_batch([b], [[9]])[0])


def test_sessions_work_alone_after_a_batch(files):
    m = _model(files, "llama", "f32")
    ss = [Session(m) for _ in range(3)]
    feed_batch(ss, [[4, 5, 6, 7], [8, 9], [10]], "none")
    feed_batch(ss, [[11], [12], [13]])
    ref = Session(m)
    ref.feed([4, 5, 6, 7, 11])
    ss[0].rollback(3)
    ref.rollback(3)
    assert rel(ss[0].feed([20]), ref.feed([20])) < REL
    assert ss[1].ids == [8, 9, 12]


def test_feed_batch_refuses_bad_input(files):
    llm = cortiq.LLM(files["llama", "f32"], max_batch=1)
    other = cortiq.LLM(files["llama", "q8_row"], max_batch=1)
    s, t = llm.session(), llm.session()
    with pytest.raises(ConfigError, match="twice"):
        llm.feed_batch([s, s], [[1], [2]])
    with pytest.raises(ConfigError, match="id lists"):
        llm.feed_batch([s, t], [[1]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.feed_batch([s, t], [[1], [BM.VOCAB]])
    with pytest.raises(ConfigError, match="another model"):
        llm.feed_batch([s, other.session()], [[1], [2]])
    with pytest.raises(ConfigError, match="want"):
        llm.feed_batch([s], [[1]], want="first")
    with pytest.raises(TypeError):
        llm.feed_batch([object()], [[1]])
    assert s.pos == 0 and t.pos == 0                 # nothing ran
    with pytest.raises(ConfigError, match="max_batch"):
        cortiq.LLM(files["llama", "f32"], max_batch=0)
    assert llm._scheduler is None
    llm.close()
    other.close()


# ---- the scheduler ---------------------------------------------------------------

def _concurrent(llm, jobs, stagger=0.0):
    out = [None] * len(jobs)
    errs = [None] * len(jobs)

    def run(i):
        time.sleep(stagger * i)
        try:
            out[i] = jobs[i](llm)
        except Exception as e:  # noqa: BLE001
            errs[i] = e
    th = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return out, errs


@pytest.mark.parametrize("precision", ["exact", "int8", "auto"])
@pytest.mark.parametrize("arch", ["llama", "dory", "dsv4"])
def test_scheduler_equals_serial(files, arch, precision):
    # every precision gives a row the arithmetic of its kind (prompt or generated)
    # however the prompt is cut, so which session a request meets does not matter
    rng = np.random.default_rng(7)
    vocab = BM.VOCAB if arch != "dsv4" else 24
    prompts = [rng.integers(3, vocab, n).tolist() for n in [3, 90, 10, 150, 5, 1, 40, 8, 20]]
    if arch == "dsv4":
        prompts = [p[:12] for p in prompts]

    def job(i, temp):
        return lambda llm: llm.generate(prompts[i], max_tokens=10, temperature=temp, seed=i)
    jobs = [job(i, 0.0) for i in range(len(prompts))] + \
        [job(i, 0.9) for i in range(len(prompts))]
    serial = cortiq.LLM(files[arch, "q8_row"], max_batch=1, precision=precision)
    want = [j(serial) for j in jobs]
    llm = cortiq.LLM(files[arch, "q8_row"], max_batch=8, precision=precision)
    got, errs = _concurrent(llm, jobs, stagger=0.003)
    assert errs == [None] * len(jobs)
    assert got == want
    sch = llm._scheduler
    assert sch.steps < sch.rows                     # steps carried several rows
    serial.close()
    llm.close()


@pytest.mark.parametrize("arch", ["llama", "dory", "dsv4"])
def test_auto_prompt_rows_do_not_depend_on_the_cut(files, arch):
    """precision "auto", q8_row: a prompt fed whole, as (n-1)+1, through a cached
    prefix and its last id, in a batch beside other sequences, and through the
    scheduler meeting a session that holds its prefix: the same last row (its last
    id is a prompt row every time, int8 products); a generated token's row keeps the
    exact products of precision "exact"."""
    vocab = BM.VOCAB if arch != "dsv4" else 24
    rng = np.random.default_rng(11)
    p = rng.integers(3, vocab, 12).tolist()
    other = rng.integers(3, vocab, 7).tolist()
    llm = cortiq.LLM(files[arch, "q8_row"], precision="auto", max_batch=8)
    m = llm.model
    qmat = m.head_w if arch == "dory" else m.head
    assert qmat.int8_prompt and not qmat.int8        # q8: int8 for prompt rows only
    whole = Session(m).prefill(p)[1]

    s = Session(m)
    s.feed(p[:-1], "none", prompt=True)
    split = s.feed(p[-1:], "last", prompt=True)
    # a saved state re-reads its pieces as what they were (the one-id prompt piece too)
    assert np.array_equal(Session.load_state(m, s.save_state()).logits(), split)

    s = Session(m)
    s.prefill(p[:-1] + [p[-1] % (vocab - 3) + 3])
    kept, cached = s.prefill(p)
    assert kept == (len(p) - 1 if m.capabilities.rollback else 0)

    a, b = Session(m), Session(m)
    feed_batch([a, b], [p[:-1], other], "none", prompt=True)
    b_ref = Session(m)
    b_ref.feed(other, "none", prompt=True)
    tok = int(rng.integers(3, vocab))
    batched, b_dec = feed_batch([a, b], [p[-1:], [tok]], "last", prompt=[True, False])
    for got in (split, cached, batched):
        assert rel(got, whole) < REL
    assert rel(b_dec, b_ref.feed([tok], "last", prompt=False)) < REL

    # the scheduler: one request meets a session holding all but its last id, the
    # others run beside it; the first row its sampler sees is the cold prompt's
    seen = []

    def first_row(ids, scores):
        if not seen:
            seen.append(scores.copy())
        return scores
    held = llm.session()
    held.prefill(p[:-1] + [p[-1] % (vocab - 3) + 3])
    jobs = [lambda lm: lm.generate(p, max_tokens=2, temperature=0, session=held,
                                   logits_processor=first_row)]
    jobs += [lambda lm, i=i: lm.generate(other[:i + 2], max_tokens=4, temperature=0)
             for i in range(3)]
    _, errs = _concurrent(llm, jobs)
    assert errs == [None] * len(jobs)
    assert rel(seen[0], whole) < REL

    # generated tokens: exact products, as under precision "exact"
    exact = cortiq.LLM(files[arch, "q8_row"], precision="exact", max_batch=1)
    assert np.array_equal(Session(m).feed([tok], prompt=False),
                          Session(exact.model).feed([tok], prompt=False))
    if arch != "dsv4":   # a prompt row does take other products (DeepSeek-V4: decode's),
        ex = Session(exact.model).prefill(p)[1]     # where the CPU has int8 ones
        assert (rel(whole, ex) > 10 * REL) == optional.int8_prompt_products()
    llm.close()
    exact.close()


def test_version_1_states_load_with_the_length_rule(files):
    """States saved before feeds carried the prompt flag: several ids are prompt rows,
    one a generated token (what such a feed was)."""
    import hashlib
    import json

    from cortiq.runtime import state as S
    m = _model(files, "llama", "q8_row")
    s = Session(m)
    s.feed([5, 6, 7], "none")
    s.feed([8], "last")
    payload = json.dumps({"ids": [5, 6, 7, 8], "feeds": [[3, "none"], [1, "last"]]}).encode()
    body = S._HEAD.pack(S.MAGIC, 1, S.model_identity(m), len(payload)) + payload
    t = Session.load_state(m, body + hashlib.sha256(body).digest())
    assert t._feeds == s._feeds == [(3, "none", True), (1, "last", False)]
    assert np.array_equal(t.logits(), s.logits())
    payload = json.dumps({"ids": [5], "feeds": [[1, "last", True, 0]]}).encode()
    body = S._HEAD.pack(S.MAGIC, 2, S.model_identity(m), len(payload)) + payload
    with pytest.raises(S.StateError, match="malformed"):
        Session.load_state(m, body + hashlib.sha256(body).digest())


def test_streams_cancel_and_usage(files):
    llm = cortiq.LLM(files["llama", "f32"], max_batch=4)
    ref = cortiq.LLM(files["llama", "f32"], max_batch=1)
    msgs = [{"role": "user", "content": "w5 w6 w7"}]
    a = llm.create_chat_completion(msgs, max_tokens=6, temperature=0)
    b = ref.create_chat_completion(msgs, max_tokens=6, temperature=0)
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["usage"] == b["usage"]
    again = llm.create_chat_completion(msgs, max_tokens=6, temperature=0)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # a stream closed early cancels its request; the others go on
    long = llm.generate([5, 6], max_tokens=200, temperature=0, stream=True)
    next(long)
    other = llm.generate([7, 8], max_tokens=5, temperature=0)
    long.close()
    assert other == ref.generate([7, 8], max_tokens=5, temperature=0)
    cancel = threading.Event()
    cancel.set()
    c = llm.create_completion([5], max_tokens=5, cancel=cancel)
    assert c["choices"][0]["finish_reason"] == "cancelled"
    llm.close()
    with pytest.raises(CortiqError, match="closed"):
        llm.generate([5], max_tokens=2)
    ref.close()


class _NanModel(ModelBase):
    """A tiny model whose logits turn NaN after token 13 (a broken request)."""
    arch = "nan"
    vocab = BM.VOCAB

    def new_state(self):
        return {"ids": []}

    def _row(self, ids):
        r = np.cos(np.arange(self.vocab, dtype=np.float32) * (sum(ids) % 7 + 1.5))
        r[:3] = -10.0                               # never the special tokens
        return r * np.nan if 13 in ids else r.astype(np.float32)

    def _run(self, st, ids, want):
        st["ids"] += [int(i) for i in ids]
        return None if want == "none" else self._row(st["ids"])

    def forward_batch(self, states, ids_list, wants, prompts):
        return [self._run(s, i, w) for s, i, w in zip(states, ids_list, wants)]

    def can_rollback(self, st, n):
        return False

    def rollback(self, st, n):
        raise CortiqError("no")


def test_an_error_ends_only_its_request():
    llm = cortiq.LLM.from_model(_NanModel(), tokenizer=BM.tokenizer_json(), max_batch=4)
    jobs = [lambda llm: llm.generate([5, 6], max_tokens=20, temperature=0),
            lambda llm: llm.generate([13], max_tokens=20, temperature=0),
            lambda llm: llm.generate([7], max_tokens=20, temperature=0)]
    got, errs = _concurrent(llm, jobs)
    assert isinstance(errs[1], ModelError)
    assert errs[0] is None and errs[2] is None and got[0] and got[2]
    assert llm.generate([5, 6], max_tokens=20, temperature=0) == got[0]
    llm.close()


def test_server_batches_streamed_chats(files):
    optional.need("extras", "starlette", "httpx")
    import httpx
    from starlette.testclient import TestClient

    from cortiq.serve import create_app
    llm = cortiq.LLM(files["llama", "q8_row"], max_batch=8)
    ref = cortiq.LLM(files["llama", "q8_row"], max_batch=1)
    app = create_app(llm, max_concurrency=8, max_queue=8)
    msgs = [[{"role": "user", "content": f"w{5 + i} w{9 + i}"}] for i in range(8)]

    def stream(client, m):
        body = {"messages": m, "max_tokens": 8, "temperature": 0, "stream": True}
        text = []
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    import json
                    d = json.loads(line[6:])["choices"]
                    if d and d[0]["delta"].get("content"):
                        text.append(d[0]["delta"]["content"])
        return "".join(text)
    with TestClient(app) as client:
        out, errs = _concurrent(client, [lambda c, m=m: stream(c, m) for m in msgs])
    assert errs == [None] * 8
    want = [ref.create_chat_completion(m, max_tokens=8, temperature=0)
            ["choices"][0]["message"]["content"] for m in msgs]
    assert out == want
    assert llm._scheduler.steps < llm._scheduler.rows
    del httpx
    llm.close()
    ref.close()


def test_two_requests_on_one_session_take_turns(files):
    llm = cortiq.LLM(files["llama", "f32"], max_batch=4)
    s = llm.session()
    jobs = [lambda llm: llm.generate([5, 6], max_tokens=4, temperature=0, session=s),
            lambda llm: llm.generate([7], max_tokens=4, temperature=0)]
    got, errs = _concurrent(llm, jobs * 2)
    assert errs == [None] * 4 and all(isinstance(g, str) for g in got)
    llm.close()


def test_cli_max_batch(files, capsys, monkeypatch):
    from cortiq.serve.cli import main
    assert main(["run", files["llama", "f32"], "-p", "w5 w6", "--greedy", "-n", "3",
                 "--max-batch", "2"]) == 0
    assert main(["run", files["llama", "f32"], "-p", "w5", "-n", "2", "--max-batch", "0"]) == 1
    assert "max_batch" in capsys.readouterr().err
    seen = {}
    import cortiq.serve
    monkeypatch.setattr(cortiq.serve, "serve", lambda llm, *a, **k: seen.update(
        batch=llm.max_batch, conc=k["max_concurrency"]) or 0)
    assert main(["serve", files["llama", "f32"], "--max-concurrency", "3"]) == 0
    assert seen == {"batch": 3, "conc": 3}
