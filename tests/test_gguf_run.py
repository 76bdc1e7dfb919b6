"""GGUF files run in place (`cortiq.gguf`): `LLM("m.gguf")` and the CLI on a .gguf.

* Logits of the GGUF as it is equal transformers' float32 forward of the weights the
  file holds (dequantized, q/k rows in HF's order) within 1e-4, and the CMF-imported
  model's: Llama and Mistral files keep llama.cpp's permuted q/k rows and run with
  rope on interleaved pairs (a wrong pairing shows as a logit mismatch).
* The tokenizer and chat template come from the metadata.
* Files are opened by magic, not by extension; a file that is neither format is
  refused naming both.
"""
from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import optional

gguf = optional.need("extras", "gguf")
torch, transformers = optional.need("torch", "torch", "transformers")
from reference import gguf_llama as G  # noqa: E402
from reference import hf_llama as H  # noqa: E402
from reference.gguf_dequant import load_dequantized  # noqa: E402

import cortiq  # noqa: E402
from cortiq.convert.gguf_import import import_gguf  # noqa: E402
from cortiq.errors import FormatError  # noqa: E402

T = gguf.GGMLQuantizationType
N_TOK = 20


def _diff(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max())


def _hf_on_gguf(case, path, **over):
    """transformers with exactly the values the GGUF holds, q/k rows back in HF order
    (decoded by the gguf package, independently of cortiq's reader)."""
    m = H.build(case, seed=0, **{**G.CASE_OVERRIDES.get(case, {}), **over})
    load_dequantized(m, path)
    return m


def _mixed(name, a):
    """Q4_0 for the MLP, Q8_0 for attention, F16 for the embedding."""
    if "mlp" in name:
        return T.Q4_0
    if "self_attn" in name:
        return T.Q8_0
    return T.F16


@pytest.mark.parametrize("case,types", [
    ("llama3", lambda n, a: T.F32), ("mistral", lambda n, a: T.F32),
    ("llama_tied_bias", lambda n, a: T.F32), ("qwen3", lambda n, a: T.F16),
    ("qwen2", lambda n, a: T.F32), ("llama3", _mixed), ("qwen3", _mixed)])
def test_gguf_runs_as_it_is(tmp_path, case, types):
    model, arch, _state, _tok, path = G.write_case(tmp_path, case, types)
    ids = H.sequence(model.config.vocab_size, N_TOK, seed=9)
    ref = H.full_logits(_hf_on_gguf(case, path), ids)
    with cortiq.LLM(path, precision="exact") as llm:
        assert llm.file.arch.get("rope_interleaved", False) == (arch["arch_name"] in (
            "llama", "mistral"))
        got = llm.session().feed(ids, want="all")
        assert _diff(got, ref) <= 1e-4
        # one token at a time (the decode path) gives the same logits
        s = llm.session()
        step = np.stack([s.feed([i], want="last") for i in ids])
        assert _diff(step, ref) <= 1e-4
    out = tmp_path / "m.cmf"
    import_gguf(path, out, quant="f32" if types is _mixed else None, progress=False)
    with cortiq.LLM(out, precision="exact") as llm:
        assert _diff(llm.session().feed(ids, want="all"), got) <= 1e-4


def test_tokenizer_and_chat_template_from_metadata(tmp_path):
    _model, _arch, _st, tok, path = G.write_case(tmp_path, "qwen3", lambda n, a: T.F32)
    with cortiq.LLM(path) as llm:
        text = "the quick brown fox jumps over the lazy dog"
        assert llm.tokenize(text) == tok.encode(text).ids
        assert llm.detokenize(llm.tokenize(text)) == text
        assert llm.apply_chat_template([{"role": "user", "content": "hi"}]).startswith(
            "<|im_start|>user\nhi<|im_end|>")
        assert tok.token_to_id("<|im_end|>") in llm.tokenizer.eos_token_ids
        r = llm.create_completion("the quick", max_tokens=4, temperature=0)
        assert r["choices"][0]["text"] is not None


def test_opened_by_magic_not_by_name(tmp_path):
    model, _arch, _st, _tok, path = G.write_case(tmp_path, "llama3", lambda n, a: T.F32)
    odd = tmp_path / "weights.bin"
    shutil.copyfile(path, odd)
    ids = H.sequence(model.config.vocab_size, 6, seed=3)
    with cortiq.LLM(path) as a, cortiq.LLM(odd) as b:
        np.testing.assert_array_equal(a.session().feed(ids, want="all"),
                                      b.session().feed(ids, want="all"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(FormatError, match="neither a CMF file .* nor a GGUF file"):
        cortiq.LLM(junk)


def test_reading_never_modifies_the_file(tmp_path):
    _model, _arch, _st, _tok, path = G.write_case(tmp_path, "qwen3", _mixed)
    before, mtime = path.read_bytes(), os.path.getmtime(path)
    with cortiq.LLM(path) as llm:
        llm.session().feed([1, 2, 3], want="last")
        with pytest.raises(ValueError):
            llm.file.raw("model.embed_tokens.weight")[0] = 1   # a read-only view
    assert path.read_bytes() == before and os.path.getmtime(path) == mtime


def test_cli_run_info_verify_on_gguf(tmp_path, capsys):
    from cortiq.serve.cli import main
    _model, _arch, _st, _tok, path = G.write_case(tmp_path, "qwen3", _mixed)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "arch:        qwen3" in out and "GGUF v3" in out
    # per-type counts: 2 layers x (4 attention matrices Q8_0, 3 MLP matrices Q4_0)
    assert "Q8_0 8" in out and "Q4_0 6" in out
    assert main(["verify", str(path)]) == 0
    assert "no hashes" in capsys.readouterr().out
    assert main(["run", str(path), "-p", "the quick", "-n", "3", "--temperature", "0"]) == 0
    capsys.readouterr()
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    assert main(["info", str(tmp_path / "bad.gguf")]) == 1
    assert "GGUF" in capsys.readouterr().err


def _k_quants(name, a):
    """Q4_K_M-like: Q6_K for v/down, Q4_K for the other matrices whose rows are whole
    256-value super-blocks, IQ2_XXS for the gate (no CMF layout), F32 for the rest."""
    if a.ndim != 2 or a.shape[1] % 256:
        return T.F32
    if "gate_proj" in name:
        return T.IQ2_XXS
    return T.Q6_K if ("v_proj" in name or "down_proj" in name) else T.Q4_K


@pytest.mark.parametrize("case", ["llama3", "qwen3"])
def test_k_quant_file_runs_as_it_is(tmp_path, case):
    sizes = dict(hidden_size=256, intermediate_size=512)
    model, _arch, _st, _tok, path = G.write_case(tmp_path, case, _k_quants, **sizes)
    ids = H.sequence(model.config.vocab_size, 12, seed=5)
    ref = H.full_logits(_hf_on_gguf(case, path, **sizes), ids)
    with cortiq.LLM(path, precision="exact") as llm:
        kinds = {t.dtype for t in llm.file.tensors.values()}
        assert {"q4_k", "q6_k", "iq2_xxs"} <= kinds
        assert _diff(llm.session().feed(ids, want="all"), ref) <= 1e-4
