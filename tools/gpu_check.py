"""GPU against CPU on the bundled demo model, on a small DeepSeek-V4 (bench_gpu.py's
--tiny geometry) and on a small random q8_row Llama (benchmarks/_bench_gpu_llama.py's
tiny geometry): whole-model logits (relative max error) and 32 greedy tokens, on
whatever adapter wgpu picks (DeepSeek-V4 twice: its hyper-connection step fused, then as
the large-fn dispatches). Prints one line per check."""
import os
import sys
import tempfile
import time

import numpy as np

from cortiq import cmf
from cortiq.demo import demo_path
from cortiq.gpu import Device, to_device
from cortiq.gpu import deepseek_v4 as G
from cortiq.models.deepseek_v4 import DeepseekV4Model
from cortiq.models.dory import DoryModel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))


def check(host, g, ids, label):
    a = host.forward(host.new_state(), ids, "all")
    b = g.forward(g.new_state(), ids, "all")
    err = float(np.abs(a - b).max() / np.abs(a).max())
    sc, sg = host.new_state(), g.new_state()
    ta = [int(np.argmax(host.forward(sc, ids[:20])))]
    tb = [g.forward_greedy(sg, ids[:20])]
    for _ in range(31):
        ta.append(int(np.argmax(host.forward(sc, [ta[-1]]))))
        tb.append(g.forward_greedy(sg, [tb[-1]]))
    t0 = time.perf_counter()
    chained = g.decode_greedy(g.new_state(), int(ids[0]), 1)
    print(f"{label}: logits rel err {err:.2e}; greedy 32 identical: {ta == tb}; "
          f"chained ok: {len(chained) == 1} ({time.perf_counter() - t0:.3f} s)")


def dsv4_path():
    import argparse

    import _bench_dsv4 as B
    from bench_gpu import DSV4_TINY
    ap = argparse.ArgumentParser()
    B.add_args(ap)
    a = ap.parse_args([])
    for k, v in DSV4_TINY.items():
        setattr(a, k, v)
    path = os.path.join(tempfile.mkdtemp(), "dsv4-check.cmf")
    B.write_model(path, B.geometry(a), "q8_row")
    return path


def main():
    dev = Device.get()
    print(f"adapter: {dev.name} ({dev.backend}); max storage binding {dev.max_binding}")
    f = cmf.open(demo_path())
    for opts in ({}, {"kv_mode": "last_loop"}, {"full_window": 48}):
        host = DoryModel(f, **opts)
        check(host, to_device(host, dev), np.random.default_rng(1).integers(0, host.vocab, 100),
              f"dory {opts}")
    host = DeepseekV4Model(cmf.open(dsv4_path()))
    ids = np.random.default_rng(1).integers(0, host.vocab, 100)
    check(host, to_device(host, dev), ids, "deepseek_v4 tiny (q8_row)")
    fuse = G.HC_FUSE_BYTES
    G.HC_FUSE_BYTES = 0       # the large-fn hyper-connection step (dsv4_hc_post/_fold)
    try:
        check(host, to_device(host, dev), ids, "deepseek_v4 tiny (q8_row, hc step unfused)")
    finally:
        G.HC_FUSE_BYTES = fuse
    import _bench_gpu_llama as L
    host = L.random_llama(L.LLAMA_TINY)
    ids = np.random.default_rng(1).integers(0, host.vocab, 100)
    check(host, to_device(host, dev), ids, "llama tiny (q8_row)")


if __name__ == "__main__":
    main()
