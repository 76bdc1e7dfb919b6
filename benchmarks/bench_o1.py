"""Dory's O(1) far field against exact attention, on a small random Dory.

    python benchmarks/bench_o1.py                       # 4k, 16k, 64k x o1 on/off
    python benchmarks/bench_o1.py --lengths 4096,16384 --decode 32 --off-max 16384
    python benchmarks/bench_o1.py --decode 256 --off-max 4096 --interleaved

Each (length, o1) cell runs in its own process (clean RSS): a prompt of random tokens is
read in one forward (prefill tokens/s), then ``--decode`` tokens one at a time (decode
tokens/s). Reported: host KV bytes after the decode (exact rows + O(1) states,
``dory.far_field.host_kv_bytes``), the process's peak and current RSS. ``--off-max`` caps the
lengths run with o1 off (exact full attention is quadratic in the prompt).

Targets with o1 on: KV bytes grow <= 5 % from 16k to 64k, decode tokens/s within 10 %
across the lengths, prefill throughput at 64k within 2x of 4k.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))


def write_model(path: str, hidden: int, pattern: str, nh: int, nk: int, hd: int, ffn: int,
                vocab: int, window: int, loops: int, quant: str, third: int) -> None:
    import cortiq.cmf
    rng = np.random.default_rng(0)

    def r(*s):
        return ((rng.random(s, dtype=np.float32) - 0.5) * (2.0 / np.sqrt(s[-1]))).astype(np.float32)

    t = {}
    for li, ch in enumerate(pattern):
        m = f"model.layers.{li}.mixer"
        if ch == "-":
            t[f"{m}.gate_proj.weight"] = r(ffn, hidden)
            t[f"{m}.up_proj.weight"] = r(ffn, hidden)
            t[f"{m}.down_proj.weight"] = r(hidden, ffn)
            t[f"{m}.suv_gate"] = np.full(ffn, 1.0 / np.sqrt(hidden), np.float32)
            t[f"{m}.suv_up"] = np.full(ffn, 1.0 / np.sqrt(hidden), np.float32)
            t[f"model.layers.{li}.mlp_alpha"] = np.full(hidden, 0.05 * 0.02 / 0.05, np.float32)
        else:
            for n, rows in (("q", nh * hd), ("k", nk * hd), ("v", nk * hd), ("g", nh * hd)):
                t[f"{m}.{n}_proj.weight"] = r(rows, hidden)
            t[f"{m}.o_proj.weight"] = r(hidden, nh * hd)
            t[f"{m}.sqk"] = np.full(nh * hd, 2 * 0.02 / np.sqrt(hd), np.float32)
            t[f"{m}.s_gate"] = np.full(nh * hd, 0.02, np.float32)
            t[f"model.layers.{li}.attn_alpha"] = np.full(hidden, 0.05 * 0.02 / 0.05, np.float32)
    t["model.embed_tokens.weight"] = r(vocab, hidden)
    t["lm_head.weight"] = r(vocab, hidden)
    t["lm_head.logit_scale"] = np.full(vocab, 0.02, np.float32)
    n = len(pattern)
    rec = {"layer_pattern": pattern, "n_input_layers": third, "n_recurrent_layers": n - 2 * third,
           "n_output_layers": third, "n_recurrent_loops": loops,
           "recurrent_kv_cache_mode": "last_loop", "sliding_window": window,
           "rope_theta_full": 1e7, "rope_theta_sliding": 1e4, "initializer_range": 0.02,
           "ngpt_alpha_init": 0.05, "gate_logit_scale_init": 4.0}
    arch = {"arch_name": "dory", "hidden_size": hidden, "intermediate_size": ffn,
            "num_layers": n, "num_attention_heads": nh, "num_kv_heads": nk, "head_dim": hd,
            "vocab_size": vocab, "max_position_embeddings": 1 << 20, "rms_norm_eps": 1e-6,
            "dory": rec}
    cortiq.cmf.write(path, sorted(t.items()), arch=arch, quant=quant, progress=False)


def rss_kb() -> tuple[int, int]:
    cur = peak = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1])
    return cur, peak


def one(args) -> dict:
    import cortiq
    import cortiq.cmf
    cortiq.set_num_threads(args.threads)
    from cortiq.models import dory
    from cortiq.models.dory.far_field import host_kv_bytes
    o1 = args.o1 if args.on else "off"
    m = dory.DoryModel(cortiq.cmf.open(args.model), o1=o1, prompt_loops=args.prompt_loops)
    ids = np.random.default_rng(1).integers(0, m.vocab, args.length + args.decode)
    st = m.new_state()
    t0, c0 = time.perf_counter(), time.process_time()
    m.forward(st, ids[:args.length], want="last")
    t_pre, c_pre = time.perf_counter() - t0, time.process_time() - c0
    wall, cpu = [], []
    for i in range(args.length, args.length + args.decode):
        t0, c0 = time.perf_counter(), time.process_time()
        m.forward(st, ids[i:i + 1], want="last")
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    exact, far = host_kv_bytes(st)
    cur, peak = rss_kb()
    return {"length": args.length, "o1": o1, "prefill_tok_s": args.length / t_pre,
            "prefill_s": t_pre, "prefill_cpu_tok_s": args.length / c_pre,
            "decode_tok_s": 1.0 / float(np.median(wall)),
            "decode_cpu_tok_s": 1.0 / float(np.median(cpu)),
            "decode_cpu_p10_tok_s": 1.0 / float(np.percentile(cpu, 10)), "kv_exact": exact,
            "kv_far": far, "kv_bytes": exact + far, "rss_mb": cur / 1024, "peak_mb": peak / 1024}


def interleaved(args, lengths) -> None:
    """Decode with o1 on after each prompt length, in one process, a token of each state in
    turn: the machine's load hits every length alike."""
    import cortiq
    import cortiq.cmf
    from cortiq.models import dory
    cortiq.set_num_threads(args.threads)
    m = dory.DoryModel(cortiq.cmf.open(args.model), o1=args.o1, prompt_loops=args.prompt_loops)
    ids = np.random.default_rng(1).integers(0, m.vocab, max(lengths) + args.decode)
    states = []
    for n in lengths:
        st = m.new_state()
        m.forward(st, ids[:n], want="last")
        states.append(st)
    cpu = [[] for _ in lengths]
    for i in range(args.decode):
        for j, (n, st) in enumerate(zip(lengths, states)):
            c0 = time.process_time()
            m.forward(st, ids[n + i:n + i + 1], want="last")
            cpu[j].append(time.process_time() - c0)
    med = [1.0 / float(np.median(c)) for c in cpu]
    print("interleaved decode, o1 on, tok/s per CPU second (median token): " +
          ", ".join(f"{n}: {x:.1f}" for n, x in zip(lengths, med)) +
          f"; spread {100 * (max(med) / min(med) - 1):.1f} % (target <= 10 %)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="4096,16384,65536")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--o1", default="32,128,4,1024", help="m,w,sink,seal for o1 on")
    ap.add_argument("--off-max", type=int, default=16384, help="longest prompt run exact")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--pattern", default="*-*-*-", help="S sliding, * full, - MLP")
    ap.add_argument("--third", type=int, default=2, help="input = output block layers")
    ap.add_argument("--heads", default="8,2,64", help="nh,nk,hd")
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--loops", type=int, default=2)
    ap.add_argument("--prompt-loops", type=int, default=1,
                    help="passes over prompt chunks (last_loop; the turbo default)")
    ap.add_argument("--quant", default="q8_row")
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=1,
                    help="kernel threads (1: the steadiest timings on a shared machine)")
    ap.add_argument("--interleaved", action="store_true",
                    help="also decode after every length in one process, token by token in turn")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--runner", default=os.path.abspath(__file__), help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--on", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    nh, nk, hd = (int(x) for x in args.heads.split(","))
    if args.model is None:
        d = os.path.join(os.environ.get("TMPDIR", "/tmp"), "cortiq-bench-o1")
        os.makedirs(d, exist_ok=True)
        args.model = os.path.join(d, f"dory-h{args.hidden}-{args.pattern}-{args.quant}.cmf")
        if not os.path.exists(args.model):
            write_model(args.model, args.hidden, args.pattern, nh, nk, hd, args.ffn, args.vocab,
                        args.window, args.loops, args.quant, args.third)
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        for on in (True, False):
            if not on and length > args.off_max:
                rows.append({"length": length, "o1": "off", "skipped": True})
                continue
            cmd = [sys.executable, args.runner, "--one", "--model", args.model,
                   "--length", str(length), "--decode", str(args.decode), "--o1", args.o1,
                   "--prompt-loops", str(args.prompt_loops), "--threads", str(args.threads)]
            if on:
                cmd.append("--on")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"# {length} o1={r['o1']}: prefill {r['prefill_s']:.1f} s", file=sys.stderr)
    print(f"model: hidden {args.hidden}, pattern {args.pattern}, heads {args.heads}, "
          f"{args.quant}, loops {args.loops} (last_loop, prompt loops {args.prompt_loops}), "
          f"o1 on = {args.o1}, decode {args.decode} tokens, {args.threads} thread(s)")
    print("| prompt | o1 | KV bytes (exact + far) | RSS MB (peak) | prefill tok/s cpu (wall)"
          " | decode tok/s cpu (wall) | decode tok/s cpu p10 |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.get("skipped"):
            print(f"| {r['length']} | off | not run (quadratic) | | | | |")
            continue
        print(f"| {r['length']} | {r['o1']} | {r['kv_bytes']:,} ({r['kv_exact']:,} + "
              f"{r['kv_far']:,}) | {r['rss_mb']:.0f} ({r['peak_mb']:.0f}) | "
              f"{r['prefill_cpu_tok_s']:.0f} ({r['prefill_tok_s']:.0f}) | "
              f"{r['decode_cpu_tok_s']:.1f} ({r['decode_tok_s']:.1f}) | "
              f"{r['decode_cpu_p10_tok_s']:.1f} |")
    on = {r["length"]: r for r in rows if r.get("o1") != "off" and not r.get("skipped")}
    ls = sorted(on)
    if len(ls) >= 2:
        a, b = on[ls[-2]], on[ls[-1]]
        dec = [on[x]["decode_cpu_tok_s"] for x in ls]
        d10 = [on[x]["decode_cpu_p10_tok_s"] for x in ls]
        print(f"o1 on: KV growth {ls[-2]} -> {ls[-1]}: "
              f"{100 * (b['kv_bytes'] / a['kv_bytes'] - 1):+.2f} % (target <= 5 %); decode "
              f"spread {100 * (max(dec) / min(dec) - 1):.1f} % median, "
              f"{100 * (max(d10) / min(d10) - 1):.1f} % p10 (target <= 10 %); prefill "
              f"{ls[0]} / {ls[-1]}: {on[ls[0]]['prefill_cpu_tok_s'] / b['prefill_cpu_tok_s']:.2f}x "
              f"(target <= 2x)")
    if args.interleaved:
        interleaved(args, [int(x) for x in args.lengths.split(",")])


if __name__ == "__main__":
    main()
