"""Weights on the device and the compute kernels that read them.

A `GpuMatrix` is a stored matrix uploaded once in its CMF dtype (no dequantized
copy), split into row pieces ("parts") where its payload exceeds the device's
storage-binding limit. The matvec / matmat and embedding shaders are generated per
combination of part dtypes from `shaders/qdecode.wgsl` (one decoder copy per binding),
so the fused Q/K/V/G and gate/up products and the pieces of a split matrix run as one
dispatch. Every kernel's parameters are a uniform block in a `ParamArena`; `Dispatch`
is one recorded kernel launch.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from .device import Device

DTYPE_IDS = {"f32": 0, "f16": 1, "bf16": 2, "q8_row": 3, "q4_block": 4, "q8_2f": 9,
             "q4_tiled": 11, "q4tp": 15, "q2tp": 16}
TILED = ("q4tp", "q2tp")        # cols % 32 == 0 by construction
MAX_PARTS = 8
NONE = 0xFFFFFFFF
#: rows per workgroup of the matvec shader (its 256 lanes split into RPW rows) where a
#: row has work for 64 lanes (matvec_lanes)
RPW = 4
#: prompt rows a matmat workgroup takes at once
MATMAT_NT = 8


# ---- matrices ------------------------------------------------------------------------
def _row_bytes_ranges(dtype: str, R: int, C: int, r0: int, r1: int) -> list:
    """The byte ranges of the payload that hold rows r0..r1-1, in the order a
    standalone payload of those rows lays them out (docs/cmf-format.md section 7)."""
    if dtype in ("f32", "f16", "bf16"):
        es = {"f32": 4, "f16": 2, "bf16": 2}[dtype]
        return [(r0 * C * es, r1 * C * es)]
    if dtype == "q8_row":
        return [(r0 * C, r1 * C), (R * C + 2 * r0, R * C + 2 * r1)]
    if dtype == "q8_2f":
        return [(r0 * C, r1 * C), (R * C + 2 * r0, R * C + 2 * r1),
                (R * C + 2 * R, R * C + 2 * R + 2 * C)]
    gpr = C // 32
    if dtype == "q4_block":
        return [(r0 * C // 2, r1 * C // 2), (R * C // 2 + 2 * r0 * gpr, R * C // 2 + 2 * r1 * gpr)]
    if dtype == "q4_tiled":
        return [(18 * r0 * gpr, 18 * r1 * gpr)]
    per = 16 if dtype == "q4tp" else 8
    s = (5 * gpr + 7) // 8
    nb = R * gpr * per
    return [(r0 * gpr * per, r1 * gpr * per), (nb + 4 * r0, nb + 4 * r1),
            (nb + 4 * R + r0 * s, nb + 4 * R + r1 * s)]


class GpuMatrix:
    """One stored matrix on the device: parts [(buffer, first row, rows)], one dtype."""

    def __init__(self, dev: Device, qt, name: str | None = None, limit: int | None = None):
        dtype, R, C = qt.dtype, qt.rows, qt.cols
        raw = np.asarray(qt.raw, np.uint8)
        if dtype not in DTYPE_IDS:     # vbit / vbit_ro: no device decoder; f32 rows
            dense = np.ascontiguousarray(qt.dequantize(), np.float32)
            raw, dtype = dense.view(np.uint8).reshape(-1), "f32"
        self.dtype, self.rows, self.cols, self.name = dtype, R, C, name or qt.name
        self.fast = C % 32 == 0
        per_row = max(1, raw.size // max(R, 1))
        limit = (limit or dev.max_binding) - 64
        if raw.size + 32 <= limit:
            pieces = [(0, R)]
        else:
            if dtype == "q4_block" and not self.fast:
                raise ConfigError(f"GPU: {self.name}: a q4_block matrix whose groups straddle "
                                  f"rows cannot be split under the {dev.max_binding}-byte "
                                  "storage-binding limit")
            step = max(1, limit // (per_row + 8))
            if step >= 32:      # whole tiles of the rows matvec (ROWS_TILE) in every part
                step -= step % 32
            pieces = [(r, min(R, r + step)) for r in range(0, R, step)]
        self.parts = []
        for r0, r1 in pieces:
            if len(pieces) == 1:
                data = raw
            else:
                data = np.concatenate([raw[a:b] for a, b in _row_bytes_ranges(dtype, R, C, r0, r1)])
            self.parts.append((dev.upload(data), r0, r1 - r0))
        self.nbytes = int(raw.size)


class WeightUpload:
    """A model's weights on their way to the device: matrices uploaded once as
    `GpuMatrix` (kept in `mats`), vectors (norm weights, gains, biases) packed into one
    float buffer whose offsets `vec` returns; offsets 0-3 hold zeros and None gives
    NONE, the shaders' "no vector"."""

    def __init__(self, dev: Device):
        self.dev = dev
        self.mats: list[GpuMatrix] = []
        self._vecs: list[np.ndarray] = [np.zeros(4, np.float32)]
        self._at = 4

    # untyped on purpose: the models keep these offsets and matrices in dicts of mixed
    # values per layer
    def vec(self, a):
        if a is None:
            return NONE
        a = np.ascontiguousarray(a, np.float32).ravel()
        off = self._at
        self._vecs.append(a)
        self._at += a.size
        return off

    def mat(self, qt):
        m = GpuMatrix(self.dev, qt)
        self.mats.append(m)
        return m

    def vector_buffer(self):
        """The packed vectors on the device (after the last `vec`)."""
        return self.dev.upload(np.concatenate(self._vecs))


@dataclass
class Dispatch:
    """One recorded kernel: pipeline, bind group and workgroup counts (a function of
    the chunk's row count t when the kernel runs per row)."""
    pipeline: object
    group: object
    dims: Any           # (x, y, z) or callable t -> (x, y, z)
    name: str = ""      # the kernel, for the time breakdown
    op: Any = None      # the MatvecOp of a decode product (its variant can be switched)
    pre: Any = None     # the pass staging a decode product's int8 input (MatvecOp.staged)
    modes: Any = None   # that product's (pipeline, group, dims) reading it, and its own
    shape: Any = None   # a product's (rows, cols), for the time breakdown by shape


class ParamArena:
    """Uniform blocks of many dispatches in one buffer, each at an aligned offset."""

    def __init__(self, dev: Device):
        self.dev = dev
        self.chunks: list[bytes] = []
        self.size = 0
        self.buf = None
        self._pending: list = []

    def add(self, data: bytes) -> int:
        at = self.size
        data = data + b"\0" * (-len(data) % 16)
        self.chunks.append(data)
        self.size = at + (len(data) + self.dev.uniform_align - 1) // self.dev.uniform_align \
            * self.dev.uniform_align
        self.chunks.append(b"\0" * (self.size - at - len(data)))
        return at

    def ref(self, data: bytes):
        """A placeholder resolved to (buffer, offset, size) once the arena is uploaded."""
        off = self.add(data)
        return _ParamRef(self, off, (len(data) + 15) // 16 * 16)

    def upload(self):
        self.buf = self.dev.upload(b"".join(self.chunks), uniform=True)
        return self.buf


class _ParamRef:
    def __init__(self, arena, off, size):
        self.arena, self.off, self.size = arena, off, size

    def resolve(self):
        return (self.arena.buf, self.off, self.size)


def resolve(resources_):
    return [r.resolve() if isinstance(r, _ParamRef) else r for r in resources_]


def u32s(*vals) -> bytes:
    out = bytearray()
    for v in vals:
        out += struct.pack("<f", v) if isinstance(v, float) else struct.pack("<I", int(v) & NONE)
    return bytes(out)


# ---- shader generation ---------------------------------------------------------------
def _decoder(dev: Device, i: int, dtype: str, src: str = "qdecode.wgsl") -> str:
    return dev.source(src).replace("$DTYPE", f"{DTYPE_IDS[dtype]}u") \
        .replace("$W", f"W{i}")


def _part_bindings(first: int, n: int) -> str:
    return "\n".join(f"@group(0) @binding({first + i}) var<storage, read> W{i}: "
                     "array<vec4<u32>>;" for i in range(n))


def _part_tables(parts_rows: list) -> bytes:
    starts, rows, at = [], [], 0
    for r in parts_rows:
        starts.append(at)
        rows.append(r)
        at += r
    starts += [NONE] * (MAX_PARTS - len(starts))
    rows += [0] * (MAX_PARTS - len(rows))
    return u32s(*starts) + u32s(*rows)


def _matvec_source(dev: Device, shader: str, n: int, fns: list, rowdot_args: str,
                   x_writable: bool = False) -> str:
    """A matvec shader over n stored parts: the shared parameters and bindings (X
    read-write only for an input stage that writes x back), the parts' functions, and
    the chain that sends a row to its part's `rowdot_i`."""
    disp = []
    for i in range(n):
        cond = f"row < P.part_start[{i} / 4][{i} % 4] + P.part_rows[{i} / 4][{i} % 4]"
        body = (f"let r = row - P.part_start[{i} / 4][{i} % 4]; rowdot_{i}(r, {rowdot_args}); "
                f"rs = W{i}_rowscale(r, P.part_rows[{i} / 4][{i} % 4], P.cols);")
        disp.append(("if" if i == 0 else "} else if") + f" ({cond}) {{ {body}")
    disp.append("}")
    return (dev.source(shader).replace("$MATVEC_IO", dev.source("matvec_io.wgsl"))
            .replace("$BINDINGS", _part_bindings(6, n))
            .replace("$PARTFNS", "\n".join(fns)).replace("$DISPATCH", "\n".join(disp))
            .replace("$XMODE", "read_write" if x_writable else "read"))


#: the decode matvec's input stages that write the residual stream back (matvec1.wgsl:
#: Dory's nGPT residual, the Llama family's residual and RMSNorm)
RESIDUAL_STAGES = (4, 6)


def matvec_kinds(nparts: int, pro: int = 0) -> tuple:
    return ("uniform", "uniform", "rw" if pro in RESIDUAL_STAGES else "read", "read", "read",
            "rw") \
        + ("read",) * nparts


def matvec_lanes(cols: int, fast: bool) -> int:
    """Lanes a row of matvec.wgsl takes: 256 // RPW, or as many as the row has 32-weight
    groups (rounded up to a power of two) where it has fewer, so that a short row's
    workgroup takes more rows instead of leaving lanes idle (the tile path hands each
    lane whole groups)."""
    lanes = 256 // RPW
    if fast:
        lanes = min(lanes, 1 << max(0, (cols // 32 - 1).bit_length()))
    return lanes


def matvec_pipeline(dev: Device, dtypes: tuple, fast: bool, nt: int, pro: int, lanes: int):
    key = ("matvec", dtypes, fast, nt, pro, lanes)
    if key in dev._pipelines:
        return dev._pipelines[key]
    n = len(dtypes)
    # a tile's 32 products written out: its weights (a private array) in registers
    part = unroll_row_loops(dev.source("matvec_part.wgsl"), 32, "e", "32u")
    fns = []
    for i, dt in enumerate(dtypes):
        fns.append(_decoder(dev, i, dt))
        fns.append(part.replace("$I", str(i)).replace("$FAST", "true" if fast else "false"))
    code = (_matvec_source(dev, "matvec.wgsl", n, fns, "lane, t0, nt")
            .replace("$RPWu", f"{256 // lanes}u").replace("$TPRu", f"{lanes}u")
            .replace("$NTu", f"{nt}u").replace("$PROu", f"{pro}u")
            .replace("$REDN", str(2 * 256 * nt)))
    return dev.pipeline(key, code, matvec_kinds(n))


def embed_kinds(nparts: int) -> tuple:
    return ("uniform", "uniform", "read", "rw") + ("read",) * nparts


def embed_pipeline(dev: Device, dtype: str, nparts: int):
    key = ("embed", dtype, nparts)
    if key in dev._pipelines:
        return dev._pipelines[key]
    part = dev.source("embed_part.wgsl")
    fns, disp = [], []
    for i in range(nparts):
        fns.append(_decoder(dev, i, dtype))
        fns.append(part.replace("$I", str(i)))
        cond = f"id < P.part_start[{i} / 4][{i} % 4] + P.part_rows[{i} / 4][{i} % 4]"
        body = f"embed_{i}(id - P.part_start[{i} / 4][{i} % 4], t, lid);"
        disp.append(("if" if i == 0 else "} else if") + f" ({cond}) {{ {body}")
    disp.append("}")
    code = (dev.source("embed.wgsl").replace("$BINDINGS", _part_bindings(4, nparts))
            .replace("$PARTFNS", "\n".join(fns)).replace("$DISPATCH", "\n".join(disp)))
    return dev.pipeline(key, code, embed_kinds(nparts))


FIXED = {  # name: binding kinds
    "qk_prep": ("uniform", "uniform", "rw", "read", "read", "rw", "rw"),
    "attention": ("uniform", "uniform", "read", "read", "read", "rw", "rw", "read", "read"),
    "attention_qk": ("uniform", "uniform", "read", "rw", "rw", "rw", "rw", "read", "read"),
    "rownorm": ("uniform", "uniform", "rw", "read", "read"),
    "argmax": ("uniform", "read", "rw", "rw"),
    "readbw": ("uniform", "read", "rw"),
    "rowstage": ("uniform", "uniform", "read", "read", "read", "rw"),
}


#: fixed kernels generated from another's source: name -> (file, {marker: text})
VARIANTS = {
    "attention": ("attention.wgsl", {"$KV": "read", "$QK": "false", "/*$W*/": "//"}),
    "attention_qk": ("attention.wgsl", {"$KV": "read_write", "$QK": "true", "/*$W*/": ""}),
}


def fixed_pipeline(dev: Device, name: str):
    src, marks = VARIANTS.get(name, (f"{name}.wgsl", {}))
    code = dev.source(src)
    for k, v in marks.items():
        code = code.replace(k, v)
    return dev.pipeline((name,), code, FIXED[name])


# ---- building dispatches ---------------------------------------------------------------
#: row groups a grid row holds (the shaders' wid.x + wid.y * NX)
NX = 32768
#: row slots of the decode matvec's workgroup (matvec1.wgsl: 256 / RPW1_SLOTS lanes a
#: row) and rows each slot takes in turn: RPW1_SLOTS * RPW1_ROWS rows share one staging
#: of the input. On an H200 (docs/PERFORMANCE.md section 15) 16 slots of 16 lanes beat 8
#: of 32 and 4 of 64 (half the workgroups, each staging the input once), and 4 rows a
#: slot measured slower than 1 (fewer workgroups in flight)
RPW1_SLOTS, RPW1_ROWS = 16, 1
#: the decode matvec's row reduction: True takes subgroupAdd where the device was opened
#: with the `subgroup` feature (`Device.subgroups`), False the shared-memory tree, None
#: follows CORTIQ_GPU_SUBGROUPS, and where that is unset: the tree for float32 inputs
#: (Llama-8B-shaped rows 1.17x faster on an H100, the long down rows 1.7x, Dory's as
#: fast: docs/PERFORMANCE.md section 15.3), subgroups for int8 ones (one 8B-shaped
#: token's int8 products 1.07x faster on an H100: section 15.6)
MATVEC_SUBGROUPS: bool | None = None
#: 16-byte loads a decode-matvec lane issues before it decodes the first (1 or 4; the
#: int8 path also takes 8)
MATVEC_UNROLL = 4
#: whether a decode product with no input stage (PRO 0) stages its input in shared
#: memory too (False: each lane reads the input where it needs it, no barrier)
MATVEC_STAGE_PLAIN = True
#: weights per 16-byte chunk of the decode matvec (the tiled dtypes: one 32-weight tile)
CHUNK = {"f32": 4, "f16": 8, "bf16": 8, "q8_row": 16, "q8_2f": 16, "q4_block": 32,
         "q4_tiled": 32, "q4tp": 32, "q2tp": 32}


def rows_dims(total_rows: int, rpw: int = RPW):
    """Workgroup grid (x, y) covering total_rows / rpw row groups under the
    65535-a-dimension limit."""
    groups = (total_rows + rpw - 1) // rpw
    return min(groups, NX), (groups + NX - 1) // NX


def matvec1_staging(dev: Device, cols: int) -> int:
    """Floats of shared memory the decode matvec stages its input in (0: the input is
    too long for the device's workgroup storage, and each lane transforms what it
    reads instead); rounded up to a power of two so that few pipeline variants exist."""
    xs = cols + cols // 32 + 4
    xs = 1 << max(8, (xs - 1).bit_length())
    return xs if (xs + 512 + 256) * 4 <= dev.max_workgroup_storage else 0


def matvec1_subgroups(dev: Device, int8: bool = False) -> bool:
    """Whether the decode matvec (on int8 inputs where `int8`) reduces its rows with
    subgroupAdd (see MATVEC_SUBGROUPS)."""
    from .device import subgroups_setting
    wanted = MATVEC_SUBGROUPS if MATVEC_SUBGROUPS is not None else subgroups_setting()
    if wanted is None:
        wanted = int8
    return dev.subgroups and wanted is True


def _subgroup_variant(code: str, sg: bool) -> str:
    """A decode-matvec shader with its subgroup reduction (sg) or its shared-memory tree;
    the tree's text holds no subgroup builtin, so it compiles on a device opened without
    the `subgroup` feature (CORTIQ_GPU_SUBGROUPS=0)."""
    code = (code.replace("$SGARGS", ", @builtin(subgroup_size) sgs: u32, "
                         "@builtin(subgroup_invocation_id) sgi: u32" if sg else "")
            .replace("$SGLANES", "    tpr = sgs; lane = sgi; slot = lid / sgs;" if sg else "")
            .replace("$SG", "true" if sg else "false"))
    return code if sg else code.replace("subgroupAdd(", "(")


def matvec1_int8_staging(dev: Device, dtypes: tuple, cols: int) -> tuple | None:
    """(words, scales) of shared memory the int8 decode matvec stages its quantized input
    in, or None where it does not apply: parts other than q8_row, columns not in whole
    32-column groups, or a device whose workgroup storage cannot hold them."""
    if cols % 32 or any(dt != "q8_row" for dt in dtypes):
        return None
    words = 1 << max(2, (cols // 16 - 1).bit_length())
    scales = 1 << max(2, (cols // 32 - 1).bit_length())
    fits = (16 * words + 4 * scales + 4 * (512 + 256 + 4)) <= dev.max_workgroup_storage
    return (words, scales) if fits else None


#: the decode product's int8 input staged once by a pass of its own (matvec1.wgsl's QOUT,
#: 1024 columns a workgroup) that the product's workgroups read (QIN), rather than by
#: each of them (one 8B-shaped int8 token 1.17x faster on an H100, 1.20x on an H200;
#: docs/PERFORMANCE.md 15.7); a product whose input stage needs its whole norm for the
#: write-back (PRO 4) stages in its workgroups
STAGE_ONCE = True
#: row slots of a product reading an input staged once (QIN): with no stage of their own,
#: smaller workgroups cost no more input reads, and more of them hide more latency (one
#: 8B-shaped token's products: 85.8 % of the read at 8 rows a workgroup, 81.7 at 16 and
#: 67.3 at 32 on an H100; 73.3, 75.8 and 72.0 on an H200: docs/PERFORMANCE.md 15.7)
STAGED_SLOTS = 8

_QSTORE = {
    "": "                xq[c >> 4u][(c >> 2u) & 3u] = q.codes;\n"
        "                if ((lid & 7u) == 0u) { xd[c >> 5u] = q.d; }",
    "out": "                Y[c >> 2u] = q.codes;\n"
           "                if ((lid & 7u) == 0u) { Y[P.cols / 4u + (c >> 5u)] = bitcast<u32>(q.d); }",
    "in": ""}


def stage_words(cols: int) -> int:
    """16-byte words a QOUT pass writes for a product of `cols` columns: the codes and
    scales (rows_block_words), then one sum of squares per 1024 columns."""
    return rows_block_words(cols) + ((cols + 1023) // 1024 + 3) // 4


def matvec1_pipeline(dev: Device, dtypes: tuple, pro: int, cols: int, int8: bool = False,
                     qmode: str = ""):
    """The decode matvec over parts of `dtypes` with input stage `pro`; int8=True takes
    the quantized-input variant (the caller checked matvec1_int8_staging, or for qmode
    "out" / "in", the pass staging the int8 input once and the product reading it, that
    the parts are q8_row and the columns whole 32-column groups)."""
    i8 = (1, 1) if qmode else (matvec1_int8_staging(dev, dtypes, cols) if int8 else None)
    xs = 0 if i8 else (matvec1_staging(dev, cols) if pro != 0 or MATVEC_STAGE_PLAIN else 0)
    sg = matvec1_subgroups(dev, i8 is not None)
    slots = STAGED_SLOTS if qmode == "in" else RPW1_SLOTS
    key = ("matvec1", dtypes, pro, xs, i8, slots, RPW1_ROWS, sg, MATVEC_UNROLL, qmode)
    if key in dev._pipelines:
        return dev._pipelines[key]
    n = len(dtypes)
    part = dev.source("matvec1_part_i8.wgsl" if i8 else "matvec1_part.wgsl")
    fns = []
    for i, dt in enumerate(dtypes):
        fns.append(_decoder(dev, i, dt))
        if not i8:
            fns.append(_decoder(dev, i, dt, "qchunk.wgsl"))
        fns.append(part.replace("$I", str(i)))
    words, scales = i8 or (1, 1)
    writes = pro in RESIDUAL_STAGES and qmode != "in"    # the residual written back
    write = ("X[P.v_b + c] = X[xb + c] + X2[x2b + c];" if pro == 6 else
             "X[P.v_b + c] = {} * inv;".format("xval(c)" if i8 else "xs[c + (c >> 5u)]"))
    code = (_subgroup_variant(_matvec_source(dev, "matvec1.wgsl", n, fns, "lane",
                                             x_writable=writes), sg)
            .replace("$RPWu", f"{slots}u").replace("$TPRu", f"{256 // slots}u")
            .replace("$RWu", f"{RPW1_ROWS}u")
            .replace("$UNROLLu", f"{MATVEC_UNROLL}u")
            .replace("$PROu", f"{pro}u").replace("$XSu", f"{xs}u")
            .replace("$XSN", str(max(xs, 4))).replace("$WTSN", "256" if pro in (3, 5) else "1")
            .replace("$I8", "true" if i8 else "false")
            .replace("$QUANT4", dev.source("quant4.wgsl"))
            .replace("$XQN", str(words)).replace("$XDN", str(scales))
            .replace("$XWRITE", write if writes else "")
            .replace("$QOUT", "true" if qmode == "out" else "false")
            .replace("$QIN", "true" if qmode == "in" else "false")
            .replace("$XQSTORE", _QSTORE[qmode])
            .replace("$XQSUMSTORE", "            if (lid == 0u) { Y[4u * (P.cols / 16u + "
                     "(P.cols / 32u + 3u) / 4u) + wid.x + wid.y * P.nx] = bitcast<u32>(sum); }"
                     if qmode == "out" else "")
            .replace("$YVAL", "bitcast<u32>(v)" if qmode == "out" else "v")
            .replace("$QWRITEBACK", "        X[P.v_b + c] = r;" if qmode == "out" and pro == 6
                     else ""))
    if qmode == "in":
        code = (code.replace("$XQWORD", "XQ[k]")
                .replace("$XQSCALE", "bitcast<f32>(XQ[P.cols / 16u + (k >> 3u)][(k >> 1u) & 3u])")
                .replace("$XQSUM", "bitcast<f32>(XQ[(at + i) >> 2u][(at + i) & 3u])")
                .replace("@group(0) @binding(3) var<storage, read> X2: array<f32>;",
                         "@group(0) @binding(3) var<storage, read> XQ: array<vec4<u32>>;\n"
                         "var<private> X2: array<f32, 1>;   // named by the stages, unused"))
    else:
        code = (code.replace("$XQWORD", "xq[k]").replace("$XQSCALE", "xd[k >> 1u]")
                .replace("$XQSUM", "0.0"))
    if qmode == "out":
        code = code.replace("@group(0) @binding(5) var<storage, read_write> Y: array<f32>;",
                            "@group(0) @binding(5) var<storage, read_write> Y: array<u32>;")
    return dev.pipeline(key, code, matvec_kinds(n, 0 if qmode == "in" else pro))


#: input rows a workgroup of the rows matvec (matvecb.wgsl) dots its weight rows with
ROWS_NB = 8


def unroll_row_loops(code: str, nb: int, var: str = "t", bound: str = "NB") -> str:
    """`code` with every `for (var t = 0u; t < NB; t++) { body }` (loop variable `var`,
    bound `bound`) written out as nb copies of body, t a constant in each: the private
    arrays it indexes (per-row accumulators, a tile's weights) are then indexed by
    constants only, so the compiler keeps them in registers rather than in the thread's
    local memory, where a dynamically indexed array goes."""
    head = f"for (var {var} = 0u; {var} < {bound}; {var}++) {{"
    out, at = [], 0
    while True:
        i = code.find(head, at)
        if i < 0:
            out.append(code[at:])
            return "".join(out)
        out.append(code[at:i])
        depth, j = 1, i + len(head)
        while depth:                       # the loop's closing brace
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        body = unroll_row_loops(code[i + len(head):j - 1], nb, var, bound)
        out.append("".join("{" + re.sub(rf"\b{var}\b", f"{k}u", body) + "}"
                           for k in range(nb)))
        at = j


def matvecb_pipeline(dev: Device, dtypes: tuple, int8: bool = False):
    """The rows matvec: the decode matvec's row dots over up to ROWS_NB input rows;
    int8=True: over rows quantized by quantrows_pipeline (q8_row parts only)."""
    sg = matvec1_subgroups(dev)
    key = ("matvecb", dtypes, RPW1_SLOTS, sg, MATVEC_UNROLL, ROWS_NB, int8)
    if key in dev._pipelines:
        return dev._pipelines[key]
    part = dev.source("matvecb_part_i8.wgsl" if int8 else "matvec1_part.wgsl")
    fns = []
    for i, dt in enumerate(dtypes):
        fns.append(_decoder(dev, i, dt))
        if not int8:
            fns.append(_decoder(dev, i, dt, "qchunk.wgsl"))
        fns.append(part.replace("$I", str(i)))
    code = (_subgroup_variant(_matvec_source(dev, "matvecb.wgsl", len(dtypes), fns, "lane"), sg)
            .replace("$RPWu", f"{RPW1_SLOTS}u").replace("$TPRu", f"{256 // RPW1_SLOTS}u")
            .replace("$UNROLLu", f"{MATVEC_UNROLL}u").replace("$NBu", f"{ROWS_NB}u")
            .replace("$REDN", str(256 * ROWS_NB)))
    code = unroll_row_loops(code, ROWS_NB)
    if int8:    # the quantized rows where the second input would be (unused here)
        code = code.replace("@group(0) @binding(3) var<storage, read> X2: array<f32>;",
                            "@group(0) @binding(3) var<storage, read> XQ: array<vec4<u32>>;")
    return dev.pipeline(key, code, matvec_kinds(len(dtypes)))


#: weight rows a lane group of the int8 rows matvec takes at once (matvecb_tile.wgsl; 0:
#: matvecb.wgsl's I8 variant, one row at a time). A product takes the tiles where every
#: part's rows are a multiple of it. Eight 8B-shaped rows' products on an H100, the input
#: in shared memory: 5.8 ms in tiles of 2, 8.2 in tiles of 4 (chunks of 512 columns),
#: 17.8 in tiles of 1 (chunks of 4096); before it, 28.5 in tiles of 8 (64 accumulators a
#: lane) (docs/PERFORMANCE.md 15.7, 15.9)
ROWS_TILE = 2


def rows_chunk_cols(dev: Device) -> int:
    """Input columns the int8 rows matvec (matvecb_tile.wgsl) holds in shared memory at
    once: 1024, one 32-column group for each of a lane group's 32 lanes, or less where
    the ROWS_NB rows of codes and scales (9 / 8 of a byte a column a row) do not fit
    beside its reduction tree (4 bytes a lane a row). Eight 8B-shaped rows' products on
    an H100: 5.8 ms in chunks of 1024 columns; 8.5 and 8.0 in chunks of 2048 and 4096
    (fewer workgroups fit an SM's shared memory), 7.2 and 12.0 in chunks of 512 and 256
    (lanes left idle); 6.8 reading the input from L2 (docs/PERFORMANCE.md 15.9). Never
    more than 1024: the shader gives a lane at most one group a chunk."""
    room = dev.max_workgroup_storage - 4 * 256 * ROWS_NB
    ch = 1024
    while ch > 32 and ROWS_NB * ch * 9 // 8 > room:
        ch //= 2
    return ch


def _tile_dispatch(n: int, call: str) -> str:
    """matvecb_tile.wgsl's chain sending the R rows from `row` to their part: `call` with
    $I the part, $ROWS its rows and r the part's row (the weight loads, or the rows' scales)."""
    disp = []
    for i in range(n):
        start, rows = f"P.part_start[{i} / 4][{i} % 4]", f"P.part_rows[{i} / 4][{i} % 4]"
        disp.append(("if" if i == 0 else "} else if") + f" (row < {start} + {rows}) {{\n"
                    f"        let r = row - {start}; " + call.replace("$I", str(i)).replace("$ROWS", rows))
    disp.append("}")
    return "\n".join(disp)


def matvecb_tile_pipeline(dev: Device, nparts: int):
    """The int8 rows matvec in R-row register tiles (matvecb_tile.wgsl, R = ROWS_TILE)
    over nparts q8_row parts."""
    sg = dev.subgroups
    ch = rows_chunk_cols(dev)
    key = ("matvecb_tile", nparts, sg, ROWS_TILE, ROWS_NB, ch)
    if key in dev._pipelines:
        return dev._pipelines[key]
    part = dev.source("matvecb_tile_part.wgsl")
    fns = [_decoder(dev, i, "q8_row") + part.replace("$I", str(i)) for i in range(nparts)]
    code = (_subgroup_variant(_matvec_source(dev, "matvecb_tile.wgsl", nparts, fns, "lane")
                              .replace("$W32", "sgs == 32u" if sg else "false"), sg)
            .replace("$TILES", _tile_dispatch(nparts, "tileload_$I(r, g);"))
            .replace("$ROWSCALES", _tile_dispatch(
                nparts, "for (var j = 0u; j < R; j++) { rsc[j] = W$I_rowscale(r + j, $ROWS, P.cols); }"))
            .replace("$RPWu", f"{8 * ROWS_TILE}u").replace("$Ru", f"{ROWS_TILE}u")
            .replace("$NBu", f"{ROWS_NB}u").replace("$ACCN", str(ROWS_TILE * ROWS_NB))
            .replace("$CHu", f"{ch}u").replace("$XQN", str(ROWS_NB * ch // 32))
            .replace("$REDN", str(256 * ROWS_NB)))
    code = unroll_row_loops(unroll_row_loops(code, ROWS_TILE, "j", "R"), ROWS_NB)
    code = code.replace("@group(0) @binding(3) var<storage, read> X2: array<f32>;",
                        "@group(0) @binding(3) var<storage, read> XQ: array<vec4<u32>>;")
    return dev.pipeline(key, code, matvec_kinds(nparts))


def rows_block_words(cols: int) -> int:
    """16-byte words of one input row quantized for the int8 rows matvec (quantrows.wgsl:
    cols / 16 words of codes, then cols / 32 scales padded to whole words)."""
    return cols // 16 + (cols // 32 + 3) // 4


def quantrows_pipeline(dev: Device):
    """Quantizes a product's input rows for the int8 rows matvec (quantrows.wgsl)."""
    io = dev.source("matvec_io.wgsl")
    head = io[:io.index("@group(0) @binding(2)")]   # the parameter structs, P and S
    code = (dev.source("quantrows.wgsl").replace("$MATVEC_IO_Q", head)
            .replace("$QUANT4_PUT", dev.source("quant4_put.wgsl"))
            .replace("$QUANT4", dev.source("quant4.wgsl")))
    return dev.pipeline(("quantrows",), code, QUANTROWS_KINDS)


QUANTROWS_KINDS = ("uniform", "uniform", "read", "rw")


class MatvecOp:
    """Y = group of matrices @ transformed input: the parameters and bindings of one
    product, usable for decode (nt=1) and prompt chunks (nt=MATMAT_NT)."""

    def __init__(self, dev: Device, mats: list, arena: ParamArena, *, x, x_off, x_stride,
                 y, y_off, y_stride, x2=None, x2_off=0, x2_stride=0, vbuf=None, v_a=NONE,
                 v_b=NONE, v_out=NONE, pro=0, last_row=False, eps=1e-6, hd=0, splits=1):
        cols = mats[0].cols
        if any(m.cols != cols for m in mats):
            raise ConfigError("GPU matvec: matrices of one group must share their columns")
        parts = [(m, buf, rows) for m in mats for (buf, _r0, rows) in m.parts]
        if len(parts) > min(MAX_PARTS, dev.max_storage_buffers - 4):
            raise ConfigError(f"GPU matvec: {len(parts)} matrix pieces in one product "
                              f"exceed {min(MAX_PARTS, dev.max_storage_buffers - 4)}")
        self.dtypes = tuple(m.dtype for m, _b, _r in parts)
        self.part_rows = [r for _m, _b, r in parts]
        self.fast = all(m.fast for m in mats)
        self.pro = pro
        self.total = sum(r for _m, _b, r in parts)
        self.cols = cols
        self.chunked = all(m.cols % CHUNK[m.dtype] == 0 for m in mats)
        if pro in (3, 5) and not (self.chunked and matvec1_staging(dev, cols)
                                  and 0 < hd and cols % hd == 0 and cols // hd * splits <= 256):
            raise ConfigError(f"GPU matvec: merging attention splits (PRO {pro}) needs the "
                              "staged decode matvec and at most 256 (head, split) records")
        if pro in RESIDUAL_STAGES and not (self.chunked and matvec1_staging(dev, cols)):
            raise ConfigError(f"GPU matvec: the fused residual (PRO {pro}) needs the staged "
                              "decode matvec")
        self.last_row = last_row
        params = (u32s(cols, x_off, x_stride, x2_off, x2_stride, y_off, y_stride, v_a, v_b,
                       v_out, int(last_row), NX, self.total, float(eps), hd, splits)
                  + _part_tables([r for _m, _b, r in parts]))
        self.param = arena.ref(params)
        self.dev = dev
        self.res = [x, x2 if x2 is not None else x, vbuf, y] + [b for _m, b, _r in parts]
        self.kinds = matvec_kinds(len(parts), pro)

    def decode_pipeline(self, int8: bool):
        """The decode matvec of this product: with its input quantized to int8 where
        int8 is asked and the parts allow it (matvec1_int8_staging), else float32."""
        i8 = int8 and matvec1_int8_staging(self.dev, self.dtypes, self.cols) is not None
        return matvec1_pipeline(self.dev, self.dtypes, self.pro, self.cols, int8=i8)

    def stages_once(self) -> bool:
        """Whether this decode product's int8 input can be staged by a pass of its own
        (STAGE_ONCE; q8_row parts, whole 32-column groups, an input stage other than
        PRO 4)."""
        return (STAGE_ONCE and self.chunked and self.pro != 4 and self.cols % 32 == 0
                and all(dt == "q8_row" for dt in self.dtypes))

    def staged(self, step_buf, xq, int8: bool) -> Dispatch:
        """The decode product (as `dispatch` with nt=1) with its QOUT pass in `pre`,
        writing its int8 input into xq (at least stage_words(cols) 16-byte words) for the
        product's QIN variant to read; recorded before the product, the pass runs no
        workgroup while the product takes float32 inputs (`switch`)."""
        dev = self.dev
        d = self.dispatch(step_buf, 1, int8)
        res = [self.param, step_buf] + self.res
        out = res[:5] + [xq] + res[6:]
        d.pre = Dispatch(matvec1_pipeline(dev, self.dtypes, self.pro, self.cols, qmode="out"),
                         dev.bind(self.kinds, resolve(out)), (0, 0, 0), f"qstage{self.pro}")
        inp = res[:3] + [xq] + res[4:]
        d.modes = ((matvec1_pipeline(dev, self.dtypes, self.pro, self.cols, qmode="in"),
                    dev.bind(matvec_kinds(len(self.dtypes)), resolve(inp)),
                    rows_dims(self.total, STAGED_SLOTS * RPW1_ROWS) + (1,)),
                   (d.group, d.dims))
        self.switch(d, int8)
        return d

    def switch(self, d: Dispatch, int8: bool) -> bool:
        """Puts decode dispatch d (and its QOUT pass) at the precision asked; whether its
        pipeline changed."""
        was = d.pipeline
        if d.pre is not None and int8:
            d.pipeline, d.group, d.dims = d.modes[0]
            d.pre.dims = rows_dims((self.cols + 1023) // 1024, 1) + (1,)
        else:
            d.pipeline = self.decode_pipeline(int8)
            if d.pre is not None:
                (d.group, d.dims), d.pre.dims = d.modes[1], (0, 0, 0)
        return d.pipeline is not was

    def dispatch(self, step_buf, nt: int, int8: bool = False) -> Dispatch:
        """The product over nt rows a workgroup (1: the decode matvec, with int8
        activations if int8; more: the matmat of a prompt chunk)."""
        dev = self.dev
        if self.pro >= 3 and nt != 1:
            raise ConfigError(f"GPU matvec: input stage {self.pro} runs in the decode "
                              "matvec only")
        group = dev.bind(self.kinds, resolve([self.param, step_buf] + self.res))
        if nt == 1 and self.chunked:
            nx, ny = rows_dims(self.total, RPW1_SLOTS * RPW1_ROWS)
            return Dispatch(self.decode_pipeline(int8), group, (nx, ny, 1), "matvec", op=self,
                            shape=(self.total, self.cols))
        lanes = matvec_lanes(self.cols, self.fast)
        pipe = matvec_pipeline(dev, self.dtypes, self.fast, nt, self.pro, lanes)
        nx, ny = rows_dims(self.total, 256 // lanes)
        if self.last_row:
            return Dispatch(pipe, group, (nx, ny, 1), "matvec")
        return Dispatch(pipe, group, lambda t, nx=nx, ny=ny, nt=nt: (nx, ny, (t + nt - 1) // nt),
                        "matmat")


    def rows_int8(self) -> bool:
        """Whether the rows matvec of this product can take int8 activations (q8_row
        parts, whole 32-column groups)."""
        return self.cols % 32 == 0 and all(dt == "q8_row" for dt in self.dtypes)

    def dispatch_rows(self, step_buf, xq=None, quantized: bool = False) -> list:
        """The rows matvec over the step's t input rows (the decode rows of several
        sequences): every workgroup reads its weight rows once for ROWS_NB of them. xq
        (a buffer of at least t * rows_block_words(cols) 16-byte words, where rows_int8)
        takes int8 activations: a quantrows pass into xq, then the integer rows matvec;
        `quantized`: the pass before the product wrote xq as quantrows would (from the
        same floats), so there is no quantrows pass."""
        if self.pro != 0 or self.last_row or not self.chunked:
            raise ConfigError("GPU matvec: the rows matvec takes a plain input (no input "
                              "stage, not the last row) and rows of whole chunks")
        dev = self.dev
        int8 = xq is not None and self.rows_int8()
        res = list(self.res)
        out = []
        if int8:
            res[1] = xq
        if int8 and not quantized:
            out.append(Dispatch(quantrows_pipeline(dev), dev.bind(
                QUANTROWS_KINDS, resolve([self.param, step_buf, self.res[0], xq])),
                lambda t, n=(self.cols + 1023) // 1024: (n, 1, t), "quantrows"))
        group = dev.bind(self.kinds, resolve([self.param, step_buf] + res))
        if int8 and ROWS_TILE and all(r % ROWS_TILE == 0 for r in self.part_rows):
            pipe, rpw = matvecb_tile_pipeline(dev, len(self.dtypes)), 8 * ROWS_TILE
        else:
            pipe, rpw = matvecb_pipeline(dev, self.dtypes, int8), RPW1_SLOTS
        nx, ny = rows_dims(self.total, rpw)
        out.append(Dispatch(pipe, group,
                            lambda t, nx=nx, ny=ny: (nx, ny, (t + ROWS_NB - 1) // ROWS_NB),
                            "matvecb", shape=(self.total, self.cols)))
        return out


def matvec_once(dev: Device, mats: list, X, *, pro: int = 0, x2=None, x2_off: int = 0,
                va=None, vb=None, out_scale=None, nt: int | None = None, hd: int = 0,
                splits: int = 1, residual_out: list | None = None,
                rows: bool = False, int8: bool = False, once: bool = False,
                eps: float = 1e-6) -> np.ndarray:
    """Run one product on its own (checks and tools): X [t, cols] (for pro=2 the
    gate/up rows [t, 2*cols'], b at x2_off, and so for pro=7; for pro=3 and pro=5 one row of
    attention split records, see attention.wgsl and llama_attn_split.wgsl; for pro=4 the
    row x, with o in x2 and alpha in va; for pro=6 the row x, with o in x2 and the norm's
    weight in va) -> Y [t, total rows]. nt=None picks what a forward would (the decode
    matvec for one row, the matmat for more); rows=True runs the rows matvec
    (matvecb.wgsl) over every row. pro=4 and pro=6 append the residual they wrote back to
    `residual_out`; int8=True runs the decode matvec (or with rows, the rows matvec) on
    int8 activations; once=True (with int8, one row) stages the int8 input by its own pass
    (`MatvecOp.staged`)."""
    X = np.ascontiguousarray(X, np.float32)
    t = X.shape[0]
    xcols = X.shape[1]
    if pro in RESIDUAL_STAGES:     # room for the residual the first workgroup writes back
        X = np.concatenate([X, np.zeros_like(X)], axis=1)
    vecs = [np.zeros(4, np.float32)]
    offs = {}
    for k, a in (("va", va), ("vb", vb), ("out", out_scale)):
        if a is not None:
            offs[k] = sum(v.size for v in vecs)
            vecs.append(np.ascontiguousarray(a, np.float32).ravel())
    vbuf = dev.upload(np.concatenate(vecs))
    xbuf = dev.upload(X)
    x2buf = dev.upload(np.ascontiguousarray(x2, np.float32)) if x2 is not None else None
    total = sum(m.rows for m in mats)
    ybuf = dev.buffer(t * total * 4, copy_src=True)
    step = dev.upload(np.array([t, 0, 0, 0], np.uint32), uniform=True)
    arena = ParamArena(dev)
    op = MatvecOp(dev, mats, arena, x=xbuf, x_off=0, x_stride=X.shape[1], y=ybuf, y_off=0,
                  y_stride=total, x2=x2buf, x2_off=x2_off,
                  x2_stride=(x2.shape[1] if x2 is not None else 0), vbuf=vbuf,
                  v_a=offs.get("va", NONE),
                  v_b=xcols if pro in RESIDUAL_STAGES else offs.get("vb", NONE),
                  v_out=offs.get("out", NONE), pro=pro, hd=hd, splits=splits, eps=eps)
    arena.upload()
    if rows:
        xq = dev.buffer(t * rows_block_words(xcols) * 16) if int8 else None
        ds = op.dispatch_rows(step, xq)
    elif once:
        if not (int8 and t == 1 and op.stages_once()):
            raise ConfigError("GPU matvec: this product's input is not staged by a pass")
        d = op.staged(step, dev.buffer(16 * stage_words(xcols)), True)
        ds = [d.pre, d]
    else:
        ds = [op.dispatch(step, nt or (1 if t == 1 else MATMAT_NT), int8)]
    stage = dev.staging(t * total * 4)
    enc = dev.record(ds, t)
    enc.copy_buffer_to_buffer(ybuf, 0, stage, 0, t * total * 4)
    xstage = None
    if pro in RESIDUAL_STAGES and residual_out is not None:
        xstage = dev.staging(xcols * 4)
        enc.copy_buffer_to_buffer(xbuf, xcols * 4, xstage, 0, (xcols * 4 + 15) // 16 * 16)
    dev.queue.submit([enc.finish()])
    if xstage is not None and residual_out is not None:
        residual_out.append(dev.read(xstage, xcols * 4).view(np.float32))
    return dev.read(stage, t * total * 4).view(np.float32).reshape(t, total)
