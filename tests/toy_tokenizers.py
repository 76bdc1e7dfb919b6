"""Tiny byte-level BPE tokenizers built in the tests (no files, no network): the 256
single-byte tokens of GPT-2's alphabet, a few multi-byte tokens after them, and one
special end-of-sequence token."""
from __future__ import annotations

import tokenizers as tk

from cortiq.text.tokenizer import Tokenizer


def gpt2_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (printable Latin-1 bytes map to
    themselves, the other 68 to U+0100 upwards in byte order), written from its
    definition rather than taken from cortiq.text.tokenizer."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def byte_level(merged: list[bytes], eos: str) -> Tokenizer:
    """Ids 0..255 the bytes, 256 + i the bytes of merged[i], then `eos` (special)."""
    alpha = gpt2_alphabet()
    vocab = {c: b for b, c in alpha.items()}
    for i, raw in enumerate(merged):
        vocab["".join(alpha[b] for b in raw)] = 256 + i
    t = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[]))
    t.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = tk.decoders.ByteLevel()
    t.add_special_tokens([eos])
    return Tokenizer(t)
