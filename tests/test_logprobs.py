"""Log-probabilities: `generation.log_softmax`, the per-token entries a `Generation`
records (the sampled token's logprob and the top alternatives), and their OpenAI
shapes (`cortiq.runtime.logprobs`) on small hand-built tokenizers.

References: a float64 NumPy log-sum-exp written here; token bytes from the
tokenizer's own vocabulary as built below (the byte-level alphabet of GPT-2, a
SentencePiece-style "<0xNN>" byte fallback).

Tolerance: LP_ATOL = 1e-12 -- both sides compute in float64 from the same float32
logits; they differ only in summation order over at most a few hundred terms.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import tokenizers as tk
from hypothesis import given
from hypothesis import strategies as st

from cortiq.runtime.generation import Generation, Options, Result, TokenLogprob, log_softmax
from cortiq.runtime.logprobs import TokenBytes, chat_logprobs, completion_logprobs
from cortiq.runtime.sampling import SamplingParams
from cortiq.text.tokenizer import Tokenizer
from toy_tokenizers import byte_level

LP_ATOL = 1e-12
GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                        repetition_penalty=1.0)


def np_log_softmax(row) -> np.ndarray:
    z = np.asarray(row, np.float64)
    finite = z[np.isfinite(z)]
    m = finite.max()
    s = math.fsum(math.exp(v - m) for v in finite)
    return z - m - math.log(s)


# ids 256.. : multi-byte tokens (bytes they stand for)
MERGED = [b"ab", b" x", "é".encode(), "€".encode()[:2]]
EOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def byte_tok():
    return byte_level(MERGED, EOS)


@pytest.fixture(scope="module")
def sp_tok():
    """SentencePiece-like: "▁word" pieces and <0xNN> byte fallback tokens."""
    vocab = {"<unk>": 0, "▁hi": 1, "lo": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = 3 + b
    t = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[], unk_token="<unk>",
                                   byte_fallback=True))
    t.decoder = tk.decoders.Sequence([tk.decoders.Replace("▁", " "),
                                      tk.decoders.ByteFallback(), tk.decoders.Fuse()])
    return Tokenizer(t)


# ---------------------------------------------------------------- log_softmax

rows = st.integers(1, 300).flatmap(lambda n: st.lists(
    st.floats(-60, 60, width=32), min_size=n, max_size=n))


@given(rows, st.floats(-1e4, 1e4))
def test_log_softmax_matches_float64(row, shift):
    row = np.asarray(row, np.float32)
    got = log_softmax(row)
    assert got.dtype == np.float64 and got.shape == row.shape
    assert np.allclose(got, np_log_softmax(row), rtol=0, atol=LP_ATOL)
    assert abs(math.fsum(np.exp(got)) - 1.0) < 1e-12
    # invariant under adding a constant (the max is subtracted first: no overflow)
    shifted = row.astype(np.float64) + shift
    assert np.allclose(log_softmax(shifted), np_log_softmax(shifted), atol=1e-9)


def test_log_softmax_extremes():
    big = np.array([3e38, 3e38, -3e38], np.float32)
    assert np.allclose(log_softmax(big)[:2], math.log(0.5), atol=LP_ATOL)
    assert log_softmax(big)[2] == pytest.approx(-6e38 - math.log(2), rel=1e-7)
    assert log_softmax(np.array([7.5], np.float32))[0] == 0.0


@given(st.lists(st.floats(-30, 30, width=32), min_size=2, max_size=40),
       st.data())
def test_log_softmax_masked_entries_stay_minus_inf(row, data):
    row = np.asarray(row, np.float32)
    masked = data.draw(st.lists(st.integers(0, row.size - 1), min_size=1,
                                max_size=row.size - 1, unique=True))
    row[masked] = -np.inf
    got = log_softmax(row)
    assert np.all(got[masked] == -np.inf)
    live = np.setdiff1d(np.arange(row.size), masked)
    assert np.allclose(got[live], np_log_softmax(row)[live], atol=LP_ATOL)
    assert abs(math.fsum(np.exp(got[live])) - 1.0) < 1e-12


# ---------------------------------------------------------------- a Generation's entries

def one_step(tok, row, k, params=GREEDY):
    res = Result()
    g = Generation(tok, [1, 2], params, 4, [], res, Options(logprobs=k))
    g.step(np.asarray(row, np.float32))
    g.finish()
    assert len(res.logprobs) == 1 and isinstance(res.logprobs[0], TokenLogprob)
    return res.token_ids[0], res.logprobs[0]


def expected_top(row, k):
    lp = np_log_softmax(row)
    order = sorted(range(len(row)), key=lambda i: (-lp[i], i))
    return order[:k], lp


@given(st.lists(st.integers(-4, 4), min_size=97, max_size=257), st.integers(0, 20))
def test_top_alternatives_order_and_ties(byte_tok, ints, k):
    # small integers: many ties, also across the k-th place (ties go to the lower id)
    n = byte_tok.vocab_size
    row = np.resize(np.asarray(ints, np.float32), n)
    row[n - 1] = -10.0                                   # EOS (last id) never sampled
    t, e = one_step(byte_tok, row, k)
    ids, lp = expected_top(row, k)
    assert t == expected_top(row, 1)[0][0]                # greedy: the argmax, lowest id
    assert [i for i, _ in e.top] == ids
    assert np.allclose([v for _, v in e.top], lp[ids], atol=LP_ATOL)
    assert e.token == t and abs(e.logprob - lp[t]) <= LP_ATOL


def test_the_sampled_token_is_reported_even_outside_the_top(byte_tok):
    n = byte_tok.vocab_size
    row = np.linspace(5, -5, n).astype(np.float32)
    rare = 200
    # logit_bias picks it; logprobs are those of the raw row (before the bias)
    params = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                            repetition_penalty=1.0, logit_bias={rare: 100})
    t, e = one_step(byte_tok, row, 3, params)
    ids, lp = expected_top(row, 3)
    assert t == rare and e.token == rare
    assert abs(e.logprob - lp[rare]) <= LP_ATOL
    assert [i for i, _ in e.top] == ids == [0, 1, 2] and rare not in ids


def test_no_top_with_logprobs_zero_and_k_capped_by_vocabulary(byte_tok):
    n = byte_tok.vocab_size
    row = np.linspace(1, -1, n).astype(np.float32)
    _, e = one_step(byte_tok, row, 0)
    assert e.top == ()
    # a vocabulary smaller than k: every id, most likely first (a padded logits row
    # longer than the vocabulary: its tail is not part of the distribution)
    small = Tokenizer.bytes_only()
    row = np.concatenate([np.arange(256, dtype=np.float32) % 7, [50.0, 60.0]])
    res = Result()
    g = Generation(small, [1], GREEDY, 1, [], res, Options(logprobs=20))
    g.step(row.astype(np.float32))
    g.finish()
    e = res.logprobs[0]
    ids, lp = expected_top(row[:256], 20)
    assert [i for i, _ in e.top] == ids
    assert abs(e.logprob - lp[e.token]) <= LP_ATOL and e.token == 6


# ---------------------------------------------------------------- token bytes

def test_token_bytes_byte_level(byte_tok):
    tb = TokenBytes(byte_tok)
    for b in (0, 10, 32, 65, 0xC3, 0xFF):
        assert tb(b) == bytes([b])
    for i, raw in enumerate(MERGED):
        assert tb(256 + i) == raw
    assert tb.text(258) == "é"
    assert tb.text(259) == "\ufffd"                   # half of a 3-byte character
    assert tb.text(0xC3) == "\ufffd"
    eos = byte_tok.token_to_id(EOS)
    assert tb(eos) == EOS.encode() and tb.text(eos) == EOS
    assert tb(10 ** 6) == b""                          # no such id
    assert TokenBytes.of(byte_tok) is TokenBytes.of(byte_tok)


def test_token_bytes_sentencepiece(sp_tok):
    tb = TokenBytes(sp_tok)
    assert tb(1) == b" hi" and tb(2) == b"lo"
    assert tb(3 + 0x41) == b"A" and tb(3 + 0xE2) == b"\xe2"
    assert tb.text(3 + 0xE2) == "\ufffd"


# ---------------------------------------------------------------- OpenAI shapes

def test_chat_shape(byte_tok):
    entries = [TokenLogprob(256, -0.25, ((256, -0.25), (97, -1.5))),
               TokenLogprob(258, -2.0, ())]
    out = chat_logprobs(byte_tok, entries)
    assert out["refusal"] is None
    assert out["content"] == [
        {"token": "ab", "logprob": -0.25, "bytes": [97, 98],
         "top_logprobs": [{"token": "ab", "logprob": -0.25, "bytes": [97, 98]},
                          {"token": "a", "logprob": -1.5, "bytes": [97]}]},
        {"token": "é", "logprob": -2.0, "bytes": [0xC3, 0xA9], "top_logprobs": []}]


def test_completion_shape_with_echo(byte_tok):
    # two top entries that spell the same text (U+FFFD): the first, more likely, stays
    gen = [TokenLogprob(257, -0.5, ((257, -0.5), (259, -2.0), (0xE2, -3.0))),
           TokenLogprob(98, -1.0, ((98, -1.0),))]
    prompt = [104, TokenLogprob(105, -4.0, ((104, -0.1),))]
    out = completion_logprobs(byte_tok, gen, text_offset=7, prompt=prompt)
    assert out["tokens"] == ["h", "i", " x", "b"]
    assert out["token_logprobs"] == [None, -4.0, -0.5, -1.0]
    assert out["top_logprobs"] == [None, {"h": -0.1}, {" x": -0.5, "\ufffd": -2.0},
                                   {"b": -1.0}]
    assert out["text_offset"] == [7, 8, 9, 11]
    empty = completion_logprobs(byte_tok, [])
    assert empty == {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                     "text_offset": []}
