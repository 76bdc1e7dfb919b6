"""cortiq.models.kv_cache.KvSlot against a plain model of what it must hold: a dict
position -> (key row, value row) over the contiguous window [first, first + n).

Operations, as the Llama and Dory forwards use them: `put` appends a chunk (or, with
`overwrite`, replaces the newest rows by a later pass over the same chunk), `trim(keep)`
drops all but the newest `keep` rows once more than 2·keep are held (a sliding window),
`rollback(pos)` forgets positions >= pos. Exact comparisons: rows are copied, never
computed.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortiq.models.kv_cache import KvSlot

NK, HD = 2, 3


class Ref:
    def __init__(self):
        self.rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.first = 0
        self.end = 0                       # one past the newest position held

    def put(self, k, v, overwrite):
        t = k.shape[0]
        if overwrite:
            self.end -= t
        for i in range(t):
            self.rows[self.end + i] = (k[i].copy(), v[i].copy())
        self.end += t

    def trim(self, keep):
        if self.end - self.first > 2 * keep:
            self.first = self.end - keep

    def rollback(self, pos):
        self.end = max(min(self.end, pos), self.first)


def rows(serial, t):
    """t distinct rows (each value tells which write made it)."""
    base = serial * 1000 + np.arange(t, dtype=np.float32)[:, None, None]
    k = base + np.arange(NK * HD, dtype=np.float32).reshape(1, NK, HD) / 100
    return k.astype(np.float32), (-k).astype(np.float32)


def same(slot: KvSlot, ref: Ref):
    assert slot.first == ref.first
    assert slot.n == ref.end - ref.first
    for j in range(slot.n):
        rk, rv = ref.rows[ref.first + j]
        assert np.array_equal(slot.k[j], rk) and np.array_equal(slot.v[j], rv), j
    assert slot.nbytes() == 2 * slot.n * NK * HD * 4
    assert slot.k.shape[0] >= slot.n and slot.k.dtype == np.float32


ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(1, 40), st.booleans()),
    st.tuples(st.just("trim"), st.integers(1, 12)),
    st.tuples(st.just("rollback"), st.integers(0, 200)),
), max_size=30)


@given(ops)
def test_matches_the_model(seq):
    slot, ref = KvSlot(NK, HD), Ref()
    for serial, op in enumerate(seq):
        if op[0] == "put":
            t, overwrite = op[1], op[2] and slot.n >= op[1]   # a re-pass covers its chunk
            k, v = rows(serial, t)
            slot.put(k, v, overwrite)
            ref.put(k, v, overwrite)
        elif op[0] == "trim":
            slot.trim(op[1])
            ref.trim(op[1])
            assert slot.n <= 2 * op[1]        # the window's bound after a trim
        else:
            slot.rollback(op[1])
            ref.rollback(op[1])
        same(slot, ref)


def test_growth_keeps_rows():
    s = KvSlot(NK, HD)
    assert s.k.shape == (16, NK, HD) and s.n == 0 and s.nbytes() == 0
    ks = []
    for i in range(5):
        k, v = rows(i, 7)
        s.put(k, v, False)
        ks.append(k)
    allk = np.concatenate(ks)
    assert s.n == 35 and s.k.shape[0] == 64            # 16 -> 32 -> 64
    assert np.array_equal(s.k[:35], allk) and np.array_equal(s.v[:35], -allk)
    big, _ = rows(9, 100)
    s.put(big, -big, False)
    assert s.k.shape[0] == 256 and np.array_equal(s.k[35:135], big)


def test_overwrite_replaces_the_newest_rows():
    s = KvSlot(NK, HD)
    a, _ = rows(1, 10)
    s.put(a, -a, False)
    b, _ = rows(2, 4)
    s.put(b, -b, True)                              # a second pass over the last 4
    assert s.n == 10
    assert np.array_equal(s.k[:6], a[:6]) and np.array_equal(s.k[6:10], b)
    assert np.array_equal(s.v[6:10], -b)


def test_sliding_window_trim_and_rollback():
    s = KvSlot(NK, HD)
    a, _ = rows(1, 9)
    s.put(a, -a, False)
    s.trim(4)                                        # 9 > 8: keep the newest 4
    assert (s.first, s.n) == (5, 4) and np.array_equal(s.k[:4], a[5:])
    s.trim(4)                                        # 4 <= 8: nothing to drop
    assert (s.first, s.n) == (5, 4)
    s.rollback(7)                                    # positions 5, 6 stay
    assert (s.first, s.n) == (5, 2) and np.array_equal(s.k[:2], a[5:7])
    s.rollback(100)                                  # past the end: no change
    assert s.n == 2
    s.rollback(3)                                    # before the window: empty, first kept
    assert (s.first, s.n) == (5, 0)
    b, _ = rows(2, 3)
    s.put(b, -b, False)                              # appends at position 5 again
    assert (s.first, s.n) == (5, 3) and np.array_equal(s.k[:3], b)


@pytest.mark.parametrize("nk, hd", [(1, 1), (4, 64)])
def test_shapes(nk, hd):
    s = KvSlot(nk, hd)
    k = np.ones((3, nk, hd), np.float32)
    s.put(k, 2 * k, False)
    assert s.k.shape[1:] == (nk, hd) and s.nbytes() == 2 * 3 * nk * hd * 4
    with pytest.raises(ValueError):
        s.put(np.ones((3, nk + 1, hd), np.float32), k, False)
