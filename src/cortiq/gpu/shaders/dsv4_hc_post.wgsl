// DeepSeek-V4's hyper-connection output step (csrc/mix's hc_expand), one lane a channel,
// in place on X, where fn is too large for dsv4_hc to fuse it:
//   bcast = 0: X[j][d] = post[j] * sum_r Y[y_off + r * n + d] + sum_k comb[k][j] * X[k][d]
//              (r < rows: 1 for attention, the shared plus the chosen experts for the
//              MoE, whose down products the gathered matvec leaves one row each);
//   bcast = 1: X[j][d] = X[0][d] (the embedding into the hc copies).
// Each workgroup also writes its channels' Gram matrix of the copies,
// GR[wid * 64 + j * hc + k] = sum_d X[j][d] X[k][d], from which dsv4_hc_fold takes both
// sums of squares it needs (the mixes' RMS scale: the trace; the folded row's RMSNorm:
// pre^T G pre) without a pass over the whole state.

struct Params { n: u32, hc: u32, rows: u32, y_off: u32, x_off: u32, pc_off: u32, bcast: u32, pad1: u32 }
const BATCH: u32 = 8u;     // Gram entries reduced at once

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> Y: array<f32>;
@group(0) @binding(3) var<storage, read> PC: array<f32>;
@group(0) @binding(4) var<storage, read_write> GR: array<f32>;

var<workgroup> red: array<f32, 2048>;    // BATCH x 256

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let d = wid.x * 256u + lid;
    let n = P.n;
    let hc = P.hc;
    var xn: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) { xn[j] = 0.0; }
    if (d < n) {
        if (P.bcast != 0u) {
            let v = X[P.x_off + d];
            xn[0] = v;
            for (var j = 1u; j < hc; j++) { X[P.x_off + j * n + d] = v; xn[j] = v; }
        } else {
            var o = 0.0;
            for (var r = 0u; r < P.rows; r++) { o += Y[P.y_off + r * n + d]; }
            var x: array<f32, 8>;
            for (var k = 0u; k < hc; k++) { x[k] = X[P.x_off + k * n + d]; }
            for (var j = 0u; j < hc; j++) {
                var s = PC[P.pc_off + j] * o;
                for (var k = 0u; k < hc; k++) { s += PC[P.pc_off + hc + k * hc + j] * x[k]; }
                X[P.x_off + j * n + d] = s;
                xn[j] = s;
            }
        }
    }
    let hh = hc * hc;
    for (var e0 = 0u; e0 < hh; e0 += BATCH) {
        for (var b = 0u; b < BATCH; b++) {
            let e = min(e0 + b, hh - 1u);
            red[b * 256u + lid] = select(0.0, xn[e / hc] * xn[e % hc], e0 + b < hh);
        }
        workgroupBarrier();
        for (var h = 128u; h > 0u; h = h / 2u) {
            if (lid < h) {
                for (var b = 0u; b < BATCH; b++) { red[b * 256u + lid] += red[b * 256u + lid + h]; }
            }
            workgroupBarrier();
        }
        if (lid < BATCH && e0 + lid < hh) { GR[wid.x * 64u + e0 + lid] = red[lid * 256u]; }
        workgroupBarrier();
    }
}
