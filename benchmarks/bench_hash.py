"""hash64 throughput (GB/s, one core) per ISA, in cache and from RAM, vs the numpy reference.

    python benchmarks/bench_hash.py [--big-mib 256] [--repeat 5]

Target: >= 5 GB/s on one core. hash64 is single-threaded by design (the
writer hashes each tensor as it is written; verify() hashes tensor by tensor).
"""
import argparse
import time

import numpy as np

from cortiq.kernels import _kernels as K
from cortiq.cmf.hash import hash64, hash64_numpy


def best_rate(fn, nbytes, repeat):
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, a.big_mib << 20, dtype=np.uint8)
    sizes = [("64 KiB (L2)", 64 << 10), ("1 MiB (L2/L3)", 1 << 20),
             (f"{a.big_mib} MiB (RAM)", a.big_mib << 20)]
    print(f"{'isa':<8}" + "".join(f"{s:>20}" for s, _ in sizes) + "   GB/s, best of "
          f"{a.repeat}, 1 core")
    before = K.active_isa()
    for isa in K.usable_isas():
        K.set_isa(isa)
        rates = []
        for _, n in sizes:
            buf = big[:n]
            reps = a.repeat if n > (8 << 20) else max(a.repeat, 50)
            rates.append(best_rate(lambda buf=buf: hash64(buf), n, reps))
        print(f"{isa:<8}" + "".join(f"{r:>20.2f}" for r in rates))
    K.set_isa(before)
    n = 64 << 20
    r = best_rate(lambda: hash64_numpy(big[:n]), n, 2)
    print(f"{'numpy':<8}{'':>40}{r:>20.2f}   (reference, 64 MiB)")
    K.set_isa(before)
    print(f"active table: {K.active_isa()}; target >= 5 GB/s")


if __name__ == "__main__":
    main()
