"""One change's speed, before and after, in the same run: two source trees of cortiq
(each with its extension built in place) timed in turn, round after round.

    python benchmarks/bench_ab.py --before ../old --after . --model M.cmf \
        [--what decode,prefill,batch] [--rounds 6] [--threads 2] [--precision exact]

Each round runs, for each tree, a fresh process with that tree's `src` first on the
path, which loads `--model` through the public API (`cortiq.LLM`) and measures:
  * decode: ms a token, one sequence, one token a feed after a 16-token prompt (best
    of 4 runs of --tokens tokens);
  * prefill: tokens/s of one --prompt-token feed (best of 3);
  * batch: aggregate tokens/s of --batch sequences decoding one token each a step
    through `feed_batch` (best of 3 runs of 16 steps).
A 2-core virtual machine's speed drifts by 10-20 % over minutes, more than most
changes move it, so one run of each side compares the drift, not the change: the
rounds alternate the trees and the table reports each side's median, its spread and
the ratio of the medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WHATS = ("decode", "prefill", "batch")


def child(a) -> dict:
    """The measurements in this process (the tree is whatever `cortiq` imports)."""
    import warnings

    import numpy as np

    import cortiq
    warnings.simplefilter("ignore")
    cortiq.set_num_threads(a.threads)
    llm = cortiq.LLM(a.model, precision=a.precision)
    rng = np.random.default_rng(0)
    vocab = llm.vocab_size
    out = {}
    if "decode" in a.what:
        ids = rng.integers(3, vocab, 16 + a.tokens).tolist()
        best = float("inf")
        for _ in range(4):
            s = llm.session()
            s.feed(ids[:16], want="last")
            t0 = time.perf_counter()
            for t in ids[16:]:
                s.feed([t], want="last")
            best = min(best, (time.perf_counter() - t0) / a.tokens)
        out["decode ms/token"] = best * 1e3
    if "prefill" in a.what:
        ids = rng.integers(3, vocab, a.prompt).tolist()
        best = float("inf")
        for _ in range(3):
            s = llm.session()
            t0 = time.perf_counter()
            s.feed(ids, want="last")
            best = min(best, time.perf_counter() - t0)
        out["prefill tok/s"] = a.prompt / best
    if "batch" in a.what:
        try:
            from cortiq.runtime.batch import feed_batch
        except ImportError:  # a tree from before the runtime/ folder
            from cortiq.batch import feed_batch  # type: ignore[no-redef]
        best = float("inf")
        for _ in range(3):
            ss = [llm.session() for _ in range(a.batch)]
            feed_batch(ss, [rng.integers(3, vocab, 16).tolist() for _ in ss], "last")
            t0 = time.perf_counter()
            for _ in range(16):
                feed_batch(ss, [[int(t)] for t in rng.integers(3, vocab, a.batch)], "last")
            best = min(best, (time.perf_counter() - t0) / 16)
        out[f"batch B={a.batch} tok/s"] = a.batch / best
    llm.close()
    return out


def run_tree(tree: str, argv: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(tree), "src"))
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *argv],
                         env=env, cwd=os.path.abspath(tree), capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        sys.exit(f"{tree}: the measurement failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before")
    ap.add_argument("--after")
    ap.add_argument("--model", required=True)
    ap.add_argument("--what", default="decode,prefill",
                    help=f"comma-separated, of {', '.join(WHATS)}")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="exact")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.what = a.what.split(",")
    bad = [w for w in a.what if w not in WHATS]
    if bad:
        ap.error(f"--what: {', '.join(bad)}: not one of {', '.join(WHATS)}")
    if a.child:
        print(json.dumps(child(a)))
        return
    if not a.before or not a.after:
        ap.error("--before and --after name the two source trees")
    argv = ["--model", os.path.abspath(a.model), "--what", ",".join(a.what),
            "--threads", str(a.threads), "--precision", a.precision, "--tokens",
            str(a.tokens), "--prompt", str(a.prompt), "--batch", str(a.batch)]
    got: dict = {"before": {}, "after": {}}
    for r in range(a.rounds):
        for side, tree in (("before", a.before), ("after", a.after)):
            for k, v in run_tree(tree, argv).items():
                got[side].setdefault(k, []).append(v)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    print(f"model {os.path.basename(a.model)}, {a.threads} threads, precision "
          f"{a.precision}, {a.rounds} rounds")
    print("| measure | before: median (min-max) | after: median (min-max) | after / before |")
    print("|---|---|---|---|")
    for k in got["before"]:
        b, f = got["before"][k], got["after"][k]
        mb, mf = statistics.median(b), statistics.median(f)
        print(f"| {k} | {mb:.3f} ({min(b):.3f}-{max(b):.3f}) | {mf:.3f} "
              f"({min(f):.3f}-{max(f):.3f}) | {mf / mb:.3f} |")


if __name__ == "__main__":
    main()
