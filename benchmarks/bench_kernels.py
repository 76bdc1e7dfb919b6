"""Speed of each mathfn kernel per ISA, as a ratio to the scalar reference.

    python benchmarks/bench_kernels.py [--n 65536] [--repeat 200]

Prints, per kernel: ns per element for each usable ISA and the ratio ref/ISA
(how many times faster than the scalar reference). Single thread.
"""
import argparse
import time

import numpy as np

import cortiq
from cortiq.kernels import _kernels as K


def timeit(fn, repeat):
    fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--repeat", type=int, default=200)
    a = ap.parse_args()
    cortiq.set_num_threads(1)
    rng = np.random.default_rng(0)
    n = a.n
    x = rng.normal(0, 3, n).astype(np.float32)
    y = rng.normal(size=n).astype(np.float32)
    out = np.empty_like(x)
    rows = x.reshape(64, -1).copy()
    s = rng.uniform(0.5, 1.5, rows.shape[1]).astype(np.float32)
    u = rng.normal(size=rows.shape).astype(np.float32)
    work = rows.copy()
    kernels = {
        "exp_f32": lambda: K.exp_f32(x, out),
        "softmax_rows": lambda: (np.copyto(work, rows), K.softmax_rows(work)),
        "silu_mul": lambda: (np.copyto(work, rows), K.silu_mul(work, u, s, s)),
        "gate_mul": lambda: (np.copyto(work, rows), K.gate_mul(work, u, s)),
        "dot_f32": lambda: K.dot_f32(x, y),
        "axpy_f32": lambda: K.axpy_f32(out, 0.5, y),
    }
    isas = K.usable_isas()
    print(f"n = {n}, 1 thread, cortiq {cortiq.__version__}, compiled {K.compiled_isas()}")
    head = f"{'kernel':14s}" + "".join(f"{i + ' ns/el':>14s}" for i in isas)
    head += "".join(f"{'ref/' + i:>12s}" for i in isas if i != "ref")
    print(head)
    for name, fn in kernels.items():
        t = {}
        for isa in isas:
            K.set_isa(isa)
            t[isa] = timeit(fn, a.repeat) / n * 1e9
        line = f"{name:14s}" + "".join(f"{t[i]:14.3f}" for i in isas)
        line += "".join(f"{t['ref'] / t[i]:12.1f}" for i in isas if i != "ref")
        print(line)
    K.set_isa(K.best_isa())


if __name__ == "__main__":
    main()
