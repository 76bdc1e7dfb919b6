"""`cortiq import-gguf`: GGUF files written with the `gguf` package from tiny transformers
checkpoints open in cortiq and match.

* F32 / F16 tensors: values exact, logits within 1e-4 of HF (F16: HF on the f16 values).
* Q4_0: re-packed, not re-quantized: the CMF tensor decodes to exactly gguf's values.
* Q8_0: re-quantized to q8_row (no per-32 int8 layout in CMF): within a q8_row step of
  the Q8_0 values; logits within 1e-3 of HF on the values cortiq reads.
* Llama's q/k rows come back from llama.cpp's permuted order (a wrong un-permute shows
  as a logit mismatch in the llama cases).
* Tokenizers: a byte-level BPE (gpt2) vocabulary reproduces the source tokenizer's ids;
  a SentencePiece (llama) vocabulary tokenizes by its scores with byte fallback.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import optional

gguf = optional.need("extras", "gguf")
torch, transformers = optional.need("torch", "torch", "transformers")
from reference import gguf_llama as G  # noqa: E402
from reference import hf_llama as H  # noqa: E402
from reference import hf_tiny  # noqa: E402

import cortiq  # noqa: E402
import cortiq.cmf  # noqa: E402
from cortiq.convert.gguf_import import import_gguf  # noqa: E402
from cortiq.gguf.llama_meta import Meta, tokenizer_from_gguf, unpermute_rows  # noqa: E402
from cortiq.errors import ConfigError, FormatError  # noqa: E402

T = gguf.GGMLQuantizationType
N_TOK = 24


def _state(model):
    return {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()
            if not k.endswith("inv_freq")}


def _diff(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max())


def _tokenizer(vocab):
    tok = hf_tiny.train_tokenizer(vocab)
    tokens, types, merges = G.gpt2_vocab(tok.to_str(), vocab)
    return tok, {"model": "gpt2", "pre": "qwen2", "tokens": tokens, "types": types,
                 "merges": merges, "eos": tokens.index("<|im_end|>"), "add_bos": False}


OVER = G.CASE_OVERRIDES


def _write(tmp_path, case, types, name="m.gguf"):
    return G.write_case(tmp_path, case, types, name)


def _hf_on(case, f, **sizes):
    """HF with exactly the weights the CMF file holds."""
    sd = {n: torch.from_numpy(np.ascontiguousarray(f.tensor(n), np.float32).reshape(
        tuple(f.tensors[n].shape))) for n in f.tensors}
    m = H.build(case, seed=0, **{**OVER.get(case, {}), **sizes})
    m.load_state_dict(sd, strict=False)
    m.tie_weights()
    return m


@pytest.mark.parametrize("case,kind", [("llama3", T.F32), ("qwen2", T.F16), ("qwen3", T.F32),
                                       ("llama_tied_bias", T.F32)])
def test_float_round_trip(tmp_path, case, kind):
    model, arch, state, tok, path = _write(tmp_path, case, lambda n, a: kind)
    out = tmp_path / "m.cmf"
    import_gguf(path, out, progress=False)
    ids = H.sequence(model.config.vocab_size, N_TOK, seed=9)
    with cortiq.cmf.open(out) as f:
        got_arch = dict(f.arch)
        for k in ("arch_name", "num_layers", "head_dim", "num_kv_heads", "tie_word_embeddings"):
            assert got_arch[k] == arch[k], k
        if "rope_freq_factors" in arch:
            np.testing.assert_allclose(got_arch["rope_freq_factors"], arch["rope_freq_factors"],
                                       rtol=1e-6)
        q = f.tensor("model.layers.1.self_attn.q_proj.weight").reshape(
            state["model.layers.1.self_attn.q_proj.weight"].shape)
        want = state["model.layers.1.self_attn.q_proj.weight"]
        if kind == T.F16:
            want = want.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(q, want)       # un-permuted, values exact
        ref = H.full_logits(_hf_on(case, f) if kind == T.F16 else model, ids)
    with cortiq.LLM(out) as llm:
        got = llm.session().feed(ids, want="all")
        assert _diff(got, ref) <= 1e-4
        text = "the quick brown fox jumps over the lazy dog"
        assert llm.tokenize(text) == tok.encode(text).ids
        assert llm.detokenize(llm.tokenize(text)) == text
        assert llm.apply_chat_template([{"role": "user", "content": "hi"}]).startswith(
            "<|im_start|>user\nhi<|im_end|>")
        assert tok.token_to_id("<|im_end|>") in llm.tokenizer.eos_token_ids


@pytest.mark.parametrize("case", ["llama3", "qwen2"])
def test_q4_0_and_q8_0_keep_their_bytes(tmp_path, case):
    """Q4_0 and Q8_0 tensors are stored as CMF's q4_0 / q8_0 (the GGUF's blocks, q/k rows
    moved whole): the same values, and logits of float32 arithmetic on them."""
    def types(name, a):
        return T.Q4_0 if "mlp" in name or "k_proj" in name else (
            T.Q8_0 if a.ndim == 2 else T.F32)
    model, arch, _, _tok, path = _write(tmp_path, case, types)
    reader = gguf.GGUFReader(str(path))
    src = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    out = tmp_path / "m.cmf"
    import_gguf(path, out, progress=False)
    ids = H.sequence(model.config.vocab_size, N_TOK, seed=9)
    with cortiq.cmf.open(out) as f:
        assert f.tensors["model.layers.0.mlp.up_proj.weight"].dtype == "q4_0"
        assert f.tensors["model.layers.0.self_attn.v_proj.weight"].dtype == "q8_0"
        up = f.tensor("model.layers.0.mlp.up_proj.weight")
        np.testing.assert_array_equal(up.reshape(src["blk.0.ffn_up.weight"].shape),
                                      src["blk.0.ffn_up.weight"])
        k = f.tensor("model.layers.1.self_attn.k_proj.weight")
        kk = src["blk.1.attn_k.weight"]
        if arch["arch_name"] == "llama":
            kk = unpermute_rows(kk, arch["num_kv_heads"])
        np.testing.assert_array_equal(k, kk.reshape(k.shape))
        v = f.tensor("model.layers.0.self_attn.v_proj.weight")
        np.testing.assert_array_equal(v, src["blk.0.attn_v.weight"].reshape(v.shape))
        ref = H.full_logits(_hf_on(case, f), ids)
    with cortiq.LLM(out, precision="exact") as llm:  # against float32 arithmetic
        got = llm.session().feed(ids, want="all")
    assert _diff(got, ref) <= 1e-4


def test_f32_option_and_k_quant_warning(tmp_path):
    _model, _arch, _, _tok, path = _write(
        tmp_path, "qwen3", lambda n, a: T.Q8_0 if "mlp" in n else T.F32)
    out = tmp_path / "exact.cmf"
    import_gguf(path, out, quant="f32", progress=False)
    reader = gguf.GGUFReader(str(path))
    src = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    with cortiq.cmf.open(out) as f:
        assert f.tensors["model.layers.0.mlp.down_proj.weight"].dtype == "f32"
        np.testing.assert_array_equal(f.tensor("model.layers.0.mlp.down_proj.weight").reshape(
            src["blk.0.ffn_down.weight"].shape), src["blk.0.ffn_down.weight"])
    # a type with no CMF layout (IQ2_XXS: random blocks, the gguf package decodes them):
    # dequantized, re-quantized to q8_row, with a warning naming it
    def iq2(n, a):
        if a.ndim != 2:
            return T.F32
        return T.IQ2_XXS if "mlp" in n and a.shape[1] % 256 == 0 else T.F16
    m, _arch, _st, _tok, p = G.write_case(tmp_path, "qwen3", iq2, name="k.gguf",
                                         hidden_size=256, intermediate_size=512)
    with pytest.warns(RuntimeWarning, match="IQ2_XXS"):
        import_gguf(p, tmp_path / "k.cmf", progress=False)
    ids = H.sequence(m.config.vocab_size, 12, seed=1)
    iq = {t.name: gguf.quants.dequantize(t.data, t.tensor_type)
          for t in gguf.GGUFReader(str(p)).tensors}["blk.1.ffn_gate.weight"]
    with cortiq.cmf.open(tmp_path / "k.cmf") as f:
        assert f.tensors["model.layers.1.mlp.gate_proj.weight"].dtype == "q8_row"
        got = f.tensor("model.layers.1.mlp.gate_proj.weight").reshape(iq.shape)
        step = np.abs(iq).max(axis=1, keepdims=True) / 127
        assert (np.abs(got - iq) <= 0.5 * step * (1 + 1e-3) + 1e-7).all()
        ref = H.full_logits(_hf_on("qwen3", f, hidden_size=256, intermediate_size=512), ids)
    with cortiq.LLM(tmp_path / "k.cmf", precision="exact") as llm:
        assert _diff(llm.session().feed(ids, want="all"), ref) <= 1e-3


def test_cli_import_gguf(tmp_path):
    from cortiq.serve.cli import main
    _model, _arch, _, _tok, path = _write(tmp_path, "qwen3", lambda n, a: T.F32)
    assert main(["import-gguf", str(path), str(tmp_path / "c.cmf"), "--quiet"]) == 0
    assert cortiq.LLM(tmp_path / "c.cmf").arch == "qwen3"
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    assert main(["import-gguf", str(tmp_path / "bad.gguf"), str(tmp_path / "d.cmf")]) == 1
    assert not (tmp_path / "d.cmf").exists()


def test_refusals(tmp_path):
    import gguf as g
    p = tmp_path / "gpt.gguf"
    w = g.GGUFWriter(str(p), "gptneox")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConfigError, match="general.architecture"):
        import_gguf(p, tmp_path / "x.cmf", progress=False)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(FormatError):
        import_gguf(tmp_path / "junk.gguf", tmp_path / "y.cmf", progress=False)
    assert not (tmp_path / "x.cmf").exists() and not (tmp_path / "y.cmf").exists()


def test_sentencepiece_vocabulary():
    """A llama (SentencePiece) vocabulary: pieces merge by score, unknown bytes fall back
    to <0xNN> tokens, BOS is prepended, and decoding gives the text back."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = ["\u2581", "t", "h", "e", "c", "a", "\u2581t", "he", "\u2581the", "at", "\u2581c",
             "\u2581cat"]
    scores = [0.0] * len(pieces) + [-float(i) for i in range(len(words))]
    # "▁the" and "▁cat" rank high (small negative scores); give them the best scores
    best = {"\u2581the": 10.0, "\u2581cat": 9.0, "he": 8.0, "\u2581t": 7.0, "at": 6.0,
            "\u2581c": 5.0}
    scores = [0.0] * len(pieces) + [best.get(w, -1.0) for w in words]
    tokens = pieces + words
    meta = Meta({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                 "tokenizer.ggml.scores": scores,
                 "tokenizer.ggml.token_type": types + [1] * len(words),
                 "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2})
    doc, bundle = tokenizer_from_gguf(meta)
    from tokenizers import Tokenizer
    t = Tokenizer.from_str(doc.decode())
    ids = t.encode("the cat!").ids
    assert [tokens[i] for i in ids] == ["<s>", "\u2581the", "\u2581cat", "<0x21>"]
    assert t.decode(ids, skip_special_tokens=True) == "the cat!"
    assert bundle["eos_token_ids"] == [2] and bundle["bos_token_id"] == 1


def test_from_pretrained_takes_a_gguf_file(tmp_path):
    model, _arch, _, _tok, path = _write(tmp_path, "llama3", lambda n, a: T.F32)
    ids = H.sequence(model.config.vocab_size, 8, seed=2)
    with cortiq.LLM.from_pretrained(path, cache_dir=tmp_path / "cache") as llm:
        first = llm.path
        assert _diff(llm.session().feed(ids, want="all"), H.full_logits(model, ids)) <= 1e-4
    mtime = os.path.getmtime(first)
    with cortiq.LLM.from_pretrained(path, cache_dir=tmp_path / "cache") as llm:
        assert llm.path == first and os.path.getmtime(first) == mtime


def _k_mix(name, a):
    if a.ndim != 2 or a.shape[1] % 256:
        return T.F16 if a.ndim == 2 else T.F32
    return T.Q6_K if "down_proj" in name else (T.Q4_0 if "up_proj" in name else T.Q4_K)


@pytest.mark.parametrize("case", ["llama_tied_bias", "qwen3"])
def test_import_keeps_every_tensors_bytes(tmp_path, case):
    """Float tensors (and block tensors, where the CMF writer knows their dtype) are the
    GGUF's bytes, q/k rows moved whole into HF's order; the CMF file is no larger than
    the GGUF (+1 %) when every block type has its CMF dtype."""
    from cortiq.cmf import quant as Q
    from cortiq.gguf import open as gguf_open
    sizes = dict(hidden_size=256, intermediate_size=512)
    _m, arch, _st, _tok, path = G.write_case(tmp_path, case, _k_mix, **sizes)
    out = tmp_path / "m.cmf"
    with pytest.warns(RuntimeWarning) if "q4_k" not in Q.DTYPES else _no_warning():
        import_gguf(path, out, progress=False)
    reader = gguf.GGUFReader(str(path))
    src = {t.name: t for t in reader.tensors}
    kept = 0
    with gguf_open(path) as gf, cortiq.cmf.open(out) as f:
        for name, t in gf.tensors.items():
            got = f.tensors[name]
            want = np.asarray(src[t.gguf_name].data).view(np.uint8).reshape(t.shape[0], -1)
            values = gf.tensor(name).reshape(t.shape[0], -1)
            proj = name.split(".")[-2]
            if arch["arch_name"] == "llama" and proj in ("q_proj", "k_proj"):
                heads = arch["num_attention_heads"] if proj == "q_proj" else arch["num_kv_heads"]
                want, values = unpermute_rows(want, heads), unpermute_rows(values, heads)
            if t.dtype in ("f32", "f16", "bf16") or t.dtype in Q.DTYPES:
                assert got.dtype == t.dtype, name
                np.testing.assert_array_equal(f.raw(name), want.ravel(), err_msg=name)
                kept += 1
            elif t.dtype == "q4_0":                 # re-packed: the same values
                assert got.dtype == "q4_tiled"
                np.testing.assert_array_equal(f.tensor(name).reshape(values.shape), values)
        assert kept >= sum(1 for t in gf.tensors.values() if t.dtype in ("f32", "f16"))
        if all(t.dtype in Q.DTYPES for t in gf.tensors.values()):
            # the payloads are the GGUF's bytes, no more; the files differ by their fixed
            # parts (CMF's 4 KiB data alignment, 64-byte tensor alignment, header), which
            # a tiny model feels and a real one does not (benchmarks/bench_gguf.py)
            payload = sum(t.nbytes for t in f.tensors.values())
            assert payload == sum(int(t.n_bytes) for t in reader.tensors
                                  if t.name != "rope_freqs.weight")
            fixed = 64 * len(f.tensors) + 2 * 4096 + os.path.getsize(path) - payload
            assert os.path.getsize(out) <= 1.01 * os.path.getsize(path) + fixed


class _no_warning:
    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("error", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def test_import_size_with_exact_layouts(tmp_path):
    """F16 / F32 / Q4_0 files: every tensor kept (re-packed Q4_0 is the same size): the
    payloads add up to the GGUF's exactly, and the file (4 KiB-aligned big tensors, a
    tokenizer.json for the vocabulary) is within 1 % of the GGUF's size."""
    sizes = dict(hidden_size=512, intermediate_size=1536, vocab_size=512)
    _m, _arch, _st, _tok, path = G.write_case(
        tmp_path, "llama3", lambda n, a: T.Q4_0 if "mlp" in n else T.F16, **sizes)
    out = tmp_path / "m.cmf"
    import_gguf(path, out, progress=False)
    from cortiq.gguf import open as gguf_open
    with gguf_open(path) as gf, cortiq.cmf.open(out) as f:
        assert sum(t.nbytes for t in f.tensors.values()) == sum(
            t.nbytes for t in gf.tensors.values())
    assert os.path.getsize(out) / os.path.getsize(path) <= 1.01
