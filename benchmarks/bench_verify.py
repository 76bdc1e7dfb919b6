"""What hash checking costs at load: cmf.open + every tensor's bytes (what building a
model does), verify="lazy" against verify="off", on a ~1 GB file, per kernel ISA.

    python benchmarks/bench_verify.py [--gib 1.0] [--repeat 3] [--dir /tmp]

The file is written once (float32 tensors of a Llama-like shape plan, so the bytes
are the file's size) and stays in the page cache; each measurement opens it afresh:

* off / lazy: open + raw() of every tensor. With "off" no page is touched; "lazy"
  hashes every byte, so it also pays the page faults of mapping the file -- which
  the first forward pass would pay anyway ("touch": one read of every page through
  a fresh map, verify="off").
* hash: the hash alone -- every tensor hashed through a map whose pages are already
  faulted in (lazy ~ touch + hash).

Target: the hash cost on a 1 GB model < 0.3 s on one core (hash64 is single-threaded).
The file is deleted afterwards.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

import cortiq.cmf as C
from cortiq.kernels import _kernels as K

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_writer import plan


def load(path, verify, preload):
    """Seconds to open `path` and hand out every tensor's bytes."""
    t0 = time.perf_counter()
    with C.open(path, preload=preload, verify=verify) as cf:
        t_open = time.perf_counter() - t0
        for name in cf.names():
            cf.raw(name)
        return time.perf_counter() - t0, t_open


def touch(path):
    """Seconds to read one byte of every page through a fresh map (the faults)."""
    with C.open(path, verify="off") as cf:
        t0 = time.perf_counter()
        for name in cf.names():
            r = cf.raw(name)
            int(r[::4096].sum())
        return time.perf_counter() - t0


def hash_only(path):
    """Seconds to hash every tensor once its pages are mapped (the hash alone)."""
    with C.open(path, verify="off") as cf:
        for name in cf.names():
            int(cf.raw(name)[::4096].sum())
        t0 = time.perf_counter()
        for name in cf.names():
            C.hash64(cf.raw(name))
        return time.perf_counter() - t0


def best(fn, repeat):
    return min(fn() for _ in range(repeat))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="file size (float32 tensors)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    shapes, _total, arch = plan(int(a.gib * (1 << 30)))
    rng = np.random.default_rng(0)
    path = os.path.join(a.dir, f"bench-verify-{os.getpid()}.cmf")
    try:
        C.write(path, [(n, (lambda s=s: rng.standard_normal(s, dtype=np.float32)))
                       for n, s in shapes], arch=arch, quant="f32", progress=False)
        size = os.path.getsize(path)
        print(f"file: {len(shapes)} tensors, {size / 1e9:.2f} GB; best of {a.repeat}")
        t_off = best(lambda: load(path, "off", False)[0], a.repeat)
        t_touch = best(lambda: touch(path), a.repeat)
        print(f"open + every tensor, verify='off': {t_off:.3f} s; touching every page of "
              f"a fresh map: {t_touch:.3f} s")
        print(f"{'isa':<8}{'lazy load':>11}{'hash alone':>12}{'GB/s':>7}{'s per GB':>10}")
        before = K.active_isa()
        for isa in K.usable_isas():
            K.set_isa(isa)
            t_lazy = best(lambda: load(path, "lazy", False)[0], a.repeat)
            t_hash = best(lambda: hash_only(path), a.repeat)
            print(f"{isa:<8}{t_lazy:>11.3f}{t_hash:>12.3f}{size / 1e9 / t_hash:>7.1f}"
                  f"{t_hash / (size / 1e9):>10.3f}")
        K.set_isa(before)
        print("target: the hash alone < 0.3 s per GB on one core")
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
