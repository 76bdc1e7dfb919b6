"""Saved session states: `Session.save_state()` -> bytes, `LLM.load_state(bytes)` -> Session.

A state records what a session holds -- its token ids and the pieces they were fed in
(`Session` keeps both) -- and loading re-reads them in the same pieces, which gives
exactly the KV state a straight run gives (the rule `Session.rollback` already relies
on: Dory's last-loop cache depends on where chunks begin and end). The bytes are
small (4 bytes a token) and independent of the cache layout, so they stay valid
across cortiq versions that keep the model's numerics; the price is a prefill on load.

Layout (little-endian)::

    magic   8 bytes  b"CORTIQST"
    version u32      2 (1 is still read)
    model   32 bytes SHA-256 identity of the model (`model_identity`)
    length  u64      payload bytes
    payload          JSON {"ids": [...], "feeds": [[n, want, prompt], ...]}
    digest  32 bytes SHA-256 of everything before it

`prompt` (version 2) says whether the piece was prompt rows or generated tokens
(`Session.feed`); version 1 states, which lack it, are read with the rule a feed
without the flag follows (several ids: prompt rows). `load_state` refuses
(StateError, naming the reason) bytes that are truncated, damaged (digest), of an
unknown version, or saved on a different model.
"""
from __future__ import annotations

import hashlib
import json
import struct

from ..errors import CortiqError

__all__ = ["STATE_VERSION", "StateError", "model_identity", "pack", "unpack"]

MAGIC = b"CORTIQST"
STATE_VERSION = 2
_HEAD = struct.Struct("<8sI32sQ")
_DIGEST = 32
_WANTS = ("none", "last", "all")


class StateError(CortiqError):
    """Saved state bytes that cannot be loaded (damaged, truncated, another model)."""


def model_identity(model) -> bytes:
    """32 bytes naming a model's weights and numerics: its `fingerprint` (the model
    protocol, `cortiq.models.base`)."""
    return model.fingerprint()


def pack(model, ids, feeds) -> bytes:
    payload = json.dumps({"ids": list(ids), "feeds": [list(f) for f in feeds]},
                         separators=(",", ":")).encode()
    body = _HEAD.pack(MAGIC, STATE_VERSION, model_identity(model), len(payload)) + payload
    return body + hashlib.sha256(body).digest()


def unpack(model, data) -> tuple[list[int], list[tuple[int, str, bool]]]:
    """(ids, feeds) of saved bytes, checked against `model`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StateError(f"load_state: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEAD.size + _DIGEST:
        raise StateError(f"load_state: {len(data)} bytes is too short for a saved state "
                         "(truncated?)")
    magic, version, ident, n = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise StateError("load_state: not a cortiq session state (bad magic)")
    if version not in (1, STATE_VERSION):
        raise StateError(f"load_state: state format version {version}; this cortiq reads "
                         f"versions 1 and {STATE_VERSION}")
    if len(data) != _HEAD.size + n + _DIGEST:
        raise StateError(f"load_state: the state is {len(data)} bytes, its header says "
                         f"{_HEAD.size + n + _DIGEST} (truncated or damaged)")
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise StateError("load_state: the state's checksum does not match (damaged)")
    if ident != model_identity(model):
        raise StateError("load_state: the state was saved on a different model (its model "
                         "identity does not match this one's weights/options)")
    try:
        obj = json.loads(body[_HEAD.size:])
        ids = [int(i) for i in obj["ids"]]
        feeds = [(int(f[0]), str(f[1]), bool(f[2]) if version > 1 else int(f[0]) > 1)
                 for f in obj["feeds"] if len(f) == (3 if version > 1 else 2)]
        if len(feeds) != len(obj["feeds"]):
            raise ValueError("a feed of the wrong length")
    except (ValueError, KeyError, TypeError) as e:
        raise StateError(f"load_state: malformed payload: {e}") from None
    if sum(f[0] for f in feeds) != len(ids) or any(k <= 0 or w not in _WANTS
                                                   for k, w, _ in feeds):
        raise StateError("load_state: malformed payload: feeds do not cover the ids")
    if any(not 0 <= i < model.vocab for i in ids):
        raise StateError("load_state: a token id is outside the model's vocabulary")
    return ids, feeds
