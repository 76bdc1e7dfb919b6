"""cortiq.runtime.scheduler on its own: a model that records every forward (which sessions,
which ids) and a stand-in for `Generation` that takes the argmax and stops after a
set number of tokens, so each request's token stream is known in advance (computed
here by feeding the same formula serially).

Checked: every request gets its own rows; at most max_batch requests share a
forward and they are admitted in submission order; prompts go in chunks of the
prefill budget (or the model's batch_unit) while running decodes keep getting a
token every step; a cancelled or closed request frees its slot; an error in one
request's generation ends only that request, an error in a forward ends the
requests of that step and not the loop; the idle thread exits and restarts.
Waits are bounded (WAIT_S) and only for the scheduler thread to get somewhere.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from cortiq.runtime import scheduler as S
from cortiq.errors import CortiqError
from cortiq.runtime.generation import Result
from cortiq.models.base import Capabilities, ModelBase
from cortiq.runtime.scheduler import Request, Scheduler
from cortiq.runtime.session import Session

WAIT_S = 10.0
VOCAB = 50
BAD = 13                      # the recording model fails a forward that is fed this id


def next_token(ids) -> int:
    """The recording model's argmax after `ids` (never BAD: only a prompt holds it)."""
    t = (3 * sum(ids) + len(ids)) % (VOCAB - 1) + 1
    return t + 1 if t == BAD else t


def key(job) -> int:
    """How the recording model names a job's session: its state's id."""
    return id(job.session._state)


class Recorder(ModelBase):
    arch = "recorder"
    vocab = VOCAB

    def __init__(self, batch_unit=1, gate: threading.Event | None = None):
        self.capabilities = Capabilities(batch_unit=batch_unit)
        self.gate = gate
        self.entered = threading.Event()       # a forward has started (before the gate)
        self.pause_at: int | None = None       # hold the forward after this many calls
        self.paused, self.resume = threading.Event(), threading.Event()
        self.calls: list[list[tuple[int, list[int], str]]] = []
        self._lock = threading.Lock()

    def new_state(self):
        return {"ids": []}

    def _row(self, st, ids, want):
        if BAD in ids:
            raise RuntimeError("forward failed")
        st["ids"] += [int(i) for i in ids]
        if want == "none":
            return None
        row = np.zeros(VOCAB, np.float32)
        row[next_token(st["ids"])] = 1.0
        return row

    def _record(self, states, ids_list, wants):
        self.entered.set()
        if self.pause_at is not None and len(self.calls) == self.pause_at:
            self.paused.set()
            assert self.resume.wait(WAIT_S)
        if self.gate is not None:
            assert self.gate.wait(WAIT_S)
        with self._lock:
            self.calls.append([(id(s), [int(i) for i in ids], w)
                               for s, ids, w in zip(states, ids_list, wants)])

    def forward_batch(self, states, ids_list, wants, prompts):
        self._record(states, ids_list, wants)
        return [self._row(s, i, w) for s, i, w in zip(states, ids_list, wants)]

    def can_rollback(self, st, n):
        return False

    def rollback(self, st, n):
        raise CortiqError("no rollback")


class Gen:
    """What the scheduler needs of a Generation: step/finish/cancel, token, done."""

    def __init__(self, n: int, fail_at: int | None = None):
        self.n, self.fail_at = n, fail_at
        self.token = None
        self.done = n <= 0
        self.steps = 0
        self.cancelled = False

    def step(self, logits):
        self.steps += 1
        if self.steps == self.fail_at:
            raise ValueError("generation failed")
        self.token = int(np.argmax(logits))
        self.done = self.steps >= self.n
        return f"<{self.token}>"

    def finish(self):
        return "|end"

    def cancel(self):
        self.cancelled = True
        self.done = True


def expected(prompt, n):
    ids, out = list(prompt), []
    for _ in range(n):
        t = next_token(ids)
        out.append(f"<{t}>")
        ids.append(t)
    return out + ["|end"]


class Job:
    """A request and a thread reading its pieces."""

    def __init__(self, sched, model, prompt, n, fail_at=None, session=None, released=None):
        self.session = session or Session(model)
        self.prompt = list(prompt)
        self.req = Request(self.session, Gen(n, fail_at), prompt, Result(),
                           release=(released.append if released is not None else None))
        self.pieces: list[str] = []
        self.error: BaseException | None = None
        sched.submit(self.req)
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        try:
            for p in self.req.pieces():
                self.pieces.append(p)
        except BaseException as e:  # noqa: BLE001 -- checked by the test
            self.error = e

    def wait(self):
        self._t.join(WAIT_S)
        assert not self._t.is_alive(), "request did not finish"
        return self


def wait_for(cond):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < WAIT_S, "the scheduler thread did not get there"
        time.sleep(0.002)


@pytest.fixture
def sched():
    made = []

    def make(max_batch=4, prefill_chunk=64):
        s = Scheduler(max_batch, prefill_chunk)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def test_each_request_gets_its_own_tokens(sched):
    s, m = sched(4), Recorder()
    released = []
    jobs = [Job(s, m, p, n, released=released)
            for p, n in [([1, 2, 3], 5), ([7], 3), ([4, 4, 4, 4, 4], 6), ([9, 8], 1)]]
    for j in jobs:
        j.wait()
        assert j.error is None and j.pieces == expected(j.prompt, j.req.gen.n)
        assert j.req.result.prefill_s >= 0 and j.req.done
        assert j.session.ids == j.prompt + [int(p[1:-1]) for p in j.pieces[:-2]]
    assert sorted(map(id, released)) == sorted(id(j.session) for j in jobs)   # once each
    assert s.steps == len(m.calls) and s.rows == sum(len(i) for c in m.calls for _, i, _ in c)


def test_max_batch_and_admission_order(sched):
    gate = threading.Event()
    s, m = sched(2), Recorder(gate=gate)
    jobs = [Job(s, m, [i + 1], 3 + i % 2) for i in range(5)]
    gate.set()
    for j in jobs:
        j.wait()
        assert j.error is None and j.pieces == expected(j.prompt, j.req.gen.n)
    assert max(len(c) for c in m.calls) == 2
    first = []
    for c in m.calls:
        for sid, _, _ in c:
            if sid not in first:
                first.append(sid)
    assert first == [key(j) for j in jobs]           # first come, first served
    # a waiting request joins as soon as a slot frees: after the first (gated) step, no
    # step runs one request while another waits
    last_join = max(next(k for k, c in enumerate(m.calls) if key(j) in
                         {sid for sid, _, _ in c}) for j in jobs)
    assert all(len(c) == 2 for c in m.calls[1:last_join + 1])


@pytest.mark.parametrize("unit, chunk, sizes", [(1, 4, [4, 4, 2]), (3, 8, [6, 4]),
                                                (None, 4, [10]), (4, 3, [4, 4, 2])])
def test_prompt_chunks(sched, unit, chunk, sizes):
    s, m = sched(4, prefill_chunk=chunk), Recorder(batch_unit=unit)
    prompt = list(range(20, 30))
    j = Job(s, m, prompt, 2).wait()
    assert j.error is None and j.pieces == expected(prompt, 2)
    fed = [c[0] for c in m.calls]
    assert [len(i) for _, i, _ in fed[:len(sizes)]] == sizes
    assert [t for _, i, _ in fed[:len(sizes)] for t in i] == prompt
    assert [w for _, _, w in fed[:len(sizes)]] == ["none"] * (len(sizes) - 1) + ["last"]
    assert [len(i) for _, i, _ in fed[len(sizes):]] == [1]    # then one token per step


def test_decodes_do_not_stall_behind_a_prompt(sched):
    s, m = sched(4, prefill_chunk=4), Recorder()
    m.pause_at = 3
    a = Job(s, m, [5], 40)
    wait_for(m.paused.is_set)                              # a is decoding, held
    b = Job(s, m, list(range(30, 48)), 2)
    c = Job(s, m, list(range(20, 26)), 2)
    m.resume.set()
    a.wait(), b.wait(), c.wait()
    assert a.pieces == expected([5], 40) and b.pieces == expected(b.prompt, 2)
    assert c.pieces == expected(c.prompt, 2)
    b_rows = [[i for sid, i, w in st if sid == key(b)] for st in m.calls]
    c_rows = [[i for sid, i, w in st if sid == key(c)] for st in m.calls]
    a_in = [any(sid == key(a) for sid, _, _ in st) for st in m.calls]
    first_b = next(k for k, r in enumerate(b_rows) if r)
    last_b_prompt = max(k for k, r in enumerate(b_rows) if r and len(r[0]) > 1)
    last_c_prompt = max(k for k, r in enumerate(c_rows) if r and len(r[0]) > 1)
    assert (first_b, last_b_prompt) == (4, 8)              # 18 prompt rows: 4+4+4+4+2
    assert all(a_in[first_b:last_c_prompt + 1])           # a got a token every step
    for st in m.calls[first_b:]:                           # the prefill budget, shared
        assert sum(len(i) for sid, i, _ in st if sid != key(a) and len(i) > 1) <= 4
    assert [t for r in b_rows[first_b:last_b_prompt + 1] for t in r[0]] == b.prompt
    assert [t for r in c_rows if r for t in r[0]][:len(c.prompt)] == c.prompt


def test_cancel_frees_the_slot(sched):
    s, m = sched(1), Recorder()
    released = []
    a = Job(s, m, [3], 10 ** 6, released=released)
    b = Job(s, m, [4], 3, released=released)
    wait_for(lambda: a.req.gen.steps >= 3)
    assert b.req.gen.steps == 0                            # b waits: max_batch 1
    a.req.cancel.set()
    a.wait(), b.wait()
    assert a.error is None and a.req.result.finish_reason == "cancelled" and a.req.gen.cancelled
    assert a.pieces[-1] == "|end"
    assert b.error is None and b.pieces == expected([4], 3)
    assert [id(x) for x in released] == [id(a.session), id(b.session)]


def test_closing_the_reader_cancels(sched):
    s, m = sched(2), Recorder()
    req = Request(Session(m), Gen(10 ** 6), [6], Result())
    s.submit(req)
    it = req.pieces()
    assert next(it).startswith("<")
    it.close()
    assert req.cancel.is_set()
    wait_for(lambda: req.done)
    assert req.result.finish_reason == "cancelled"
    b = Job(s, m, [7], 2).wait()
    assert b.pieces == expected([7], 2)


def test_an_error_in_one_generation_ends_only_that_request(sched):
    s, m = sched(4), Recorder()
    released = []
    a = Job(s, m, [1, 2], 6, released=released)
    bad = Job(s, m, [3], 6, fail_at=2, released=released)
    c = Job(s, m, [5], 4, released=released)
    for j in (a, bad, c):
        j.wait()
    assert isinstance(bad.error, ValueError) and bad.pieces == expected([3], 1)[:1]
    assert a.error is None and a.pieces == expected([1, 2], 6)
    assert c.error is None and c.pieces == expected([5], 4)
    assert len(released) == 3


def test_an_error_in_a_forward_ends_that_step_only(sched):
    s, m = sched(4), Recorder()
    gate = threading.Event()
    m.gate = gate
    a = Job(s, m, [1], 10 ** 6)
    wait_for(m.entered.is_set)                             # a's first forward is held
    bad = Job(s, m, [BAD, 2], 3)                           # joins a's next step
    gate.set()
    a.wait(), bad.wait()
    assert isinstance(bad.error, RuntimeError) and isinstance(a.error, RuntimeError)
    assert a.session.pos == 0 and bad.session.pos == 0     # half-advanced states reset
    after = Job(s, m, [8, 9], 3).wait()                    # the loop lives on
    assert after.error is None and after.pieces == expected([8, 9], 3)


def test_two_requests_on_one_session_take_turns(sched):
    s, m = sched(4), Recorder()
    shared = Session(m)
    a = Job(s, m, [1], 4, session=shared)
    b = Job(s, m, [2], 4, session=shared)
    a.wait(), b.wait()
    assert a.error is None and b.error is None
    assert all(len({sid for sid, _, _ in c}) == len(c) for c in m.calls)
    assert shared.pos == 2 + 4 + 4 - 2                     # each feeds all but its last


def test_close(sched):
    s, m = sched(1), Recorder()
    running = Job(s, m, [1], 10 ** 6)
    waiting = Job(s, m, [2], 2)
    wait_for(lambda: running.req.gen.steps >= 2)
    s.close()
    running.wait(), waiting.wait()
    assert isinstance(running.error, CortiqError) and "while the request ran" in str(
        running.error)
    assert running.req.gen.cancelled
    assert isinstance(waiting.error, CortiqError) and "before the request ran" in str(
        waiting.error)
    with pytest.raises(CortiqError, match="closed"):
        s.submit(Request(Session(m), Gen(1), [3], Result()))


def test_idle_thread_exits_and_restarts(sched, monkeypatch):
    monkeypatch.setattr(S, "IDLE_EXIT_S", 0.02)
    s, m = sched(2), Recorder()
    assert Job(s, m, [1], 2).wait().pieces == expected([1], 2)
    wait_for(lambda: s._thread is None)
    assert Job(s, m, [2], 3).wait().pieces == expected([2], 3)


def test_end_is_once():
    released = []
    req = Request(Session(Recorder()), Gen(1), [], Result(), release=released.append)
    req.end()
    req.end(ValueError("late"))
    assert list(req.pieces()) == ["|end"] and len(released) == 1
