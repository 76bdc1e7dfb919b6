"""Load the values a GGUF file holds into a transformers model (tests, benchmarks).

``load_dequantized(model, path)`` decodes every tensor with the ``gguf`` package
(independently of cortiq's reader), puts the q/k rows of a ``llama``-architecture file
back in HF's order and loads the result into `model`, so the model's float32 forward is
the reference for an engine that runs the same file.
"""
from __future__ import annotations

import numpy as np


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order -> HF's (the inverse of ``gguf_llama.permute``)."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def load_dequantized(model, path) -> dict:
    """Load the dequantized tensors of GGUF `path` into HF `model` (in place) and return
    {ggml tensor name: GGML type name} of what the file held."""
    import gguf
    import torch

    from .gguf_llama import ggml_name
    reader = gguf.GGUFReader(str(path))
    cfg = model.config
    heads = {"q": cfg.num_attention_heads, "k": cfg.num_key_value_heads}
    to_hf = {ggml_name(n): n for n in model.state_dict() if not n.endswith("inv_freq")}
    permuted = reader.fields["general.architecture"].contents() == "llama"
    state, kinds = {}, {}
    for t in reader.tensors:
        kinds[t.name] = t.tensor_type.name
        if t.name not in to_hf:
            continue
        hf = to_hf[t.name]
        a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        a = a.reshape(tuple(reversed([int(d) for d in t.shape])))
        proj = hf.split(".")[-2] if "self_attn" in hf else ""
        if permuted and proj in ("q_proj", "k_proj"):
            a = unpermute(a, heads[proj[0]])
        state[hf] = torch.from_numpy(np.array(a, np.float32))       # a writable copy
    missing = sorted(set(to_hf) - set(kinds) - {"output.weight"})
    if missing:
        raise KeyError(f"{path}: no tensor {', '.join(missing)}")
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return kinds
