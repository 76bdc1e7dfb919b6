"""Llama decode on the GPU for bench_gpu.py (``--models llama,llama8b``).

Two random q8_row Llamas, built in memory without a file so that even the 8B shape is
ready in seconds:

* ``llama``: benchmarks/_bench_llama.py's bench geometry (hidden 2048, 16 layers, 16/4
  heads of 128, FFN 5632, vocab 32000, untied head);
* ``llama8b``: Llama-3-8B's shape (hidden 4096, 32 layers, FFN 14336, 32/8 heads of
  128, vocab 128256, untied head: 7.5 GB of q8_row weights a token).

A matrix's payload is random int8 codes (rng.integers into one preallocated array per
shape, shared by the layers on the host: each layer still gets its own upload, so a
token reads every byte once on the device) and per-row f16 scales that keep the
products' outputs near unit size; norms are ones. `MemoryFile` hands these to
`LlamaModel` through the few members it reads of a CmfFile.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from _bench_gpu_kernels import _finish, busy, decode_rates, ms_by_kernel, prefill_rate

#: Llama-3-8B's shape
LLAMA8B = dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
               vocab=128256)
#: a Llama small enough for a software adapter (--tiny)
LLAMA_TINY = dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=1000)


@dataclass
class _Info:
    shape: tuple
    dtype: str
    nbytes: int


class MemoryFile:
    """The members of a CmfFile that `LlamaModel` reads (arch, tensors, raw, tensor,
    path), over payloads held in memory."""

    def __init__(self, arch: dict, path: str):
        self.arch, self.path = arch, path
        self.tensors: dict[str, _Info] = {}
        self._raw: dict[str, np.ndarray] = {}
        self._vec: dict[str, np.ndarray] = {}

    def add_matrix(self, name: str, raw: np.ndarray, rows: int, cols: int) -> None:
        self.tensors[name] = _Info((rows, cols), "q8_row", raw.size)
        self._raw[name] = raw

    def add_vector(self, name: str, v: np.ndarray) -> None:
        self.tensors[name] = _Info((v.size,), "f32", v.nbytes)
        self._vec[name] = v

    def raw(self, name: str) -> np.ndarray:
        return self._raw[name]

    def tensor(self, name: str) -> np.ndarray:
        return self._vec[name]


def _q8_row(rng, rows: int, cols: int) -> np.ndarray:
    """A random q8_row payload: rows x cols int8 codes, then one f16 scale a row."""
    raw = np.empty(rows * cols + 2 * rows, np.uint8)
    raw[:rows * cols].view(np.int8)[:] = rng.integers(-127, 128, rows * cols, dtype=np.int8)
    # codes uniform in [-127, 127] have a standard deviation of about 73
    scale = np.full(rows, 1.0 / (73.0 * np.sqrt(cols)), np.float16)
    raw[rows * cols:] = scale.view(np.uint8)
    return raw


def random_llama(g: dict, seed: int = 0):
    """A host LlamaModel of geometry g (keys of LLAMA8B) with random q8_row weights."""
    from cortiq.models.llama import LlamaModel
    rng = np.random.default_rng(seed)
    H, F, V = g["hidden"], g["ffn"], g["vocab"]
    q, kv = g["heads"] * g["head_dim"], g["kv_heads"] * g["head_dim"]
    arch = {"arch_name": "llama", "hidden_size": H, "intermediate_size": F,
            "num_layers": g["layers"], "num_attention_heads": g["heads"],
            "num_kv_heads": g["kv_heads"], "head_dim": g["head_dim"], "vocab_size": V,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}
    f = MemoryFile(arch, f"<random q8_row llama, hidden {H}, {g['layers']} layers>")
    shapes = {"q_proj": (q, H), "k_proj": (kv, H), "v_proj": (kv, H), "o_proj": (H, q),
              "gate_proj": (F, H), "up_proj": (F, H), "down_proj": (H, F)}
    payload = {n: _q8_row(rng, *rc) for n, rc in shapes.items()}
    ones = np.ones(H, np.float32)
    for i in range(g["layers"]):
        p = f"model.layers.{i}"
        for n, (r, c) in shapes.items():
            part = "mlp" if n in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            f.add_matrix(f"{p}.{part}.{n}.weight", payload[n], r, c)
        f.add_vector(f"{p}.input_layernorm.weight", ones)
        f.add_vector(f"{p}.post_attention_layernorm.weight", ones)
    f.add_matrix("model.embed_tokens.weight", _q8_row(rng, V, H), V, H)
    f.add_matrix("lm_head.weight", _q8_row(rng, V, H), V, H)
    f.add_vector("model.norm.weight", ones)
    return LlamaModel(f)


def _word_tokenizer(vocab: int) -> bytes:
    """A word-level tokenizer.json of `vocab` ids and no special tokens (so no EOS cuts
    a benchmark's generation short)."""
    import json
    return json.dumps({"version": "1.0", "truncation": None, "padding": None,
                       "added_tokens": [], "normalizer": None,
                       "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
                       "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
                       "model": {"type": "WordLevel", "unk_token": "w0",
                                 "vocab": {f"w{i}": i for i in range(vocab)}}}).encode()


def llm_greedy_rate(g, prompt, tokens: int, precision: str) -> float:
    """Generated tokens/s of a greedy `LLM.create_completion` on the GPU model g at
    `precision` (the product's path: the scheduler, `Generation`, detokenizing; plain
    argmax, so through the device's chain), the prompt already cached by a first call.
    The LLM sets g's precision: pass the one g has, so later measurements keep it."""
    from cortiq.runtime.llm import LLM
    with LLM.from_model(g, tokenizer=_word_tokenizer(g.vocab), precision=precision) as llm:
        ids = [int(i) for i in prompt]
        llm.create_completion(ids, max_tokens=4, temperature=0)
        t0 = time.perf_counter()
        c = llm.create_completion(ids, max_tokens=tokens, temperature=0)
        dt = time.perf_counter() - t0
    return c["usage"]["completion_tokens"] / dt


def rows_breakdown(g, prompt, rows: int, time_dispatches) -> dict:
    """Where a step of `rows` sequences' decode rows (one submission) spends its time:
    dispatches, host recording and GPU ms of the rows program, GPU ms by kernel, whole
    steps (`forward_batch`) with and without the rows' logits read back, and the
    readback alone (a submission copying the rows' logits to the staging buffer, waited
    for and copied out)."""
    sts = [g.new_state() for _ in range(rows)]
    for st in sts:
        g.forward(st, prompt, "none")
    tok = int(prompt[-1])
    g.forward_batch(sts, [[tok]] * rows, ["last"] * rows, [False] * rows)
    rows_part = getattr(g, "_rows_part", None)    # (a build before it: each row's own)
    prog = g._resolve(g._skeleton("rows", "all"), (lambda m: rows_part(sts, m)) if rows_part
                      else lambda m: [d for b, st in enumerate(sts)
                                      for d in g._sequence_part(st, m, b)])
    t0 = time.perf_counter()
    for _ in range(5):
        g.dev.record(prog, rows).finish()
    record = (time.perf_counter() - t0) / 5
    step = {}
    for want in ("last", "none"):     # whole steps: with every row's logits read back, without
        g.forward_batch(sts, [[tok]] * rows, [want] * rows, [False] * rows)
        _finish(g.dev)
        t0 = time.perf_counter()
        for _ in range(5):
            g.forward_batch(sts, [[tok]] * rows, [want] * rows, [False] * rows)
        _finish(g.dev)
        step[want] = (time.perf_counter() - t0) / 5 * 1e3
    nbytes = rows * g.vocab * 4
    stage = g._logits_stage(nbytes)

    def read_back():
        enc = g.dev.dev.create_command_encoder()
        enc.copy_buffer_to_buffer(g.logits, 0, stage, 0, nbytes)
        return g.dev.read(stage, nbytes, after=g.dev.submit([enc.finish()]))
    read_back()
    t0 = time.perf_counter()
    for _ in range(5):
        read_back()
    read_ms = (time.perf_counter() - t0) / 5 * 1e3
    return {"rows": rows, "dispatches": len(prog), "record_ms": record * 1e3,
            "step_ms": step["last"], "step_no_logits_ms": step["none"], "read_ms": read_ms,
            "gpu_ms": time_dispatches(g, prog, k=4, at=rows) * 1e3,
            "gpu_ms_by_kernel": ms_by_kernel(
                prog, lambda ds: time_dispatches(g, ds, k=4, at=rows), shapes=True)}


#: positions at which rows_range_sweep times the rows' attention alone
RANGE_POSITIONS = (1024, 4096)


def _state_at(g, prompt, pos: int):
    """A state that took a few prompt tokens, its position then set to pos over caches
    grown to hold it (what the keys hold does not change an attention's time)."""
    st = g.new_state()
    g.forward(st, prompt[:4], "none")
    g._grow(st, pos + 2)
    st.pos = pos
    return st


def rows_attention_ms(g, prompt, rows: int, pos: int, time_dispatches) -> dict:
    """GPU ms of a rows step's attention dispatches (and their merges) for `rows`
    sequences at position `pos` (states from _state_at)."""
    sts = [_state_at(g, prompt, pos) for _ in range(rows)]
    g.forward_batch(sts, [[int(prompt[-1])]] * rows, ["none"] * rows, [False] * rows)
    prog = g._resolve(g._skeleton("rows", "none"), lambda m: g._rows_part(sts, m))
    attn = [d for d in prog if d.name.startswith("llama_attn")]
    return {"dispatches": len(attn), "ms": time_dispatches(g, attn, k=4, at=rows) * 1e3}


def decode_attention_ms(g, prompt, pos: int, time_dispatches) -> dict:
    """GPU ms of one sequence's decode attention dispatches at position `pos` (a state
    from _state_at), and its key ranges."""
    st = _state_at(g, prompt, pos)
    g._write_step(st.pos, 1)
    attn = [d for d in g._program(st, 1, "greedy") if d.name.startswith("llama_attn")]
    return {"dispatches": len(attn), "splits": g.decode_splits(pos),
            "ms": time_dispatches(g, attn, k=4, at=1) * 1e3}


def rows_range_sweep(g, prompt, batch, time_dispatches, values) -> dict:
    """The batched decode and the rows step of eight rows under each value "N" of
    llama.ROWS_RANGE_KEYS (the keys a range of the rows' split attention takes at
    least; 0: every row cut into all of the model's ranges), "N:1" the same with a
    workgroup a query head (llama.ROWS_ATTN_GQA off), and the rows' attention alone at
    RANGE_POSITIONS."""
    from cortiq.gpu import llama
    keep = llama.ROWS_RANGE_KEYS, llama.ROWS_ATTN_GQA
    out = {}
    try:
        for v in values:
            keys, _, one = str(v).partition(":")
            llama.ROWS_RANGE_KEYS, llama.ROWS_ATTN_GQA = int(keys), one != "1"
            g._rows = None
            busy(g.dev)
            r = dict(batch(g, prompt))
            r["query_heads_a_workgroup"] = g._rows_setup().heads
            b = rows_breakdown(g, prompt, 8, time_dispatches)
            r["rows_program_b8"] = {k: b[k] for k in ("step_ms", "step_no_logits_ms", "gpu_ms",
                                                      "read_ms")}
            r["rows_program_b8"]["ms_by_kernel"] = {
                k: t["ms"] for k, t in b["gpu_ms_by_kernel"].items()
                if not k.startswith("matvecb")}
            for pos in RANGE_POSITIONS:
                r[f"attention_b8_at_{pos}"] = rows_attention_ms(g, prompt, 8, pos,
                                                                time_dispatches)
            out[str(v)] = r
    finally:
        llama.ROWS_RANGE_KEYS, llama.ROWS_ATTN_GQA = keep
        g._rows = None
    return out


def llama_decode(dev, name: str, geometry: dict, n_prompt: int, tokens: int, bw: float,
                 time_dispatches, batch=None, range_keys=()) -> dict:
    """Build the model, then prefill and decode tokens/s (the session path, greedy on the
    device, greedy chained on the device), effective weight GB/s and % of the read
    bandwidth bw, dispatches, host recording and GPU time per token, GPU time by kernel.
    time_dispatches(g, dispatches, k, at): bench_gpu.py's GPU timer; batch(g, prompt), when
    given: the aggregate batched decode (bench_gpu.py's batch_decode), under
    "cortiq_gpu_batch" (and "int8" -> "cortiq_gpu_batch"); range_keys: values of
    llama.ROWS_RANGE_KEYS ("N", or "N:1": a workgroup a query head) under which the int8
    batched decode and its rows step are measured again ("int8" -> "rows_range_keys")."""
    from cortiq.gpu import to_device
    t0 = time.perf_counter()
    host = random_llama(geometry)
    out = {"model": name, "dtype": "q8_row", "geometry": dict(geometry),
           "host_build_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    g = to_device(host, dev)
    out["gpu_load_s"] = time.perf_counter() - t0
    per_token = sum(m.nbytes for m in host.matrices())   # the head, not the embedding
    out["weight_gb_per_token"] = per_token / 1e9
    prompt = np.random.default_rng(0).integers(0, host.vocab, n_prompt)
    st = g.new_state()
    out["prefill_tok_s"] = prefill_rate(g, st, prompt)
    tok = int(prompt[-1])
    g.forward(st, [tok])                 # warm the decode programs
    g.forward_greedy(st, [tok])
    g.decode_greedy(st, tok, 2)
    busy(dev)
    out.update(decode_rates(g, st, tok, tokens))
    for k in ("session_tok_s", "greedy_tok_s", "chained_tok_s"):
        out[k.replace("tok_s", "eff_gb_s")] = out[k] * per_token / 1e9
    best = max(out["session_tok_s"], out["greedy_tok_s"], out["chained_tok_s"])
    out["pct_of_read_bw"] = 100 * best * per_token / 1e9 / bw
    out["dispatches_per_token"] = g.dispatches_per_token
    out["fused_norms_swiglu"] = [g.fused_norms, g.fused_swiglu]
    g._grow(st, st.pos + 1)
    g._write_step(st.pos, 1)
    prog = g._program(st, 1, "greedy")
    # the decode attention's key ranges: the most the model takes, and those of the timed
    # program at its position (1: unsplit, llama_attn_qk)
    out["attn_splits_most"] = g.splits
    out["attn_splits_timed"] = g.decode_splits(st.pos)
    out["attn_position_timed"] = st.pos
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        dev.record(prog, 1).finish()
    out["record_ms_per_token"] = (time.perf_counter() - t0) / n * 1e3
    out["gpu_ms_per_token"] = time_dispatches(g, prog, k=8, at=1) * 1e3
    out["gpu_ms_by_kernel"] = ms_by_kernel(prog, lambda ds: time_dispatches(g, ds, k=8, at=1))
    if batch is not None:
        busy(dev)
        out["cortiq_gpu_batch"] = batch(g, prompt)
    # the same decode with int8 activations in the decode products (precision "int8")
    g.set_precision("int8")
    g.decode_greedy(st, tok, 2)
    busy(dev)
    i8 = decode_rates(g, st, tok, tokens)
    i8["pct_of_read_bw"] = 100 * max(i8.values()) * per_token / 1e9 / bw
    i8["gpu_ms_per_token"] = time_dispatches(g, prog, k=8, at=1) * 1e3
    i8["gpu_ms_by_kernel"] = ms_by_kernel(prog, lambda ds: time_dispatches(g, ds, k=8, at=1),
                                          shapes=True)
    busy(dev)
    i8["llm_greedy_tok_s"] = llm_greedy_rate(g, prompt, tokens, "int8")
    if batch is not None:       # the int8 rows matvec
        busy(dev)
        i8["cortiq_gpu_batch"] = batch(g, prompt)
        i8["rows_program_b8"] = rows_breakdown(g, prompt, 8, time_dispatches)
        if range_keys:
            i8["rows_range_keys"] = rows_range_sweep(g, prompt, batch, time_dispatches,
                                                     range_keys)
            i8["one_row_attention"] = {str(pos): decode_attention_ms(g, prompt, pos,
                                                                     time_dispatches)
                                       for pos in RANGE_POSITIONS}
    out["int8"] = i8
    # A/B: the same int8 decode with each product staging its input in every workgroup
    from cortiq.gpu import kernels
    from cortiq.gpu.llama import GpuLlamaModel
    keep, kernels.STAGE_ONCE = kernels.STAGE_ONCE, not kernels.STAGE_ONCE
    try:
        g2 = GpuLlamaModel(host, dev)
        g2.set_precision("int8")
        st2 = g2.new_state()
        g2.forward(st2, prompt, "none")
        g2.decode_greedy(st2, tok, 2)
        busy(dev)
        ab = decode_rates(g2, st2, tok, tokens)
    finally:
        kernels.STAGE_ONCE = keep
    ab["dispatches_per_token"] = g2.dispatches_per_token
    out["int8_stage_once" if not keep else "int8_stages_in_workgroups"] = ab
    del g2, st2
    return out
