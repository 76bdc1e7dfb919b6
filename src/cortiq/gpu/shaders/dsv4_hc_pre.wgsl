// DeepSeek-V4's hyper-connection input step, one workgroup (csrc/mix's hc_mixes,
// split_sinkhorn / head_pre, hc_fold_norm). X holds hc copies of an n vector; MIX the
// raw products fn . flatten(X) (a matvec before this kernel). Here:
//   mixes = MIX * rsqrt(mean(X^2) + eps)
//   mode 0 (a layer's block): pre / post / Sinkhorn-normalised comb from the mixes,
//          3 scales and the base; post and comb go to PC[pc_off ..] (hc + hc*hc);
//   mode 1 (the head): pre = sigmoid(m * scale + base) + hc_eps only;
//   OUT[out_off ..] = RMSNorm_w(sum_j pre[j] X[j]).

struct Params {
    n: u32, hc: u32, mode: u32, iters: u32,
    x_off: u32, mix_off: u32, v_scale: u32, v_base: u32,
    v_w: u32, out_off: u32, pc_off: u32, pad0: u32,
    eps: f32, hc_eps: f32, pad1: u32, pad2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> MIX: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;
@group(0) @binding(4) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(5) var<storage, read_write> PC: array<f32>;

var<workgroup> red: array<f32, 256>;
var<workgroup> pre: array<f32, 8>;

fn sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }

fn total(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {
        if (lid < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn split(r: f32) {
    let hc = P.hc;
    var comb: array<f32, 64>;
    for (var j = 0u; j < hc; j++) {
        pre[j] = sigmoid(MIX[P.mix_off + j] * r * V[P.v_scale] + V[P.v_base + j]) + P.hc_eps;
        if (P.mode == 0u) {
            PC[P.pc_off + j] = 2.0 * sigmoid(MIX[P.mix_off + hc + j] * r * V[P.v_scale + 1u]
                                             + V[P.v_base + hc + j]);
        }
    }
    if (P.mode != 0u) { return; }
    for (var j = 0u; j < hc * hc; j++) {
        comb[j] = MIX[P.mix_off + 2u * hc + j] * r * V[P.v_scale + 2u] + V[P.v_base + 2u * hc + j];
    }
    for (var j = 0u; j < hc; j++) {      // row softmax + eps
        var m = comb[j * hc];
        for (var k = 1u; k < hc; k++) { m = max(m, comb[j * hc + k]); }
        var s = 0.0;
        for (var k = 0u; k < hc; k++) { comb[j * hc + k] = exp(comb[j * hc + k] - m); s += comb[j * hc + k]; }
        for (var k = 0u; k < hc; k++) { comb[j * hc + k] = comb[j * hc + k] / s + P.hc_eps; }
    }
    let rounds = max(P.iters, 1u);     // the first round normalises columns only
    for (var it = 0u; it < rounds; it++) {
        if (it > 0u) {
            for (var j = 0u; j < hc; j++) {
                var s = P.hc_eps;
                for (var k = 0u; k < hc; k++) { s += comb[j * hc + k]; }
                for (var k = 0u; k < hc; k++) { comb[j * hc + k] /= s; }
            }
        }
        for (var k = 0u; k < hc; k++) {
            var s = P.hc_eps;
            for (var j = 0u; j < hc; j++) { s += comb[j * hc + k]; }
            for (var j = 0u; j < hc; j++) { comb[j * hc + k] /= s; }
        }
    }
    for (var j = 0u; j < hc * hc; j++) { PC[P.pc_off + hc + j] = comb[j]; }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    let n = P.n;
    let all = n * P.hc;
    var ss = 0.0;
    for (var i = lid; i < all; i += 256u) { let v = X[P.x_off + i]; ss += v * v; }
    let r = 1.0 / sqrt(total(lid, ss) / f32(all) + P.eps);
    if (lid == 0u) { split(r); }
    workgroupBarrier();
    var s2 = 0.0;
    for (var d = lid; d < n; d += 256u) {
        var f = 0.0;
        for (var j = 0u; j < P.hc; j++) { f += pre[j] * X[P.x_off + j * n + d]; }
        OUT[P.out_off + d] = f;
        s2 += f * f;
    }
    let inv = 1.0 / sqrt(total(lid, s2) / f32(n) + P.eps);
    for (var d = lid; d < n; d += 256u) {
        OUT[P.out_off + d] = OUT[P.out_off + d] * inv * V[P.v_w + d];
    }
}
