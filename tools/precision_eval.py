"""What int8 activations cost in quality: the bundled demo model's perplexity on its
held-out text, requantized to each weight dtype, with precision exact / int8 / auto.

    python tools/precision_eval.py [--tokens 20000] [--seq 256] [--dtypes q8_row,q4_block]
        [--json out.json]

The held-out text is what tools/train_demo.py holds out (5 % of the files of this
Python's standard library, by its seeded split; the shipped demo was trained on
CPython 3.11.7's). Each dtype's file is written once with cortiq.cmf.write (the
writer's dtype rules: norms and small vectors stay f32) into a temporary directory.
Windows of `seq` + 1 tokens, each in a fresh session: the mean next-token loss, then
perplexity = exp(loss). Prints a Markdown table (docs/PERFORMANCE.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def heldout_ids(llm, limit: int) -> np.ndarray:
    """The held-out documents of train_demo's split, tokenized by the model's tokenizer,
    each followed by <|endoftext|> (train_demo.encode_docs), cut to `limit` tokens."""
    from train_demo import RECIPE, build_corpus
    _, held, _ = build_corpus(RECIPE["seed"], RECIPE["holdout_frac"], RECIPE["chat_frac"])
    (eot,) = llm.tokenize("<|endoftext|>", add_special_tokens=False)
    ids: list[int] = []
    for doc in held:
        ids.extend(llm.tokenize(doc, add_special_tokens=False))
        ids.append(eot)
        if len(ids) > limit:
            break
    return np.asarray(ids[:limit], np.int64)


def perplexity(llm, ids: np.ndarray, seq: int) -> tuple[float, int]:
    n = (len(ids) - 1) // seq
    tot, cnt = 0.0, 0
    for w in range(n):
        win = ids[w * seq: w * seq + seq + 1]
        logits = llm.session().feed(win[:-1], want="all").astype(np.float64)
        m = logits.max(axis=1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1)))
        tot += float((lse - logits[np.arange(seq), win[1:]]).sum())
        cnt += seq
    return math.exp(tot / max(cnt, 1)), cnt


def requantized(src_path: str, dtype: str, out_dir: str) -> str:
    from cortiq import cmf
    path = os.path.join(out_dir, f"demo_{dtype}.cmf")
    with cmf.open(src_path) as cf:
        tensors = {n: cf.tensor(n) for n in cf.names()}
        cmf.write(path, tensors, arch=cf.arch, quant=dtype, tokenizer_json=cf.tokenizer_json(),
                  tokenizer_config=cf.tokenizer_config, progress=False)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=20000, help="held-out tokens to score")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dtypes", default="q8_row,q8_2f,q4_block,q4_tiled,q4tp,q2tp")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    import cortiq
    from cortiq.demo import demo_path
    src = demo_path()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ids = None
        for dtype in args.dtypes.split(","):
            path = src if dtype == "q8_row" else requantized(src, dtype, tmp)
            res = {"dtype": dtype}
            for prec in ("exact", "int8", "auto"):
                with cortiq.LLM(path, precision=prec) as llm:
                    if ids is None:
                        ids = heldout_ids(llm, args.tokens)
                    t0 = time.perf_counter()
                    ppl, n = perplexity(llm, ids, args.seq)
                    res[prec] = ppl
                    res["tokens"] = n
                    print(f"{dtype:9s} {prec:5s} ppl {ppl:8.3f} over {n} tokens "
                          f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            rows.append(res)
    print(f"| dtype | exact | int8 | int8 vs exact | auto | auto vs exact |")
    print(f"|---|---|---|---|---|---|")
    for r in rows:
        d8 = 100 * (r["int8"] / r["exact"] - 1)
        da = 100 * (r["auto"] / r["exact"] - 1)
        print(f"| {r['dtype']} | {r['exact']:.3f} | {r['int8']:.3f} | {d8:+.2f} % | "
              f"{r['auto']:.3f} | {da:+.2f} % |")
    print(f"\n({rows[0]['tokens']} held-out tokens, windows of {args.seq}; "
          f"{cortiq.config()['isa']}, {cortiq.get_num_threads()} threads)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
