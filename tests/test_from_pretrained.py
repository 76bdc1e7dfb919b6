"""`LLM.from_pretrained`: a checkpoint directory converts once into the cache, opens from
the cache afterwards, converts again when the checkpoint changes; .cmf files open as
they are; a missing path without huggingface_hub is a ConfigError."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import optional

optional.need("torch", "torch", "transformers")
from reference import hf_llama as H  # noqa: E402

import cortiq  # noqa: E402
from cortiq import pretrained  # noqa: E402
from cortiq.errors import ConfigError  # noqa: E402


def test_converts_once_into_the_cache(tmp_path, monkeypatch):
    model = H.build("qwen3", seed=3)
    hf = H.save(model, tmp_path / "Qwen3-tiny")
    cache = tmp_path / "cache"
    ids = H.sequence(model.config.vocab_size, 10)
    ref = H.full_logits(model, ids)
    calls = []
    real = pretrained.resolve

    import cortiq.convert as conv
    orig = conv.from_hf
    monkeypatch.setattr(conv, "from_hf", lambda *a, **k: (calls.append(a), orig(*a, **k))[1])
    with cortiq.LLM.from_pretrained(hf, quant="f32", cache_dir=cache) as llm:
        assert np.abs(llm.session().feed(ids, want="all") - ref).max() <= 1e-4
        first = llm.path
    assert len(calls) == 1 and os.path.dirname(first) == str(cache)
    assert sorted(p.name for p in cache.iterdir() if ".tmp-" in p.name) == []
    with cortiq.LLM.from_pretrained(hf, quant="f32", cache_dir=cache) as llm:
        assert llm.path == first
    assert len(calls) == 1                                    # opened from the cache
    # another quant is another file; an edited checkpoint converts again
    assert real(hf, quant="q8_row", cache=cache) != real(hf, quant="f32", cache=cache)
    cfg = (hf / "tokenizer_config.json").read_text()
    (hf / "tokenizer_config.json").write_text(cfg.replace("<|im_end|>", "<|endoftext|>"))
    assert real(hf, quant="f32", cache=cache) != first
    # a CMF file opens as it is; the environment picks the default cache
    assert str(real(first)) == first
    monkeypatch.setenv("CORTIQ_CACHE", str(tmp_path / "env"))
    assert pretrained.cache_dir() == tmp_path / "env"


def test_missing_path_without_hub(tmp_path, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_hub(name, *a, **k):
        if name.startswith("huggingface_hub"):
            raise ImportError("no hub")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_hub)
    with pytest.raises(ConfigError, match="huggingface_hub"):
        cortiq.LLM.from_pretrained("some-org/some-model", cache_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="config.json"):
        cortiq.LLM.from_pretrained(tmp_path / "empty", cache_dir=tmp_path)
