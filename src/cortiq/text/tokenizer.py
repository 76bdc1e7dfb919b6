"""Text <-> token ids over Hugging Face `tokenizers`, plus a streaming detokeniser.

A CMF file stores the model's `tokenizer.json` verbatim in its vocab section
(docs/cmf-format.md §13) and the chat bundle in `header.tokenizer_config` (§4.4)::

    {"chat_template": str?, "eos_token_ids": [u32], "bos_token_id": u32?, "pad_token_id": u32?}

`Tokenizer` wraps the HF tokenizer built from those bytes (or from a path) and
resolves the special ids the runtime needs, following upstream cortiq
(docs/runtime.md §4):

* stop set (`eos_token_ids`, `is_eos`): the tokenizer's own end-of-text token, the
  `<|im_end|>` token when the vocabulary has one, plus the bundle's `eos_token_ids`;
* BOS: the tokenizer's own BOS (the one its post-processor prepends, else a
  conventionally named special token); the bundle's `bos_token_id` only when the
  tokenizer has none. BOS is *added* only when the tokenizer's post-processor adds
  it (llama-style) or the caller forces it (`add_bos=True`, e.g. for Gemma), and
  never twice.

`StreamDecoder` turns ids into text one id at a time without ever splitting a UTF-8
character: a byte-level / byte-fallback token that ends inside a character is held
back until the character completes.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigError, FormatError

__all__ = ["StreamDecoder", "Tokenizer"]

# Conventional names, most specific first. Only *special* added tokens are considered.
_EOS_NAMES = (
    "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "<|end|>",
)
_BOS_NAMES = (
    "<s>", "<|begin_of_text|>", "<bos>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
    "<|startoftext|>",
)
_IM_END = "<|im_end|>"
_REPLACEMENT = "\ufffd"
_GIL_FREE_CHARS = 4096            # texts longer than this are tokenized without the GIL


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE:
    printable Latin-1 bytes map to themselves, the other 68 to U+0100 onwards."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(0x100 + n)
            n += 1
    return out


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError(
            "cortiq.text.tokenizer needs the 'tokenizers' package: pip install tokenizers") from e
    return tokenizers


def _check_id(name: str, value: Any, vocab_size: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"tokenizer_config.{name}: expected a non-negative integer, got {value!r}")
    if vocab_size is not None and value >= vocab_size:
        raise ConfigError(
            f"tokenizer_config.{name}: id {value} is outside the vocabulary [0, {vocab_size})")
    return value


class Tokenizer:
    """A HF `tokenizers.Tokenizer` plus the special ids the runtime needs.

    `source` is the bytes of a `tokenizer.json` (the CMF vocab section), a path to a
    `tokenizer.json` or to a directory holding one, or a `tokenizers.Tokenizer`.
    `tokenizer_config` is the CMF chat bundle (or None). `add_bos` overrides whether
    `encode(..., add_special_tokens=True)` puts BOS first (None = as the tokenizer's
    post-processor does).
    """

    def __init__(self, source: Any, tokenizer_config: Mapping | None = None, *,
                 add_bos: bool | None = None):
        tk = _import_tokenizers()
        self._source_name = "tokenizer.json"
        if isinstance(source, tk.Tokenizer):
            self._tok = source
        elif isinstance(source, (bytes, bytearray, memoryview)):
            self._tok = self._from_json(bytes(source), "tokenizer.json (bytes)")
        elif isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            if os.path.isdir(path):
                path = os.path.join(path, "tokenizer.json")
            with open(path, "rb") as f:
                data = f.read()
            self._source_name = path
            self._tok = self._from_json(data, path)
        else:
            raise TypeError(
                "Tokenizer: source must be tokenizer.json bytes, a path or a "
                f"tokenizers.Tokenizer, got {type(source).__name__}")

        if tokenizer_config is not None and not isinstance(tokenizer_config, Mapping):
            raise ConfigError(
                f"tokenizer_config: expected a JSON object, got {type(tokenizer_config).__name__}")
        cfg = dict(tokenizer_config or {})
        self.tokenizer_config = cfg
        n = self.vocab_size

        specials = self._special_tokens()
        # BOS: what the post-processor prepends, else a conventional name, else the bundle.
        plain = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        self._pp_bos = None
        if len(full) > len(plain) and full[1:1 + len(plain)] == plain:
            self._pp_bos = full[0]
        bos = self._pp_bos
        if bos is None:
            bos = next((specials[t] for t in _BOS_NAMES if t in specials), None)
        if bos is None and cfg.get("bos_token_id") is not None:
            bos = _check_id("bos_token_id", cfg["bos_token_id"], n)
        self.bos_token_id: int | None = bos
        self.add_bos: bool = bool(self._pp_bos is not None) if add_bos is None else bool(add_bos)
        if self.add_bos and self.bos_token_id is None:
            raise ConfigError("Tokenizer: add_bos=True but the tokenizer has no BOS token")

        # EOS / stop set.
        own_eos = next((specials[t] for t in _EOS_NAMES if t in specials), None)
        cfg_eos = cfg.get("eos_token_ids", [])
        if cfg_eos is None:
            cfg_eos = []
        if not isinstance(cfg_eos, (list, tuple)):
            raise ConfigError(
                f"tokenizer_config.eos_token_ids: expected a list of ids, got {cfg_eos!r}")
        cfg_eos = [_check_id(f"eos_token_ids[{i}]", v, n) for i, v in enumerate(cfg_eos)]
        stop: list[int] = []
        for i in [own_eos, self.token_to_id(_IM_END), *cfg_eos]:
            if i is not None and i not in stop:
                stop.append(i)
        self.eos_token_ids: tuple[int, ...] = tuple(stop)
        self._eos_set = frozenset(stop)
        # The id a template's `eos_token` names: the bundle's first, else the tokenizer's.
        self.eos_token_id: int | None = cfg_eos[0] if cfg_eos else (
            own_eos if own_eos is not None else (stop[0] if stop else None))
        self.byte_fallback_ids: frozenset[int] = self._find_byte_fallback_ids()
        pad = cfg.get("pad_token_id")
        self.pad_token_id: int | None = None if pad is None else _check_id("pad_token_id", pad, n)

    # -- construction ---------------------------------------------------------------
    @staticmethod
    def _from_json(data: bytes, where: str):
        tk = _import_tokenizers()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"{where}: not a valid JSON document: {e}") from None
        try:
            return tk.Tokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 -- tokenizers raises bare Exceptions
            try:
                json.loads(text)
            except json.JSONDecodeError as je:
                raise FormatError(f"{where}: not a valid JSON document: {je}") from None
            raise FormatError(f"{where}: not a tokenizers tokenizer.json: {e}") from None

    def _find_byte_fallback_ids(self) -> frozenset[int]:
        """Ids of the <0xNN> tokens when the decoder has a ByteFallback step, else {}."""
        if self._tok.decoder is None:
            return frozenset()
        try:   # the decoder's own JSON: small, unlike the whole tokenizer's
            dec = json.loads(self._tok.decoder.__getstate__())
        except (AttributeError, TypeError, ValueError):  # pragma: no cover - older tokenizers
            dec = json.loads(self._tok.to_str()).get("decoder")

        def has_fallback(node) -> bool:
            if isinstance(node, dict):
                return node.get("type") == "ByteFallback" or any(
                    has_fallback(v) for v in node.values())
            if isinstance(node, list):
                return any(has_fallback(v) for v in node)
            return False

        if not has_fallback(dec):
            return frozenset()
        ids = (self._tok.token_to_id(f"<0x{b:02X}>") for b in range(256))
        return frozenset(i for i in ids if i is not None)

    @classmethod
    def from_file(cls, path, tokenizer_config: Mapping | None = None, **kw) -> Tokenizer:
        return cls(os.fspath(path), tokenizer_config, **kw)

    @classmethod
    def from_bytes(cls, data: bytes, tokenizer_config: Mapping | None = None,
                   **kw) -> Tokenizer:
        return cls(bytes(data), tokenizer_config, **kw)

    @classmethod
    def from_cmf(cls, cmf_file, *, bytes_fallback: bool = False, **kw) -> Tokenizer:
        """From an open CMF file: its vocab section, else a sidecar tokenizer.json next
        to the file, else (only with `bytes_fallback=True`, upstream's last resort)
        the 256-token byte tokenizer of `Tokenizer.bytes_only()`."""
        data = cmf_file.tokenizer_json()
        cfg = getattr(cmf_file, "tokenizer_config", None)
        if data is not None:
            return cls(data, cfg, **kw)
        side = os.path.join(os.path.dirname(os.path.abspath(cmf_file.path)), "tokenizer.json")
        if os.path.exists(side):
            return cls(side, cfg, **kw)
        if bytes_fallback:
            return cls.bytes_only(cfg, **kw)
        raise FormatError(
            f"{cmf_file.path}: no tokenizer (no vocab section and no sidecar {side})")

    @classmethod
    def bytes_only(cls, tokenizer_config: Mapping | None = None, **kw) -> Tokenizer:
        """A byte-level tokenizer without merges: token id = UTF-8 byte value (0..255)."""
        tk = _import_tokenizers()
        vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
        tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        return cls(tok, tokenizer_config, **kw)

    # -- vocabulary -----------------------------------------------------------------
    @property
    def backend(self):
        """The underlying `tokenizers.Tokenizer`."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    def _special_tokens(self) -> dict[str, int]:
        dec = self._tok.get_added_tokens_decoder()
        return {t.content: i for i, t in dec.items() if t.special}

    @property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset(self._special_tokens().values())

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_token_id is None else self.id_to_token(self.eos_token_id)

    @property
    def pad_token(self) -> str | None:
        return None if self.pad_token_id is None else self.id_to_token(self.pad_token_id)

    def is_eos(self, token_id: int) -> bool:
        return token_id in self._eos_set

    # -- encode / decode ------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (`<|im_start|>`)
        become their ids. With `add_special_tokens` the post-processor runs and BOS
        is put first when the tokenizer (or `add_bos`) asks for it -- never twice."""
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode: text must be str, got {type(text).__name__}")
        if not add_special_tokens:
            return self._ids(text, False)
        ids = self._ids(text, True)
        bos = self.bos_token_id
        if self._pp_bos is not None and len(ids) >= 2 and ids[0] == ids[1] == self._pp_bos:
            ids = ids[1:]                       # the text already began with BOS
        if self.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        elif not self.add_bos and self._pp_bos is not None and ids and ids[0] == self._pp_bos:
            # add_bos=False overrides a post-processor that prepends BOS; keep a BOS
            # the text itself spelled out.
            plain = self._ids(text, False)
            if not plain or plain[0] != self._pp_bos:
                ids = ids[1:]
        return ids

    def _ids(self, text: str, add_special_tokens: bool) -> list[int]:
        # `tokenizers` holds the GIL through `encode` but releases it in `encode_batch`:
        # a long text goes through the batch path, so other threads (a server's event
        # loop) keep running while it is tokenized. Same pipeline, same ids.
        if len(text) > _GIL_FREE_CHARS:
            return list(self._tok.encode_batch([text], add_special_tokens=add_special_tokens)
                        [0].ids)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts: Iterable[str],
                     add_special_tokens: bool = True) -> list[list[int]]:
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`. Incomplete UTF-8 sequences decode to U+FFFD, as in HF."""
        ids = [int(i) for i in ids]
        n = self.vocab_size
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"Tokenizer.decode: id {i} is outside the vocabulary [0, {n})")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def stream_decoder(self, skip_special_tokens: bool = False,
                       prefix_ids: Iterable[int] = ()) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens, prefix_ids=prefix_ids)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, "
                f"eos_ids={list(self.eos_token_ids)}, add_bos={self.add_bos})")


class StreamDecoder:
    """Incremental detokeniser: `feed(id)` returns the text that id completes.

    Pieces never split a UTF-8 character: while the decoded window ends in an
    incomplete sequence (U+FFFD at the end) nothing is emitted. `flush()` returns
    whatever is still held (an incomplete tail as U+FFFD, exactly like `decode`).
    For the tokenizers in use (byte-level BPE, SentencePiece byte-fallback)
    ``"".join(pieces) + flush() == tokenizer.decode(ids)``.

    Byte fallback needs one more rule: HF's ByteFallback decoder validates a whole
    run of consecutive <0xNN> tokens at once and turns *every* byte of an invalid
    run into U+FFFD, so a later byte can change how earlier ones decode. Text is
    therefore held while the last id is a byte token (at most until the next
    non-byte token or `flush()`; a special token skipped by `skip_special_tokens`
    does not end a run, as in HF).

    How: decode a small window `ids[prefix:]` and emit what it adds over
    `ids[prefix:read]` (the text-generation-inference scheme); the window's leading
    tokens carry context such as a SentencePiece leading space. If a decoder ever
    makes the window's text disagree with its own prefix, the decoder switches to
    diffing the full decode (O(n) per id, correct for any decoder).

    `prefix_ids` (e.g. the tail of the prompt) give context and are not emitted:
    then the pieces add up to ``decode(prefix + ids)[len(decode(prefix)):]``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False,
                 prefix_ids: Iterable[int] = ()):
        self._tk = tokenizer
        self._skip = bool(skip_special_tokens)
        self._ids: list[int] = [int(i) for i in prefix_ids]
        self._start = len(self._ids)         # first id that is ours to emit
        self._prefix = 0
        self._read = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        self._full_mode = False
        self._base_text = self._prefix_text  # full-mode: text of prefix_ids
        self._emitted: list[str] = []
        self._emitted_len = 0
        self._byte_ids = tokenizer.byte_fallback_ids
        self._special_ids = tokenizer.special_token_ids if self._skip else frozenset()
        self._in_byte_run = False
        for i in self._ids:
            if self._byte_ids and not (self._skip and i in self._special_ids):
                self._in_byte_run = i in self._byte_ids

    def _decode(self, ids) -> str:
        return self._tk.decode(ids, skip_special_tokens=self._skip)

    @property
    def ids(self) -> list[int]:
        """The ids fed so far (without `prefix_ids`)."""
        return self._ids[self._start:]

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._emitted)

    def _emit(self, piece: str) -> str:
        if piece:
            self._emitted.append(piece)
            self._emitted_len += len(piece)
        return piece

    def feed(self, token_id: int) -> str:
        """Add one id; return the newly completed text ('' while a character is open)."""
        token_id = int(token_id)
        n = self._tk.vocab_size
        if not 0 <= token_id < n:
            raise ValueError(
                f"StreamDecoder.feed: id {token_id} is outside the vocabulary [0, {n})")
        self._ids.append(token_id)
        if self._byte_ids:
            if not (self._skip and token_id in self._special_ids):   # skipped: run goes on
                self._in_byte_run = token_id in self._byte_ids
            if self._in_byte_run:
                return ""                      # the byte run may still grow (see above)
        if self._full_mode:
            return self._feed_full(final=False)
        new_text = self._decode(self._ids[self._prefix:])
        if len(new_text) <= len(self._prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        if not new_text.startswith(self._prefix_text):
            self._full_mode = True
            return self._feed_full(final=False)
        piece = new_text[len(self._prefix_text):]
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix:self._read])
        return self._emit(piece)

    def feed_many(self, ids: Iterable[int]) -> str:
        return "".join(self.feed(i) for i in ids)

    def _feed_full(self, final: bool) -> str:
        full = self._decode(self._ids)
        ours = full.removeprefix(self._base_text)
        if not final and ours.endswith(_REPLACEMENT):
            return ""
        if len(ours) <= self._emitted_len:
            return ""
        return self._emit(ours[self._emitted_len:])

    def flush(self) -> str:
        """Emit what is held back (call once generation has ended)."""
        if self._full_mode:
            return self._feed_full(final=True)
        if self._read == len(self._ids):
            return ""
        new_text = self._decode(self._ids[self._prefix:])
        if len(new_text) <= len(self._prefix_text):
            return ""
        if not new_text.startswith(self._prefix_text):
            self._full_mode = True
            return self._feed_full(final=True)
        piece = new_text[len(self._prefix_text):]
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix:self._read])
        return self._emit(piece)
