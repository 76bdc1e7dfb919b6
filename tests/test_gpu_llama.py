"""The Llama family on the WebGPU path (cortiq.gpu.llama) against the CPU forward.

Small random files of each feature the family has (Qwen2 biases, Qwen3 q/k norms, a
Mistral window shorter than the sequence, a tied head, the interleaved rope pair order
of GGUF files, YaRN and per-frequency rope factors), in f32 and in the quantized
dtypes the GPU decodes. Runs on any adapter (Mesa's llvmpipe in CI); skips without
one unless CORTIQ_REQUIRE_GPU=1. Tolerances: docs/gpu.md.
"""
import warnings

import numpy as np
import pytest
from arrays import stable_seed
from batch_models import llama_tensors, tokenizer_json

from cortiq import cmf
from cortiq.errors import ConfigError

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _drop(tensors, *parts):
    return {k: v for k, v in tensors.items() if not any(p in k for p in parts)}


def _variant(name):
    """(tensors, arch) of one family member, small enough for llvmpipe."""
    if name == "wide_heads":             # head_dim over 256: two output lanes a thread
        t, arch = llama_tensors(hidden=64, ffn=96, layers=1, heads=2, kv=1, hd=288, seed=4)
        return t, dict(arch, layer_types=["FullAttention"], sliding_window=None)
    t, arch = llama_tensors(hidden=64, ffn=96, layers=2, heads=4, kv=2, hd=16, seed=3)
    if name == "qwen3":                  # biases, q/k norms, one sliding layer (window 7)
        return t, arch
    if name == "qwen2":                  # q/k/v biases, no norms, no window
        return _drop(t, "q_norm", "k_norm"), dict(arch, arch_name="qwen2", layer_types=None,
                                                  sliding_window=None)
    plain = _drop(t, "q_norm", "k_norm", ".bias")
    llama = dict(arch, arch_name="llama", layer_types=None, sliding_window=None)
    if name == "mistral":                # every layer slides, window 5 < the sequence
        return plain, dict(llama, arch_name="mistral", sliding_window=5,
                           layer_types=["SlidingAttention"] * 2)
    if name == "tied":
        return _drop(plain, "lm_head"), llama
    if name == "interleaved":            # a GGUF file's q/k row order
        return plain, dict(llama, rope_interleaved=True)
    if name == "yarn":
        return plain, dict(llama, yarn={"factor": 4.0, "original_max_position_embeddings": 8})
    if name == "freq_factors":
        return plain, dict(llama, rope_freq_factors=[1.0 + 0.5 * i for i in range(8)])
    if name == "mlp_bias":               # biases on every product
        rng = np.random.default_rng(5)
        extra = {}
        for i in range(2):
            p = f"model.layers.{i}"
            for n, size in (("self_attn.o_proj", 64), ("mlp.gate_proj", 96),
                            ("mlp.up_proj", 96), ("mlp.down_proj", 64)):
                extra[f"{p}.{n}.bias"] = (rng.standard_normal(size) * 0.2).astype(np.float32)
        return {**_drop(t, "q_norm", "k_norm"), **extra}, dict(llama, arch_name="qwen2")
    raise AssertionError(name)


_FILES: dict = {}


def _open(tmp_path_factory, name, quant="f32"):
    key = (name, quant)
    if key not in _FILES:
        t, arch = _variant(name)
        arch = {k: v for k, v in arch.items() if v is not None}
        path = tmp_path_factory.mktemp("gl") / f"{name}_{quant}.cmf"
        cmf.write(path, t, arch=arch, quant=quant, tokenizer_json=tokenizer_json(),
                  progress=False)
        _FILES[key] = cmf.open(str(path))
    return _FILES[key]


def _pair(dev, tmp_path_factory, name, quant="f32"):
    from cortiq.gpu import to_device
    from cortiq.models.llama import LlamaModel
    host = LlamaModel(_open(tmp_path_factory, name, quant))
    return host, to_device(host, dev)


VARIANTS = ["qwen3", "qwen2", "mistral", "tied", "interleaved", "yarn", "freq_factors",
            "mlp_bias", "wide_heads"]


@pytest.mark.parametrize("name", VARIANTS)
def test_logits_match_cpu(dev, tmp_path_factory, name):
    """A prompt's rows ("all"), then decode rows past the window, equal the host's."""
    host, g = _pair(dev, tmp_path_factory, name)
    assert type(g).__name__ == "GpuLlamaModel" and g.arch == host.arch
    ids = np.random.default_rng(stable_seed(name)).integers(0, host.vocab, 16)
    sc, sg = host.new_state(), g.new_state()
    a = host.forward(sc, ids[:12], "all")
    b = g.forward(sg, ids[:12], "all")
    assert b.shape == a.shape == (12, host.vocab)
    assert _rel(b, a) < 1e-3
    for i in ids[12:]:
        assert _rel(g.forward(sg, [int(i)]), host.forward(sc, [int(i)])) < 1e-3
    assert sg.pos == sc.pos == 16


@pytest.mark.parametrize("quant", ["q8_row", "q4_block"])
def test_quantized_weights_match_cpu(dev, tmp_path_factory, quant):
    host, g = _pair(dev, tmp_path_factory, "qwen3", quant)
    assert {m.dtype for m in g.mats} == {quant}
    ids = np.random.default_rng(7).integers(0, host.vocab, 10)
    sc, sg = host.new_state(), g.new_state()
    assert _rel(g.forward(sg, ids[:8], "all"), host.forward(sc, ids[:8], "all")) < 1e-3
    for i in ids[8:]:
        assert _rel(g.forward(sg, [int(i)]), host.forward(sc, [int(i)])) < 1e-3


def test_prompt_over_one_chunk_and_cache_growth(dev, tmp_path_factory, monkeypatch):
    """A prompt longer than a submission's chunk, into caches grown on the device."""
    from cortiq.gpu import llama as gl
    monkeypatch.setattr(gl, "KV_CAP0", 16)
    host, g = _pair(dev, tmp_path_factory, "mistral")
    ids = np.random.default_rng(8).integers(0, host.vocab, gl.CHUNK + 6)
    sc, sg = host.new_state(), g.new_state()
    assert _rel(g.forward(sg, ids, "all"), host.forward(sc, ids, "all")) < 1e-3
    assert sg.cap >= ids.size
    nxt = int(ids[0])
    assert _rel(g.forward(sg, [nxt]), host.forward(sc, [nxt])) < 1e-3


def test_keys_over_one_attention_block(dev, tmp_path_factory):
    """Rows attending more than the 256 keys an attention workgroup scores at once (the
    online softmax across blocks), in a prompt chunk and a decode row (split into ranges
    of several 32-key tiles)."""
    host, g = _pair(dev, tmp_path_factory, "qwen2")
    assert g.decode_splits(299) > 1     # the decode row's ranges hold over 32 keys each
    ids = np.random.default_rng(11).integers(0, host.vocab, 300)
    sc, sg = host.new_state(), g.new_state()
    host.forward(sc, ids[:280], "none")
    g.forward(sg, ids[:280], "none")
    assert _rel(g.forward(sg, ids[280:299], "all"), host.forward(sc, ids[280:299], "all")) < 1e-3
    assert _rel(g.forward(sg, ids[299:]), host.forward(sc, ids[299:])) < 1e-3


@pytest.mark.parametrize("name", ["qwen3", "interleaved"])
def test_decode_qk_fused_or_not(dev, tmp_path_factory, name):
    """Decode rows whose attention dispatch does llama_qk's work (the default) and rows
    with the llama_qk pass equal the host from position 0 on, through the window; the k/v
    rows the fused dispatch writes are the ones a later prompt chunk reads; the fused
    program has one dispatch fewer a layer."""
    from cortiq.gpu.llama import GpuLlamaModel
    host, fused = _pair(dev, tmp_path_factory, name)
    plain = GpuLlamaModel(host, dev, fuse_qk=False)
    assert fused.fuse_qk and not plain.fuse_qk
    ids = np.random.default_rng(stable_seed("qk", name)).integers(0, host.vocab, 14)
    sc, sf, sp = host.new_state(), fused.new_state(), plain.new_state()
    for i in ids[:11]:
        a = host.forward(sc, [int(i)])
        b = fused.forward(sf, [int(i)])
        assert _rel(b, a) < 1e-3
        assert _rel(b, plain.forward(sp, [int(i)])) < 1e-5
    assert _rel(fused.forward(sf, ids[11:], "all"), host.forward(sc, ids[11:], "all")) < 1e-3
    assert plain.dispatches_per_token - fused.dispatches_per_token == len(host.layers)


@pytest.mark.parametrize("name,most,fuse_qk", [("qwen3", 4, True), ("qwen3", 8, False),
                                               ("mistral", 2, True), ("wide_heads", 16, True)])
def test_split_decode_attention_matches_cpu(dev, tmp_path_factory, monkeypatch, name, most,
                                            fuse_qk):
    """Decode rows whose attention is split over key ranges (one range of 2 keys at
    least here) and merged in the O product equal the host and the unsplit model: GQA,
    biases and q/k norms (qwen3), windows shorter than the sequence (qwen3's layer 1,
    mistral), a head of 288 (wide_heads), with llama_qk fused or not, from positions with
    one range through several range counts, after a prompt chunk."""
    from cortiq.gpu import llama as gl
    monkeypatch.setattr(gl, "SPLIT_KEYS", 2)
    host, _ = _pair(dev, tmp_path_factory, name)
    split = gl.GpuLlamaModel(host, dev, fuse_qk=fuse_qk, attn_splits=most)
    plain = gl.GpuLlamaModel(host, dev, fuse_qk=fuse_qk, attn_splits=1)
    assert split.splits == most and plain.splits == 1
    ids = np.random.default_rng(stable_seed("split", name)).integers(0, host.vocab, 22)
    sc, ss, sp = host.new_state(), split.new_state(), plain.new_state()
    host.forward(sc, ids[:2], "none")
    split.forward(ss, ids[:2], "none")
    plain.forward(sp, ids[:2], "none")
    seen = set()
    for i in ids[2:]:
        seen.add(split.decode_splits(ss.pos))
        a = host.forward(sc, [int(i)])
        b = split.forward(ss, [int(i)])
        assert _rel(b, a) < 1e-3
        assert _rel(b, plain.forward(sp, [int(i)])) < 1e-5
    assert seen == {n for n in (1, 2, 4, 8) if n <= most}
    # the k/v rows the split dispatch wrote are the ones a later prompt chunk reads
    assert _rel(split.forward(ss, ids[:5], "all"), host.forward(sc, ids[:5], "all")) < 1e-3


def test_split_choice_follows_the_keys(dev, tmp_path_factory):
    """One range below 2 * SPLIT_KEYS keys, then powers of two of SPLIT_KEYS keys a range
    up to the model's most (at most 256 records / heads); attn_splits=1 never splits."""
    from cortiq.gpu import llama as gl
    host, g = _pair(dev, tmp_path_factory, "qwen2")
    k = gl.SPLIT_KEYS
    assert g.splits == min(gl.ATTN_SPLITS_MOST, 256 // host.cfg.n_heads)
    assert g.decode_splits(0) == g.decode_splits(2 * k - 2) == 1
    assert g.decode_splits(2 * k - 1) == 2
    assert g.decode_splits(8 * k - 1) == 8
    assert g.decode_splits(10 ** 6) == g.splits
    assert gl.GpuLlamaModel(host, dev, attn_splits=6).splits == 4
    assert gl.GpuLlamaModel(host, dev, attn_splits=1).decode_splits(10 ** 6) == 1
    with pytest.raises(ConfigError, match="splits"):
        gl.GpuLlamaModel(host, dev, attn_splits=0)


def test_greedy_tokens_identical(dev, tmp_path_factory):
    host, g = _pair(dev, tmp_path_factory, "qwen3", "q8_row")
    ids = np.random.default_rng(4).integers(0, host.vocab, 9)
    sc, sg = host.new_state(), g.new_state()
    want = [int(np.argmax(host.forward(sc, ids)))]
    got = [g.forward_greedy(sg, ids)]
    for _ in range(15):
        want.append(int(np.argmax(host.forward(sc, [want[-1]]))))
        got.append(g.forward_greedy(sg, [got[-1]]))
    assert got == want
    s2 = g.new_state()
    g.forward(s2, ids[:-1], "none")
    assert g.decode_greedy(s2, int(ids[-1]), 16) == want
    assert s2.pos == ids.size + 15
    # embed, the first norm, per layer Q|K|V, attention, O, gate|up and down (the other
    # norms and SwiGLU in the products' input stages), the final norm, head and argmax
    assert g.fused_norms and g.fused_swiglu
    assert g.dispatches_per_token == 2 + 5 * len(host.layers) + 3


def test_rollback_on_device(dev, tmp_path_factory):
    """Rolling back past the window and re-feeding gives the logits of a straight run."""
    host, g = _pair(dev, tmp_path_factory, "mistral")
    rng = np.random.default_rng(9)
    ids = rng.integers(0, host.vocab, 14)
    other = rng.integers(0, host.vocab, 4)
    st = g.new_state()
    g.forward(st, ids, "none")
    assert g.can_rollback(st, 3)
    g.rollback(st, 3)
    assert st.pos == 3
    got = g.forward(st, other, "all")
    want = host.forward(host.new_state(), np.concatenate([ids[:3], other]), "all")[3:]
    assert _rel(got, want) < 1e-3
    assert g.kv_bytes(st) == 7 * 2 * g.kv_size * 4 * len(host.layers)


def test_final_hidden_matches_cpu(dev, tmp_path_factory):
    host, g = _pair(dev, tmp_path_factory, "qwen2")
    ids = np.random.default_rng(10).integers(0, host.vocab, 6)
    a = host.final_hidden(host.new_state(), ids)
    b = g.final_hidden(g.new_state(), ids)
    assert b.shape == a.shape
    assert _rel(b, a) < 1e-3


def test_llm_sessions_on_gpu(dev, tmp_path_factory):
    from cortiq.runtime.llm import LLM
    f = _open(tmp_path_factory, "qwen3", "q8_row")
    cpu = LLM(f.path, device="cpu", seed=1)
    gpu = LLM(f.path, device="gpu", seed=1)
    assert gpu.device == "gpu" and type(gpu.model).__name__ == "GpuLlamaModel"
    kw = dict(max_tokens=8, temperature=0)
    assert gpu.generate("w5 w9 w11", **kw) == cpu.generate("w5 w9 w11", **kw)
    s = gpu.session()
    s.feed(gpu.tokenize("w7 w8 w9"), want="none")
    s.rollback(1)
    assert s.pos == 1


def test_greedy_chain_stops_where_the_consumer_stops(dev, tmp_path_factory):
    """Closing the chain after k tokens leaves the state holding the first id and every
    token taken but the last (the pass run ahead forgotten): the rows that follow are
    the straight run's."""
    host, g = _pair(dev, tmp_path_factory, "qwen3", "q8_row")
    ids = np.random.default_rng(6).integers(0, host.vocab, 7)
    s = g.new_state()
    g.forward(s, ids[:-1], "none")
    want = g.decode_greedy(s, int(ids[-1]), 12)
    for k in (1, 4, 9):
        st = g.new_state()
        g.forward(st, ids[:-1], "none")
        chain = g.greedy_chain(st, int(ids[-1]))
        got = [next(chain) for _ in range(k)]
        chain.close()
        assert got == want[:k]
        assert st.pos == ids.size + k - 1
        assert int(np.argmax(g.forward(st, [got[-1]]))) == want[k]


def test_llm_greedy_requests_chain_on_the_device(dev, tmp_path_factory):
    """A plain-argmax request runs its tokens through the device chain, alone and in the
    scheduler: the text, finish reason and the session's ids equal the feed-and-sample
    loop's on the same model (the chain turned off), a stop string cutting it mid-way."""
    import dataclasses

    import cortiq
    f = _open(tmp_path_factory, "qwen3", "q8_row")
    for max_batch in (1, 4):
        with cortiq.LLM(f.path, device="gpu", max_batch=max_batch) as llm:
            caps = llm.model.capabilities
            assert caps.greedy_chain
            chained: list = []

            def spy(*a, chained=chained, real=llm.model.greedy_chain, **kw):
                chained.append(1)
                return real(*a, **kw)
            llm.model.greedy_chain = spy

            def run(**kw):
                s = llm.session()
                c = llm.create_completion("w5 w9 w11", session=s, temperature=0, **kw)
                return c["choices"][0]["text"], c["choices"][0]["finish_reason"], s.ids
            full = run(max_tokens=16)
            stop = full[0].split()[5]
            got = [full, run(max_tokens=16, stop=[stop])]
            assert chained
            llm.model.capabilities = dataclasses.replace(caps, greedy_chain=False)
            want = [run(max_tokens=16), run(max_tokens=16, stop=[stop])]
            assert got == want and want[1][1] == "stop"


def test_non_finite_logits_are_refused_on_the_device(dev, tmp_path_factory):
    """An inf in the final norm's weight makes the head's row non-finite: the device's
    argmax flags it and the greedy calls raise ModelError, as the host's sampler does."""
    from cortiq.errors import ModelError
    from cortiq.gpu import to_device
    from cortiq.models.llama import LlamaModel
    host = LlamaModel(_open(tmp_path_factory, "qwen3"))
    host.norm = host.norm.copy()
    host.norm[3] = np.inf           # a file refuses it (cmf.write): poked after loading
    g = to_device(host, dev)
    with pytest.raises(ModelError, match="non-finite"):
        g.forward_greedy(g.new_state(), [5, 6, 7])
    with pytest.raises(ModelError, match="non-finite"):
        g.decode_greedy(g.new_state(), 5, 3)


def _q8_0(rows, cols):
    """A ggml q8_0 matrix (a 2-byte f16 scale and 32 int8 codes a block)."""
    from cortiq.kernels.tensor import QTensor
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, rows * cols // 32 * 34, dtype=np.uint8)
    raw.reshape(-1, 34)[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return QTensor(raw, "q8_0", (rows, cols), name="model.layers.0.mlp.down_proj.weight")


def test_refusals_name_the_problem(dev, tmp_path_factory):
    from cortiq.gpu import to_device
    from cortiq.gpu.llama import GpuLlamaModel
    from cortiq.models.llama import LlamaModel, Products
    host = LlamaModel(_open(tmp_path_factory, "qwen3"))
    L0 = host.layers[0]
    L0.down = Products([_q8_0(L0.down.mats[0].rows, L0.down.mats[0].cols)], [None])
    with pytest.raises(ConfigError, match=r"down_proj.*q8_0.*import-gguf"):
        to_device(host, dev)

    class NotLlama:
        arch = "llama"
    with pytest.raises(ConfigError, match="LlamaModel"):
        GpuLlamaModel(NotLlama(), dev)


def test_gguf_file_run_as_it_is(dev, tmp_path):
    """A GGUF file opened directly: f16 weights run on the device with the file's
    interleaved rope pairs (logits as on the CPU); ggml block types are refused with the
    tensor, its dtype and the import command named."""
    import optional
    gguf = optional.need("extras", "gguf")
    from reference import gguf_llama

    import cortiq
    T = gguf.GGMLQuantizationType
    t, arch = _variant("interleaved")
    arch = {k: v for k, v in arch.items() if k != "rope_interleaved" and v is not None}
    path = tmp_path / "m.gguf"
    gguf_llama.write(path, t, arch, types=lambda n, a: T.F16)
    ids = np.random.default_rng(12).integers(0, arch["vocab_size"], 12)
    with warnings.catch_warnings():      # no vocabulary in the file: byte tokens
        warnings.simplefilter("ignore", RuntimeWarning)
        cpu, gpu = cortiq.LLM(path, device="cpu"), cortiq.LLM(path, device="gpu")
    with cpu, gpu:
        assert cpu.file.arch.get("rope_interleaved") is True
        assert type(gpu.model).__name__ == "GpuLlamaModel"
        want = cpu.session().feed(ids, want="all")
        assert _rel(gpu.session().feed(ids, want="all"), want) < 1e-3
    q8 = tmp_path / "q8.gguf"
    gguf_llama.write(q8, t, arch, types=lambda n, a: T.Q8_0)
    with warnings.catch_warnings(), pytest.raises(
            ConfigError, match=r"q_proj.weight is stored as q8_0.*import-gguf"):
        warnings.simplefilter("ignore", RuntimeWarning)
        cortiq.LLM(q8, device="gpu")
