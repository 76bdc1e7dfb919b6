// DeepSeek-V4's hyper-connection step over many workgroups (csrc/mix's hc_mixes scale,
// split_sinkhorn / head_pre, hc_fold_norm), after dsv4_hc_post (the expand and the Gram
// partials GR) and the matvec of the mixes fn . flatten(X) (MIX[mix_off ..]). Each
// workgroup sums the `groups` Gram partials, G = X X^T (hc x hc), and takes the scalar
// part it needs itself (a few dozen floats; no extra dispatch):
//   the mixes times rsqrt(trace(G) / (hc n) + eps)  (mean(X^2));
//   split (dsv4_hc_split.wgsl): pre; workgroup 0 alone, in mode 0, also post and the
//   Sinkhorn comb into PC (the next expand's; this fold needs pre only);
//   the folded row's mean square pre^T G pre / n  (sum_d (sum_j pre[j] X[j][d])^2);
// then folds and normalises its 256 channels, one a lane:
//   OUT[out_off + d] = (sum_j pre[j] X[j][d]) * rsqrt(pre^T G pre / n + eps) * w[d].

struct Params {
    n: u32, hc: u32, mode: u32, iters: u32,
    x_off: u32, mix_off: u32, v_scale: u32, v_base: u32,
    v_w: u32, out_off: u32, groups: u32, pad0: u32,
    eps: f32, hc_eps: f32, pad1: u32, pad2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> MIX: array<f32>;
@group(0) @binding(3) var<storage, read> GR: array<f32>;
@group(0) @binding(4) var<storage, read> V: array<f32>;
@group(0) @binding(5) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(6) var<storage, read_write> PC: array<f32>;

var<workgroup> gs: array<f32, 64>;

$HC_SPLIT

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = P.n;
    let hc = P.hc;
    if (lid < hc * hc) {
        var g = 0.0;
        for (var q = 0u; q < P.groups; q++) { g += GR[q * 64u + lid]; }
        gs[lid] = g;
    }
    workgroupBarrier();
    var tr = 0.0;
    for (var j = 0u; j < hc; j++) { tr += gs[j * hc + j]; }
    let r = 1.0 / sqrt(tr / f32(hc * n) + P.eps);
    let mixes = select(hc, (2u + hc) * hc, P.mode == 0u);
    if (lid < mixes) { mx[lid] = MIX[P.mix_off + lid] * r; }
    workgroupBarrier();
    split(lid, wid.x == 0u);
    var s2 = 0.0;
    for (var j = 0u; j < hc; j++) {
        var t = 0.0;
        for (var k = 0u; k < hc; k++) { t += pre[k] * gs[j * hc + k]; }
        s2 += pre[j] * t;
    }
    let inv = 1.0 / sqrt(max(s2, 0.0) / f32(n) + P.eps);
    let d = wid.x * 256u + lid;
    if (d < n) {
        var f = 0.0;
        for (var j = 0u; j < hc; j++) { f += pre[j] * X[P.x_off + j * n + d]; }
        OUT[P.out_off + d] = f * inv * V[P.v_w + d];
    }
}
