"""Two GPU probes behind the int8 rows matvec's design (docs/PERFORMANCE.md 15.9).

* overlap: passes of 512 `readbw` dispatches (1, 32 or 512 workgroups each) whose output
  is one buffer for all, a buffer each, or four buffers in turn: microseconds a
  dispatch. wgpu puts a barrier before a dispatch that writes a buffer an earlier
  dispatch of the command buffer wrote, and a barrier waits for all the work before it,
  so only dispatches writing buffers of their own run at once.
* rows: one pass over eight Llama-3-8B-shaped decode rows' int8 products (each with its
  quantrows pass; `_bench_gpu_kernels.llama8b_rows_chain`'s stream) for each
  (ROWS_TILE, input chunk columns): GPU ms of the pass and of its rows matvecs alone.
* alu (with --alu): the device's rate of the operations the int8 matvecs spend their
  time on: dot4I8Packed (a DP4A instruction where the shader compiler emits one, else
  four byte extractions a side, multiplies and adds), the same written out as that
  polyfill, an i32 multiply-add and an f32 FMA, each in 8 independent chains a lane:
  giga-operations a second.
* splits (with --splits): the int8 8B-shaped model built with each number of attention
  key ranges, a rows step of eight sequences at position 132
  (`_bench_gpu_llama.rows_breakdown`): the step, its GPU time and its attention's.

    python benchmarks/gpu_rows_probe.py [--out FILE] [--variants 2:1024,2:512:8:nodot]
                                        [--splits 8,4,2] [--alu]

A rows variant is ROWS_TILE:chunk columns[:input rows[:mode]], a mode taking a part out
of matvecb_tile.wgsl to time the rest: `nodot` (each 16-byte dot replaced by an XOR fold
of the same words: the loads and barriers without the arithmetic), `poly` (dot4I8Packed
written out as its polyfill), `nocopy` (no input chunk copied into shared memory and no
barriers: the dots read whatever is there), `noweights` (no weight loads: the dots take
made-up words); modes joined by + take out several parts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_gpu_kernels as K


def overlap(dev, n: int = 512) -> dict:
    from cortiq.gpu.kernels import FIXED, Dispatch, ParamArena, fixed_pipeline, resolve, u32s
    src = dev.buffer(1 << 20)
    arena = ParamArena(dev)
    sizes = (1, 32, 512)
    params = {wg: arena.ref(u32s(65536, 65536 // wg, 0, 0)) for wg in sizes}
    arena.upload()
    pipe = fixed_pipeline(dev, "readbw")
    outs = [dev.buffer(4096) for _ in range(n)]

    def d(out, wg):
        return Dispatch(pipe, dev.bind(FIXED["readbw"], resolve([params[wg], src, out])),
                        (wg, 1, 1), "readbw")
    K.busy(dev)
    res = {}
    for wg in sizes:
        res[f"workgroups_{wg}"] = {
            name: K._time_pass(dev, ds, rounds=3) * 1e6 / n for name, ds in (
                ("one_buffer_us", [d(outs[0], wg)] * n),
                ("a_buffer_each_us", [d(outs[i], wg) for i in range(n)]),
                ("four_in_turn_us", [d(outs[i % 4], wg) for i in range(n)]))}
    return res


ALU_OPS = {
    "dot4I8Packed": "a[k] = dot4I8Packed(b[k], u32(a[k])) + a[k];",
    "polyfill": "a[k] = dot4p(b[k], u32(a[k])) + a[k];",
    "imad": "a[k] = a[k] * i32(b[k]) + 7;",
    "ffma": "f[k] = fma(f[k], bitcast<f32>(b[k]), 0.5);",
}

# dot4I8Packed written out as naga's polyfill: byte extractions, multiplies, adds
_DOT4P = """fn dot4p(x: u32, y: u32) -> i32 {
    var s = 0;
    for (var i = 0u; i < 32u; i += 8u) {
        s += extractBits(bitcast<i32>(x), i, 8u) * extractBits(bitcast<i32>(y), i, 8u);
    }
    return s;
}
"""

_ALU = """
@group(0) @binding(0) var<uniform> P: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> B: array<u32>;
$DOT4P
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    var a: array<i32, 8>;
    var f: array<f32, 8>;
    var b: array<u32, 8>;
    for (var k = 0u; k < 8u; k++) {
        b[k] = B[k] ^ (g.x * 2654435761u + k);
        a[k] = i32(b[k] >> 3u);
        f[k] = f32(a[k]) * 1e-9;
    }
    for (var i = 0u; i < P.x; i++) {
        $UNROLLED
    }
    var s = 0u;
    for (var k = 0u; k < 8u; k++) { s += u32(a[k]) + bitcast<u32>(f[k]); }
    B[16u + g.x] = s;
}
"""


def alu(dev, iters: int = 2048, groups: int = 2048) -> dict:
    """Giga-operations a second of each ALU_OPS body (8 independent chains a lane)."""
    from cortiq.gpu.kernels import Dispatch
    par = dev.upload(np.array([iters, 0, 0, 0], np.uint32), uniform=True)
    buf = dev.buffer(4 * (16 + 256 * groups))
    kinds = ("uniform", "rw")
    K.busy(dev)
    res = {}
    for name, body in ALU_OPS.items():
        chains = "".join(body.replace("[k]", f"[{k}]") for k in range(8))
        code = _ALU.replace("$DOT4P", _DOT4P).replace("$UNROLLED", chains)
        pipe = dev.pipeline(("alu_probe", name), code, kinds)
        d = Dispatch(pipe, dev.bind(kinds, [par, buf]), (groups, 1, 1), name)
        sec = K._time_pass(dev, [d] * 4, rounds=3)
        res[name + "_gops"] = 4 * 8 * iters * 256 * groups / sec / 1e9
        print(name, res[name + "_gops"], flush=True)
    return res


_DOT16 = """fn dot16(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y)
         + dot4I8Packed(a.z, b.z) + dot4I8Packed(a.w, b.w);
}"""
# the chunk's copy into shared memory, from the barrier before it to the one after
_COPY = re.compile(r"\n[ ]*workgroupBarrier\(\);[^\n]*the last chunk's reads are done\n"
                   r".*?\n[ ]*workgroupBarrier\(\);\n", re.DOTALL)
_TILELOAD = """fn tileload(row: u32, g: u32) {   // the R rows from `row`: group g's words into nw, nw2
$TILES
}"""
_FAKE_TILELOAD = """fn tileload(row: u32, g: u32) {
    for (var j = 0u; j < R; j++) {
        nw[j] = vec4<u32>(row + j, g, 1u, 2u);
        nw2[j] = vec4<u32>(g, row, 3u, 4u);
    }
}"""
# mode -> (the text of matvecb_tile.wgsl it replaces, its replacement)
_MODES = {
    "nodot": (_DOT16, """fn dot16(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return bitcast<i32>((a.x ^ b.x) + (a.y ^ b.y) + (a.z ^ b.z) + (a.w ^ b.w));
}"""),
    "poly": (_DOT16, _DOT4P + """fn dot16(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4p(a.x, b.x) + dot4p(a.y, b.y) + dot4p(a.z, b.z) + dot4p(a.w, b.w);
}"""),
    "nocopy": (_COPY, "\n"),
    "noweights": (_TILELOAD, _FAKE_TILELOAD),
}


def _patched(code: str, mode: str) -> str:
    """matvecb_tile.wgsl (or any other shader, untouched) with a part taken out by mode."""
    if "fn tiledots" not in code or not mode:
        return code
    for m in mode.split("+"):
        old, new = _MODES[m]
        code, found = (old.subn(new, code, count=1) if isinstance(old, re.Pattern)
                       else (code.replace(old, new), code.count(old)))
        if not found:
            raise SystemExit(f"mode {m}: the shader no longer holds the text it replaces")
    return code


def forget_tiles(dev) -> None:
    """Drops the device's cached matvecb_tile pipelines (made from a patched or the plain
    shader), so the next product makes them again."""
    for key in [k for k in dev._pipelines if k[0] == "matvecb_tile"]:
        del dev._pipelines[key]


def rows(dev, variants: list) -> dict:
    """Each variant (tile, chunk, input rows, mode) of the rows matvec over one pass of an
    8B-shaped rows step's products (each with its quantrows pass)."""
    from cortiq.gpu import kernels
    from cortiq.gpu.kernels import rows_block_words
    tmax = max(v[2] for v in variants)
    _layer, _head, ops = K._llama8b_ops(dev, 4096, 14336, 32, 8, 128, 128256, rows=tmax)
    steps = {t: dev.upload(np.array([t, 0, 0, 0], np.uint32), uniform=True)
             for t in {v[2] for v in variants}}
    xq = dev.buffer(tmax * 16 * rows_block_words(14336))
    K.busy(dev)
    res = {"chunk_default": kernels.rows_chunk_cols(dev)}
    keep = kernels.ROWS_TILE, kernels.rows_chunk_cols
    source = dev.source
    try:
        for tile, chunk, t, mode in variants:
            kernels.ROWS_TILE = tile
            kernels.rows_chunk_cols = lambda dev, c=chunk: c
            dev.source = lambda name, m=mode: _patched(source(name), m)
            forget_tiles(dev)
            ds = [op.dispatch_rows(steps[t], xq) for op in ops]
            prog = [x for g in ds[:4] for x in g] * 32 + ds[4]
            name = f"tile{tile}_chunk{chunk}_rows{t}" + (f"_{mode}" if mode else "")
            res[name] = {
                "pass_ms": K._time_pass(dev, prog, rounds=3, t=t) * 1e3,
                "matvecb_ms": K._time_pass(dev, [x for x in prog if x.name == "matvecb"],
                                           rounds=3, t=t) * 1e3}
            print(name, res[name], flush=True)
    finally:
        kernels.ROWS_TILE, kernels.rows_chunk_cols = keep
        dev.source = source
        forget_tiles(dev)
    return res


def splits(dev, counts: list) -> dict:
    import bench_gpu
    from _bench_gpu_llama import LLAMA8B, random_llama, rows_breakdown
    from cortiq.gpu.llama import GpuLlamaModel
    host = random_llama(LLAMA8B)
    prompt = np.random.default_rng(0).integers(0, host.vocab, 132)
    res = {}
    for s in counts:
        g = GpuLlamaModel(host, dev, attn_splits=s)
        g.set_precision("int8")
        r = rows_breakdown(g, prompt, 8, bench_gpu._time_dispatches)
        res[f"splits{g.splits}"] = {k: v for k, v in r.items() if k != "gpu_ms_by_kernel"}
        res[f"splits{g.splits}"]["attention_ms"] = {
            k: v["ms"] for k, v in r["gpu_ms_by_kernel"].items() if "attn" in k}
        print(s, res[f"splits{g.splits}"], flush=True)
        del g
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--variants", default="2:1024,2:2048,2:512,4:512",
                    help="ROWS_TILE:chunk columns[:input rows[:mode]] of the rows probe")
    ap.add_argument("--alu", action="store_true", help="run the ALU rate probe too")
    ap.add_argument("--splits", default="",
                    help="attention key ranges of the splits probe (none: not run)")
    a = ap.parse_args()
    from cortiq.gpu.device import Device
    dev = Device()
    variants = []
    for v in a.variants.split(","):
        if v:
            f = v.split(":") + ["8", ""][len(v.split(":")) - 2:]
            variants.append((int(f[0]), int(f[1]), int(f[2]), f[3]))
    out = {"device": dev.name}
    if a.alu:
        out["alu"] = alu(dev)
    out["overlap"] = overlap(dev)
    out["rows"] = rows(dev, variants)
    if a.splits:
        out["splits"] = splits(dev, [int(x) for x in a.splits.split(",")])
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
