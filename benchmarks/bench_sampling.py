"""Sampler cost per token on large vocabularies, as ratios to numpy work on the same logits.

    python benchmarks/bench_sampling.py [--repeat 30] [--vocab 32000 152064 262144]

The full chain (temperature, top-p, repetition/presence/frequency penalties over a
2000-token history) is vectorised: one call costs about one stable sort of the
vocabulary (top-p orders the survivors) plus a few elementwise passes. Printed per vocabulary:
the milliseconds per call (best of --repeat), the ratio to one `np.sort` of the same
logits, and how many times faster it is than the same chain written as Python loops
over the vocabulary.
"""
import argparse
import math
import time

import numpy as np

from cortiq.runtime.sampling import Sampler, SamplingParams


def best(fn, repeat):
    fn()
    out = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def python_chain(z, hist, temperature=0.8, top_p=0.95):
    """The same chain as one pass of Python per token (penalties, softmax, top-p), the
    cost a non-vectorised sampler would pay."""
    z = [float(v) for v in z.tolist()]
    counts = {}
    for t in hist.tolist():
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        v = z[t]
        z[t] = (v / 1.1 if v > 0 else v * 1.1) - 0.2 - 0.1 * c
    m = max(z)
    e = [math.exp((v - m) / temperature) for v in z]
    total = sum(e)
    order = sorted(range(len(e)), key=e.__getitem__, reverse=True)
    acc, keep = 0.0, []
    for i in order:
        keep.append(i)
        acc += e[i] / total
        if acc >= top_p:
            break
    return keep[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 152064, 262144])
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'vocab':>8}{'ms/call':>10}{'in sorts':>10}{'x python':>11}")
    for n in a.vocab:
        z = rng.standard_normal(n).astype(np.float32) * 3
        hist = rng.integers(0, n, 2000)
        s = Sampler(SamplingParams(temperature=0.8, top_k=0, top_p=0.95, min_p=0.0,
                                   repetition_penalty=1.1, presence_penalty=0.2,
                                   frequency_penalty=0.1, seed=0))
        t = best(lambda z=z, hist=hist, s=s: s.sample(z, hist), a.repeat)
        t_sort = best(lambda z=z: np.sort(z), a.repeat)
        t_py = best(lambda z=z, hist=hist: python_chain(z, hist), max(1, a.repeat // 10))
        print(f"{n:>8}{t * 1e3:>10.2f}{t / t_sort:>10.1f}{t_py / t:>11.1f}")


if __name__ == "__main__":
    main()
