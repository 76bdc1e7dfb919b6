"""Two GPU probes behind the int8 rows matvec's design (docs/PERFORMANCE.md 15.9).

* overlap: passes of 512 `readbw` dispatches (1, 32 or 512 workgroups each) whose output
  is one buffer for all, a buffer each, or four buffers in turn: microseconds a
  dispatch. wgpu puts a barrier before a dispatch that writes a buffer an earlier
  dispatch of the command buffer wrote, and a barrier waits for all the work before it,
  so only dispatches writing buffers of their own run at once.
* rows: one pass over eight Llama-3-8B-shaped decode rows' int8 products (each with its
  quantrows pass; `_bench_gpu_kernels.llama8b_rows_chain`'s stream) for each
  (ROWS_TILE, input chunk columns): GPU ms of the pass and of its rows matvecs alone.
* splits (with --splits): the int8 8B-shaped model built with each number of attention
  key ranges, a rows step of eight sequences at position 132
  (`_bench_gpu_llama.rows_breakdown`): the step, its GPU time and its attention's.

    python benchmarks/gpu_rows_probe.py [--out FILE] [--variants 2:1024,2:512,4:512]
                                        [--splits 8,4,2]
"""
from __future__ import annotations

import argparse
import json
import os
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


def rows(dev, variants: list, t: int = 8) -> dict:
    from cortiq.gpu import kernels
    from cortiq.gpu.kernels import rows_block_words
    _layer, _head, ops = K._llama8b_ops(dev, 4096, 14336, 32, 8, 128, 128256, rows=t)
    step = dev.upload(np.array([t, 0, 0, 0], np.uint32), uniform=True)
    xq = dev.buffer(t * 16 * rows_block_words(14336))
    K.busy(dev)
    res = {"rows": t, "chunk_default": kernels.rows_chunk_cols(dev)}
    keep = kernels.ROWS_TILE, kernels.rows_chunk_cols
    try:
        for tile, chunk in variants:
            kernels.ROWS_TILE = tile
            kernels.rows_chunk_cols = lambda dev, c=chunk: c
            ds = [op.dispatch_rows(step, xq) for op in ops]
            prog = [x for g in ds[:4] for x in g] * 32 + ds[4]
            res[f"tile{tile}_chunk{chunk}"] = {
                "pass_ms": K._time_pass(dev, prog, rounds=3, t=t) * 1e3,
                "matvecb_ms": K._time_pass(dev, [x for x in prog if x.name == "matvecb"],
                                           rounds=3, t=t) * 1e3}
            print(tile, chunk, res[f"tile{tile}_chunk{chunk}"], flush=True)
    finally:
        kernels.ROWS_TILE, kernels.rows_chunk_cols = keep
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
                    help="ROWS_TILE:chunk columns pairs of the rows probe")
    ap.add_argument("--splits", default="",
                    help="attention key ranges of the splits probe (none: not run)")
    a = ap.parse_args()
    from cortiq.gpu.device import Device
    dev = Device()
    variants = [tuple(int(x) for x in v.split(":")) for v in a.variants.split(",") if v]
    out = {"device": dev.name, "overlap": overlap(dev), "rows": rows(dev, variants)}
    if a.splits:
        out["splits"] = splits(dev, [int(x) for x in a.splits.split(",")])
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
