"""Matvec speed of the ggml K-quant dtypes (q4_k, q6_k, q5_k, ...) against the read
bandwidth, exact and with int8 activations.

For each dtype and thread count: GB/s of weight bytes of a matvec over matrices that
together exceed the last-level cache (4096 x 11008 each, blocks of random bytes with
normal half-precision scales), beside the read probe (K.read_sum, 4 streams a thread)
measured alternately with it, and the in-cache ceiling (one 4 MiB block repeated). The
machine's other load shows up as noise: best of `--reps`; run it on a quiet machine.
With --matmat: the prefill product instead, a prompt chunk's matmat(X, prompt=True) of
512 x 2048 inputs against 5632 x 2048 weights (int8 activations), in GMAC/s and its
tokens/s, for each dtype and for q8_row's int8 matmat as the yardstick.
    PYTHONPATH=src python benchmarks/bench_ggml_kquants.py [--dtypes q4_k,q6_k] [--threads 1,2]
    PYTHONPATH=src python benchmarks/bench_ggml_kquants.py --matmat [--threads 1,2]
"""
import argparse
import time

import numpy as np

import cortiq
from cortiq.cmf.ggml_blocks import FORMATS
from cortiq.cmf.quant import quantize
from cortiq.kernels import _kernels as K
from cortiq.kernels.tensor import QTensor

#: byte offsets of each format's f16 scales (d, and dmin where it has one)
SCALE_OFFSETS = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "q2_k": (80, 82),
                 "q3_k": (108,), "iq4_xs": (0,)}


def random_blocks(rng, dtype, rows, cols):
    f = FORMATS[dtype]
    nb = rows * cols // f.block_elems
    raw = rng.integers(0, 256, size=(nb, f.block_bytes), dtype=np.uint8)
    for off in SCALE_OFFSETS[dtype]:
        raw[:, off:off + 2] = rng.uniform(1e-3, 1e-2, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def best(fn, reps, *args):
    fn(*args)
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        t = min(t, time.perf_counter() - t0)
    return t


def bench_matmat(a, rng):
    t, cols, rows = 512, 2048, 5632
    X = rng.standard_normal((t, cols)).astype(np.float32)
    print(f"isa {K.active_isa()}; matmat(prompt=True) of {t} x {cols} inputs, {rows} x {cols} weights")
    for dtype in a.dtypes.split(",") + ["q8_row"]:
        if dtype == "q8_row":
            w = rng.standard_normal((rows, cols)).astype(np.float32)
            q = QTensor(quantize(w, "q8_row"), "q8_row", (rows, cols), precision="auto")
        else:
            q = QTensor(random_blocks(rng, dtype, rows, cols), dtype, (rows, cols), precision="auto")
        for th in (int(n) for n in a.threads.split(",")):
            cortiq.set_num_threads(th)
            sec = best(q.matmat, a.reps, X, None, True)
            print(f"{dtype:7s} {th}T  {t * cols * rows / sec / 1e9:6.1f} GMAC/s  {t / sec:7.1f} tokens/s "
                  f"(one {rows}x{cols} matrix)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--matmat", action="store_true", help="the prefill product instead of matvec")
    ap.add_argument("--dtypes", default="q4_k,q6_k,q5_k")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--total-mib", type=int, default=512)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    if a.matmat:
        bench_matmat(a, rng)
        return
    buf = np.ones(a.total_mib << 20, np.uint8)
    rows, cols = 11008, 4096
    print(f"isa {K.active_isa()}; matrices {rows}x{cols}, about {a.total_mib} MiB of weights a pass")
    for dtype in a.dtypes.split(","):
        raw = random_blocks(rng, dtype, rows, cols)
        n = max(2, (a.total_mib << 20) // raw.size)
        x = rng.standard_normal(cols).astype(np.float32)
        out = np.empty(rows, np.float32)
        ceil_rows = max(96, (4 << 20) // K.qmat_nbytes(dtype, 1, cols))
        for prec in ("int8", "exact"):
            qs = [QTensor(raw if i == 0 else raw.copy(), dtype, (rows, cols), precision=prec) for i in range(n)]
            small = QTensor(random_blocks(rng, dtype, ceil_rows, cols), dtype, (ceil_rows, cols), precision=prec)
            for th in (int(t) for t in a.threads.split(",")):
                cortiq.set_num_threads(th)
                mv = rd = float("inf")
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    K.read_sum(buf, th, 4)
                    t1 = time.perf_counter()
                    for q in qs:
                        q.matvec(x, out)
                    t2 = time.perf_counter()
                    rd, mv = min(rd, t1 - t0), min(mv, t2 - t1)
                gbs, rbw = n * raw.size / mv / 1e9, buf.size / rd / 1e9
                ceil = small.nbytes / best(small.matvec, 10 * a.reps, x) / 1e9
                print(f"{dtype:7s} {prec:5s} {th}T  {gbs:6.1f} GB/s  read {rbw:6.1f} GB/s  "
                      f"{100 * gbs / rbw:5.1f} %   in-cache {ceil:6.1f} GB/s")
            del qs


if __name__ == "__main__":
    main()
