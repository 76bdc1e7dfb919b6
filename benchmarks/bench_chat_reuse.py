"""What a chat turn costs with and without session reuse (longest-common-prefix rollback).

    python benchmarks/bench_chat_reuse.py [--turns 5] [--max-tokens 16] [--hidden 128]
                                          [--engine auto|cortiq|reference] [--model FILE]

Builds a small Dory checkpoint (tests/reference/hf_tiny.py), converts it to CMF
(cortiq.convert.from_hf) and holds a multi-turn greedy chat twice:

* reuse: one session for the whole conversation; each turn re-renders the history and
  rolls the session back to the longest common prefix, reading only the rest;
* fresh: a new session per turn, reading the whole rendered history every time.

Both must produce the same replies (checked). Printed per turn: prompt tokens, tokens
read, time of the turn (prefill + decode; fastest of `--repeat` alternating runs, the
machine being shared); then the totals and the ratio. The engine is cortiq's DoryModel
when it is available (`--engine cortiq`), else the float64 NumPy reference forward of
tests/reference/dory_numpy.py with its real KV cache wrapped in the model protocol
(`--engine reference`). `--model FILE` runs on an existing .cmf with cortiq.LLM.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import cortiq  # noqa: E402
from cortiq.models.base import Capabilities, ModelBase  # noqa: E402

USER_TURNS = [
    "the quick brown fox jumps over the lazy dog",
    "sliding window attention reads only the last few keys",
    "the recurrent block runs twice with the input mixed back",
    "a looped normalized transformer keeps every hidden state on the unit sphere",
    "hello world this is a tiny tokenizer for tests",
    "the quick brown fox reads the last few keys of the sequence",
    "the lazy dog runs twice",
    "every hidden state on the unit sphere",
]


class ReferenceDory(ModelBase):
    """tests/reference/dory_numpy.DoryReference behind cortiq's model protocol."""
    arch = "dory"
    capabilities = Capabilities(rollback=True)

    def __init__(self, cf):
        from reference.dory_numpy import DoryReference
        self.ref = DoryReference.from_cmf_file(cf)
        self.vocab = int(cf.arch["vocab_size"])
        self.tokens = 0

    def new_state(self):
        return self.ref.new_cache()

    def forward_batch(self, states, ids_list, wants, prompts):
        return [self._run(st, ids, want) for st, ids, want in zip(states, ids_list, wants)]

    def _run(self, state, ids, want):
        out = self.ref.step(state, [int(i) for i in ids])
        self.tokens += len(ids)
        if want == "none":
            return None
        out = out.astype(np.float32)
        return out[-1] if want == "last" else out

    def can_rollback(self, state, n):
        return True

    def rollback(self, state, n):
        state.rollback(n)


def build(tmp, hidden):
    from reference import hf_tiny
    from cortiq.convert import from_hf
    hf = os.path.join(tmp, "hf")
    hf_tiny.build(hf, hidden=hidden, heads=4, kv_heads=2, head_dim=hidden // 4,
                  mlp=2 * hidden, vocab=384, window=64, max_pos=4096, dtype="bf16")
    out = os.path.join(tmp, "tiny_dory.cmf")
    from_hf(hf, out, quant="f32", progress=False)
    return out


def open_llm(path, engine):
    if engine in ("auto", "cortiq"):
        try:
            return cortiq.LLM(path), "cortiq DoryModel"
        except cortiq.ConfigError:
            if engine == "cortiq":
                raise
    cf = cortiq.cmf.open(path)
    model = ReferenceDory(cf)
    llm = cortiq.LLM.from_model(model, tokenizer=cf.tokenizer_json(),
                                tokenizer_config=cf.tokenizer_config, name="tiny_dory",
                                max_sessions=0)
    return llm, "float64 NumPy reference (tests/reference/dory_numpy.py)"


def chat(llm, turns, max_tokens, reuse):
    msgs = [{"role": "system", "content": "you are a tiny model"}]
    s = llm.session()
    rows, replies = [], []
    for text in turns:
        msgs.append({"role": "user", "content": text})
        session = s if reuse else llm.session()
        t0 = time.perf_counter()
        r = llm.create_chat_completion(msgs, session=session, max_tokens=max_tokens,
                                       temperature=0, repetition_penalty=1.0)
        dt = time.perf_counter() - t0
        u = r["usage"]
        cached = u["prompt_tokens_details"]["cached_tokens"]
        rows.append((u["prompt_tokens"], u["prompt_tokens"] - cached, u["completion_tokens"], dt))
        reply = r["choices"][0]["message"]["content"]
        replies.append(reply)
        msgs.append({"role": "assistant", "content": reply})
    return rows, replies


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--engine", default="auto", choices=("auto", "cortiq", "reference"))
    ap.add_argument("--model", default=None, help="an existing .cmf (cortiq.LLM)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode (fastest kept)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        cortiq.set_num_threads(args.threads)
    turns = (USER_TURNS * 4)[:args.turns]
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or build(tmp, args.hidden)
        llm, engine = open_llm(path, "cortiq" if args.model else args.engine)
        print(f"engine: {engine}; {args.turns} turns, {args.max_tokens} new tokens each, "
              f"greedy")
        chat(llm, turns[:1], 2, True)                     # warm-up (imports, caches)
        runs = {False: [], True: []}
        for rep in range(args.repeat):                    # alternate; keep the fastest
            for mode in ((False, True) if rep % 2 == 0 else (True, False)):
                rows, replies = chat(llm, turns, args.max_tokens, reuse=mode)
                runs[mode].append(rows)
                if rep == 0 and mode is False:
                    r_fresh = replies
                if rep == 0 and mode is True:
                    r_reuse = replies
        assert r_fresh == r_reuse, "reuse changed the replies"

        def best(rs):
            return [min((r[i] for r in rs), key=lambda x: x[3]) for i in range(len(rs[0]))]
        fresh, reuse = best(runs[False]), best(runs[True])
        print("turn  prompt  read(fresh)  read(reuse)  time fresh   time reuse")
        for i, (f, r) in enumerate(zip(fresh, reuse), 1):
            print(f"{i:4d}  {f[0]:6d}  {f[1]:11d}  {r[1]:11d}  {f[3] * 1e3:8.1f} ms  "
                  f"{r[3] * 1e3:8.1f} ms")
        tf, tr = sum(x[3] for x in fresh), sum(x[3] for x in reuse)
        nf, nr = sum(x[1] for x in fresh), sum(x[1] for x in reuse)
        print(f"total prompt tokens read: fresh {nf}, reuse {nr} ({1 - nr / nf:.0%} fewer); "
              f"time: fresh {tf:.2f} s, reuse {tr:.2f} s (x{tf / tr:.2f})")
        llm.close()


if __name__ == "__main__":
    main()
