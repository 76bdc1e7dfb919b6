"""The model protocol: what the runtime (sessions, batching, the scheduler, embeddings,
saved state, `LLM`) may call on a model, and nothing else.

A model holds the weights of one file and serves many sequences; a sequence's state is
whatever `new_state` returns. Its one forward is `forward_batch`: the rows of several
sequences in one pass (one sequence is a batch of one), each sequence's ids either
prompt rows or generated tokens (`prompts`), so a row's arithmetic depends on its kind,
never on how the feed was cut or batched. What varies between architectures is one
`Capabilities` record, read, never probed.

`ModelBase` gives a model the derived calls (`forward`, `set_precision`,
`fingerprint`, `final_hidden`'s refusal) from the few it must write (`new_state`,
`forward_batch`, `can_rollback`, `rollback`, `matrices`).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError, CortiqError

WANTS = ("none", "last", "all")


@dataclass(frozen=True)
class Capabilities:
    """What a model can do, for the runtime to read.

    rollback: `rollback(state, n)` forgets positions >= n (in place when
        `can_rollback` says so; else the session re-reads the kept prefix).
    batch_unit: the scheduler feeds a prompt in pieces of this many rows (a model's
        own chunk, so the state is the one a straight run gives); None: in one piece.
    prefill_cap: at most this many prompt rows of one sequence per scheduler step
        (None: the scheduler's budget).
    tasks: the MoE routing tasks a `task` option may restrict the model to (empty:
        the model has no routing to restrict).
    far_field: the model summarises the far past in a fixed-size state (Dory's
        O(1) attention), so its memory per sequence does not grow with length.
    max_seq_len: the longest sequence the model's positions cover (None: no limit).
    greedy_chain: `greedy_chain(state, first)` yields the argmax tokens after `first`,
        each fed to the next pass on the model's device without its logits read back
        (`cortiq.runtime.chained`); the state then holds `first` and every token
        yielded but the last.
    """

    rollback: bool = False
    batch_unit: int | None = 1
    prefill_cap: int | None = None
    tasks: tuple[str, ...] = ()
    far_field: bool = False
    max_seq_len: int | None = None
    greedy_chain: bool = False


@runtime_checkable
class Model(Protocol):
    """A loaded model, as the runtime sees it."""

    arch: str
    vocab: int
    capabilities: Capabilities

    def new_state(self) -> Any: ...

    def forward_batch(self, states: Sequence[Any], ids_list: Sequence[np.ndarray],
                      wants: Sequence[str], prompts: Sequence[bool]) -> list: ...

    def forward(self, state: Any, ids, want: str = "last", prompt: bool | None = None): ...

    def can_rollback(self, state: Any, n: int) -> bool: ...

    def rollback(self, state: Any, n: int) -> None: ...

    def final_hidden(self, state: Any, ids) -> np.ndarray: ...

    def set_precision(self, precision) -> int: ...

    def fingerprint(self) -> bytes: ...


_MEMBERS = ("arch", "vocab", "capabilities", "new_state", "forward_batch", "forward",
            "can_rollback", "rollback", "final_hidden", "set_precision", "fingerprint")


def check_model(model) -> Model:
    """`model` itself when it implements the protocol; else a ConfigError naming what
    it lacks (a model handed to `LLM.from_model` or registered by a user)."""
    missing = [m for m in _MEMBERS if not hasattr(model, m)]
    if missing:
        raise ConfigError(f"{type(model).__name__} is not a cortiq model: it lacks "
                          f"{', '.join(missing)} (see cortiq.models.base.Model)")
    if not isinstance(model.capabilities, Capabilities):
        raise ConfigError(f"{type(model).__name__}.capabilities must be a "
                          f"cortiq.models.base.Capabilities, got {model.capabilities!r}")
    if model.capabilities.greedy_chain and not callable(getattr(model, "greedy_chain", None)):
        raise ConfigError(f"{type(model).__name__}: capabilities.greedy_chain is set but the "
                          "model has no greedy_chain(state, first) method")
    return model


def check_feed(ids, want: str, vocab: int) -> np.ndarray:
    """A forward's `ids` as a flat int64 array, after checking `want` and that every id
    is inside the vocabulary (ConfigError / ValueError naming the problem)."""
    if want not in WANTS:
        raise ConfigError(f"want must be one of {', '.join(WANTS)}, got {want!r}")
    a = np.asarray(ids, dtype=np.int64).ravel()
    # one id (a decode step) is checked as a Python int: the array test costs ten times more
    if a.size == 1 and 0 <= int(a[0]) < vocab:
        return a
    bad = (a < 0) | (a >= vocab)
    if bad.any():
        raise ValueError(f"token id {int(a[bad][0])} is outside the vocabulary [0, {vocab})")
    return a


def is_prompt(prompt, n: int) -> bool:
    """The `prompt` flag of a feed of n ids: as given, or (None) whether n > 1."""
    return n > 1 if prompt is None else bool(prompt)


def empty_result(want: str, vocab: int):
    """What a forward of no ids returns for `want` (the "last" of nothing is empty)."""
    if want == "none":
        return None
    return np.zeros((0, vocab) if want == "all" else 0, np.float32)


class ModelBase:
    """The calls every model derives from its own: subclasses set `arch`, `vocab`,
    `capabilities` and write `new_state`, `forward_batch`, `can_rollback`, `rollback`,
    `matrices` (and `final_hidden` when they can give hidden states). A model read
    from a CMF file sets `file`; one whose numbers depend on constructor options
    (loop counts, cache modes, ...) lists them in `options`, so that `fingerprint`
    tells two models of one file apart."""

    arch: str
    vocab: int
    capabilities: Capabilities = Capabilities()
    # written by every subclass (declared, not defined, so `check_model` still finds a
    # subclass that lacks it)
    forward_batch: Callable[..., list]
    #: the CMF file (or skill overlay of one) the weights were read from; None for a
    #: model built in memory
    file: Any = None
    #: the constructor options that change the model's numbers, by name
    options: Mapping[str, Any] = MappingProxyType({})

    def forward(self, state, ids, want: str = "last", prompt: bool | None = None):
        """One sequence's feed: `forward_batch` of one. want: "none" -> None, "last" ->
        [vocab], "all" -> [len(ids), vocab]; prompt: prompt rows (True) or generated
        tokens (False), None: prompt rows when there are several."""
        a = check_feed(ids, want, self.vocab)
        if a.size == 0:
            return empty_result(want, self.vocab)
        return self.forward_batch([state], [a], [want], [is_prompt(prompt, a.size)])[0]

    def can_rollback(self, state, n: int) -> bool:
        return False

    def rollback(self, state, n: int) -> None:
        raise CortiqError(f"{self.arch}: rollback is not supported; start a new session "
                          "instead")

    def final_hidden(self, state, ids) -> np.ndarray:
        raise ConfigError(f"embeddings: the {self.arch} model does not give hidden states")

    def matrices(self) -> list:
        """Every weight matrix (QTensor) the forward multiplies by, for `set_precision`
        (a model without cortiq matrices has none)."""
        return []

    def set_precision(self, precision) -> int:
        """Give every matrix the activation precision ("exact", "int8", "auto", or None:
        the process default). Returns how many matrices were set."""
        from ..kernels._config import check_precision
        check_precision(precision)
        mats = {id(m): m for m in (getattr(t, "qmat", t) for t in self.matrices())}
        for m in mats.values():
            m.precision = precision
        return len(mats)

    def fingerprint(self) -> bytes:
        """32 bytes naming the model's weights and numerics, which saved session states
        (`cortiq.runtime.state`) are checked against: its class, vocabulary, `options` and its
        file's architecture record and every tensor's name, type, shape and content
        hash (a model without a file of its own -- built in memory, or on a skill
        overlay, whose blended tensors have no content hash -- the object's identity
        instead)."""
        h = hashlib.sha256()
        cls = type(self)
        h.update(f"{cls.__module__}.{cls.__qualname__}|{self.vocab}|".encode())
        f = self.file
        if f is not None and isinstance(f.tensors, dict):
            h.update(json.dumps(f.arch, sort_keys=True, default=str).encode())
            for name in sorted(f.tensors):
                t = f.tensors[name]
                h.update(f"|{name}:{t.dtype}:{tuple(t.shape)}:{t.hash}".encode())
        else:
            h.update(f"object:{id(self)}".encode())
        for name, value in self.options.items():
            h.update(f"|{name}={value!r}".encode())
        return h.digest()
