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


def _fake_hub_serving(monkeypatch, repo: str, folder):
    """huggingface_hub's listing and snapshot download answering `repo` from `folder`."""
    import shutil

    import huggingface_hub
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    monkeypatch.setattr(huggingface_hub, "list_repo_files",
                        lambda r, **k: files if r == repo else pytest.fail(r))

    def snapshot(r, *, local_dir, allow_patterns, **k):
        import fnmatch
        for f in files:
            if any(fnmatch.fnmatch(f, p) for p in allow_patterns):
                (local_dir / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / f, local_dir / f)
        return str(local_dir)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)


def test_commands_take_a_directory_and_a_hub_id(tmp_path, monkeypatch, capsys):
    """`cortiq info` and `cortiq run` on a checkpoint directory and on a (faked) Hub id:
    converted once into the cache, listed by `cortiq models`, removed by `cortiq rm`."""
    import json

    from cortiq.serve.cli import main
    pytest.importorskip("huggingface_hub")
    model = H.build("qwen3", seed=5)
    hf = H.save(model, tmp_path / "Qwen3-tiny")
    cache = tmp_path / "cache"
    monkeypatch.setenv("CORTIQ_CACHE", str(cache))
    assert main(["info", str(hf), "--quant", "f32", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "arch:" in out and f"hidden {model.config.hidden_size}," in out
    with cortiq.LLM.from_pretrained(hf, quant="f32", progress=False) as llm:
        want = llm.generate("hello", max_tokens=3, temperature=0, repetition_penalty=1.0)
    assert main(["run", str(hf), "--quant", "f32", "-p", "hello", "--raw", "--greedy",
                 "-n", "3"]) == 0
    assert capsys.readouterr().out == want + "\n"
    _fake_hub_serving(monkeypatch, "tiny-org/Qwen3-tiny", hf)
    assert main(["run", "tiny-org/Qwen3-tiny", "--quant", "f32", "-p", "hello", "--raw",
                 "--greedy", "-n", "3", "--no-progress"]) == 0
    assert capsys.readouterr().out == want + "\n"
    assert main(["models", "--json"]) == 0
    rows = {(m["source_kind"], m["format"]): m for m in
            json.loads(capsys.readouterr().out)["models"]}
    assert set(rows) == {("dir", "cmf"), ("hub", "cmf"), ("hub", "safetensors")}
    assert rows[("hub", "cmf")]["source"] == "tiny-org/Qwen3-tiny"
    assert rows[("dir", "cmf")]["quant"] == "f32"
    assert main(["rm", rows[("hub", "cmf")]["name"], rows[("hub", "safetensors")]["name"]]) == 0
    capsys.readouterr()
    assert main(["models", "--json"]) == 0
    assert [m["source_kind"] for m in json.loads(capsys.readouterr().out)["models"]] == ["dir"]
    assert (hf / "config.json").is_file()                  # the source is never touched
