"""GPU decode speed of Dory against the device's read bandwidth, cortiq's own CPU decode
and PyTorch eager on the same GPU.

    python benchmarks/bench_gpu.py [--quick] [--tokens 128] [--no-cpu] [--no-torch]
                                   [--ab splits=1,splits=8,fuse=0,slots=8] [--batch 1,2,4,8]
                                   [--models dory,dsv4,llama,llama8b]

The model is bench_decode.py's bench-size Dory (hidden 2048, 24 sub-layers in blocks
8/8/8, 2 loops, q8_row: 0.855 GB of weights per token), written once to --cache. In
one run it measures
  * the device's read bandwidth: a WGSL kernel XOR-reducing 1 GiB (16-byte loads,
    many workgroups), the best of several timed submissions;
  * cortiq GPU decode tokens/s three ways: the session path (one submission a token,
    the logits read back), greedy on the device (one submission a token, 4 bytes
    read back), and greedy chained on the device (token i+1 recorded and submitted
    before token i is read, so recording overlaps the GPU);
  * aggregate decode tokens/s of B = 1, 2, 4, 8 sequences at once (--batch; one
    submission a step, every product reading its weights once for the B rows) under
    "cortiq_gpu_batch", with each B's ratio to B = 1;
  * where a token's time goes: dispatches per token, host recording time per token,
    GPU time per token (many tokens' programs in one submission, no host in between),
    and at int8 the GPU time of each product shape;
  * what the int8 decode token's dependency structure costs at best on the device
    ("stream_ceiling_int8": every product replaced by a pure read of its bytes in one
    dependent dispatch, every other pass by an empty one, in one pass);
  * effective GB/s = weight bytes per token x tokens/s, as a percentage of the read
    bandwidth;
  * the same for each --ab variant (a fresh model changing one setting: attention
    splits, the fused residual, rows a decode-matvec workgroup takes; --ab-int8: at
    int8 activations);
  * cortiq's CPU decode on this machine (all cores) and a PyTorch eager bf16 forward of
    the same model on the same GPU (benchmark-only code below), with the largest
    relative logit difference of its first token against cortiq's.
Then the same decode measurements for the DeepSeek-V4 bench model (benchmarks/_bench_dsv4.py's
default geometry, q8_row; --tiny: a small one) under "deepseek_v4", and (unless
--no-kernels) benchmarks/_bench_gpu_kernels.py's kernel measurements: the per-dispatch
floor, the decode matvec's GB/s per variant, and the matvec stream of a Llama-3-8B-shaped
token (7.5 GB, q8_row). Under "llama" and "llama8b" the Llama family's decode, measured
as DeepSeek-V4's (benchmarks/_bench_gpu_llama.py: the _bench_llama.py geometry and
Llama-3-8B's shape, random q8_row weights built in memory; --tiny: a tiny one for both),
with their aggregate batched decode (--batch) under "cortiq_gpu_batch".
--models picks which of dory, dsv4, llama and llama8b run (without dory the read
bandwidth is measured on its own). "phase_s" says how long each part took. It prints one
JSON object.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_gpu_llama as L
import _bench_llama as BL
from _bench_gpu_kernels import (_finish, busy, copies, decode_rates, ms_by_kernel,
                                prefill_rate, stream_ceiling)
from bench_decode import QUICK, RELEASE_LIKE, TINY, build_dory, touched_bytes

from cortiq import cmf
from cortiq.models.dory import AttnWeights, DoryModel


#: what --models chooses from
MODELS = ("dory", "dsv4", "llama", "llama8b")


# ---- the device ------------------------------------------------------------------------
def read_bandwidth(dev, nbytes=1 << 30, reps=8, rounds=4):
    from cortiq.gpu.kernels import ParamArena, fixed_pipeline, resolve, u32s, FIXED
    nbytes = min(nbytes, dev.max_binding // 16 * 16)
    buf = dev.buffer(nbytes)
    out = dev.buffer(1 << 20, copy_src=True)
    words = nbytes // 16
    per_wg = 4096
    nwg = (words + per_wg - 1) // per_wg
    arena = ParamArena(dev)
    p = arena.ref(u32s(words, per_wg, 0, 0))
    arena.upload()
    pipe = fixed_pipeline(dev, "readbw")
    group = dev.bind(FIXED["readbw"], resolve([p, buf, out]))
    best = None
    for r in range(rounds + 1):
        enc = dev.dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        for _ in range(reps):
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, group)
            cp.dispatch_workgroups(min(nwg, 65535), (nwg + 65534) // 65535, 1)
        cp.end()
        t0 = time.perf_counter()
        dev.queue.submit([enc.finish()])
        _finish(dev)
        dt = time.perf_counter() - t0
        if r and (best is None or dt < best):
            best = dt
    return nbytes * reps / best / 1e9


# ---- cortiq on the GPU -----------------------------------------------------------------
def gpu_decode(g, prompt, tokens):
    res = {}
    st = g.new_state()
    res["prefill_tok_s"] = prefill_rate(g, st, prompt)
    tok = int(prompt[-1])
    # warm the decode programs
    g.forward(st, [tok])
    g.forward_greedy(st, [tok])
    g.decode_greedy(st, tok, 2)
    res.update(decode_rates(g, st, tok, tokens))
    # where the time goes
    res["dispatches_per_token"] = g.dispatches_per_token
    g._prepare(st, 1)
    g._write_step(st.pos, 1)
    n = 50
    t0 = time.perf_counter()
    for _ in range(n):
        g._record(st, 1, g.loops, "greedy").finish()
    res["record_ms_per_token"] = (time.perf_counter() - t0) / n * 1e3
    prog = g._program(st, True, g.loops, "greedy")
    best = _time_dispatches(g, prog)
    res["gpu_ms_per_token"] = best * 1e3
    res["gpu_us_per_dispatch"] = best * 1e6 / len(prog)
    res["gpu_ms_by_kernel"] = ms_by_kernel(prog, lambda ds: _time_dispatches(g, ds))
    return res


#: runs of `batch_decode` a figure, the best kept
BATCH_ROUNDS = 3


def batch_decode(g, prompt, tokens, sizes):
    """Aggregate decode tokens/s of B sequences at once (`forward_batch`, one
    submission a step, every row's logits read back and its argmax taken on the host),
    for each B in sizes: the best of BATCH_ROUNDS runs of `tokens` steps, each from the
    same prompt, since the host's share of a step moves from run to run. B = 1 is the
    one-sequence decode program (the same layer program with B = 1); "matmat" (Dory) the
    same B > 1 with the rows' products as the prompt matmat (rows_matvec off)."""
    res = {}

    def run(n, step):
        best = 0.0
        for _ in range(BATCH_ROUNDS):
            sts = [g.new_state() for _ in range(n)]
            for st in sts:
                g.forward(st, prompt, "none")
            toks = [int(prompt[-1])] * n
            for _ in range(2):      # warm the programs
                toks = step(sts, toks)
            t0 = time.perf_counter()
            for _ in range(tokens):
                toks = step(sts, toks)
            best = max(best, n * tokens / (time.perf_counter() - t0))
        return best

    def batched(sts, toks):
        outs = g.forward_batch(sts, [[t] for t in toks], ["last"] * len(sts),
                               [False] * len(sts))
        return [int(np.argmax(o)) for o in outs]

    for b in sizes:
        res[f"b{b}_tok_s"] = run(b, batched)
    if getattr(g, "rows_matvec", False):
        res["rows_matvec"] = g._rows_setup().matvec
    base = res.get("b1_tok_s")
    if base:
        res["over_b1"] = {f"b{b}": res[f"b{b}_tok_s"] / base for b in sizes}
    if getattr(g, "rows_matvec", False):    # the same rows through the prompt matmat
        g.rows_matvec, g._rows = False, None
        try:
            res["matmat"] = {f"b{b}_tok_s": run(b, batched) for b in sizes if b > 1}
        finally:
            g.rows_matvec, g._rows = True, None
    return res


def _time_dispatches(g, ds, k=64, rounds=3, at=1):
    """GPU seconds of one pass over dispatches ds: k passes in one submission (fewer on a
    software adapter: `copies`), best of `rounds` (no host work in between); workgroup
    counts that depend on the step are taken at `at`."""
    k = copies(g.dev, k)
    best = None
    for _ in range(rounds):
        cb = g.dev.record(list(ds) * k, at).finish()
        t0 = time.perf_counter()
        g.dev.queue.submit([cb])
        _finish(g.dev)
        dt = (time.perf_counter() - t0) / k
        best = dt if best is None else min(best, dt)
    return best


# ---- DeepSeek-V4 ---------------------------------------------------------------------------
#: a DeepSeek-V4 small enough for llvmpipe (--tiny)
DSV4_TINY = dict(dim=64, layers=4, heads=2, head_dim=32, rope=16, q_lora=32, o_groups=2,
                 o_lora=32, experts=8, top_k=2, inter=64, vocab=512, window=8, index_heads=2,
                 index_head_dim=16, index_topk=4, hca_ratio=8)


def dsv4_decode(dev, cache, tiny, n_prompt, tokens, bw, cpu):
    """The DeepSeek-V4 bench model (benchmarks/_bench_dsv4.py's default geometry, q8_row)
    decoded on the GPU: prefill and decode tokens/s three ways (as for Dory), dispatches
    and GPU time per token, effective weight GB/s (the bytes a token reads: attention,
    hyper-connections, router, shared + top_k experts, head), GPU time by kernel."""
    import _bench_dsv4 as B
    from cortiq.gpu import to_device
    from cortiq.models.deepseek_v4 import DeepseekV4Model
    ap = argparse.ArgumentParser()
    B.add_args(ap)
    da = ap.parse_args([])
    if tiny:
        for k, v in DSV4_TINY.items():
            setattr(da, k, v)
    geo = B.geometry(da)
    tag = "tiny" if tiny else "default"
    path = os.path.join(cache, f"dsv4-{tag}-q8_row.cmf")
    if not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        B.write_model(path, geo, "q8_row")
    host = DeepseekV4Model(cmf.open(path))
    t0 = time.perf_counter()
    g = to_device(host, dev)
    out = {"model": tag, "dtype": "q8_row", "gpu_load_s": time.perf_counter() - t0,
           "geometry": {k: geo[k] for k in ("dim", "layers", "heads", "head_dim", "experts",
                                            "top_k", "inter", "vocab", "ratios")}}
    per_token = B.touched_bytes(host)
    out["weight_gb_per_token"] = per_token / 1e9
    prompt = np.random.default_rng(0).integers(0, host.vocab, n_prompt)
    st = g.new_state()
    out["prefill_tok_s"] = prefill_rate(g, st, prompt)
    tok = int(prompt[-1])
    g.forward_greedy(st, [tok])
    g.decode_greedy(st, tok, 2)
    out.update(decode_rates(g, st, tok, tokens))
    for k in ("session_tok_s", "greedy_tok_s", "chained_tok_s"):
        out[k.replace("tok_s", "eff_gb_s")] = out[k] * per_token / 1e9
    best = max(out["session_tok_s"], out["greedy_tok_s"], out["chained_tok_s"])
    out["pct_of_read_bw"] = 100 * best * per_token / 1e9 / bw
    out["dispatches_per_token"] = g.dispatches_per_token
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        g._record(st, "greedy").finish()
    out["record_ms_per_token"] = (time.perf_counter() - t0) / n * 1e3
    prog = g._program(st, "greedy")
    out["gpu_ms_per_token"] = _time_dispatches(g, prog, k=16, at=st.pos) * 1e3
    out["gpu_ms_by_kernel"] = ms_by_kernel(
        prog, lambda ds: _time_dispatches(g, ds, k=16, at=st.pos))
    if cpu:
        out["cortiq_cpu"] = cpu_decode(path, prompt, max(4, tokens // 8))
        out["gpu_over_cpu"] = best / out["cortiq_cpu"]["tok_s"]
    return out


# ---- the PyTorch eager peer (benchmark-only) -----------------------------------------------
class TorchDory:
    """Dory decode in PyTorch eager, bf16 weights and matmuls on the GPU, norms in
    float32: the same math as src/cortiq/models/dory/model.py, one token at a time."""

    def __init__(self, host: DoryModel, torch, max_pos: int):
        self.t, self.h = torch, host
        dev = "cuda"
        bf = torch.bfloat16

        def m(*qts):
            return torch.from_numpy(np.concatenate([q.dequantize() for q in qts])).to(dev, bf)

        def v(a):
            return torch.from_numpy(np.asarray(a, np.float32)).to(dev)

        self.layers = []
        for w in host.layers:
            if isinstance(w, AttnWeights):
                self.layers.append(dict(attn=True, qkvg=m(w.q, w.k, w.v, w.g), o=m(w.o),
                                        sq=v(w.sq), sg=v(w.sg), alpha=v(w.alpha),
                                        sliding=w.sliding, ordinal=w.ordinal))
            else:
                self.layers.append(dict(attn=False, gu=m(w.gate, w.up), down=m(w.down),
                                        sg=v(w.sg), su=v(w.su), alpha=v(w.alpha)))
        self.embed = m(host.embed)
        self.head = m(host.head_w)
        self.ls = v(host.logit_scale)
        hd = host.hd
        ang_s = np.arange(max_pos)[:, None] * host.inv_sliding.astype(np.float64)[None]
        ang_f = np.arange(max_pos)[:, None] * host.inv_full.astype(np.float64)[None]
        self.rope = {True: (v(np.cos(ang_s)), v(np.sin(ang_s))),
                     False: (v(np.cos(ang_f)), v(np.sin(ang_f)))}
        nslots = host.attn_layers * host.loops
        self.kc = torch.zeros(nslots, max_pos, host.nk, hd, device=dev, dtype=bf)
        self.vc = torch.zeros_like(self.kc)

    def norm(self, x):
        x = x.float()
        return x / self.t.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    def forward(self, tok: int, pos: int):
        t, h = self.t, self.h
        x = self.embed[tok].float()
        rec = range(h.n_in, h.n_in + h.n_rec)

        def layer(li, loop_i, x):
            w = self.layers[li]
            if w["attn"]:
                nh, nk, hd = h.nh, h.nk, h.hd
                qkvg = (w["qkvg"] @ x.to(t.bfloat16)).float()
                q, k, vv, g = t.split(qkvg, [nh * hd, nk * hd, nk * hd, nh * hd])
                cos, sin = self.rope[w["sliding"]]
                c, s = cos[pos], sin[pos]

                def rot(z):
                    a, b = z[..., :hd // 2], z[..., hd // 2:]
                    return t.cat([a * c - b * s, a * s + b * c], -1)
                q = self.norm(rot(q.view(nh, hd))) * w["sq"].view(nh, hd)
                k = self.norm(rot(k.view(nk, hd)))
                slot = w["ordinal"] * h.loops + (loop_i if h.kv_mode == "per_loop" and li in rec
                                                 else 0)
                self.kc[slot, pos] = k.to(t.bfloat16)
                self.vc[slot, pos] = vv.view(nk, hd).to(t.bfloat16)
                lo = max(0, pos + 1 - h.window) if w["sliding"] else 0
                K = self.kc[slot, lo:pos + 1].float()
                V = self.vc[slot, lo:pos + 1].float()
                qg = q.view(nk, nh // nk, hd)
                sc = t.einsum("kgd,nkd->kgn", qg, K) * float(h.attn_scale)
                y = t.einsum("kgn,nkd->kgd", t.softmax(sc, -1), V).reshape(nh * hd)
                y = self.norm(y * t.sigmoid(g * w["sg"]))
                out = (w["o"] @ y.to(t.bfloat16)).float()
            else:
                gu = (w["gu"] @ x.to(t.bfloat16)).float()
                a, b = gu[:h.ffn] * w["sg"], gu[h.ffn:] * w["su"]
                mm = self.norm(t.nn.functional.silu(a) * b)
                out = (w["down"] @ mm.to(t.bfloat16)).float()
            xh = self.norm(x)
            return self.norm(xh + w["alpha"] * (self.norm(out) - xh))

        for li in range(h.n_in):
            x = layer(li, 0, x)
        inp = x
        state = inp
        for i in range(h.loops):
            x = self.norm(state + inp)
            for li in rec:
                x = layer(li, i, x)
            state = self.norm(x)
        x = state
        for li in range(h.n_in + h.n_rec, len(self.layers)):
            x = layer(li, 0, x)
        return (self.head @ x.to(t.bfloat16)).float() * self.ls


def torch_decode(host, prompt, tokens, ref_logits):
    import torch
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device for torch"}
    td = TorchDory(host, torch, len(prompt) + 2 * tokens + 8)
    with torch.no_grad():
        for p, tok in enumerate(prompt):
            lg = td.forward(int(tok), p)
        first = lg.cpu().numpy()
        diff = float(np.abs(first - ref_logits).max() / np.abs(ref_logits).max())
        pos = len(prompt)
        tok = int(first.argmax())
        for _ in range(4):
            tok = int(td.forward(tok, pos).argmax())
            pos += 1
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(tokens):
            tok = int(td.forward(tok, pos).argmax())     # .item(): one sync a token
            pos += 1
        dt = time.perf_counter() - t0
    return {"tok_s": tokens / dt, "first_logits_rel_diff_vs_cortiq_gpu": diff,
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}


def cpu_decode(path, prompt, tokens):
    from cortiq.runtime.llm import LLM
    llm = LLM(path, n_threads=os.cpu_count(), device="cpu", precision="exact")
    s = llm.session()
    s.feed(prompt, want="last")
    tok = int(prompt[-1])
    for _ in range(2):
        tok = int(np.argmax(s.feed([tok])))
    t0 = time.perf_counter()
    for _ in range(tokens):
        tok = int(np.argmax(s.feed([tok])))
    return {"tok_s": tokens / (time.perf_counter() - t0), "threads": os.cpu_count()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the hidden-1024 model")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (a smoke test)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "cortiq-bench"))
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", help="also write the JSON here, after each part")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="the models measured, comma-separated: dory (and its --ab variants, "
                         "CPU and PyTorch peers), dsv4, llama (the _bench_llama.py geometry), "
                         "llama8b (Llama-3-8B's shape, 7.5 GB a token); --tiny makes both "
                         "Llamas tiny")
    ap.add_argument("--batch", default="1,2,4,8",
                    help="sequence counts B of the aggregate batched decode measurement "
                         "(comma-separated; empty: skip it)")
    ap.add_argument("--no-kernels", action="store_true",
                    help="skip the dispatch-floor, matvec-variant and 8B-chain measurements")
    ap.add_argument("--variants", default="",
                    help="the decode-matvec variants measured (comma-separated parts of "
                         "their names, e.g. int8; empty: all)")
    ap.add_argument("--ab", default="sg=1,unroll=1,rows=32,stage=0",
                    help="variants measured beside the default, comma-separated: splits=N "
                         "(attention key splits), fuse=1|0 (each residual in the next "
                         "product's input stage, or a rownorm pass), qk=1|0 (qk_prep's "
                         "work in the decode attention dispatch, or a qk_prep pass), "
                         "slots=N (rows a decode-matvec workgroup takes, 256/N lanes a row), "
                         "rows=N (the same under subgroups: rows a workgroup), sg=1|0 (the "
                         "decode matvec's rows added by subgroupAdd, or by its shared-memory "
                         "tree), unroll=N "
                         "(16-byte loads a matvec lane issues at once: 1 or 4), stage=0 (a "
                         "plain product's lanes read its input themselves, unstaged), once=1|0 "
                         "(int8 activations, each product's input staged by a pass of its "
                         "own or in each of its workgroups), staged=N (rows a workgroup of "
                         "a product reading an input staged once takes)")
    ap.add_argument("--ab-int8", action="store_true",
                    help="the --ab variants at int8 activations (precision \"int8\")")
    ap.add_argument("--rows-range-keys", default="",
                    help="values of llama.ROWS_RANGE_KEYS (comma-separated; N:1 the same with "
                         "a workgroup a query head, llama.ROWS_ATTN_GQA off) under which the "
                         "Llamas' int8 batched decode is measured again (empty: none)")
    a = ap.parse_args()
    phases = {}
    t_phase = time.perf_counter()

    def phase(name):
        nonlocal t_phase
        now = time.perf_counter()
        phases[name] = round(now - t_phase, 2)
        t_phase = now

    models = [m.strip() for m in a.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        ap.error(f"--models: {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    from cortiq.gpu import Device, to_device
    dev = Device.get()
    out = {"bench": "gpu_decode", "models": models, "device": dev.name,
           "backend": dev.backend, "subgroups": dev.subgroups, "phase_s": phases}

    def save():
        """The results so far to --out (atomically), so a run cut short keeps them."""
        if a.out:
            tmp = a.out + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(out, fh, indent=1)
            os.replace(tmp, a.out)

    bw = 0.0
    sizes = [int(b) for b in a.batch.split(",") if b.strip()]
    if "dory" in models:
        p = TINY if a.tiny else (QUICK if a.quick else RELEASE_LIKE)
        tag = "tiny" if a.tiny else ("quick" if a.quick else "release_like")
        path = build_dory(os.path.join(a.cache, f"dory-{tag}-q8_row.cmf"), p, "q8_row")
        phase("dory_build")
        f = cmf.open(path)
        host = DoryModel(f, o1="off")
        t0 = time.perf_counter()
        g = to_device(host, dev)
        load_s = time.perf_counter() - t0
        per_token = touched_bytes(host)
        rng = np.random.default_rng(0)
        prompt = rng.integers(0, host.vocab, a.prompt)
        busy(dev)
        bw0 = read_bandwidth(dev)
        res = gpu_decode(g, prompt, a.tokens)
        bw1 = read_bandwidth(dev)
        bw = (bw0 + bw1) / 2
        phase("dory_decode")
        out.update({"model": tag, "dtype": "q8_row", "weight_gb_per_token": per_token / 1e9,
                    "gpu_load_s": load_s, "device_read_gb_s": bw,
                    "device_read_gb_s_before_after": [bw0, bw1], "cortiq_gpu": res})
        for k in ("session_tok_s", "greedy_tok_s", "chained_tok_s"):
            out["cortiq_gpu"][k.replace("tok_s", "eff_gb_s")] = res[k] * per_token / 1e9
        best = max(res["session_tok_s"], res["greedy_tok_s"], res["chained_tok_s"])
        out["pct_of_read_bw"] = 100 * best * per_token / 1e9 / bw
        out["attn_splits"] = g.splits
        out["fused_residual"] = g.fuse_residual
        out["fused_qk_prep"] = g.fuse_qk
        save()
        g.set_precision("int8")      # the decode products on int8 activations
        busy(dev)
        r8 = gpu_decode(g, prompt, a.tokens)
        prog8 = g._decode_program
        r8["gpu_ms_by_shape"] = ms_by_kernel(prog8, lambda ds: _time_dispatches(g, ds),
                                             shapes=True)
        # the same token's dependency structure with every product a pure read of its
        # bytes and every other pass empty: what this structure costs at best here
        ceil = stream_ceiling(dev, prog8, bw)
        ceil["tok_s"] = 1e3 / ceil["ms_per_token"]
        ceil["pct_of_read_bw_touched"] = 100 * ceil["tok_s"] * per_token / 1e9 / bw
        out["stream_ceiling_int8"] = ceil
        g.set_precision("exact")
        r8["pct_of_read_bw"] = 100 * max(r8["session_tok_s"], r8["greedy_tok_s"],
                                         r8["chained_tok_s"]) * per_token / 1e9 / bw
        out["cortiq_gpu_int8"] = r8
        phase("dory_decode_int8")
    else:
        busy(dev)
        bw = read_bandwidth(dev)
        out["device_read_gb_s"] = bw
    save()
    if sizes and "dory" in models:
        busy(dev)
        out["cortiq_gpu_batch"] = batch_decode(g, prompt, a.tokens, sizes)
        g.set_precision("int8")       # the int8 rows matvec
        busy(dev)
        out["cortiq_gpu_batch_int8"] = batch_decode(g, prompt, a.tokens, sizes)
        g.set_precision("exact")
        phase("dory_batch")
        save()
    if not a.no_kernels:
        import _bench_gpu_kernels as K
        chain = {}
        if a.tiny:       # shapes a software adapter measures in seconds
            K.SHAPES = [("tiny 96x256", 96, 256, 0), ("tiny swiglu 64x512", 64, 512, 2)]
            chain = dict(layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64,
                         vocab=1000)
        K.ONLY[:] = [v.strip() for v in a.variants.split(",") if v.strip()]
        out["dispatch_floor"] = K.dispatch_floor(dev)
        save()
        out["matvec_variants"] = K.matvec_variants(dev, bw, **({"l2_bytes": 1 << 16}
                                                                if a.tiny else {}))
        phase("matvec_variants")
        save()
        out["llama8b_matvec_chain"] = K.llama8b_chain(dev, bw, **chain)
        phase("llama8b_chain")
        save()
        out["llama8b_rows_chain"] = K.llama8b_rows_chain(dev, bw, **chain)
        phase("llama8b_rows_chain")
        save()
    if "dory" in models:
        ab = {}
        for v in [v.strip() for v in a.ab.split(",") if v.strip()]:
            from cortiq.gpu.dory import GpuDoryModel
            from cortiq.gpu import kernels
            key, _, val = v.partition("=")
            kw = {"splits": {"attn_splits": int(val or 1)},
                  "fuse": {"fuse_residual": val not in ("0", "off")},
                  "qk": {"fuse_qk": val not in ("0", "off")}}.get(key, {})
            keep = (kernels.RPW1_SLOTS, kernels.MATVEC_SUBGROUPS, kernels.MATVEC_UNROLL,
                    kernels.MATVEC_STAGE_PLAIN, kernels.STAGE_ONCE, kernels.STAGED_SLOTS)
            if key == "staged":
                kernels.STAGED_SLOTS = int(val)
            elif key in ("slots", "rows"):  # rows (lane groups) a decode-matvec workgroup takes
                kernels.RPW1_SLOTS = int(val)
            elif key == "sg":
                kernels.MATVEC_SUBGROUPS = val not in ("0", "off")
            elif key == "unroll":
                kernels.MATVEC_UNROLL = int(val)
            elif key == "stage":
                kernels.MATVEC_STAGE_PLAIN = val not in ("0", "off")
            elif key == "once":
                kernels.STAGE_ONCE = val not in ("0", "off")
            try:
                gv = GpuDoryModel(host, dev, **kw)
                if key == "once" or a.ab_int8:
                    gv.set_precision("int8")
                busy(dev, 0.5)
                r = gpu_decode(gv, prompt, a.tokens)
            finally:
                (kernels.RPW1_SLOTS, kernels.MATVEC_SUBGROUPS, kernels.MATVEC_UNROLL,
                 kernels.MATVEC_STAGE_PLAIN, kernels.STAGE_ONCE, kernels.STAGED_SLOTS) = keep
            ab[v] = {k: r[k] for k in ("chained_tok_s", "greedy_tok_s", "record_ms_per_token",
                                       "dispatches_per_token", "gpu_ms_per_token",
                                       "gpu_ms_by_kernel")}
        if ab:
            out["variants"] = ab
        phase("dory_variants")
        save()
        st = g.new_state()
        ref = g.forward(st, prompt, "last")
        if not a.no_cpu:
            out["cortiq_cpu"] = cpu_decode(path, prompt, max(8, a.tokens // 8))
            out["gpu_over_cpu"] = best / out["cortiq_cpu"]["tok_s"]
        if not a.no_torch:
            try:
                out["torch_eager_bf16"] = torch_decode(host, prompt, a.tokens, ref)
                if "tok_s" in out["torch_eager_bf16"]:
                    out["gpu_over_torch"] = best / out["torch_eager_bf16"]["tok_s"]
            except ImportError:
                out["torch_eager_bf16"] = {"skipped": "torch is not installed"}
        phase("dory_cpu_torch")
        save()
    for name in ("llama", "llama8b"):
        if name in models:
            geo = (L.LLAMA_TINY if a.tiny else
                   L.LLAMA8B if name == "llama8b" else BL.QUICK if a.quick else BL.GEOMETRY)
            out[name] = L.llama_decode(dev, name, geo, a.prompt, a.tokens, bw,
                                       _time_dispatches,
                                       (lambda g, prompt: batch_decode(g, prompt, a.tokens,
                                                                       sizes))
                                       if sizes else None,
                                       [v.strip() for v in a.rows_range_keys.split(",")
                                        if v.strip()])
            phase(name)
            save()
    if "dsv4" in models:
        out["deepseek_v4"] = dsv4_decode(dev, a.cache, a.tiny, a.prompt, a.tokens, bw,
                                         not a.no_cpu)
        phase("deepseek_v4")
        save()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
