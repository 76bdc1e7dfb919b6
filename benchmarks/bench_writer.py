"""CMF writer throughput and peak memory on a synthetic ~1 GB (float32) model.

    python benchmarks/bench_writer.py [--gib 1.0] [--quant q8_row] [--threads 1] [--dir /tmp]

Tensors are generated one at a time by callables (as a converter streams a checkpoint),
quantized, hashed and written. Prints the writer's rate in MB/s of float32 input and of
file output (generation time excluded), the peak RSS against the baseline before
writing (bounded memory means peak - baseline ~ a few times the largest tensor, not the
model), and the open + verify() rate of the result. The file is deleted afterwards.
"""
import argparse
import os
import resource
import tempfile
import time

import numpy as np

import cortiq
import cortiq.cmf as C


def rss_mib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def plan(target_bytes, hidden=2048, inter=5632, vocab=32000):
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    total = vocab * hidden * 4
    i = 0
    while total < target_bytes - vocab * hidden * 4:
        p = f"model.layers.{i}."
        for name, shape in [("input_layernorm.weight", (hidden,)),
                            ("self_attn.q_proj.weight", (hidden, hidden)),
                            ("self_attn.k_proj.weight", (hidden // 4, hidden)),
                            ("self_attn.v_proj.weight", (hidden // 4, hidden)),
                            ("self_attn.o_proj.weight", (hidden, hidden)),
                            ("post_attention_layernorm.weight", (hidden,)),
                            ("mlp.gate_proj.weight", (inter, hidden)),
                            ("mlp.up_proj.weight", (inter, hidden)),
                            ("mlp.down_proj.weight", (hidden, inter))]:
            shapes.append((p + name, shape))
            total += int(np.prod(shape)) * 4
        i += 1
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    total += (hidden + vocab * hidden) * 4
    arch = dict(arch_name="llama", hidden_size=hidden, intermediate_size=inter, num_layers=i,
                num_attention_heads=16, num_kv_heads=4, head_dim=hidden // 16,
                vocab_size=vocab, max_position_embeddings=4096,
                layer_types=["FullAttention"] * i, rms_norm_eps=1e-5)
    return shapes, total, arch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="float32 model size")
    ap.add_argument("--quant", default="q8_row")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    cortiq.set_num_threads(a.threads)
    shapes, total, arch = plan(int(a.gib * (1 << 30)))
    largest = max(int(np.prod(s)) * 4 for _, s in shapes)
    gen_time = [0.0]
    rng = np.random.default_rng(0)

    def make(shape):
        def f():
            t0 = time.perf_counter()
            x = rng.standard_normal(shape, dtype=np.float32)
            x *= np.float32(0.02)
            gen_time[0] += time.perf_counter() - t0
            return x
        return f

    path = os.path.join(a.dir, f"bench-writer-{os.getpid()}.cmf")
    base = rss_mib()
    t0 = time.perf_counter()
    try:
        C.write(path, [(n, make(s)) for n, s in shapes], arch=arch, quant=a.quant,
                progress=False)
        wall = time.perf_counter() - t0
        peak = peak_mib()
        out = os.path.getsize(path)
        wt = wall - gen_time[0]
        print(f"model: {len(shapes)} tensors, {total / 1e6:.0f} MB float32 "
              f"(largest tensor {largest / 1e6:.0f} MB) -> {a.quant}, {out / 1e6:.0f} MB file, "
              f"threads {a.threads}")
        print(f"write: {wall:.2f} s wall, of which {gen_time[0]:.2f} s generating data; "
              f"writer {wt:.2f} s = {total / 1e6 / wt:.0f} MB/s float32 in, "
              f"{out / 1e6 / wt:.0f} MB/s file out")
        print(f"memory: baseline RSS {base:.0f} MiB, peak RSS {peak:.0f} MiB "
              f"(+{peak - base:.0f} MiB; model is {total / 2**20:.0f} MiB)")
        t1 = time.perf_counter()
        with C.open(path) as cf:
            t_open = time.perf_counter() - t1
            probs = cf.verify()
        t_ver = time.perf_counter() - t1 - t_open
        print(f"read: open {t_open * 1e3:.1f} ms, verify {t_ver:.2f} s = "
              f"{out / 1e9 / t_ver:.2f} GB/s, problems: {len(probs)}")
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
