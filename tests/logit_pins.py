"""Logit rows of every CPU architecture, recorded to pin the forwards' bits.

`runs(files)` feeds fixed ids through each architecture's model (Llama family, Dory
with its options, DeepSeek-V4; f32 and q8_row weights; exact and auto precision): a
prompt (every row's logits), decode steps one token at a time, a batch of several
sequences mixing prompt pieces and decode rows, and the final hidden states. The
results depend on the kernel table and on numpy's float32 sin/cos (the rotary
tables), so pins are kept per `environment()`. `python tests/logit_pins.py` records
them for the kernel tables this machine can run.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import batch_models as BM
from reference.dsv4_toy import write_toy

import cortiq
from cortiq.kernels import _kernels

PINS = os.path.join(os.path.dirname(__file__), "data", "logit_pins.npz")

#: (name, arch, quant, model options)
CASES = [("llama_f32", "llama", "f32", {}), ("llama_q8", "llama", "q8_row", {}),
         ("dory_f32", "dory", "f32", {}), ("dory_q8", "dory", "q8_row", {}),
         ("dory_lastloop_gate", "dory", "f32", {"kv_mode": "last_loop", "gate": "conf:0.2"}),
         ("dory_loops3", "dory", "q8_row", {"loops": 3, "full_window": 5}),
         ("dory_o1", "dory", "f32", {"o1": "4,2,1,24"}),
         ("dsv4_f32", "dsv4", "f32", {}), ("dsv4_q8", "dsv4", "q8_row", {})]
PRECISIONS = ("exact", "auto")


def environment() -> str:
    """What decides the bits besides the code: the kernel table and numpy's SIMD
    target for float32 sin/cos."""
    from numpy._core._multiarray_umath import __cpu_features__ as f
    np_simd = "avx512" if f.get("AVX512_SKX") else "avx2" if f.get("AVX2") else "base"
    return f"{_kernels.active_isa()}-np{np_simd}"


def write_files(d) -> dict:
    os.makedirs(d, exist_ok=True)
    out = {}
    for q in ("f32", "q8_row"):
        out["llama", q] = BM.write_llama(os.path.join(d, f"llama_{q}.cmf"), q)
        out["dory", q] = BM.write_dory(os.path.join(d, "dory"), q)
        out["dsv4", q] = str(write_toy(os.path.join(d, f"dsv4_{q}.cmf"), quant=q))
    return out


def _model(files, arch, quant, opts, precision):
    from cortiq.models import model_class
    cf = cortiq.cmf.open(files[arch, quant])
    m = model_class(cf.arch["arch_name"])(cf, **opts)
    m.set_precision(precision)
    return m


def runs(files) -> dict:
    """name -> float32 array, for every case and precision."""
    from cortiq.runtime.batch import feed_batch
    from cortiq.runtime.session import Session
    out = {}
    for name, arch, quant, opts in CASES:
        for precision in PRECISIONS:
            m = _model(files, arch, quant, opts, precision)
            key = f"{name}/{precision}"
            rng = np.random.default_rng(7)

            def ids(n, rng=rng, vocab=m.vocab):
                return rng.integers(3, vocab, n).tolist()
            s = Session(m)
            out[f"{key}/prompt"] = s.feed(ids(9), "all", prompt=True)
            out[f"{key}/decode"] = np.stack([s.feed([t], "last", prompt=False)
                                             for t in ids(4)])
            ss = [Session(m) for _ in range(4)]
            first = feed_batch(ss, [ids(5), ids(1), ids(70), ids(3)],
                               ["all", "all", "last", "last"], prompt=True)
            out[f"{key}/batch_prompt"] = np.concatenate(
                [np.atleast_2d(r) for r in first])
            steps = [np.stack(feed_batch(ss, [[t] for t in ids(4)], "last", prompt=False))
                     for _ in range(3)]
            out[f"{key}/batch_decode"] = np.stack(steps)
            mixed = feed_batch(ss[:2], [ids(6), ids(1)], ["all", "last"], prompt=[True, False])
            out[f"{key}/batch_mixed"] = np.concatenate([np.atleast_2d(r) for r in mixed])
            if arch == "llama":
                out[f"{key}/hidden"] = m.final_hidden(m.new_state(), ids(11))
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


def record(tmp) -> None:
    files = write_files(tmp)
    have = dict(np.load(PINS)) if os.path.exists(PINS) else {}
    for isa in _kernels.usable_isas():
        _kernels.set_isa(isa)
        env = environment()
        have = {k: v for k, v in have.items() if not k.startswith(env + "/")}
        have.update({f"{env}/{k}": v for k, v in runs(files).items()})
        print(f"recorded {env}")
    tmp_out = PINS + ".tmp.npz"
    np.savez_compressed(tmp_out, **have)
    os.replace(tmp_out, PINS)


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        record(d)
