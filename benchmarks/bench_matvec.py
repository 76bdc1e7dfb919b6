"""Matrix-vector throughput of every stored dtype against the machine's read bandwidth.

    python benchmarks/bench_matvec.py [--quick] [--threads 1,2] [--dtypes ...] [--gib 1]

In one run it measures
  (a) the read bandwidth: a C kernel (cortiq.kernels._kernels.read_sum) sums the 64-bit words
      of a 1 GiB buffer on 1 and 2 threads (best of several passes), each thread reading
      its part as 1, 2, 4 or 8 far-apart streams side by side; the best pattern
      (READ_STREAMS, 4) is the reference of every percentage below, because on some
      machines one stream per core reads far below what the memory gives;
  (b) cortiq QTensor.matvec for each dtype at 4096x4096, 11008x4096 and 4096x11008 on
      1 and 2 threads, in GB/s of payload (weight) bytes; it cycles through enough
      copies of the payload (>= --gib GiB) that the weights come from DRAM, not cache;
      the ggml block formats (q8_0+i8, q4_0+i8, ...: those with kernels) have no encoder,
      so they get random blocks with normal scales;
  (c) numpy float32 W @ x on the same shapes (OpenBLAS, OPENBLAS_NUM_THREADS = the
      thread count, in a subprocess), also cycling copies;
  (d) prefill: QTensor.matmat with t = 64 inputs against 64 separate matvecs, with the
      weights from DRAM (each matvec visits all the cycled copies, as token-by-token
      decoding of a model larger than the caches does) and in cache (one copy), in
      GMAC/s beside numpy's float32 W @ X.T (OpenBLAS sgemm) on the same shape, and the
      GMAC/s that 3x would take; the int8 matmat of each '+i8' dtype beside the exact
      one of the same weights (target >= 2.5x for q8_row);
  (f) ceilings: each dtype's matvec with its weights in cache (a block of at most
      CEIL_BYTES, so no memory stall), in weight bytes per second: what its kernel
      computes when memory is free. The bound on n threads is the larger of the n-thread
      figure and n times the one-thread one (cores do not compute faster together, and
      a second vCPU's figure is the noisier), as % of the median read of (b) on n
      threads; a target above it is bound by the core's arithmetic, not by the reads.
  (g) the matvecs of (b) again as a Markdown table, the rows docs/PERFORMANCE.md keeps
      (§1.6: GB/s, % of the read measured alternately with it, the read, per thread
      count, with the kernel table), ready to paste beside an earlier run's.
Each matvec GB/s figure is printed with its percentage of the read bandwidth measured
alternately with it (same thread count; best of each), since on a shared machine the
available bandwidth drifts, and with the target. --quick: 256 MiB buffers, one shape, fewer dtypes.
The machine's other load shows up as noise: run it on a quiet machine.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

import cortiq
from cortiq.kernels import _kernels as K
from cortiq.kernels.tensor import I8_DTYPES, QTensor
from cortiq.cmf.ggml_blocks import FORMATS as GGML_FORMATS
from cortiq.cmf.testing import ggml_random_payload, qtensor_from_f32

DTYPES = ("f32", "f16", "bf16", "q8_row", "q8_2f", "q4_block", "q4_tiled", "q4tp", "q2tp",
          "q8_row+i8", "q8_2f+i8", "q4_block+i8", "q4_tiled+i8", "q4tp+i8", "q2tp+i8") + tuple(
    f"{d}+i8" for d in K.GGML_DTYPES)
# "<dtype>+i8": the same weights with int8 activations (QTensor precision="int8")
SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008))
# The matvec targets, % of read bandwidth: {threads: {dtype: pct}}
TARGETS = {2: {"q8_row": 90, "q8_2f": 90, "q4_block": 85, "q4_tiled": 85, "q4tp": 85,
               "f16": 85, "bf16": 85},
           1: {"q8_row": 85}}
# int8 activations (issue: >= 85 % of the read bandwidth at 2 threads, AVX2 and AVX-512)
for _d in ("q8_row", "q4_block", "q4_tiled", "q4tp", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"):
    TARGETS[2][_d + "+i8"] = 85
MM_I8_TARGET = {"q8_row": 2.5}  # int8 matmat / exact matmat GMAC/s at t = 64


def best_time(fn, reps):
    fn()  # warm (page-in, thread start)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


READ_STREAMS = 4  # the reference probe's streams per thread (see (a))


def read_bw(buf, threads, reps, streams=READ_STREAMS):
    t = best_time(lambda: K.read_sum(buf, threads, streams), reps)
    return buf.size / t / 1e9


def copies_for(nbytes, total):
    return max(2, -(-total // nbytes))


def make_tensor(rng, shape, dtype, precision):
    """A QTensor of `dtype`: normal weights quantized, or for a ggml block format (no
    encoder: GGUF files bring their own bytes) random blocks with normal scales."""
    if dtype in GGML_FORMATS:
        return QTensor(ggml_random_payload(rng, dtype, *shape), dtype, shape, precision=precision)
    return qtensor_from_f32(rng.standard_normal(shape, dtype=np.float32), dtype, precision=precision)


def bench_matvec(dtype, shape, threads_list, total, reps, rng, buf):
    """{threads: (matvec GB/s, read GB/s measured alternately with it)}: on a shared
    machine the bandwidth drifts, so each figure gets its own adjacent reference."""
    rows, cols = shape
    dtype, _, mode = dtype.partition("+")
    prec = "int8" if mode == "i8" else "exact"
    q = make_tensor(rng, shape, dtype, prec)
    n = copies_for(q.nbytes, total)
    qs = [q] + [QTensor(q.raw.copy(), dtype, shape, precision=prec) for _ in range(n - 1)]
    x = rng.standard_normal(cols, dtype=np.float32)
    out = np.empty(rows, np.float32)
    res = {}
    if mode == "i8":  # the price of int8 activations, on this run's data
        y8 = q.matvec(x)
        y = QTensor(q.raw, dtype, shape).matvec(x)
        i8_err[dtype] = float(np.linalg.norm(y8 - y) / np.linalg.norm(y))
    for th in threads_list:
        cortiq.set_num_threads(th)

        def run():
            for m in qs:
                m.matvec(x, out)
        run()
        best_mv = best_rd = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            K.read_sum(buf, th, READ_STREAMS)
            t1 = time.perf_counter()
            run()
            t2 = time.perf_counter()
            best_rd, best_mv = min(best_rd, t1 - t0), min(best_mv, t2 - t1)
        res[th] = (n * q.nbytes / best_mv / 1e9, buf.size / best_rd / 1e9)
    return res, qs


i8_err = {}  # dtype -> ||y_int8 - y_f32|| / ||y_f32|| of the benchmark's matvec
CEIL_BYTES = 4 << 20  # (f): a block this size stays in L2 + L3 on every x86 of the last decade


def bench_ceiling(dtype, cols, threads_list, reps, rng):
    """{threads: in-cache matvec GB/s of weight bytes} on a block of at most CEIL_BYTES
    (at least 96 rows, so two threads and four row streams each have work)."""
    dtype, _, mode = dtype.partition("+")
    rows = max(96, CEIL_BYTES // max(1, K.qmat_nbytes(dtype, 1, cols)))
    q = make_tensor(rng, (rows, cols), dtype, "int8" if mode == "i8" else "exact")
    x = rng.standard_normal(cols, dtype=np.float32)
    out = np.empty(rows, np.float32)
    res = {}
    for th in threads_list:
        cortiq.set_num_threads(th)
        # best of many short calls: an upper bound is wanted, and on a shared machine
        # a long loop catches the neighbours' bursts
        res[th] = q.nbytes / best_time(lambda: q.matvec(x, out), 10 * reps) / 1e9
    return res


def bench_prefill(qs, t, reps, rng, both=False):
    """(DRAM ratio, in-cache ratio) of matmat over t separate matvecs at t inputs; with
    `both`, also the exact and the int8 matmat of these weights in alternating rounds.
    DRAM: every matvec of input i visits all the copies before input i + 1 (weights
    stream from memory, as in token-by-token decoding); in cache: one copy, t matvecs
    back to back."""
    cols = qs[0].cols
    X = rng.standard_normal((t, cols), dtype=np.float32)

    def mm():
        for m in qs:
            m.matmat(X)

    def mv():
        for i in range(t):
            for m in qs:
                m.matvec(X[i])
    t_mv, t_mm = best_time(mv, 1), best_time(mm, max(1, reps // 2))
    q = qs[0]
    cache = best_time(lambda: [q.matvec(X[i]) for i in range(t)], reps) / best_time(lambda: q.matmat(X), reps)
    macs = len(qs) * q.rows * q.cols * t / 1e9
    out = {"dram": t_mv / t_mm, "cache": cache, "mm": macs / t_mm, "mv": macs / t_mv}
    if both and q.dtype in I8_DTYPES and q.precision == "exact":
        out["alt"] = {p: macs / s for p, s in mm_precisions(qs, mm, max(4, 2 * reps)).items()}
    return out


def mm_precisions(qs, mm, rounds):
    """Best seconds of mm() with the matrices exact and with them int8, in alternating
    rounds: the machine's drift over the run cancels out of the two's ratio."""
    best = {"exact": float("inf"), "int8": float("inf")}
    try:
        for _ in range(rounds):
            for p in list(best):
                for m in qs:
                    m.precision = p
                t0 = time.perf_counter()
                mm()
                best[p] = min(best[p], time.perf_counter() - t0)
    finally:
        for m in qs:
            m.precision = "exact"
    return best


NUMPY_SNIPPET = r"""
import sys, time, numpy as np
rows, cols, total, reps = map(int, sys.argv[1:5])
rng = np.random.default_rng(0)
w = rng.standard_normal((rows, cols), dtype=np.float32)
n = max(2, -(-total // w.nbytes))
ws = [w.copy() for _ in range(n)]
x = rng.standard_normal(cols, dtype=np.float32)
out = np.empty(rows, np.float32)
def run():
    for m in ws:
        np.dot(m, x, out=out)
run()
best = min((lambda t0: (run(), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(reps))
print(n * w.nbytes / best / 1e9)
"""


SGEMM_SNIPPET = r"""
import sys, time, numpy as np
rows, cols, t, reps = map(int, sys.argv[1:5])
rng = np.random.default_rng(0)
w = rng.standard_normal((rows, cols), dtype=np.float32)
X = rng.standard_normal((t, cols), dtype=np.float32)
out = np.empty((t, rows), np.float32)
np.dot(X, w.T, out=out)
best = min((lambda t0: (np.dot(X, w.T, out=out), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(reps))
print(rows * cols * t / best / 1e9)
"""


def run_numpy(snippet, threads, *args):
    """The number a numpy snippet prints, run in a subprocess with OpenBLAS on
    `threads` threads (nan if it fails)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-c", snippet, *map(str, args)], env=env,
                       capture_output=True, text=True, check=False)
    return float(r.stdout.strip()) if r.returncode == 0 else float("nan")


def bench_sgemm(shape, t, threads, reps):
    """numpy float32 X @ W.T, GMAC/s (the peer of (d))."""
    return run_numpy(SGEMM_SNIPPET, threads, shape[0], shape[1], t, reps)


def bench_numpy(shape, threads, total, reps):
    """numpy float32 W @ x over cycled copies, GB/s (the peer of (b))."""
    return run_numpy(NUMPY_SNIPPET, threads, shape[0], shape[1], total, reps)


def print_table(isa, threads, table):
    """(g): the rows of (b) as Markdown, one line a dtype and shape."""
    print(f"(g) Markdown table of (b), {isa} kernel table, load average {os.getloadavg()[0]:.2f}")
    print("| table | dtype | shape | " + " | ".join(f"{th} thr GB/s (% of read) [read GB/s]" for th in threads) + " |")
    print("|---|---|---|" + "---|" * len(threads))
    for dt, shape, cells in table:
        print(f"| {isa} | {dt} | {shape[0]}x{shape[1]} | "
              + " | ".join("{:.1f} ({:.0f} %) [{:.1f}]".format(*cells[th]) for th in threads) + " |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short run: 256 MiB, one shape")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--shapes", default=None, help="e.g. 4096x4096,11008x4096")
    ap.add_argument("--gib", type=float, default=None, help="bytes cycled per measurement")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--no-numpy", action="store_true")
    ap.add_argument("--no-ceiling", action="store_true")
    ap.add_argument("--isa", default=None, help="kernel table (default: the best usable)")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    dtypes = [d for d in a.dtypes.split(",") if d]
    total = int((a.gib if a.gib else (0.25 if a.quick else 1.0)) * (1 << 30))
    reps = a.reps or (3 if a.quick else 5)
    if a.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    else:
        shapes = SHAPES[:1] if a.quick else SHAPES
    if a.quick and a.dtypes == ",".join(DTYPES):
        dtypes = ["f16", "q8_row", "q8_2f", "q4_tiled", "q4tp", "q4tp+i8"]
    rng = np.random.default_rng(0)
    if a.isa:
        K.set_isa(a.isa)
    cfg = cortiq.config()
    print(f"cortiq {cfg['version']}: isa {cfg['isa']}, pool spin {cfg['pool']['spin_us']} us, "
          f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} "
          f"(other processes make these numbers noisy)")
    print(f"cycling >= {total / (1 << 30):.2f} GiB of weights per measurement, best of {reps}\n")

    buf = np.ones(total, np.uint8)
    probe = {(th, ns): read_bw(buf, th, reps, ns) for th in threads for ns in (1, 2, 4, 8)}
    bw = {th: probe[th, READ_STREAMS] for th in threads}
    print("(a) read bandwidth (C read kernel, sum over the buffer) at the start, GB/s, by streams")
    print(f"    per thread read side by side (the reference below: {READ_STREAMS})")
    for th in threads:
        print(f"    {th} thread{'s' if th > 1 else ' '}: " +
              "   ".join(f"{ns} stream{'s' if ns > 1 else ' '} {probe[th, ns]:5.1f}" for ns in (1, 2, 4, 8)))
    print()

    print("(b) cortiq matvec, GB/s of weight bytes; % of the read bandwidth measured alternately")
    print("    with it (same thread count, best of each), shown as [read GB/s]; '+i8': the same")
    print("    weights with int8 activations (precision 'int8')")
    hdr = "    {:<9} {:>12}" + "".join("  {:>32}".format(f"{th} thr GB/s (%, target) [read]") for th in threads)
    print(hdr.format("dtype", "shape"))
    fails = []
    prefill = {}
    ceilings = {}
    reads = {th: [] for th in threads}  # the adjacent read references of (b)
    table = []  # (g): (dtype, shape, {threads: (GB/s, % of read, read GB/s)})
    for shape in shapes:
        for dt in dtypes:
            res, qs = bench_matvec(dt, shape, threads, total, reps, rng, buf)
            cells = []
            for th in threads:
                g, rd = res[th]
                bw[th] = max(bw[th], rd)
                reads[th].append(rd)
                pct = 100 * g / rd
                tgt = TARGETS.get(th, {}).get(dt, TARGETS.get(th, {}).get(dt.partition("+")[0]))
                mark = "" if tgt is None else (f" >={tgt} ok" if pct >= tgt else f" >={tgt} LOW")
                if tgt is not None and pct < tgt:
                    fails.append((dt, shape, th, pct, tgt))
                cells.append(f"{g:6.1f} ({pct:3.0f}%{mark}) [{rd:4.1f}]")
            print(f"    {dt:<9} {shape[0]:>5}x{shape[1]:<6}" + "".join(f"  {c:>32}" for c in cells))
            table.append((dt, shape, {th: (res[th][0], 100 * res[th][0] / res[th][1], res[th][1]) for th in threads}))
            if shape == shapes[0] and not a.no_ceiling:
                ceilings[dt] = bench_ceiling(dt, shape[1], threads, reps, rng)
            if not a.no_prefill and shape == shapes[0]:
                cortiq.set_num_threads(threads[0])
                prefill[dt] = bench_prefill(qs, 64, reps, rng, both=dt + "+i8" in dtypes)
            del qs
    print()
    if not a.no_numpy:
        print("(c) numpy float32 W @ x (OpenBLAS), GB/s of float32 weight bytes")
        for shape in shapes:
            cells = []
            for th in threads:
                g = bench_numpy(shape, th, total, reps)
                cells.append(f"{th} thr {g:6.1f} ({100 * g / bw[th]:3.0f}% of the best read)")
            print(f"    {shape[0]:>5}x{shape[1]:<6}  " + "   ".join(cells))
        print()
    if prefill:
        sg = float("nan") if a.no_numpy else bench_sgemm(shapes[0], 64, threads[0], reps)
        print(f"(d) prefill at t = 64, {shapes[0][0]}x{shapes[0][1]}, {threads[0]} thread(s): throughput of "
              "one matmat / 64 separate matvecs (target >= 3x);")
        print("    GMAC/s from DRAM of the matmat, of the 64 matvecs, and what 3x takes; numpy float32")
        print(f"    X @ W.T (OpenBLAS sgemm) on the same shape: {sg:.1f} GMAC/s")
        print("    dtype      weights from DRAM   in cache    matmat  matvecs  3x takes")
        for dt, r in prefill.items():
            rd, rc = r["dram"], r["cache"]
            print(f"    {dt:<11} {rd:6.2f}x {'ok ' if rd >= 3 else 'LOW'}    {rc:6.2f}x {'ok' if rc >= 3 else 'LOW'}"
                  f"   {r['mm']:7.1f}  {r['mv']:7.1f}  {3 * r['mv']:8.1f}")
        pairs = [(d, prefill[d]["alt"]) for d in prefill if "alt" in prefill[d]]
        if pairs:
            print("    int8 matmat (precision 'int8') / exact matmat of the same weights, GMAC/s from DRAM")
            print("    (the two timed in alternating rounds, best of each):")
            for d, alt in pairs:
                tgt = MM_I8_TARGET.get(d)
                ratio = alt["int8"] / alt["exact"]
                mark = "" if tgt is None else (f"  (target >= {tgt}x {'ok' if ratio >= tgt else 'LOW'})")
                print(f"    {d:<11} exact {alt['exact']:7.1f}  int8 {alt['int8']:7.1f}  = {ratio:5.2f}x{mark}")
        print()
    if i8_err:
        print("(e) int8 activations: relative error ||y_int8 - y_f32|| / ||y_f32|| (Gaussian W, x)")
        print("    " + ", ".join(f"{d} {e:.2e}" for d, e in i8_err.items()))
        print()
    med = {th: float(np.median(r)) if r else bw[th] for th, r in reads.items()}

    def bound(d, th):  # GB/s: the in-cache figure, or th cores at the one-thread rate
        c = ceilings.get(d, {})
        return max(c.get(th, 0.0), th * c.get(1, 0.0)) if c else None
    if ceilings:
        print(f"(f) ceilings: matvec with the weights in cache ({shapes[0][1]} columns, <= {CEIL_BYTES >> 20} MiB), "
              "GB/s of weight bytes; the bound (% of the median read of (b): "
              + ", ".join(f"{th} thr {med[th]:.1f}" for th in threads) + ")")
        for dt, c in ceilings.items():
            print(f"    {dt:<11} " + "   ".join(f"{th} thr {c[th]:6.1f} [bound {100 * bound(dt, th) / med[th]:4.0f}%]"
                                                for th in threads))
        print()
    print_table(cfg["isa"], threads, table)
    if fails:
        def why(d, t, g):
            b = bound(d, t)
            return "" if b is None or 100 * b / med[t] >= g else f" (bound {100 * b / med[t]:.0f}%)"
        print("below target: " + "; ".join(f"{d} {s[0]}x{s[1]} {t}thr {p:.0f}% < {g}%{why(d, t, g)}"
                                           for d, s, t, p, g in fails))


if __name__ == "__main__":
    main()
