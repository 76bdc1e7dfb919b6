"""GPU against CPU on the bundled demo model: whole-model logits (relative max error) and
32 greedy tokens, on whatever adapter wgpu picks. Prints one line per check."""
import time

import numpy as np

from cortiq import cmf
from cortiq.demo import demo_path
from cortiq.gpu import Device, to_device
from cortiq.models.dory import DoryModel


def main():
    dev = Device.get()
    print(f"adapter: {dev.name} ({dev.backend}); max storage binding {dev.max_binding}")
    f = cmf.open(demo_path())
    for opts in ({}, {"kv_mode": "last_loop"}, {"full_window": 48}):
        host = DoryModel(f, **opts)
        g = to_device(host, dev)
        ids = np.random.default_rng(1).integers(0, host.vocab, 100)
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
        print(f"{opts}: logits rel err {err:.2e}; greedy 32 identical: {ta == tb}; "
              f"chained ok: {len(chained) == 1} ({time.perf_counter() - t0:.3f} s)")


if __name__ == "__main__":
    main()
