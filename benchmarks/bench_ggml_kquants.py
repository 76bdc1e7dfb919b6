"""Matvec speed of the ggml K-quant dtypes (q4_k, q6_k, q5_k, ...) against the read
bandwidth, exact and with int8 activations.

For each dtype and thread count: GB/s of weight bytes of a matvec over matrices that
together exceed the last-level cache (4096 x 11008 each, blocks of random bytes with
normal half-precision scales), beside the read probe (K.read_sum, 4 streams a thread)
measured alternately with it, and the in-cache ceiling (one 4 MiB block repeated). The
machine's other load shows up as noise: best of `--reps`; run it on a quiet machine.
It ends with the docs/PERFORMANCE.md table (markdown). `CORTIQ_ISA=avx2` runs the AVX2
table on an AVX-512 machine.
    PYTHONPATH=src python benchmarks/bench_ggml_kquants.py [--dtypes q4_k,q6_k] [--threads 1,2]
        [--precisions int8,exact]
With --matmat: the prefill product instead, a prompt chunk's matmat(X, prompt=True) of
512 x 2048 inputs against 5632 x 2048 weights (int8 activations), in GMAC/s and its
tokens/s, for each dtype and for q8_row's int8 matmat as the yardstick; "cpu" divides
by the process's CPU time instead of the wall clock (on a shared machine the time the
thread actually ran: read it for 1 thread). With --peer as well, llama.cpp's own CPU
matmul (ggml_mul_mat of the same block bytes against the same float32 X, through the
libggml of llama-cpp-python, ctypes) is timed alternately with cortiq's.
    PYTHONPATH=src python benchmarks/bench_ggml_kquants.py --matmat [--peer] [--threads 1,2]
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


class GgmlPeer:
    """llama.cpp's CPU matmul through libggml (ctypes): W (rows x cols, ggml block bytes)
    times X (t x cols, float32)."""
    def __init__(self):
        import ctypes as C
        import os

        import llama_cpp  # llama-cpp-python: a benchmark-only dependency
        lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")

        class Params(C.Structure):
            _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]
        self.C, self.Params = C, Params
        b = self.base = C.CDLL(os.path.join(lib, "libggml-base.so"), mode=C.RTLD_GLOBAL)
        c = self.cpu = C.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=C.RTLD_GLOBAL)
        P = C.c_void_p
        for fn, res, args in ((b.ggml_init, P, [Params]), (b.ggml_new_tensor_2d, P, [P, C.c_int, C.c_int64, C.c_int64]),
                              (b.ggml_mul_mat, P, [P, P, P]), (b.ggml_new_graph, P, [P]),
                              (b.ggml_build_forward_expand, None, [P, P]), (b.ggml_get_data, P, [P]),
                              (b.ggml_nbytes, C.c_size_t, [P]), (b.ggml_free, None, [P]),
                              (c.ggml_graph_compute_with_ctx, C.c_int, [P, P, C.c_int])):
            fn.restype, fn.argtypes = res, args
        c.ggml_cpu_init()

    def product(self, dtype, raw, rows, X):
        """A function(threads) computing the product; returns Y (t x rows) view."""
        b, C = self.base, self.C
        t, cols = X.shape
        # (room for the graph and the work buffer the compute call takes from the context)
        ctx = b.ggml_init(self.Params(raw.size + 2 * X.nbytes + 4 * t * rows + (64 << 20), None, False))
        W = b.ggml_new_tensor_2d(ctx, FORMATS[dtype].ggml_type, cols, rows)
        assert b.ggml_nbytes(W) == raw.size
        C.memmove(b.ggml_get_data(W), raw.ctypes.data, raw.size)
        Xt = b.ggml_new_tensor_2d(ctx, 0, cols, t)  # GGML_TYPE_F32
        C.memmove(b.ggml_get_data(Xt), X.ctypes.data, X.nbytes)
        Y = b.ggml_mul_mat(ctx, W, Xt)
        g = b.ggml_new_graph(ctx)
        b.ggml_build_forward_expand(g, Y)
        out = np.ctypeslib.as_array(C.cast(b.ggml_get_data(Y), C.POINTER(C.c_float)), shape=(t, rows))
        return (lambda th: self.cpu.ggml_graph_compute_with_ctx(ctx, g, th)), out, (lambda: b.ggml_free(ctx))


def timed(fn, *args):
    w, c = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - w, time.process_time() - c


def bench_matmat(a, rng):
    t, cols, rows = 512, 2048, 5632
    mac = t * cols * rows / 1e9
    X = rng.standard_normal((t, cols)).astype(np.float32)
    peer = GgmlPeer() if a.peer else None
    print(f"isa {K.active_isa()}; matmat(prompt=True) of {t} x {cols} inputs, {rows} x {cols} weights; "
          f"GMAC/s by wall clock / by CPU time, best of {a.reps}")
    for dtype in a.dtypes.split(",") + ([] if peer else ["q8_row"]):
        if dtype == "q8_row":
            w = rng.standard_normal((rows, cols)).astype(np.float32)
            raw = quantize(w, "q8_row")
        else:
            raw = random_blocks(rng, dtype, rows, cols)
        q = QTensor(raw, dtype, (rows, cols), precision="auto")
        run, Yp, free = peer.product(dtype, raw, rows, X) if peer else (None, None, None)
        for th in (int(n) for n in a.threads.split(",")):
            cortiq.set_num_threads(th)
            q.matmat(X, None, True)
            if run:
                run(th)
            mine = theirs = (float("inf"), float("inf"))
            for _ in range(a.reps):  # alternately, so that both see the same load
                mine = tuple(map(min, mine, timed(q.matmat, X, None, True)))
                if run:
                    theirs = tuple(map(min, theirs, timed(run, th)))
            print(f"{dtype:7s} {th}T  cortiq {mac / mine[0]:6.1f} / {mac / mine[1]:6.1f} GMAC/s  "
                  f"{t / mine[0]:7.1f} tokens/s (one {rows}x{cols} matrix)", end="")
            if run:
                Y = q.matmat(X, None, True)
                diff = float(np.abs(Y - Yp).max() / np.abs(Y).max())
                print(f"   llama.cpp {mac / theirs[0]:6.1f} / {mac / theirs[1]:6.1f} GMAC/s  ratio "
                      f"{theirs[0] / mine[0]:.2f} / {theirs[1] / mine[1]:.2f}  (max |dY| / max |Y| {diff:.1e})", end="")
            print()
        if free:
            free()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--matmat", action="store_true", help="the prefill product instead of matvec")
    ap.add_argument("--peer", action="store_true", help="with --matmat: llama.cpp's matmul beside it")
    ap.add_argument("--dtypes", default="q4_k,q6_k,q5_k")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--total-mib", type=int, default=512)
    ap.add_argument("--precisions", default="int8,exact")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    if a.matmat:
        bench_matmat(a, rng)
        return
    buf = np.ones(a.total_mib << 20, np.uint8)
    rows, cols = 11008, 4096
    print(f"isa {K.active_isa()}; matrices {rows}x{cols}, about {a.total_mib} MiB of weights a pass")
    table = []
    for dtype in a.dtypes.split(","):
        raw = random_blocks(rng, dtype, rows, cols)
        n = max(2, (a.total_mib << 20) // raw.size)
        x = rng.standard_normal(cols).astype(np.float32)
        out = np.empty(rows, np.float32)
        ceil_rows = max(96, (4 << 20) // K.qmat_nbytes(dtype, 1, cols))
        for prec in a.precisions.split(","):
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
                table.append(f"| {dtype} | {prec} | {K.active_isa()} | {th} | {gbs:.1f} | {100 * gbs / rbw:.0f} % "
                             f"| {rbw:.1f} | {ceil:.1f} |")
            del qs
    print("\n| dtype | precision | ISA table | threads | GB/s from DRAM | % of read | read GB/s | in-cache GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
