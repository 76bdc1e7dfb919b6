"""Prototype decode-matvec arithmetics on q8 rows, timed against the read probe
(benchmark-only; the variants that win move into cortiq.gpu's shaders).

  cvt   : int8 weights to f32 by sign-extending shifts and a convert, f32 x
  magic : int8 weights to f32 by an exponent-bias OR and one subtract (exact), f32 x
  dp4a  : x quantized to int8 per 32 columns, four-way integer dots (dot4I8Packed),
          each 16-column chunk's integer sum scaled by its x scale
A row is LPR lanes' (subgroup shuffles add them), each lane UNR 16-byte loads in flight.
"""
import sys

import numpy as np

SHADER = """
struct Prm { rows: u32, cols: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> p: Prm;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> XF: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> XQ: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> XD: array<f32>;
@group(0) @binding(5) var<storage, read_write> Y: array<f32>;

const LPR: u32 = $LPRu;
const SLOTS: u32 = 256u / LPR;

fn mg(u0: u32) -> vec4<f32> {
    let u = u0 ^ 0x80808080u;
    return bitcast<vec4<f32>>(vec4<u32>(u & 0xffu, (u >> 8u) & 0xffu, (u >> 16u) & 0xffu, u >> 24u)
                              | vec4<u32>(0x4b000000u)) - vec4<f32>(8388736.0);
}
fn sx(u: u32) -> vec4<f32> {
    return vec4<f32>(f32((i32(u) << 24u) >> 24u), f32((i32(u) << 16u) >> 24u),
                     f32((i32(u) << 8u) >> 24u), f32(i32(u) >> 24u));
}
fn dmg(w: vec4<u32>, k: u32) -> f32 {
    return dot(mg(w.x), XF[4u * k]) + dot(mg(w.y), XF[4u * k + 1u])
         + dot(mg(w.z), XF[4u * k + 2u]) + dot(mg(w.w), XF[4u * k + 3u]);
}
fn dcv(w: vec4<u32>, k: u32) -> f32 {
    return dot(sx(w.x), XF[4u * k]) + dot(sx(w.y), XF[4u * k + 1u])
         + dot(sx(w.z), XF[4u * k + 2u]) + dot(sx(w.w), XF[4u * k + 3u]);
}
fn dq(w: vec4<u32>, q: vec4<u32>, d: f32) -> f32 {
    return f32(dot4I8Packed(w.x, q.x) + dot4I8Packed(w.y, q.y) + dot4I8Packed(w.z, q.z)
               + dot4I8Packed(w.w, q.w)) * d;
}

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_size) sgs: u32) {
    let slot = lid / LPR;
    let lane = lid % LPR;
    let n = p.cols / 16u;
    let base = wid.x * SLOTS * $Ru;
$ROWS
    var k = lane;
    for (; k + $UM1u * LPR < n; k += $UNRu * LPR) {
$BODY
    }
    for (; k < n; k += LPR) {
$TAIL
    }
$RED
}
"""


def shader(mode, lpr, unr, r):
    """The prototype's text for R rows a lane, UNR loads of each in flight."""
    rows = "\n".join(f"    let row{i} = min(base + {i}u * SLOTS + slot, p.rows - 1u); "
                     f"let b{i} = row{i} * n; var acc{i} = 0.0;" for i in range(r))
    body = []
    for j in range(unr):
        kk = f"k + {j}u * LPR"
        for i in range(r):
            body.append(f"        let w{i}_{j} = W[b{i} + {kk}];")
    for j in range(unr):
        kk = f"k + {j}u * LPR"
        if mode == "dp4a":
            body.append(f"        let q{j} = XQ[{kk}]; let d{j} = XD[({kk}) >> 1u];")
        for i in range(r):
            if mode == "dp4a":
                body.append(f"        acc{i} += dq(w{i}_{j}, q{j}, d{j});")
            else:
                fn = "dmg" if mode == "magic" else "dcv"
                body.append(f"        acc{i} += {fn}(w{i}_{j}, {kk});")
    tail = []
    if mode == "dp4a":
        tail.append("        let q = XQ[k]; let d = XD[k >> 1u];")
    for i in range(r):
        if mode == "dp4a":
            tail.append(f"        acc{i} += dq(W[b{i} + k], q, d);")
        else:
            fn = "dmg" if mode == "magic" else "dcv"
            tail.append(f"        acc{i} += {fn}(W[b{i} + k], k);")
    red = []
    for i in range(r):
        red.append(f"""    for (var m = LPR / 2u; m > 0u; m = m / 2u) {{
        if (m < sgs) {{ acc{i} += subgroupShuffleXor(acc{i}, m); }}
    }}
    if (LPR > sgs) {{
        workgroupBarrier();
        red[lid] = acc{i};
        workgroupBarrier();
        if (lane == 0u) {{ for (var j = sgs; j < LPR; j += sgs) {{ acc{i} += red[lid + j]; }} }}
    }}
    if (lane == 0u && base + {i}u * SLOTS + slot < p.rows) {{ Y[row{i}] = acc{i}; }}""")
    return (SHADER.replace("$LPRu", f"{lpr}u").replace("$UNRu", f"{unr}u")
            .replace("$UM1u", f"{unr - 1}u").replace("$Ru", f"{r}u").replace("$ROWS", rows)
            .replace("$BODY", "\n".join(body)).replace("$TAIL", "\n".join(tail))
            .replace("$RED", "\n".join(red)))


KINDS = ("uniform", "read", "read", "read", "read", "rw")
MODES = {"cvt": 0, "magic": 1, "dp4a": 2}


def pipeline(dev, mode, lpr, unr, r):
    return dev.pipeline(("proto", mode, lpr, unr, r), shader(mode, lpr, unr, r), KINDS)


def quant_x(x):
    g = x.reshape(-1, 32)
    d = np.abs(g).max(1) / 127
    q = np.round(g / np.where(d > 0, d, 1)[:, None]).astype(np.int8)
    return q.reshape(-1), d.astype(np.float32)


def main():
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from _bench_gpu_kernels import _time_pass, busy
    from bench_gpu import read_bandwidth
    from cortiq.gpu.device import Device
    from cortiq.gpu.kernels import Dispatch, ParamArena, resolve, u32s
    dev = Device.get()
    print(dev, "subgroups", dev.subgroups, flush=True)
    rng = np.random.default_rng(0)
    out = {"device": dev.name}
    busy(dev, 1.5)
    bw = read_bandwidth(dev)
    out["read_gb_s"] = bw
    print(f"read {bw:.0f} GB/s", flush=True)
    small = "--small" in sys.argv
    shapes = [(6144, 4096), (14336, 4096), (4096, 14336)] if not small else [(96, 256), (40, 512)]
    target = 256 << 20 if not small else 1 << 20
    variants = [("cvt", 32, 4, 1), ("magic", 32, 4, 1)] + [
        (m, lpr, unr, r) for m in ("magic", "dp4a") for lpr in (32, 16) for unr in (2, 4)
        for r in (1, 2, 4) if (m, lpr, unr, r) != ("magic", 32, 4, 1)]
    res = {}
    for rows, cols in shapes:
        nbytes = rows * cols
        copies = max(1, -(-target // nbytes))
        x = rng.standard_normal(cols).astype(np.float32)
        xq, xd = quant_x(x)
        xf_b, xq_b, xd_b = dev.upload(x), dev.upload(xq), dev.upload(xd)
        ws = [rng.integers(-127, 128, (rows, cols), dtype=np.int8) for _ in range(min(copies, 2))]
        wbufs = [dev.upload(ws[i % len(ws)]) for i in range(copies)]
        y = dev.buffer(rows * 4, copy_src=True)
        arena = ParamArena(dev)
        prm = arena.ref(u32s(rows, cols, 0, 0))
        arena.upload()
        ref_exact = ws[0].astype(np.float64) @ x
        ref_q = (ws[0].astype(np.int64).reshape(rows, -1, 16) * xq.astype(np.int64).reshape(-1, 16)).sum(2) \
            @ np.repeat(xd.astype(np.float64), 2)
        busy(dev, 1.0)
        key = f"{rows}x{cols}"
        res[key] = {}
        for mode, lpr, unr, r in variants:
            try:
                pipe = pipeline(dev, mode, lpr, unr, r)
            except Exception as e:  # noqa: BLE001
                res[key][f"{mode}_l{lpr}_u{unr}_r{r}"] = {"error": str(e)[:300]}
                continue
            ds = [Dispatch(pipe, dev.bind(KINDS, resolve([prm, wb, xf_b, xq_b, xd_b, y])),
                           (-(-rows // (256 // lpr * r)), 1, 1), "p") for wb in wbufs]
            # correctness on copy 0
            st = dev.staging(rows * 4)
            enc = dev.record(ds[:1])
            enc.copy_buffer_to_buffer(y, 0, st, 0, rows * 4)
            dev.queue.submit([enc.finish()])
            got = dev.read(st, rows * 4).view(np.float32)
            ref = ref_q if mode == "dp4a" else ref_exact
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            dt = _time_pass(dev, ds * 2, rounds=3) / 2
            gbs = nbytes * copies / dt / 1e9
            res[key][f"{mode}_l{lpr}_u{unr}_r{r}"] = {"gb_s": round(gbs, 1), "pct": round(100 * gbs / bw, 1),
                                                 "rel_err": err}
            print(key, mode, lpr, unr, r, f"{gbs:.0f} GB/s {100 * gbs / bw:.1f}% err {err:.1e}",
                  flush=True)
        del wbufs
    out["shapes"] = res
    if not small:   # the shipped decode matvec on the same shapes, same run
        import _bench_gpu_kernels as bk
        bk.SHAPES = [(f"{r}x{c}", r, c, 0) for r, c in shapes]
        bk.VARIANTS = {k: v for k, v in bk.VARIANTS.items() if "default" in k or k.startswith("sg_unroll4_rows16")}
        out["shipped"] = bk.matvec_variants(dev, bw)
        print(out["shipped"], flush=True)
    return out


if __name__ == "__main__":
    import json
    r = main()
    path = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--out=")), None)
    if path:
        with open(path, "w") as f:
            json.dump(r, f, indent=1)
