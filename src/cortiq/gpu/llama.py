"""The Llama family on the GPU: the forward of src/cortiq/models/llama.py as WebGPU compute.

A chunk of up to CHUNK rows (one token when decoding) is ONE submission: the
embedding, every layer, the final norm, the head and (greedy) the argmax are recorded
into one command buffer, and one readback returns the logits, or only the token. Per
layer (shaders/llama_*.wgsl and the shared products of kernels.py):

    llama_norm     the previous product's output (+ its bias) added to the residual
                   stream, then RMSNorm with weight into the products' input
    matvec Q|K|V   one dispatch over the three matrices
    llama_qk       per head: biases (Qwen2), q/k RMSNorm (Qwen3), rotary from the host
                   RopeTable's cos/sin rows (so YaRN, rope_freq_factors and the
                   interleaved pair order of GGUF files come from the host), k and v
                   into the KV cache
    llama_attn     causal GQA with an optional sliding window, online softmax (a decode
                   row: llama_attn_qk, which does llama_qk's work in the same dispatch;
                   a decode row with enough keys: llama_attn_split_qk, the keys split
                   into ranges, one workgroup a (query head, range), flash-decoding)
    matvec O       (after a split attention: its input stage merges the ranges, PRO 5)
    llama_norm     the residual and the MLP norm
    matvec gate|up
    llama_swiglu   silu(gate) * up in place (biases where the file has them)
    matvec down

then llama_norm with the final norm, the head (the last row only unless every row's
logits are asked for) and the argmax for greedy decoding. A decode row runs the norms
after the first and the SwiGLU as input stages of the products that read them
(`_fuse_decode_stages`): five dispatches a layer.

Decode rows of several sequences run the same layer program as one submission
(`forward_rows`): the products over the rows through the rows matvec, each sequence's
attention (with llama_qk's work) over its own cache at its own position.

The KV cache of each layer is a linear buffer on the device grown by doubling (copied
on the device), position p at row p; a sliding layer masks by its window instead of
dropping keys, so rollback to any earlier position is in place.

The model wraps the host `LlamaModel` (validated config, weights as QTensors, rotary
table) and implements the model protocol (`cortiq.models.base`), so Session, LLM and
the server run it as they run the host.
"""
from __future__ import annotations

import time

import numpy as np

from ..errors import ConfigError, CortiqError
from ..models.base import Capabilities, check_feed
from .device import Device
from .kernels import (DTYPE_IDS, FIXED, MATMAT_NT, NONE, Dispatch, GpuMatrix, MatvecOp,
                      ParamArena, WeightUpload, _part_tables, embed_kinds, embed_pipeline,
                      fixed_pipeline, resolve, rows_block_words, u32s, unroll_row_loops)
from .model import SEQUENCE_PART, GpuModel, RowSlices

#: prompt rows a submission takes (the host forward's chunk)
CHUNK = 64
#: rows of a layer's KV cache before its first growth
KV_CAP0 = 256
#: keys each range of a split decode attention takes at least: a row with fewer than
#: 2 * SPLIT_KEYS keys runs unsplit, and the ranges double with the keys (a power of two,
#: so that few programs exist) up to the model's most
SPLIT_KEYS = 16
#: the most key ranges a decode row's attention is split into by default (and never
#: more than the O product's merge takes: 256 records / query heads)
ATTN_SPLITS_MOST = 16
#: dtypes GpuMatrix uploads as f32 rows by design (no device decoder, docs/gpu.md)
_DENSE_ON_DEVICE = ("vbit", "vbit_ro")

#: the Llama kernels: name -> binding kinds (uniform parameters, uniform step, buffers)
KERNELS = {
    "llama_norm": ("uniform", "uniform", "rw", "read", "read", "rw"),
    "llama_qk": ("uniform", "uniform", "rw", "read", "read", "rw", "rw"),
    "llama_attn": ("uniform", "uniform", "read", "read", "read", "rw", "read", "read"),
    "llama_attn_qk": ("uniform", "uniform", "read", "rw", "rw", "rw", "read", "read"),
    "llama_attn_split": ("uniform", "uniform", "read", "read", "read", "rw", "read", "read"),
    "llama_attn_split_qk": ("uniform", "uniform", "read", "rw", "rw", "rw", "read", "read"),
    "llama_swiglu": ("uniform", "uniform", "rw", "read"),
    "llama_attn_merge": ("uniform", "uniform", "read", "rw"),
}
# the variants that also write their output quantized for an int8 rows matvec
KERNELS["llama_norm_q"] = KERNELS["llama_norm"] + ("rw",)
KERNELS["llama_swiglu_q"] = KERNELS["llama_swiglu"] + ("rw",)
KERNELS["llama_attn_merge_q"] = KERNELS["llama_attn_merge"] + ("rw",)
#: kernels generated from another's source: name -> (file, {marker: text}, replaced in
#: order)
VARIANTS = {
    "llama_attn": ("llama_attn.wgsl", {"$KVN": "1", "$KV": "read", "$QK": "false",
                                       "/*$W*/": "//"}),
    "llama_attn_qk": ("llama_attn.wgsl", {"$KVN": "512", "$KV": "read_write", "$QK": "true",
                                          "/*$W*/": ""}),
    "llama_attn_split": ("llama_attn_split.wgsl", {"$KV": "read", "$QK": "false",
                                                   "/*$W*/": "//"}),
    "llama_attn_split_qk": ("llama_attn_split.wgsl", {"$KV": "read_write", "$QK": "true",
                                                      "/*$W*/": ""}),
    "llama_norm": ("llama_norm.wgsl", {"/*$Q*/": "//"}),
    "llama_norm_q": ("llama_norm.wgsl", {"/*$Q*/": ""}),
    "llama_swiglu": ("llama_swiglu.wgsl", {"/*$Q*/": "//"}),
    "llama_swiglu_q": ("llama_swiglu.wgsl", {"/*$Q*/": ""}),
    "llama_attn_merge": ("llama_attn_merge.wgsl", {"/*$Q*/": "//"}),
    "llama_attn_merge_q": ("llama_attn_merge.wgsl", {"/*$Q*/": ""}),
}


#: int8 decode rows: the norms, SwiGLU and the attention merge write their output
#: quantized as well, for the products after them (False: each product quantizes its
#: input rows in a quantrows pass)
ROWS_QUANTIZE_IN_PASSES = True

#: decode rows one rows attention dispatch takes at most (llama_attn_rows_qk binds two
#: caches a row; fewer where the device binds fewer storage buffers)
ROWS_ATTN_GROUP = 8
#: lanes a workgroup of the split attention (llama_attn_split.wgsl: 128 or 256): a rows
#: dispatch's (query head, row, key range) workgroups, eight times the one-row decode's,
#: take 128 so that twice as many are resident at once; the one-row decode's, fewer than
#: the device holds at once either way, take 256
ROWS_ATTN_LANES = 128
ATTN_LANES = 256
#: keys a range of a rows dispatch's split attention takes at least: each row is cut into
#: as many of the model's `splits` ranges as leave every range this many keys (its other
#: workgroups only write empty records), since the rows already give the dispatch its
#: workgroups and a thin range repeats the head prep for a few keys
ROWS_RANGE_KEYS = 32
#: True: a rows dispatch's split attention takes a whole GQA group of query heads a
#: workgroup (rows_attn_heads: each key and value loaded once for the group, a tile's
#: barriers and softmax paid once for it), where the workgroup's memory holds them.
#: False (the default until a card shows it no slower at short context, where it leaves
#: fewer workgroups; `bench_gpu.py --rows-range-keys 32,32:1` measures both): a workgroup
#: a query head, as the one-row decode
ROWS_ATTN_GQA = False


def split_attn_marks(gq: int, hd: int, lanes: int) -> dict:
    """llama_attn_split.wgsl's sizes for gq query heads a workgroup of `lanes` lanes (head
    dim hd): the queries (at least the 128 vec4s of one head of 512), the partial dots
    and a tile's scores."""
    return {"$GQ": str(gq), "$Q4N": str(max(128, gq * hd // 4)), "$DOTN": str(gq * lanes),
            "$SCN": str(gq * 8), "$WG": str(lanes)}


# llama_attn_split.wgsl's one-row pieces: its step block, cache write and key loop
_ONE_ROW = {
    "$STEP_DECL": "@group(0) @binding(1) var<uniform> S: Step;",
    "$ROWS_DECL": "",
    "$ROW_FNS": """fn row_pos(rb: u32) -> u32 { return S.pos0; }
/*$W*/fn kvw(rb: u32, i: u32, k: vec4<f32>, v: vec4<f32>) { KC[i] = k; VC[i] = v; }""",
    "$KEYS_CALL": "keys(kfrom, kto, p, own, kvw4, kb4, lid);",
    **split_attn_marks(1, 128, ATTN_LANES),
}
_ROPE_CHUNK = {"$ROPE_COS": "t * hh + i", "$ROPE_SIN": "(P.rope_t + t) * hh + i"}


def _source(dev: Device, src: str, marks: dict, rows: int = 1) -> str:
    """Shader `src` with the head prep, the key loop (one for each of `rows` cache
    bindings) and `marks` spliced in."""
    keys = dev.source("llama_attn_keys.wgsl")
    # the quantizing variants (their lines marked Q kept) also write XQ (quant4_put)
    put = dev.source("quant4_put.wgsl") if marks.get("/*$Q*/") == "" else ""
    code = (dev.source(src).replace("$HEAD_PREP", dev.source("llama_head_prep.wgsl"))
            .replace("$QUANT4_PUT", put).replace("$QUANT4", dev.source("quant4.wgsl"))
            .replace("$KEYS_FNS", "".join(keys.replace("$KB", str(b) if b else "")
                                          for b in range(rows))))
    for k, v in marks.items():
        code = code.replace(k, v)
    if "$WG" in marks:      # the split attention's key loads and heads, written out
        code = unroll_row_loops(code, 1024 // int(marks["$WG"]), "m", "NP")
        code = unroll_row_loops(code, int(marks["$GQ"]), "h", "GQ")
    return code


def llama_pipeline(dev: Device, name: str):
    src, marks = VARIANTS.get(name, (f"{name}.wgsl", {}))
    return dev.pipeline((name,), _source(dev, src, {**_ONE_ROW, **_ROPE_CHUNK, **marks}),
                        KERNELS[name])


def rows_attn_group(dev: Device) -> int:
    """Decode rows a rows attention dispatch takes: ROWS_ATTN_GROUP, or what the device's
    storage-buffer bindings hold (four, and two a row)."""
    return max(1, min(ROWS_ATTN_GROUP, (dev.max_storage_buffers - 4) // 2))


def split_attn_bytes(gq: int, hd: int, lanes: int) -> int:
    """Workgroup memory of llama_attn_split.wgsl with split_attn_marks(gq, hd, lanes):
    q4, kn4, vn4, dots, sc, ew and part, and the head prep's red and tmp."""
    return (16 * (max(128, gq * hd // 4) + 2 * 128 + lanes) + 4 * gq * lanes
            + 2 * 16 * gq * 8 + 4 * (256 + 512))


def rows_attn_heads(dev: Device, nh: int, nk: int, hd: int) -> int:
    """Query heads a workgroup of the rows attention takes: the whole GQA group where
    ROWS_ATTN_GQA and the workgroup's memory holds its queries and scores, else the
    largest divisor of the group that fits (1: a workgroup a query head)."""
    grp = nh // nk
    if not ROWS_ATTN_GQA:
        return 1
    for gq in range(grp, 0, -1):
        if grp % gq == 0 and split_attn_bytes(gq, hd, ROWS_ATTN_LANES) <= dev.max_workgroup_storage:
            return gq
    return 1


def rows_attn_kinds(g: int) -> tuple:
    return KERNELS["llama_attn_split_qk"] + ("rw", "rw") * (g - 1)


def llama_rows_attn_pipeline(dev: Device, g: int, gq: int = 1, hd: int = 128):
    """llama_attn_rows_qk: the split decode attention (llama_qk's work in it) of g rows of
    a rows submission in one dispatch, each row on its own caches at its own position
    (llama_attn_split.wgsl, ROWS), gq query heads of head dim hd a workgroup."""
    sw4 = max(dev.uniform_align // 4, 4) // 4     # RowSlices' step block, in vec4s
    decl, keys, kv = [], [], []
    for b in range(1, g):
        decl.append(f"@group(0) @binding({6 + 2 * b}) var<storage, read_write> KC{b}: "
                    f"array<vec4<f32>>;\n@group(0) @binding({7 + 2 * b}) "
                    f"var<storage, read_write> VC{b}: array<vec4<f32>>;")
        keys.append(f"case {b}u: {{ keys{b}(kfrom, kto, p, own, kvw4, kb4, lid); }}")
        kv.append(f"case {b}u: {{ KC{b}[i] = k; VC{b}[i] = v; }}")
    fns = f"""fn row_pos(rb: u32) -> u32 {{ return ST[rb * {sw4}u].y; }}
fn kvw(rb: u32, i: u32, k: vec4<f32>, v: vec4<f32>) {{
    switch rb {{ {" ".join(kv)} default: {{ KC[i] = k; VC[i] = v; }} }}
}}"""
    call = (f"switch rb {{ {' '.join(keys)} default: "
            "{ keys(kfrom, kto, p, own, kvw4, kb4, lid); } }")
    marks = {"$STEP_DECL": f"@group(0) @binding(1) var<uniform> ST: array<vec4<u32>, {g * sw4}>;",
             "$ROWS_DECL": "\n".join(decl), "$ROW_FNS": fns, "$KEYS_CALL": call,
             "$ROPE_COS": "t * P.pad1 + i", "$ROPE_SIN": "t * P.pad1 + hh + i",
             "$KV": "read_write", "$QK": "true", "/*$W*/": "",
             **split_attn_marks(gq, hd, ROWS_ATTN_LANES)}
    return dev.pipeline(("llama_attn_rows_qk", g, sw4, ROWS_ATTN_LANES, gq, marks["$Q4N"]),
                        _source(dev, "llama_attn_split.wgsl", marks, g), rows_attn_kinds(g))


def check_dtypes(host) -> None:
    """ConfigError naming the first matrix whose stored dtype has no device decoder."""
    for qt in host.matrices() + [host.embed]:
        if qt.dtype not in DTYPE_IDS and qt.dtype not in _DENSE_ON_DEVICE:
            path = getattr(host.file, "path", "?")
            raise ConfigError(
                f"device='gpu': {path}: tensor {qt.name} is stored as {qt.dtype}, which the "
                f"GPU matvec does not decode (it reads {', '.join(DTYPE_IDS)}); import the "
                "file to CMF with a GPU dtype (`cortiq import-gguf FILE.gguf OUT.cmf --quant "
                "q8_row`) or run it on the CPU")


class GpuLlamaState:
    """One sequence on the device: position, KV caches and the recorded programs."""

    def __init__(self):
        self.pos = 0
        self.cap = KV_CAP0
        self.k: list = []
        self.v: list = []
        self.programs: dict = {}


class GpuLlamaModel(GpuModel):
    """The host LlamaModel's forward on the GPU (see the module docstring): one layer
    program (`_skeleton`) for a sequence's decode rows and prompt chunks and for decode
    rows of several sequences in one submission (`forward_rows`). fuse_qk (default True):
    a decode row's llama_qk work runs inside its attention dispatch (llama_attn_qk, one
    dispatch fewer a layer); False keeps the llama_qk pass (A/B measurements).
    attn_splits: the most key ranges a decode row's attention is split into (None:
    ATTN_SPLITS_MOST; 1: never split); `splits` is what the model takes (rounded down to
    a power of two, at most 256 / heads, 1 where the shape has no split path).
    fuse_stages (default True): a decode row's norms and SwiGLU run in the products'
    input stages where the shape allows (`_fuse_decode_stages`); False keeps their
    passes (A/B measurements)."""

    int8_products = True

    def __init__(self, host, device: Device | None = None, fuse_qk: bool = True,
                 attn_splits: int | None = None, fuse_stages: bool = True):
        from ..models.llama import LlamaModel
        if not isinstance(host, LlamaModel):
            raise ConfigError(f"device='gpu': the llama GPU model runs a LlamaModel, got "
                              f"{type(host).__name__}")
        check_dtypes(host)
        cfg = self.cfg = host.cfg
        if cfg.head_dim > 512:
            raise ConfigError(f"device='gpu': head_dim {cfg.head_dim}: the Llama attention "
                              "kernel takes at most 512")
        if attn_splits is not None and int(attn_splits) < 1:
            raise ConfigError(f"attention splits: expected >= 1, got {attn_splits}")
        self.host = host
        self.fuse_qk = bool(fuse_qk)
        self.arch = host.arch
        self.dev = dev = device or Device.get()
        self.vocab, self.hidden, self.ffn = cfg.vocab, cfg.hidden, cfg.ffn
        self.nh, self.nk, self.hd = cfg.n_heads, cfg.n_kv, cfg.head_dim
        self.file = host.file
        self.max_seq_len = host.max_seq_len
        self.capabilities = Capabilities(rollback=True, batch_unit=CHUNK, greedy_chain=True,
                                         max_seq_len=self.max_seq_len)
        self.options = host.options
        self.q_size, self.kv_size = self.nh * self.hd, self.nk * self.hd
        self.qkv_w = self.q_size + 2 * self.kv_size
        H, F, T = self.hidden, self.ffn, CHUNK
        t0 = time.perf_counter()
        # ---- weights, once, in their stored dtypes; vectors in one buffer
        upload = WeightUpload(dev)
        self.mats: list[GpuMatrix] = upload.mats
        vec, mat = upload.vec, upload.mat

        def joined_bias(products):
            bs = products.biases
            if all(b is None for b in bs):
                return None
            return np.concatenate([np.zeros(m.rows, np.float32) if b is None else b
                                   for m, b in zip(products.mats, bs)])

        self.lw = []
        for L in host.layers:
            q, k, v = (mat(m) for m in L.qkv.mats)
            gate, up = (mat(m) for m in L.gate_up.mats)
            self.lw.append(dict(
                q=q, k=k, v=v, o=mat(L.o.mats[0]), gate=gate, up=up, down=mat(L.down.mats[0]),
                attn_norm=vec(L.attn_norm), mlp_norm=vec(L.mlp_norm),
                qkv_bias=vec(joined_bias(L.qkv)), q_norm=vec(L.q_norm), k_norm=vec(L.k_norm),
                o_bias=vec(L.o.biases[0]), gate_bias=vec(L.gate_up.biases[0]),
                up_bias=vec(L.gate_up.biases[1]), down_bias=vec(L.down.biases[0]),
                window=int(L.window)))
        self.embed = mat(host.embed)
        self.head = self.embed if host.head is host.embed else mat(host.head)
        self.v_norm = vec(host.norm)
        self.vbuf = upload.vector_buffer()
        self.weight_bytes = sum(m.nbytes for m in self.mats)
        # ---- activations for a chunk of up to CHUNK rows
        f4 = 4
        # the residual stream, in two regions of T rows: a norm pass reads one and writes
        # the other (llama_norm.wgsl, a workgroup a round of columns)
        self.x = dev.buffer(2 * T * H * f4)
        self.xn = dev.buffer(T * H * f4, copy_src=True)     # a norm's output
        self.qkv = dev.buffer(T * self.qkv_w * f4)
        self.att = dev.buffer(T * self.q_size * f4)
        self.out = dev.buffer(T * H * f4)                   # O / down products
        self.gu = dev.buffer(T * 2 * F * f4)
        self.logits = dev.buffer(T * self.vocab * f4, copy_src=True)
        self.ids = dev.buffer(T * 4)
        self.res = dev.buffer(16, copy_src=True)
        self.step = dev.buffer(16, uniform=True)
        self.rope = dev.buffer(2 * T * (self.hd // 2) * f4)
        self.stage_out = None
        self.stage_logits = None
        self.stage_ids = [dev.staging(16), dev.staging(16)]
        most = min(ATTN_SPLITS_MOST if attn_splits is None else int(attn_splits),
                   256 // self.nh)
        self.splits = 1 << (most.bit_length() - 1) if most >= 1 and self.hd % 4 == 0 else 1
        # a split decode attention's records, [m, l, 0, 0, acc[hd]] per (head, range)
        self.apart = dev.buffer(self.nh * self.splits * (self.hd + 4) * f4)
        # ---- the products and the fixed kernels' parameters, in one arena
        a = self.arena = ParamArena(dev)
        eps = float(cfg.eps)
        for i, w in enumerate(self.lw):
            w["qkv_op"] = MatvecOp(dev, [w["q"], w["k"], w["v"]], a, x=self.xn, x_off=0,
                                   x_stride=H, y=self.qkv, y_off=0, y_stride=self.qkv_w,
                                   vbuf=self.vbuf)
            w["o_op"] = MatvecOp(dev, [w["o"]], a, x=self.att, x_off=0, x_stride=self.q_size,
                                 y=self.out, y_off=0, y_stride=H, vbuf=self.vbuf)
            # after a split attention: the O product merging its ranges, per range count
            w["o_split_ops"] = {}
            n = 2
            while n <= self.splits:
                try:
                    w["o_split_ops"][n] = MatvecOp(
                        dev, [w["o"]], a, x=self.apart, x_off=0, x_stride=0, y=self.out,
                        y_off=0, y_stride=H, vbuf=self.vbuf, pro=5, hd=self.hd, splits=n)
                except ConfigError:     # no staged decode matvec for this shape
                    self.splits = 1
                n *= 2
            w["gu_op"] = MatvecOp(dev, [w["gate"], w["up"]], a, x=self.xn, x_off=0,
                                  x_stride=H, y=self.gu, y_off=0, y_stride=2 * F,
                                  vbuf=self.vbuf)
            w["down_op"] = MatvecOp(dev, [w["down"]], a, x=self.gu, x_off=0, x_stride=2 * F,
                                    y=self.out, y_off=0, y_stride=H, vbuf=self.vbuf)
            # the attention norm adds the previous layer's down product (none before layer 0)
            prev_bias = self.lw[i - 1]["down_bias"] if i else NONE
            # (the attention norm takes the residual from the first region into the second,
            # the MLP norm back)
            w["p_norm_in"] = a.ref(u32s(H, 0, 0, int(i > 0), 0, prev_bias, w["attn_norm"], eps,
                                        T * H, 0, 0, 0))
            w["p_norm_mlp"] = a.ref(u32s(H, T * H, 0, 1, 0, w["o_bias"], w["mlp_norm"], eps,
                                         0, 0, 0, 0))
            w["p_qk"] = a.ref(u32s(self.nh, self.nk, self.hd, self.qkv_w, w["qkv_bias"],
                                   w["q_norm"], w["k_norm"], int(cfg.rope_interleaved), eps,
                                   T, 0, 0))
            w["p_attn"] = a.ref(u32s(self.nh, self.nk, self.hd, self.qkv_w, w["window"],
                                     self.q_size, float(host.attn_scale), 0, w["qkv_bias"],
                                     w["q_norm"], w["k_norm"], int(cfg.rope_interleaved), eps,
                                     T, 0, 0))
            # a rows submission's per-sequence kernels read one row's rotary rows
            # (cos then sin, rope_t 1)
            w["p_qk_row"] = a.ref(u32s(self.nh, self.nk, self.hd, self.qkv_w, w["qkv_bias"],
                                       w["q_norm"], w["k_norm"], int(cfg.rope_interleaved),
                                       eps, 1, 0, 0))
            w["p_attn_row"] = a.ref(u32s(self.nh, self.nk, self.hd, self.qkv_w, w["window"],
                                         self.q_size, float(host.attn_scale), 0,
                                         w["qkv_bias"], w["q_norm"], w["k_norm"],
                                         int(cfg.rope_interleaved), eps, 1, 0, 0))
            w["p_swiglu"] = a.ref(u32s(F, w["gate_bias"], w["up_bias"], 0))
        self._fuse_decode_stages(eps, fuse_stages)
        last_bias = self.lw[-1]["down_bias"] if self.lw else NONE
        self.p_norm_final = a.ref(u32s(H, 0, 0, int(bool(self.lw)), 0, last_bias,
                                       self.v_norm, eps, T * H, 0, 0, 0))
        # a decode row's residual ends at the stream's second row (fused norms); in place
        self.p_norm_final_b = a.ref(u32s(H, H, 0, int(bool(self.lw)), 0, last_bias,
                                         self.v_norm, eps, H, 0, 0, 0))
        self.head_last = MatvecOp(dev, [self.head], a, x=self.xn, x_off=0, x_stride=H,
                                  y=self.logits, y_off=0, y_stride=self.vocab, vbuf=self.vbuf,
                                  last_row=True)
        self.head_all = MatvecOp(dev, [self.head], a, x=self.xn, x_off=0, x_stride=H,
                                 y=self.logits, y_off=0, y_stride=self.vocab, vbuf=self.vbuf)
        e = self.embed
        self.p_embed = a.ref(u32s(H, 0, len(e.parts), 0)
                             + _part_tables([r for _b, _r0, r in e.parts]))
        self.p_argmax = a.ref(u32s(self.vocab, 0, 0, 0))
        a.upload()
        for name in KERNELS:     # compile now: a shader error surfaces at load
            llama_pipeline(dev, name)
        self._static: dict = {}
        self._skeletons: dict = {}
        self._rows: _LlamaRows | None = None
        self.load_seconds = time.perf_counter() - t0
        self._decode_program: list | None = None

    def _fuse_decode_stages(self, eps: float, wanted: bool) -> None:
        """The decode row's products that take the passes before them as their input
        stage (matvec1.wgsl): Q|K|V and gate|up the residual add and RMSNorm (PRO 6,
        the residual stream alternating between two regions of x: gate|up writes the
        second, Q|K|V of the next layer the first), down the SwiGLU (PRO 7). Each applies
        to the whole stack or not at all: not where a product's bias would be added
        before the norm (or a gate/up bias before SwiGLU), nor where the device cannot
        stage the input."""
        H, F = self.hidden, self.ffn
        self.fused_norms = wanted and all(w["o_bias"] == NONE and w["down_bias"] == NONE
                                          for w in self.lw)
        self.fused_swiglu = wanted and all(w["gate_bias"] == NONE and w["up_bias"] == NONE
                                           for w in self.lw)
        a = self.arena
        try:
            for li, w in enumerate(self.lw):
                if self.fused_norms:
                    if li:
                        w["qkv_norm_op"] = MatvecOp(
                            self.dev, [w["q"], w["k"], w["v"]], a, x=self.x, x_off=H,
                            x_stride=0, x2=self.out, y=self.qkv, y_off=0,
                            y_stride=self.qkv_w, vbuf=self.vbuf, v_a=w["attn_norm"], v_b=0,
                            pro=6, eps=eps)
                    w["gu_norm_op"] = MatvecOp(
                        self.dev, [w["gate"], w["up"]], a, x=self.x, x_off=0, x_stride=0,
                        x2=self.out, y=self.gu, y_off=0, y_stride=2 * F, vbuf=self.vbuf,
                        v_a=w["mlp_norm"], v_b=H, pro=6, eps=eps)
                if self.fused_swiglu:
                    w["down_swiglu_op"] = MatvecOp(
                        self.dev, [w["down"]], a, x=self.gu, x_off=0, x_stride=2 * F,
                        x2_off=F, y=self.out, y_off=0, y_stride=H, vbuf=self.vbuf, pro=7)
        except ConfigError:     # no staged decode matvec for these shapes
            self.fused_norms = self.fused_swiglu = False

    # ---- sequences ----------------------------------------------------------------
    def new_state(self) -> GpuLlamaState:
        st = GpuLlamaState()
        per_row = self.kv_size * 4
        for _ in self.lw:
            st.k.append(self.dev.buffer(st.cap * per_row, copy_src=True))
            st.v.append(self.dev.buffer(st.cap * per_row, copy_src=True))
        return st

    def _grow(self, st: GpuLlamaState, need: int) -> None:
        """Room in every layer's cache for `need` positions (copying what they hold)."""
        if need <= st.cap:
            return
        cap = self._grown_cap(st.cap, need)
        nbytes = cap * self.kv_size * 4
        st.k = self._grown_copies(st.k, nbytes)
        st.v = self._grown_copies(st.v, nbytes)
        st.cap = cap
        st.programs.clear()

    def kv_bytes(self, st: GpuLlamaState) -> int:
        return st.pos * self.kv_size * 4 * 2 * len(self.lw)

    # ---- the forward ----------------------------------------------------------------
    def forward(self, st: GpuLlamaState, ids, want: str = "last", prompt: bool | None = None):
        """Run tokens `ids` from position st.pos. want: "none" -> None, "last" ->
        [vocab], "all" -> [len(ids), vocab] (float32). Prompt rows and generated
        tokens run the same arithmetic on the device, so `prompt` changes nothing."""
        ids = check_feed(ids, want, self.vocab)
        return self._forward_chunks(ids, want, CHUNK, lambda chunk, w: self._submit(st, chunk, w))

    def final_hidden(self, st: GpuLlamaState, ids) -> np.ndarray:
        """The final-norm hidden states [len(ids), hidden] of `ids` run from st.pos."""
        ids = check_feed(ids, "all", self.vocab)
        rows = [self._submit(st, ids[s:s + CHUNK], "hidden") for s in range(0, ids.size, CHUNK)]
        return (np.concatenate(rows, axis=0) if rows
                else np.zeros((0, self.hidden), np.float32))

    def forward_greedy(self, st: GpuLlamaState, ids) -> int:
        """Run `ids` and return the argmax of the last row's logits, computed on the
        device (one 4-byte readback)."""
        ids = check_feed(ids, "last", self.vocab)
        if ids.size == 0:
            raise CortiqError("forward_greedy: no tokens")
        for start in range(0, ids.size - 1, CHUNK):
            self._submit(st, ids[start:min(start + CHUNK, ids.size - 1)], "none")
        return self._submit(st, ids[-1:], "greedy")

    def _greedy_pass(self, st: GpuLlamaState):
        self._grow(st, st.pos + 1)
        self._write_step(st.pos, 1)
        enc = self.dev.record(self._program(st, 1, "greedy"), 1)
        st.pos += 1
        return enc

    def _write_step(self, pos0: int, t: int) -> None:
        q = self.dev.queue
        q.write_buffer(self.step, 0, np.array([t, pos0, 0, 0], np.uint32))
        cos, sin = self.host.rope(pos0, t)
        half = self.hd // 2
        q.write_buffer(self.rope, 0, np.ascontiguousarray(cos, np.float32).ravel())
        q.write_buffer(self.rope, CHUNK * half * 4, np.ascontiguousarray(sin, np.float32).ravel())

    def _submit(self, st: GpuLlamaState, chunk: np.ndarray, want: str):
        t = int(chunk.size)
        dev = self.dev
        self._grow(st, st.pos + t)
        self._write_step(st.pos, t)
        dev.queue.write_buffer(self.ids, 0, chunk.astype(np.uint32))
        nbytes = 0
        stage = None
        copy = None
        if want in ("last", "all", "hidden"):
            rows = 1 if want == "last" else t
            width = self.hidden if want == "hidden" else self.vocab
            nbytes = rows * width * 4
            if self.stage_out is None or self.stage_out.size < nbytes:
                self.stage_out = dev.staging(max(nbytes, self.vocab * 4))
            stage = self.stage_out
            copy = (self.xn if want == "hidden" else self.logits, stage, (nbytes + 15) // 16 * 16)
        elif want == "greedy":
            stage = self.stage_ids[0]
            copy = (self.res, stage, 16)
        done = dev.run(self._program(st, t, want), t, copy)
        self._advance(st, t)
        if want == "greedy":
            return self._greedy_token(stage, st.pos - 1, done)
        if stage is None:
            return None
        out = dev.read(stage, nbytes, after=done).view(np.float32)
        return out.reshape(-1, self.hidden if want == "hidden" else self.vocab)

    # ---- decode rows of several sequences in one submission ---------------------------
    batch_rows = CHUNK

    def forward_rows(self, states, tokens, wants) -> list:
        """One new token for each of up to CHUNK sequences (distinct states), in one
        submission of the layer program over the rows (`_skeleton`, mode "rows"): every
        product reads its weights once for all the rows, each sequence's attention runs
        over its own cache at its own position, and the head writes every row's
        logits."""
        if len(states) > self.batch_rows:
            raise ConfigError(f"forward_rows: {len(states)} rows exceed {self.batch_rows}")
        head = any(w != "none" for w in wants)
        if len(states) == 1:        # one row: the one-sequence decode program
            lg = self._submit(states[0], np.asarray(tokens, np.int64),
                              "last" if head else "none")
        else:
            R = self._rows_setup()
            lg = self._submit_rows(states, tokens,
                                   self._skeleton("rows", "all" if head else "none"),
                                   R.slices, head)
        # rows of the one array the readback made for this call: no copy each
        return [lg[j] if w == "last" else lg[j:j + 1] if w == "all" else None
                for j, w in enumerate(wants)]

    def _rows_setup(self) -> _LlamaRows:
        """The per-row buffers and the products over rows, made on first use."""
        if self._rows is None:
            self._rows = _LlamaRows(self)
            self._skeletons = {k: v for k, v in self._skeletons.items() if k[0] != "rows"}
        return self._rows

    def _rows_part(self, sts, marker: tuple) -> list:
        """A rows submission's split attention (llama_qk's work in it) runs a dispatch a
        group of rows (`_LlamaRows.attention`); any other attention, each row's own."""
        _tag, mode, li, splits = marker
        if mode == "rows" and splits > 1 and self.fuse_qk:
            return self._rows_setup().attention(sts, li)
        return super()._rows_part(sts, marker)

    def _rope_row(self, pos: int) -> np.ndarray:
        cos, sin = self.host.rope(pos, 1)
        return np.concatenate([np.ravel(cos), np.ravel(sin)]).astype(np.float32)

    # ---- programs: the dispatch lists of a chunk ------------------------------------
    def _program(self, st: GpuLlamaState, t: int, want: str) -> list:
        """A sequence's program: a decode row (t 1, its attention split by
        `decode_splits` of its position) or a prompt chunk, its attention on the state's
        own caches; made once per state (and range count)."""
        splits = self.decode_splits(st.pos) if t == 1 else 1
        key = (t == 1, want, splits)
        prog = st.programs.get(key)
        if prog is None:
            mode = "decode" if t == 1 else "chunk"
            prog = self._resolve(self._skeleton(mode, want, splits),
                                 lambda m: self._sequence_part(st, m, None))
            st.programs[key] = prog
            if t == 1 and want in ("last", "greedy"):
                self._decode_program = prog
        return prog

    def decode_splits(self, pos: int) -> int:
        """The key ranges the attention of a decode row at position `pos` is split into:
        1 below 2 * SPLIT_KEYS keys, then the most powers of two that leave every range
        SPLIT_KEYS keys, up to `splits` (a sliding layer's ranges are shorter)."""
        n = 1
        while 2 * n <= self.splits and pos + 1 >= 2 * n * SPLIT_KEYS:
            n *= 2
        return n

    def _kernel(self, name: str, resources: list, dims) -> Dispatch:
        dev = self.dev
        return Dispatch(llama_pipeline(dev, name), dev.bind(KERNELS[name], resolve(resources)),
                        dims, name)

    def _attention_part(self, st: GpuLlamaState, marker: tuple, at) -> list:
        """Layer marker[2]'s attention on state st's cache: llama_qk (unless the
        attention dispatch does its work) and the attention, over the chunk's rows (at
        None) or over one row of a rows submission (at: its RowSlices and row); with
        marker[3] > 1 key ranges the split attention, writing the range records that the
        O product (a decode row) or llama_attn_merge (rows) merges."""
        _tag, mode, li, splits = marker
        w = self.lw[li]
        row = None
        if at is None:
            step, qkv, att, rope = self.step, self.qkv, self.att, self.rope
            p_qk, p_attn = w["p_qk"], w["p_attn"]
            apart = self.apart
        else:
            S, row = at
            step, qkv, att, rope = S.step_at(row), S.at("qkv", row), S.at("att", row), \
                S.rope_at(row)
            p_qk, p_attn = w["p_qk_row"], w["p_attn_row"]
            apart = S.at("apart", row) if splits > 1 else None
        fused_qk = mode != "chunk" and self.fuse_qk
        part = []
        if not fused_qk:
            part.append(self._kernel("llama_qk", [p_qk, step, qkv, self.vbuf, rope, st.k[li],
                                                  st.v[li]],
                                     (self.nh + 2 * self.nk, 1, 1) if row is not None
                                     else lambda t: (self.nh + 2 * self.nk, t, 1)))
        if splits > 1:
            part.append(self._kernel("llama_attn_split_qk" if fused_qk else "llama_attn_split",
                                     [p_attn, step, qkv, st.k[li], st.v[li], apart,
                                      self.vbuf, rope], (self.nh, 1, splits)))
        else:
            part.append(self._kernel("llama_attn_qk" if fused_qk else "llama_attn",
                                     [p_attn, step, qkv, st.k[li], st.v[li], att, self.vbuf,
                                      rope], (self.nh, 1, 1) if row is not None
                                     else lambda t: (self.nh, t, 1)))
        return part

    def _skeleton(self, mode: str, want: str, splits: int = 1) -> list:
        """The Llama layer program, written once for every way a chunk runs; each
        layer's attention is left as a (SEQUENCE_PART, mode, layer, splits) marker that
        `_sequence_part` fills per sequence. mode "decode": one sequence's decode row
        (the decode matvec, llama_qk's work inside the attention dispatch); "chunk": a
        prompt chunk (the matmat); "rows": decode rows of several sequences (the
        products over the rows from `_LlamaRows`, the attention per row, split into the
        model's `splits` key ranges where it has more than one, then llama_attn_merge
        over every row). splits > 1 (decode): the attention split into that many key
        ranges, merged in the O product's input stage."""
        R = self._rows_setup() if mode == "rows" else None
        key = (mode, want, splits)
        made = self._skeletons.get(key)
        if made is not None:
            return made
        dev = self.dev
        nt = 1 if mode == "decode" else MATMAT_NT
        rows = lambda t: (t, 1, 1)  # noqa: E731
        rounds = (self.hidden + 1023) // 1024
        by_round = lambda t: (t, rounds, 1)  # noqa: E731 -- a norm: a workgroup a round

        # int8 rows: the norms and SwiGLU (and the attention merge, R.merge_quantizes)
        # write their output quantized as well, and the products reading it take it so
        xq = R.xq if R is not None and ROWS_QUANTIZE_IN_PASSES else None
        quantize = xq is not None

        def product(name: str, li: int | None = None, quantized: bool | None = None) -> list:
            """The one place a mode picks its products: op `name` of layer li (None: the
            model's head); `quantized` (rows): the pass before wrote its input into xq
            (default: where `quantize`, for every product but O)."""
            if R is not None:
                if quantized is None:
                    quantized = quantize and name != "o_op"
                return R.product(name, li, quantized=quantized)
            return self._chunk_product(getattr(self, name) if li is None
                                       else self.lw[li][name], nt)

        def stage(name: str, resources: list, dims) -> Dispatch:
            """A norm or SwiGLU pass (name), quantizing its output where `quantize`."""
            if quantize:
                return self._kernel(name + "_q", resources + [xq], dims)
            return self._kernel(name, resources, dims)

        e = self.embed
        prog: list = [Dispatch(embed_pipeline(dev, e.dtype, len(e.parts)), dev.bind(
            embed_kinds(len(e.parts)), resolve([self.p_embed, self.step, self.ids, self.x]
                                               + [b for b, _r0, _r in e.parts])), rows, "embed")]
        norm = [self.step, self.x, self.out, self.vbuf, self.xn]
        groups = (self.ffn + 1023) // 1024
        fuse_norms = mode == "decode" and self.fused_norms
        fuse_swiglu = mode == "decode" and self.fused_swiglu
        for li, w in enumerate(self.lw):
            if fuse_norms and li:
                prog.extend(product("qkv_norm_op", li))
            else:
                prog.append(stage("llama_norm", [w["p_norm_in"]] + norm, by_round))
                prog.extend(product("qkv_op", li))
            if R is not None and self.splits > 1:   # each row split, merged over the rows
                prog.append((SEQUENCE_PART, mode, li, self.splits))
                prog.append(R.merge)
                prog.extend(product("o_op", li, quantized=R.merge_quantizes))
            elif splits > 1:                         # merged in the O product's input
                prog.append((SEQUENCE_PART, mode, li, splits))
                prog.extend(self._chunk_product(w["o_split_ops"][splits], nt))
            else:
                prog.append((SEQUENCE_PART, mode, li, 1))
                prog.extend(product("o_op", li))
            if fuse_norms:
                prog.extend(product("gu_norm_op", li))
            else:
                prog.append(stage("llama_norm", [w["p_norm_mlp"]] + norm, by_round))
                prog.extend(product("gu_op", li))
            if fuse_swiglu:
                prog.extend(product("down_swiglu_op", li))
            else:
                prog.append(stage("llama_swiglu", [w["p_swiglu"], self.step, self.gu, self.vbuf],
                                  lambda t: (groups, t, 1)))
                prog.extend(product("down_op", li))
        if want != "none":
            if fuse_norms and self.lw:      # in place: a workgroup a row
                prog.append(stage("llama_norm", [self.p_norm_final_b] + norm, rows))
            else:
                prog.append(stage("llama_norm", [self.p_norm_final] + norm, by_round))
        if want in ("last", "greedy") and R is None:
            prog.extend(product("head_last"))
        elif want in ("last", "greedy", "all"):
            prog.extend(product("head_all"))
        if want == "greedy":
            prog.append(Dispatch(fixed_pipeline(dev, "argmax"), dev.bind(
                FIXED["argmax"], resolve([self.p_argmax, self.logits, self.ids, self.res])),
                (1, 1, 1), "argmax"))
        self._skeletons[key] = prog
        return prog


class _LlamaRows:
    """What decode rows of several sequences in one submission run beyond the chunk's
    buffers: the per-row pieces (`slices`: the Q|K|V output, the split attention's
    records and the attention output with each row bindable alone, a step block and
    rotary rows per row), the merge of the rows' key ranges (`merge`, where the model
    splits its attention) and the products over the rows: the rows matvec (matvecb.wgsl; every Llama product takes
    its input as it is), or the prompt matmat for a shape the rows matvec does not
    take. Q|K|V and O read and write the per-row pieces; the others the chunk's
    buffers."""

    def __init__(self, m: GpuLlamaModel):
        self.m = m
        widths = dict(qkv=m.qkv_w, att=m.q_size)
        if m.splits > 1:    # each row's split attention records
            widths["apart"] = m.nh * m.splits * (m.hd + 4)
        self.slices = S = RowSlices(m.dev, m.batch_rows, m.hd, **widths)
        self.arena = ParamArena(m.dev)
        self.ops: dict = {}
        for li, w in enumerate(m.lw):
            self.ops[(li, "qkv_op")] = MatvecOp(
                m.dev, [w["q"], w["k"], w["v"]], self.arena, x=m.xn, x_off=0, x_stride=m.hidden,
                y=S.bufs["qkv"], y_off=0, y_stride=S.stride["qkv"], vbuf=m.vbuf)
            self.ops[(li, "o_op")] = MatvecOp(
                m.dev, [w["o"]], self.arena, x=S.bufs["att"], x_off=0, x_stride=S.stride["att"],
                y=m.out, y_off=0, y_stride=m.hidden, vbuf=m.vbuf)
        self.merge = None
        if m.splits > 1:
            p_merge = self.arena.ref(u32s(m.hd, m.splits, S.stride["apart"], S.stride["att"]))
            # the rows attention's parameters: a row's Q|K|V, records (vec4s) and rotary
            # rows the slices' strides apart (llama_attn_split.wgsl, ROWS)
            self.p_attn = [self.arena.ref(u32s(
                m.nh, m.nk, m.hd, S.stride["qkv"], w["window"], m.q_size,
                float(m.host.attn_scale), S.stride["apart"] // 4, w["qkv_bias"], w["q_norm"],
                w["k_norm"], int(m.cfg.rope_interleaved), float(m.cfg.eps), 1, S.rope_stride,
                ROWS_RANGE_KEYS))
                for w in m.lw]
        self.group = rows_attn_group(m.dev)
        self.heads = rows_attn_heads(m.dev, m.nh, m.nk, m.hd)    # query heads a workgroup
        # the rows attention's dispatches of the last submission and of this one, by
        # (layer, first row, the group's caches): a batch of the same sequences binds
        # again what it bound the step before, and caches no longer in a batch are let go
        self._attn_last: dict = {}
        self._attn_now: dict = {}
        self.arena.upload()
        self._made: dict = {}
        # int8 activations: every product's input rows quantized into one scratch first
        # (by the pass that makes them, or by a quantrows pass of the product's own)
        self.xq = m.dev.buffer(m.batch_rows * 16 * max(rows_block_words(c) for c in (
            m.hidden, m.q_size, m.ffn))) if m.int8 else None
        # whether the merge writes the O product's input quantized too (heads of whole
        # quantization groups)
        self.merge_quantizes = (m.splits > 1 and self.xq is not None and m.hd % 32 == 0
                                and ROWS_QUANTIZE_IN_PASSES)
        if m.splits > 1:
            res = [p_merge, m.step, S.bufs["apart"], S.bufs["att"]]
            self.merge = (m._kernel("llama_attn_merge_q", res + [self.xq], lambda t: (m.nh, t, 1))
                          if self.merge_quantizes else
                          m._kernel("llama_attn_merge", res, lambda t: (m.nh, t, 1)))

    def attention(self, sts, li: int) -> list:
        """Layer li's split attention of the rows `sts` (llama_attn_rows_qk): a dispatch
        a group of up to `group` rows, each on its own caches at its own position, the
        records into the rows' slices for `merge`."""
        if li == 0:     # a new submission: keep what the last one bound
            self._attn_last, self._attn_now = self._attn_now, {}
        out = []
        for b0 in range(0, len(sts), self.group):
            grp = sts[b0:b0 + self.group]
            key = (li, b0) + tuple(id(b) for st in grp for b in (st.k[li], st.v[li]))
            d = self._attn_last.get(key) or self._attn_now.get(key)
            if d is None:
                d = self._attention_group(li, b0, grp)
            self._attn_now[key] = d
            out.append(d)
        return out

    def _attention_group(self, li: int, b0: int, grp) -> Dispatch:
        """The rows attention dispatch of rows b0.. (states grp) of layer li: the rows'
        slices of the step blocks, Q|K|V, records and rotary rows from row b0 on, and
        each row's caches."""
        m, S, n = self.m, self.slices, len(grp)

        def rows(buf, stride: int):
            return (buf, b0 * stride * 4, n * stride * 4)
        res = [self.p_attn[li], rows(S.step, S.step_words), rows(S.bufs["qkv"], S.stride["qkv"]),
               grp[0].k[li], grp[0].v[li], rows(S.bufs["apart"], S.stride["apart"]), m.vbuf,
               rows(S.rope, S.rope_stride)]
        for st in grp[1:]:
            res += [st.k[li], st.v[li]]
        return Dispatch(llama_rows_attn_pipeline(m.dev, n, self.heads, m.hd),
                        m.dev.bind(rows_attn_kinds(n), resolve(res)),
                        (m.nh // self.heads, n, m.splits), "llama_attn_rows_qk")

    def product(self, name: str, li: int | None, quantized: bool = False) -> list:
        """The dispatches of op `name` of layer li (None: the head) over the rows;
        `quantized`: the pass before it wrote its input rows into xq already."""
        m = self.m
        op = m.head_all if li is None else self.ops.get((li, name), m.lw[li][name])
        ds = self._made.get(id(op))
        if ds is None:
            try:
                ds = op.dispatch_rows(m.step, self.xq, quantized)
            except ConfigError:     # rows of partial chunks: the prompt matmat
                ds = [op.dispatch(m.step, MATMAT_NT)]
            self._made[id(op)] = ds
        return ds
