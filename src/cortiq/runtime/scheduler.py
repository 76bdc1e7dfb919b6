"""Continuous batching: the requests of one `LLM` share each forward.

Decode is bound by streaming the weights; B sessions that each run their own forward
stream them B times. The scheduler runs one thread per `LLM` that owns the model
while requests are active: each step it gathers one piece of work per request -- the
next token of a decoding request, or the next chunk of a prompt being prefilled -- and
runs them all in one `feed_batch`, then hands each request its row of logits through
its own `Generation` (sampling, stop strings, limits, detokenizing: all per request).
A request decoding alone whose tokens are plain argmax runs its tokens chained on the
model's device (`cortiq.runtime.chained`) until another request arrives.
Requests join and leave at token boundaries; a new prompt is read in chunks of the
model's `capabilities.batch_unit` rows (at most `prefill_chunk` prompt rows per step,
and the model's `capabilities.prefill_cap`), interleaved
with the decodes already running, so running streams do not stall for a whole prompt.

A request is submitted by its caller's thread (which has already chosen the model and
session and rolled the session back to the prefix it keeps) and read back from its
queue, so the caller's generator streams, and closing it cancels the request. An
error inside one request ends that request (raised in its caller's thread); an error
in a batched forward ends the requests of that step. The thread exits when idle and
starts again on the next request; `close()` stops it.
"""
from __future__ import annotations

import collections
import threading
import time
import weakref

from .batch import feed_batch
from .chained import can_chain, chained_pieces
from ..errors import CortiqError

__all__ = ["Request", "Scheduler"]

IDLE_EXIT_S = 2.0        # an idle scheduler thread exits after this long
_END = object()


class Request:
    """One generation in the scheduler: its session, its Generation, the prompt ids
    still to run, and the queue its caller reads pieces of text from."""

    def __init__(self, session, gen, todo, result, cancel=None, release=None):
        self.session = session
        self.gen = gen
        self.todo = list(todo)        # prompt ids not fed yet
        self.result = result
        self.cancel = cancel if cancel is not None else threading.Event()
        self.release = release        # called once the scheduler is done with the session
        self._q: collections.deque = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self.t0 = time.perf_counter()
        self.t1 = None
        self.done = False
        self.feed_next = False        # a device chain stopped short: feed the next token

    # -- the scheduler's side ----------------------------------------------------------
    def put(self, item) -> None:
        with self._ready:
            self._q.append(item)
            self._ready.notify()

    def end(self, error: BaseException | None = None) -> None:
        """Finish: the held-back text (or the error), then the end mark; free the session."""
        if self.done:
            return
        self.done = True
        try:
            if error is None:
                tail = self.gen.finish()
                if tail:
                    self.put(tail)
                if self.t1 is not None:
                    self.result.decode_s = time.perf_counter() - self.t1
        except BaseException as e:  # noqa: BLE001 -- handed to the caller
            error = e
        if error is not None:
            self.put(error)
        self.put(_END)
        if self.release is not None:
            self.release(self.session)

    # -- the caller's side -------------------------------------------------------------
    def pieces(self):
        """Yield the request's text pieces as they come; raise its error, if any.
        Closing the generator early cancels the request."""
        finished = False
        try:
            while True:
                with self._ready:
                    while not self._q:
                        self._ready.wait()
                    item = self._q.popleft()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished:
                self.cancel.set()


class Scheduler:
    """The batching loop of one LLM (see the module docstring)."""

    def __init__(self, max_batch: int, prefill_chunk: int = 64):
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self._cv = threading.Condition(threading.Lock())
        self._waiting: collections.deque = collections.deque()
        self._active: list[Request] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.steps = 0                  # forwards run (for tests and benchmarks)
        self.rows = 0                   # request rows they carried
        # Watchers of each step (a server's metrics): objects with a
        # `batch_step(requests, rows)` method, held weakly so that a watcher gone (an app
        # closed) needs no unregistering.
        self.watchers: weakref.WeakSet = weakref.WeakSet()

    def submit(self, req: Request) -> Request:
        with self._cv:
            if self._closed:
                raise CortiqError("the LLM is closed: no more generations")
            self._waiting.append(req)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="cortiq-batch",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()
        return req

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
        with self._cv:
            left = list(self._waiting)
            self._waiting.clear()
        for r in left:
            r.end(CortiqError("the LLM was closed before the request ran"))

    # -- the loop ----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._active and not self._waiting and not self._closed:
                    if not self._cv.wait(IDLE_EXIT_S) and not self._waiting:
                        self._thread = None
                        return
                if self._closed:
                    active, self._active = self._active, []
                    self._thread = None
                    break
                while self._waiting and len(self._active) < self.max_batch:
                    self._active.append(self._waiting.popleft())
                active = list(self._active)
            try:
                self._step(active)
            except BaseException as e:  # noqa: BLE001 -- a broken step ends its requests
                for r in active:
                    r.session.reset()   # its state may be half-advanced
                    r.end(e)
            with self._cv:
                self._active = [r for r in self._active if not r.done]
        for r in active:
            r.gen.cancel()
            r.end(CortiqError("the LLM was closed while the request ran"))

    def _chain(self, r: Request) -> None:
        """A lone decoding request of plain argmax tokens: its tokens chained on the
        model's device (`cortiq.runtime.chained`) until it ends, is cancelled or another
        request arrives; each token counts as a step of one row."""
        def interrupt() -> bool:
            return bool(self._waiting) or r.cancel.is_set() or self._closed

        pieces = chained_pieces(r.session, r.gen, interrupt)
        try:
            for piece in pieces:
                self.steps += 1
                self.rows += 1
                for w in list(self.watchers):
                    w.batch_step(1, 1)
                if piece:
                    r.put(piece)
        finally:
            pieces.close()
        if r.gen.done:
            r.end()
        else:       # interrupted, or a token in the padded tail: the next row is sampled
            r.feed_next = True

    def _step(self, active: list[Request]) -> None:
        live = []
        for r in active:
            if r.cancel.is_set():
                r.result.finish_reason = "cancelled"
                r.gen.cancel()
                r.end()
            else:
                live.append(r)
        if not live:
            return
        if len(live) == 1 and not live[0].todo and not live[0].feed_next \
                and not self._waiting and can_chain(live[0].session, live[0].gen):
            self._chain(live[0])
            return
        budget = self.prefill_chunk
        decoding = any(not r.todo for r in live)
        batch, ids, wants, prompts = [], [], [], []
        held = set()
        for r in live:
            if id(r.session) in held:       # two requests on one caller's session:
                continue                    # one token each, in turn
            held.add(id(r.session))
            if r.todo:
                caps = r.session.model.capabilities
                unit = caps.batch_unit
                if unit is None:            # the model reads a prompt in one piece
                    n = len(r.todo)
                else:
                    cap = caps.prefill_cap or budget
                    n = min(len(r.todo), max(unit, min(budget, cap) // unit * unit))
                if budget <= 0 and decoding:
                    continue                # this step's prompt rows are spent
                budget -= n
                chunk, r.todo = r.todo[:n], r.todo[n:]
                batch.append(r)
                ids.append(chunk)
                wants.append("none" if r.todo else "last")
                prompts.append(True)
            else:
                r.feed_next = False
                batch.append(r)
                ids.append([r.gen.token])
                wants.append("last")
                prompts.append(False)
        outs = feed_batch([r.session for r in batch], ids, wants, prompts)
        self.steps += 1
        rows = sum(len(x) for x in ids)
        self.rows += rows
        for w in list(self.watchers):
            w.batch_step(len(batch), rows)
        for r, out, want in zip(batch, outs, wants):
            if want == "none":
                continue
            if r.t1 is None:
                r.t1 = time.perf_counter()
                r.result.prefill_s = r.t1 - r.t0
            try:
                piece = r.gen.step(out)
            except BaseException as e:  # noqa: BLE001 -- ends this request only
                r.end(e)
                continue
            if piece:
                r.put(piece)
            if r.gen.done:
                r.end()
