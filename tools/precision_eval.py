"""What int8 activations cost in quality: the bundled demo model's perplexity on its
held-out text, requantized to each weight dtype, with precision exact / int8 / auto.

    python tools/precision_eval.py [--tokens 20000] [--seq 256] [--dtypes q8_row,q4_block]
        [--json out.json]
    python tools/precision_eval.py --matrix-error   # per-product error only, fast

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


def matrix_errors(dtypes) -> str:
    """Markdown: relative error of y = W x per dtype, int8 vs exact activations and the
    weights' own quantization error, for Gaussian W and x (1024 x 4096) and for the demo
    model's matrices (real weight scales) against real-scale inputs (its token
    embeddings, with their outliers, for every matrix of 256 columns)."""
    from cortiq import cmf
    from cortiq.demo import demo_path
    from cortiq.kernels.tensor import QTensor
    from cortiq.cmf.testing import qtensor_from_f32
    rng = np.random.default_rng(8)
    cases = [("Gaussian 1024x4096", [(rng.standard_normal((1024, 4096)).astype(np.float32),
                                      rng.standard_normal((16, 4096)).astype(np.float32))])]
    with cmf.open(demo_path()) as cf:
        emb = np.ascontiguousarray(cf.tensor("model.embed_tokens.weight"), np.float32)
        xs = emb[rng.choice(len(emb), 16, replace=False)]
        mats = [np.ascontiguousarray(cf.tensor(n), np.float32) for n in cf.names()
                if len(cf.tensors[n].shape) == 2 and cf.tensors[n].shape[1] == xs.shape[1]
                and n != "model.embed_tokens.weight"]
    cases.append((f"demo model, {len(mats)} matrices x 16 embedding rows", [(w, xs) for w in mats]))
    out = ["| weights | dtype | int8 vs exact activations | weights' own error | int8 total |",
           "|---|---|---|---|---|"]
    for label, pairs in cases:
        for dtype in dtypes:
            num = [0.0, 0.0, 0.0]
            den = 0.0
            for w, X in pairs:
                qe = qtensor_from_f32(w, dtype)
                qi = QTensor(qe.raw, dtype, qe.shape, precision="int8")
                for x in X:
                    ref = w.astype(np.float64) @ x.astype(np.float64)
                    ye, yi = qe.matvec(x).astype(np.float64), qi.matvec(x).astype(np.float64)
                    num[0] += float(np.sum((yi - ye) ** 2))
                    num[1] += float(np.sum((ye - ref) ** 2))
                    num[2] += float(np.sum((yi - ref) ** 2))
                    den += float(np.sum(ref ** 2))
            r = [100 * math.sqrt(v / den) for v in num]
            out.append(f"| {label} | {dtype} | {r[0]:.2f} % | {r[1]:.2f} % | {r[2]:.2f} % |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=20000, help="held-out tokens to score")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dtypes", default="q8_row,q8_2f,q4_block,q4_tiled,q4tp,q2tp")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--matrix-error", action="store_true",
                    help="only the per-product error table (no perplexity)")
    args = ap.parse_args(argv)
    if args.matrix_error:
        print(matrix_errors(args.dtypes.split(",")))
        return 0
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
    print("| dtype | exact | int8 | int8 vs exact | auto | auto vs exact |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        d8 = 100 * (r["int8"] / r["exact"] - 1)
        da = 100 * (r["auto"] / r["exact"] - 1)
        print(f"| {r['dtype']} | {r['exact']:.3f} | {r['int8']:.3f} | {d8:+.3f} % | "
              f"{r['auto']:.3f} | {da:+.3f} % |")
    print(f"\n({rows[0]['tokens']} held-out tokens, windows of {args.seq}; "
          f"{cortiq.config()['isa']}, {cortiq.get_num_threads()} threads)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
