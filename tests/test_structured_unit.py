"""cortiq.text.structured on its own: the token masks and acceptance of compiled grammars on
a tiny byte-level tokenizer, against a brute-force reading of finite languages
written here (a token is allowed iff the text so far plus its bytes is a prefix of a
string of the language; end-of-sequence iff the text so far is one), and the errors
for bad grammars, schemas and response formats.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
import optional

optional.need("extras", "llguidance")

from cortiq.text import structured as S  # noqa: E402
from cortiq.errors import ConfigError  # noqa: E402
from toy_tokenizers import byte_level  # noqa: E402

MERGED = [b"ye", b"yes", b"no", b'{"', b'": ']
EOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def tok():
    return byte_level(MERGED, EOS)


def token_bytes(t: int) -> bytes:
    return bytes([t]) if t < 256 else MERGED[t - 256]


N_TOKENS = 256 + len(MERGED)


def expected_mask(done: bytes, language) -> np.ndarray:
    m = np.zeros(N_TOKENS + 1, bool)
    for t in range(N_TOKENS):
        m[t] = any(s.startswith(done + token_bytes(t)) for s in language)
    m[N_TOKENS] = done in language
    return m


def walk(g: S.Grammar, tokens, language):
    """Feed `tokens`, checking every mask on the way; True when the whole sequence fits
    (and the grammar accepts at its end), False at the first token it refuses.

    The mask must be sound: it allows no token that leaves the language, and EOS
    exactly where the text so far is a string of it. Where the grammar forces the
    next bytes, llguidance allows only the tokenizer's own tokenization of them (here
    single bytes: the BPE has no merges), so a multi-byte token the language would
    admit may be masked; every single-byte token that fits must be allowed."""
    m = g.matcher()
    done = b""
    for t in tokens:
        mask = check_mask(m, done, language)
        if not mask[t]:
            assert t >= 256 or not expected_mask(done, language)[t]
            if not expected_mask(done, language)[t]:
                with pytest.raises(ConfigError, match="does not fit the grammar"):
                    m.accept(t)
            return False
        m.accept(t)
        done += token_bytes(t)
    check_mask(m, done, language)
    assert m.accepting == (done in language)
    if done in language:
        m.accept(N_TOKENS)                           # EOS
        assert m.stopped
    return done in language


def check_mask(m, done, language):
    mask = m.fill_mask()
    want = expected_mask(done, language)
    assert mask.shape == want.shape and mask.dtype == np.bool_
    assert not (mask & ~want).any(), (done, np.flatnonzero(mask & ~want))
    assert np.array_equal(mask[:256], want[:256]), done
    assert mask[N_TOKENS] == want[N_TOKENS], done
    return mask


YES_NO = [b"yes", b"no"]


def test_gbnf_masks_and_acceptance(tok):
    g = S.compile_grammar('root ::= "yes" | "no"', tok, tok.vocab_size)
    assert walk(g, [ord("y"), ord("e"), ord("s")], YES_NO)
    # no forced bytes at the start: every token that fits, multi-byte ones too
    assert np.array_equal(np.flatnonzero(g.matcher().fill_mask()),
                          [ord("n"), ord("y"), 256, 257, 258])
    assert walk(g, [256, ord("s")], YES_NO)          # "ye" + "s"
    assert walk(g, [257], YES_NO) and walk(g, [258], YES_NO)
    assert not walk(g, [ord("y"), ord("o")], YES_NO)
    assert not walk(g, [ord("x")], YES_NO)
    assert not walk(g, [ord("n")], YES_NO)            # a prefix: not accepting yet


def test_lark_and_matchers_are_independent(tok):
    g = S.compile_grammar('start: "ab" | "abc"', tok, tok.vocab_size)
    lang = [b"ab", b"abc"]
    a, b = g.matcher(), g.matcher()
    a.accept(ord("a"))
    a.accept(ord("b"))
    assert a.accepting and not b.accepting
    check_mask(b, b"", lang)
    check_mask(a, b"ab", lang)
    assert a.fill_mask()[ord("c")] and a.fill_mask()[N_TOKENS] and not b.fill_mask()[N_TOKENS]
    assert walk(g, [ord("a"), ord("b"), ord("c")], lang)
    scores = np.linspace(-1, 1, N_TOKENS + 1).astype(np.float32)
    before = scores.copy()
    a.apply(scores)
    allowed = [ord("c"), N_TOKENS]
    assert np.array_equal(np.flatnonzero(np.isfinite(scores)), allowed)
    assert np.array_equal(scores[allowed], before[allowed])


def test_padded_model_vocabulary(tok):
    # a model's vocabulary may be padded past the tokenizer's: the extra ids never fit,
    # and a row cut to the tokenizer's size (as generation samples it) takes the mask
    g = S.compile_grammar('root ::= "no"', tok, N_TOKENS + 9)
    m = g.matcher()
    mask = m.fill_mask()
    assert mask.shape == (N_TOKENS + 9,) and not mask[N_TOKENS + 1:].any()
    assert np.array_equal(np.flatnonzero(mask), [ord("n")])   # forced: the tokenizer's way
    scores = np.zeros(N_TOKENS + 1, np.float32)
    m.apply(scores)
    assert np.array_equal(np.flatnonzero(scores == 0), [ord("n")])


SCHEMA = {"type": "object", "properties": {"a": {"enum": [1, 22]}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}
# the compact form (no whitespace but one space after ':' and ','), keys in order
SCHEMA_LANG = [b'{"a": 1, "b": true}', b'{"a": 1, "b": false}',
               b'{"a": 22, "b": true}', b'{"a": 22, "b": false}']


def byte_ids(s: bytes):
    return list(s)


@pytest.fixture(scope="module")
def schema_grammar(tok):
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    return S.compile_response_format(rf, tok, tok.vocab_size)


@pytest.mark.parametrize("doc", SCHEMA_LANG)
def test_json_schema_accepts_its_documents(schema_grammar, doc):
    assert walk(schema_grammar, byte_ids(doc), SCHEMA_LANG)
    # the forced opening, in merged tokens: never allowed beyond the language
    assert not walk(schema_grammar, [259, ord("a"), 260] + byte_ids(doc[6:]), SCHEMA_LANG)


@given(st.sampled_from(SCHEMA_LANG), st.data())
def test_json_schema_refuses_edits(schema_grammar, doc, data):
    i = data.draw(st.integers(0, len(doc) - 1))
    c = data.draw(st.sampled_from(b' {}":,ab12tfx'))
    edited = doc[:i] + bytes([c]) + doc[i + 1:]
    assert walk(schema_grammar, byte_ids(edited), SCHEMA_LANG) == (edited in SCHEMA_LANG)
    cut = doc[:i]
    assert not walk(schema_grammar, byte_ids(cut), SCHEMA_LANG)   # a prefix is not done


def test_json_object_and_text(tok):
    g = S.compile_response_format({"type": "json_object"}, tok, tok.vocab_size)
    m = g.matcher()
    mask = m.fill_mask()
    assert mask[ord("{")] and not mask[ord("[")] and not mask[ord("1")] and not mask[N_TOKENS]
    for b in b'{"k": [1, null]}':
        m.accept(b)
    assert m.accepting
    assert S.compile_response_format(None, tok, tok.vocab_size) is None
    assert S.compile_response_format({"type": "text"}, tok, tok.vocab_size) is None
    assert S.compile_grammar(g, tok, tok.vocab_size) is g
    assert S.have_llguidance()


def test_compiled_grammars_are_cached(tok):
    a = S.compile_grammar('root ::= "no"', tok, tok.vocab_size)
    assert S.compile_grammar('root ::= "no"', tok, tok.vocab_size) is a
    assert S.compile_grammar('root ::= "yes"', tok, tok.vocab_size) is not a


@pytest.mark.parametrize("grammar, match", [
    ("", "expected GBNF or Lark"), ("   ", "expected GBNF or Lark"), (42, "expected GBNF"),
    ('root ::= "a', "^grammar: "), ('root ::= ( "a"', "^grammar: "),
    ("root ::= undefined_rule", "^grammar: "), ("start: /[/", "^grammar: "),
])
def test_bad_grammars(tok, grammar, match):
    with pytest.raises(ConfigError, match=match):
        S.compile_grammar(grammar, tok, tok.vocab_size)


@pytest.mark.parametrize("rf, match", [
    ("json", "expected an object with a string 'type'"),
    ({"type": 3}, "string 'type'"),
    ({"type": "xml"}, "'xml' is not supported"),
    ({"type": "json_schema"}, "json_schema: expected an object"),
    ({"type": "json_schema", "json_schema": {"schema": "{nope"}}, "not valid JSON"),
    ({"type": "json_schema", "json_schema": {"schema": [1]}}, "must be an object, got list"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}},
     "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nowhere"}}},
     "response_format.json_schema"),
])
def test_bad_response_formats(tok, rf, match):
    with pytest.raises(ConfigError, match=match):
        S.compile_response_format(rf, tok, tok.vocab_size)


def test_boolean_schemas(tok):
    anything = S.Grammar.get(S.json_schema_grammar(True), tok, tok.vocab_size)
    m = anything.matcher()
    for b in b"[true]":
        m.accept(b)
    assert m.accepting
    with pytest.raises(ConfigError):
        S.Grammar.get(S.json_schema_grammar(False), tok, tok.vocab_size).matcher().fill_mask()
