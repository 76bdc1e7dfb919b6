"""Text embeddings from a generative model's final hidden state.

    vecs = llm.embed(["first text", "second"], pooling="mean")   # [2, hidden], float32

Each text is tokenized (with BOS as the tokenizer asks), run through the model in a
fresh state, and its final hidden states -- what the LM head reads, after the final
norm -- are pooled: "mean" averages every position, "last" takes the last token's
(the usual choice for causal models trained as embedders). The result is scaled to
unit L2 norm, so a dot product is a cosine similarity.

Every architecture cortiq runs offers `model.final_hidden(state, ids) -> [len(ids), hidden]`
(Dory, DeepSeek-V4, the Llama family); a model that gives no hidden states refuses
with a ConfigError (`cortiq.models.base.ModelBase.final_hidden`). `hidden_states` is
the one call that touches the model, so a batched scheduler can take its place.
"""
from __future__ import annotations

import base64
from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError, ModelError
from ..types import EmbeddingList

__all__ = ["ENCODING_FORMATS", "POOLINGS", "embed", "embedding_list", "hidden_states", "pool"]

POOLINGS = ("mean", "last")
ENCODING_FORMATS = ("float", "base64")


def hidden_states(model, ids: Sequence[int]) -> np.ndarray:
    """[len(ids), hidden] float32 final hidden states of `ids` on a fresh state."""
    h = np.asarray(model.final_hidden(model.new_state(), np.asarray(ids, dtype=np.int64)),
                   dtype=np.float32)
    if h.ndim != 2 or h.shape[0] != len(ids):
        raise ModelError(f"embeddings: model.final_hidden returned shape {h.shape} for "
                         f"{len(ids)} tokens")
    return h


def pool(h: np.ndarray, pooling: str) -> np.ndarray:
    """One unit-norm vector from hidden states [n, hidden]."""
    v = h.mean(axis=0, dtype=np.float64) if pooling == "mean" else h[-1].astype(np.float64)
    if not np.isfinite(v).all():
        raise ModelError("embeddings: the model produced non-finite hidden states -- the "
                         "file may be damaged: run cortiq verify")
    n = np.linalg.norm(v)
    return (v / n if n > 0 else v).astype(np.float32)


def embed(llm, texts, pooling: str = "mean") -> np.ndarray:
    """[len(texts), hidden] unit-norm float32 embeddings (a single string: [hidden]).
    `texts` may also hold token-id lists."""
    if pooling not in POOLINGS:
        raise ConfigError(f"pooling: expected one of {', '.join(POOLINGS)}, got {pooling!r}")
    single = isinstance(texts, str)
    items = [texts] if single else texts
    if isinstance(items, (bytes, bytearray)) or not isinstance(items, Sequence) or not items:
        raise ConfigError("embed: expected a string or a non-empty list of strings (or of "
                          "token-id lists)")
    out = []
    for i, t in enumerate(items):
        if isinstance(t, str) and not t:
            raise ConfigError(f"embed: input[{i}] is empty")
        try:
            ids = llm._prompt_ids(t)
        except ConfigError as e:
            raise ConfigError(f"embed: input[{i}]: {e}") from None
        model, _ = llm._model_for(ids)
        out.append(pool(hidden_states(model, ids), pooling))
    arr = np.stack(out)
    return arr[0] if single else arr


def embedding_list(vectors, prompt_tokens: int, model: str,
                   encoding_format: str = "float") -> EmbeddingList:
    """OpenAI's embeddings response for `vectors` ([n, hidden]): each vector as a list of
    floats, or with "base64" the base64 of its little-endian float32 bytes."""
    if encoding_format not in ENCODING_FORMATS:
        raise ConfigError(f"encoding_format: expected one of {', '.join(ENCODING_FORMATS)}, "
                          f"got {encoding_format!r}")
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
             if encoding_format == "base64" else [float(x) for x in v]}
            for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,  # type: ignore[typeddict-item]
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
