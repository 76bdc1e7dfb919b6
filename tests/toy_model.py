"""A deterministic toy language model implementing cortiq's model protocol, and CMF
files for it (with a trained tokenizer and a chat bundle), for the runtime tests.

The toy is a small recurrent net, so its logits depend on the whole prefix (a reused
prefix that was wrong would show):  h_t = tanh(A h_{t-1} + E[id_t] + p_t),
logits_t = W h_t · scale. Its state is the list of hidden states, so rollback is
exact at any position. numpy's matmul releases the GIL, like cortiq's kernels.
"""
from __future__ import annotations

import base64
import os
import sys
import threading
import time

import numpy as np

import cortiq.models
from cortiq import cmf
from cortiq.models.base import Capabilities, ModelBase

sys.path.insert(0, os.path.dirname(__file__))
from reference import hf_tiny

HIDDEN = 32
ARCH = "toy"
EMBED = "model.embed_tokens.weight"
HEAD = "lm_head.weight"
MIX = "toy.mix"
CHAT_TEMPLATE = hf_tiny.CHATML


class ToyModel(ModelBase):
    arch = ARCH

    def __init__(self, cf, *, scale: float = 4.0, max_seq_len: int | None = None,
                 delay: float | None = None):
        self.E = np.ascontiguousarray(cf.tensor(EMBED), np.float32)      # [vocab, hidden]
        self.A = np.ascontiguousarray(cf.tensor(MIX), np.float32)        # [hidden, hidden]
        self.W = np.ascontiguousarray(cf.tensor(HEAD), np.float32)       # [vocab, hidden]
        self.vocab = self.E.shape[0]
        self.hidden = self.E.shape[1]
        self.scale = np.float32(scale)
        self.capabilities = Capabilities(rollback=True, max_seq_len=max_seq_len)
        # seconds slept per forward call (slow enough to cancel in the server tests)
        self.delay = float(os.environ.get("CORTIQ_TOY_DELAY", "0")) if delay is None else delay
        self.forward_tokens = 0          # tokens run, over all sessions (for the tests)
        self._count_lock = threading.Lock()

    def new_state(self):
        return {"h": [np.zeros(self.hidden, np.float32)]}

    def _pos(self, t):
        k = np.arange(self.hidden, dtype=np.float32)
        return np.sin(np.float32(t + 1) * (k + 1) * np.float32(0.37)).astype(np.float32) * 0.1

    def forward_batch(self, states, ids_list, wants, prompts):
        return [self._run(st, ids, want) for st, ids, want in zip(states, ids_list, wants)]

    def _run(self, state, ids, want):
        hs = state["h"]
        out = []
        for i in np.asarray(ids, np.int64).ravel():
            h = np.tanh(self.A @ hs[-1] + self.E[int(i)] + self._pos(len(hs) - 1))
            hs.append(h.astype(np.float32))
            if want == "all":
                out.append(self.W @ h * self.scale)
        with self._count_lock:
            self.forward_tokens += len(ids)
        if self.delay:
            time.sleep(self.delay)
        if want == "none":
            return None
        if want == "last":
            return (self.W @ hs[-1] * self.scale).astype(np.float32)
        return np.stack(out).astype(np.float32)

    def can_rollback(self, state, n):
        return n < len(state["h"])

    def rollback(self, state, n):
        del state["h"][n + 1:]


class ToyTaskModel(ToyModel):
    """A toy that takes `task` (stands in for an MoE model) and `skill`."""

    def __init__(self, cf, *, task=None, skill=None, **kw):
        super().__init__(cf, **kw)
        self.task = task
        self.skill = skill


def register():
    cortiq.models.register(ARCH, ToyModel)
    cortiq.models.register("toytask", ToyTaskModel)


def tokenizer_json(vocab: int = 300) -> bytes:
    return hf_tiny.train_tokenizer(vocab).to_str().encode()


def random_tensors(vocab: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        EMBED: rng.standard_normal((vocab, HIDDEN)).astype(np.float32),
        MIX: (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32),
        HEAD: rng.standard_normal((vocab, HIDDEN)).astype(np.float32),
    }


def _f16_b64(a) -> str:
    return base64.b64encode(np.asarray(a, "<f2").tobytes()).decode()


def write_toy(path, *, arch_name: str = ARCH, seed: int = 0, skills: dict | None = None,
              selections: dict | None = None, template: str | None = CHAT_TEMPLATE,
              masks=None, max_pos: int = 4096, vocab_json: bytes | None = None,
              generation_defaults: dict | None = None) -> dict:
    """Write a toy CMF file (f32 tensors). `skills`: {id: {tensor name: array}} written
    as skill.{id}.{name}; `selections`: {id: (mean [h], basis [rank, h])}. Returns the
    tensors (plain names) so tests can compute expectations."""
    vocab_json = vocab_json or tokenizer_json()
    from tokenizers import Tokenizer
    n = Tokenizer.from_str(vocab_json.decode()).get_vocab_size(with_added_tokens=True)
    tensors = random_tensors(n, seed)
    items = list(tensors.items())
    records = []
    for sid, repl in (skills or {}).items():
        for name, arr in repl.items():
            items.append((f"skill.{sid}.{name}", np.asarray(arr, np.float32)))
        rec = {"id": sid, "name": sid}
        if selections and sid in selections:
            mean, basis = selections[sid]
            basis = np.atleast_2d(basis)
            rec["selection"] = {"metric": "mse", "phi_layer": 0, "mean": _f16_b64(mean),
                                "basis": _f16_b64(basis.ravel()), "rank": int(basis.shape[0])}
        records.append(rec)
    arch = {"arch_name": arch_name, "hidden_size": HIDDEN, "intermediate_size": HIDDEN,
            "num_layers": 1, "num_attention_heads": 1, "num_kv_heads": 1,
            "head_dim": HIDDEN, "vocab_size": n, "layer_types": ["FullAttention"],
            "rms_norm_eps": 1e-6, "max_position_embeddings": max_pos}
    bundle = {"eos_token_ids": [hf_tiny.SPECIALS.index("<|im_end|>")]}
    if template is not None:
        bundle["chat_template"] = template
    if generation_defaults is not None:
        bundle["generation_defaults"] = generation_defaults
    cmf.write(path, items, arch=arch, quant="f32", tokenizer_json=vocab_json,
              tokenizer_config=bundle, skills=records, masks=masks, progress=False)
    return tensors
