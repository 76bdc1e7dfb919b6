"""Decode benchmark: ``python benchmarks/bench_decode.py --arch {dory,deepseek_v4} ...``.

Each architecture's code lives in its own module (``_bench_dsv4.py`` for DeepSeek-V4;
the Dory part is the integrator's) and adds its own options."""
from __future__ import annotations

import argparse
import os
import sys

# The machine may be shared: with OpenMP's default active wait a preempted worker makes
# every short parallel region (one per matvec) stall; passive waiting keeps 2-thread
# matvecs at single-thread speed or better under load. Set before cortiq loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--arch", default="dory", choices=("dory", "deepseek_v4"))
    known, rest = pre.parse_known_args(argv)
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--arch", default="dory", choices=("dory", "deepseek_v4"))
    if known.arch == "deepseek_v4":
        import _bench_dsv4 as mod
    else:
        try:
            import _bench_dory as mod
        except ImportError:
            p.error("the dory decode benchmark is not in this build yet")
    mod.add_args(p)
    mod.run(p.parse_args(argv))


if __name__ == "__main__":
    main()
