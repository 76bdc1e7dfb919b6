// DeepSeek-V4's hyper-connection step between two blocks, one workgroup (csrc/mix's
// hc_expand, hc_mixes, split_sinkhorn / head_pre, hc_fold_norm): the whole step in one
// dispatch where fn is small (larger ones: dsv4_hc_post, a matvec, dsv4_hc_fold over
// many workgroups). X holds hc copies of an n vector. In turn, each optional:
//   bcast:        X[j] = X[0] for j >= 1 (the embedding written once);
//   post_rows>0:  the previous block's expand, in place:
//                 X[j][d] = post[j] * sum_r Y[y_off + r n + d] + sum_k comb[k][j] X[k][d]
//                 (post / comb: PC as the previous step left them);
//   the mixes:    fn . flatten(X) from the f32 matrix MIX[fn_off ..], times
//                 rsqrt(mean(X^2) + eps);
//   split (dsv4_hc_split.wgsl): mode 0 (a layer's block): pre / post / the
//          Sinkhorn-normalised comb from the mixes, 3 scales and the base; post and comb
//          go to PC (hc + hc*hc values); mode 1 (the head): pre only;
//   OUT[out_off ..] = RMSNorm_w(sum_j pre[j] X[j]).

struct Params {
    n: u32, hc: u32, mode: u32, iters: u32,
    x_off: u32, pad0: u32, v_scale: u32, v_base: u32,
    v_w: u32, out_off: u32, fn_off: u32, post_rows: u32,
    eps: f32, hc_eps: f32, y_off: u32, bcast: u32,
}
const BATCH: u32 = 8u;     // mixes reduced at once

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> MIX: array<f32>;
@group(0) @binding(3) var<storage, read> Y: array<f32>;
@group(0) @binding(4) var<storage, read> V: array<f32>;
@group(0) @binding(5) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(6) var<storage, read_write> PC: array<f32>;

var<workgroup> red: array<f32, 2048>;    // BATCH x 256

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

$HC_SPLIT

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    let n = P.n;
    let hc = P.hc;
    let all = n * hc;
    let xb = P.x_off;
    if (P.bcast != 0u) {
        for (var d = lid; d < n; d += 256u) {
            let v = X[xb + d];
            for (var j = 1u; j < hc; j++) { X[xb + j * n + d] = v; }
        }
    }
    if (P.post_rows > 0u) {
        var pc: array<f32, 72>;
        for (var i = 0u; i < hc + hc * hc; i++) { pc[i] = PC[i]; }
        for (var d = lid; d < n; d += 256u) {
            var o = 0.0;
            for (var r = 0u; r < P.post_rows; r++) { o += Y[P.y_off + r * n + d]; }
            var x: array<f32, 8>;
            for (var k = 0u; k < hc; k++) { x[k] = X[xb + k * n + d]; }
            for (var j = 0u; j < hc; j++) {
                var s = pc[j] * o;
                for (var k = 0u; k < hc; k++) { s += pc[hc + k * hc + j] * x[k]; }
                X[xb + j * n + d] = s;
            }
        }
    }
    storageBarrier();
    workgroupBarrier();
    let nmix = (2u + hc) * hc;
    let mixes = select(hc, nmix, P.mode == 0u);
    var ss = 0.0;
    for (var i = lid; i < all; i += 256u) { let v = X[xb + i]; ss += v * v; }
    let r = 1.0 / sqrt(total(lid, ss) / f32(all) + P.eps);
    for (var m0 = 0u; m0 < mixes; m0 += BATCH) {
        var acc: array<f32, BATCH>;
        for (var b = 0u; b < BATCH; b++) { acc[b] = 0.0; }
        for (var i = lid; i < all; i += 256u) {
            let v = X[xb + i];
            for (var b = 0u; b < BATCH; b++) {
                if (m0 + b < mixes) { acc[b] += MIX[P.fn_off + (m0 + b) * all + i] * v; }
            }
        }
        for (var b = 0u; b < BATCH; b++) { red[b * 256u + lid] = acc[b]; }
        workgroupBarrier();
        for (var h = 128u; h > 0u; h = h / 2u) {
            if (lid < h) {
                for (var b = 0u; b < BATCH; b++) { red[b * 256u + lid] += red[b * 256u + lid + h]; }
            }
            workgroupBarrier();
        }
        if (lid < BATCH && m0 + lid < mixes) { mx[m0 + lid] = red[lid * 256u] * r; }
        workgroupBarrier();
    }
    workgroupBarrier();
    split(lid, true);
    var s2 = 0.0;
    for (var d = lid; d < n; d += 256u) {
        var f = 0.0;
        for (var j = 0u; j < hc; j++) { f += pre[j] * X[xb + j * n + d]; }
        OUT[P.out_off + d] = f;
        s2 += f * f;
    }
    let inv = 1.0 / sqrt(total(lid, s2) / f32(n) + P.eps);
    for (var d = lid; d < n; d += 256u) {
        OUT[P.out_off + d] = OUT[P.out_off + d] * inv * V[P.v_w + d];
    }
}
