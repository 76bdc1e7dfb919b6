"""Structured output: grammars that the sampler obeys, token by token.

    llm.create_chat_completion(msgs, response_format={"type": "json_schema",
                               "json_schema": {"name": "x", "schema": {...}}})
    llm.generate(prompt, grammar='root ::= "yes" | "no"')          # GBNF or Lark

The constraint is enforced during sampling: before each token the grammar's set of
allowed tokens becomes a mask (every other logit is set to -inf), so the output is
always a prefix of a string the grammar accepts, and a complete one unless the token
limit cuts it (finish_reason "length"). The end-of-sequence token is allowed only
where the grammar accepts, and generation ends when the grammar can take nothing more.

The matcher is llguidance (the `structured` extra): a Rust library with an abi3
wheel and no framework underneath, that computes a full-vocabulary mask in tens of
microseconds (its lexer walks the token trie once per step, not the vocabulary),
accepts JSON Schema, Lark, GBNF (llama.cpp's grammar language, which
llama-cpp-python users pass as `grammar=`) and regular expressions, and keeps no state
outside its matcher object, so one `Grammar` serves any number of concurrent
requests. Without llguidance installed cortiq runs as before and asking for a
grammar raises ConfigError naming the extra.

`Grammar` is the compiled request (validated once, against the model's tokenizer);
`Grammar.matcher()` is one generation's state, used by `cortiq.runtime.generation`.
"""
from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError

__all__ = [
    "Grammar",
    "GrammarMatcher",
    "compile_grammar",
    "compile_response_format",
    "have_llguidance",
    "json_schema_grammar",
]

_EXTRA_HINT = "pip install 'cortiq[structured]' (llguidance)"
# cortiq Tokenizer -> {vocab size: llguidance tokenizer}; goes with its tokenizer
_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_tok_lock = threading.Lock()


def _llg():
    try:
        import llguidance
        import llguidance.numpy
    except ImportError:
        raise ConfigError("structured output (response_format json_object/json_schema, "
                          f"grammar=, tool_choice required/named) needs llguidance: "
                          f"{_EXTRA_HINT}") from None
    return llguidance


def have_llguidance() -> bool:
    try:
        _llg()
    except ConfigError:
        return False
    return True


def _ll_tokenizer(tokenizer, n_vocab: int):
    """The llguidance view of a cortiq Tokenizer (built once per tokenizer: ~20 ms
    for a 4k vocabulary, ~1 s for 150k)."""
    llg = _llg()
    with _tok_lock:
        hit = _tokenizers.get(tokenizer, {}).get(n_vocab)
        if hit is not None:
            return hit
    eos = sorted(tokenizer.eos_token_ids) or None
    try:
        tk = llg.LLTokenizer(tokenizer.backend.to_str(), n_vocab=n_vocab, eos_token=eos)
    except Exception as e:  # noqa: BLE001 -- llguidance reports a tokenizer it cannot map
        raise ConfigError(f"structured output: this model's tokenizer cannot be used for "
                          f"constrained decoding: {e}") from None
    with _tok_lock:
        _tokenizers.setdefault(tokenizer, {})[n_vocab] = tk
    return tk


class GrammarMatcher:
    """One generation's position in a grammar: `allowed(n)` -> bool mask of the next
    token, `accept(token)` after sampling; `stopped` once nothing more can follow."""

    __slots__ = ("_bits", "_m", "_n")

    def __init__(self, matcher, n_vocab: int):
        import llguidance.numpy as lnp
        self._m = matcher
        self._n = n_vocab
        self._bits = lnp.allocate_token_bitmask(1, n_vocab)

    def fill_mask(self) -> np.ndarray:
        """The allowed tokens as a bool array [n_vocab] (llguidance's bitmask, unpacked)."""
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self._m.is_error():
            raise ConfigError(f"structured output: the grammar failed: {self._m.get_error()}")
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little",
                             count=self._n).view(np.bool_)

    def apply(self, scores: np.ndarray) -> None:
        """Set every logit the grammar forbids to -inf, in place."""
        scores[~self.fill_mask()[:scores.size]] = -np.inf

    def accept(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise ConfigError(f"structured output: token {token} does not fit the grammar: "
                              f"{self._m.get_error()}")

    @property
    def stopped(self) -> bool:
        return bool(self._m.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self._m.is_accepting())


class Grammar:
    """A grammar compiled for one model's tokenizer (llguidance's serialized form,
    validated). Thread-safe: each generation takes its own `matcher()`.

    Compiling costs milliseconds and the lexer builds its automaton lazily, so the
    grammar keeps one pristine matcher and hands out copies of it: a copy starts in
    microseconds and shares the automaton states every earlier copy built (measured
    on the demo model: the mask of a warm copy costs ~10 us, a fresh matcher's ~35 us
    after a 1-9 ms compile). `Grammar.get` caches compiled grammars per tokenizer."""

    _cache: ClassVar[OrderedDict] = OrderedDict()
    _cache_lock = threading.Lock()
    CACHE_SIZE = 64

    def __init__(self, spec: str, tokenizer, n_vocab: int, what: str = "grammar"):
        llg = _llg()
        self._tk = _ll_tokenizer(tokenizer, n_vocab)
        self._n = n_vocab
        self.spec = spec
        self.what = what
        try:
            failed, messages = llg.LLMatcher.validate_grammar_with_warnings(spec, self._tk)
        except Exception as e:  # noqa: BLE001 -- e.g. a schema llguidance cannot parse
            failed, messages = True, [str(e)]
        if failed:
            raise ConfigError(f"{what}: invalid: {'; '.join(messages) or 'rejected'}")
        self._proto = llg.LLMatcher(self._tk, spec, log_level=0)
        if self._proto.is_error():
            raise ConfigError(f"{what}: {self._proto.get_error()}")
        self._lock = threading.Lock()

    @classmethod
    def get(cls, spec: str, tokenizer, n_vocab: int, what: str = "grammar") -> Grammar:
        """The compiled grammar for `spec` on this tokenizer (from a small LRU cache)."""
        key = (spec, id(tokenizer), n_vocab, what)
        with cls._cache_lock:
            hit = cls._cache.get(key)
            if hit is not None and hit[0]() is tokenizer:
                cls._cache.move_to_end(key)
                return hit[1]
        g = cls(spec, tokenizer, n_vocab, what)
        with cls._cache_lock:
            cls._cache[key] = (weakref.ref(tokenizer), g)
            while len(cls._cache) > cls.CACHE_SIZE:
                cls._cache.popitem(last=False)
        return g

    def matcher(self) -> GrammarMatcher:
        with self._lock:
            m = self._proto.deep_copy()
        return GrammarMatcher(m, self._n)

    def __repr__(self) -> str:
        return f"Grammar({self.what})"


def _schema_text(schema, what: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ConfigError(f"{what}: not valid JSON: {e}") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, Mapping):
        raise ConfigError(f"{what}: a JSON schema must be an object, got "
                          f"{type(schema).__name__}")
    return json.dumps(schema)


# JSON is written compactly (one space after ':' and ','; no other whitespace): a model
# left free to add whitespace between tokens can spend its whole budget on it.
COMPACT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def compact_schema(schema: Mapping) -> dict:
    """`schema` with llguidance's compact-JSON options (its `x-guidance` key)."""
    return {**schema, "x-guidance": {**COMPACT, **(schema.get("x-guidance") or {})}}


def json_schema_grammar(schema, *, what: str = "json_schema") -> str:
    """llguidance's grammar text for documents valid against `schema` (a dict or its
    JSON text), written compactly."""
    llg = _llg()
    try:
        return llg.grammar_from("json_schema",
                                json.dumps(compact_schema(json.loads(_schema_text(schema, what)))))
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{what}: {e}") from None


def compile_grammar(grammar: Any, tokenizer, n_vocab: int) -> Grammar:
    """`grammar=` of the Python API: a `Grammar` (used as is), or text in GBNF
    (llama.cpp's `root ::= ...`) or Lark (llguidance's `start: ...`, which may embed
    `%json {...}`)."""
    if isinstance(grammar, Grammar):
        return grammar
    if not isinstance(grammar, str) or not grammar.strip():
        raise ConfigError(f"grammar: expected GBNF or Lark text, got {grammar!r}")
    llg = _llg()
    try:
        spec = llg.grammar_from("grammar", grammar)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"grammar: {e}") from None
    return Grammar.get(spec, tokenizer, n_vocab, "grammar")


def compile_response_format(response_format: Any, tokenizer, n_vocab: int) -> Grammar | None:
    """OpenAI's `response_format`: None or {"type": "text"} -> None (no constraint);
    {"type": "json_object"} -> any JSON object; {"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}} -> documents valid against the schema."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping) or not isinstance(
            response_format.get("type"), str):
        raise ConfigError("response_format: expected an object with a string 'type'")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.get(json_schema_grammar({"type": "object"}), tokenizer, n_vocab,
                           "response_format")
    if kind == "json_schema":
        js = response_format.get("json_schema")
        if not isinstance(js, Mapping):
            raise ConfigError("response_format.json_schema: expected an object with "
                              "'name' and 'schema'")
        schema = js.get("schema", {})
        return Grammar.get(json_schema_grammar(schema, what="response_format.json_schema.schema"),
                           tokenizer, n_vocab, "response_format.json_schema")
    raise ConfigError(f"response_format.type: {kind!r} is not supported (text, json_object, "
                      "json_schema)")
