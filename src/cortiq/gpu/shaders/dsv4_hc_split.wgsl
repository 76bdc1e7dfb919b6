// The scalar part of a hyper-connection step (csrc/mix's split_sinkhorn / head_pre),
// shared by dsv4_hc and dsv4_hc_fold: from the scaled mixes mx, pre; with write_pc (one
// workgroup of a dispatch) and mode 0 also post and the Sinkhorn-normalised comb, into
// PC for the next expand (this step's fold needs pre only). Every lane of the workgroup
// calls it; lane e < hc*hc holds comb[e / hc][e % hc] in a register and each row or
// column normalisation publishes it to workgroup memory (two buffers taken in turn, so
// one barrier a normalisation), which keeps the 2 * iters rounds off a single lane.

var<workgroup> mx: array<f32, 80>;   // (2 + hc) * hc for hc <= 8
var<workgroup> pre: array<f32, 8>;
var<workgroup> cb: array<f32, 128>;  // 2 x (hc * hc)

fn sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }

fn split(lid: u32, write_pc: bool) {
    let hc = P.hc;
    if (lid < hc) {
        pre[lid] = sigmoid(mx[lid] * V[P.v_scale] + V[P.v_base + lid]) + P.hc_eps;
        if (P.mode == 0u && write_pc) {
            PC[lid] = 2.0 * sigmoid(mx[hc + lid] * V[P.v_scale + 1u] + V[P.v_base + hc + lid]);
        }
    }
    if (P.mode == 0u && write_pc) {
        let on = lid < hc * hc;
        let j = lid / hc;
        let k = lid % hc;
        var c = 0.0;
        if (on) {
            c = mx[2u * hc + lid] * V[P.v_scale + 2u] + V[P.v_base + 2u * hc + lid];
            cb[lid] = c;
        }
        workgroupBarrier();
        if (on) {                          // row softmax + eps
            var m = cb[j * hc];
            for (var q = 1u; q < hc; q++) { m = max(m, cb[j * hc + q]); }
            var s = 0.0;
            for (var q = 0u; q < hc; q++) { s += exp(cb[j * hc + q] - m); }
            c = exp(c - m) / s + P.hc_eps;
        }
        var b = 0u;
        let rounds = max(P.iters, 1u);     // the first round normalises columns only
        for (var it = 0u; it < rounds; it++) {
            if (it > 0u) {
                b = 64u - b;
                if (on) { cb[b + lid] = c; }
                workgroupBarrier();
                if (on) {
                    var s = P.hc_eps;
                    for (var q = 0u; q < hc; q++) { s += cb[b + j * hc + q]; }
                    c = c / s;
                }
            }
            b = 64u - b;
            if (on) { cb[b + lid] = c; }
            workgroupBarrier();
            if (on) {
                var s = P.hc_eps;
                for (var q = 0u; q < hc; q++) { s += cb[b + q * hc + k]; }
                c = c / s;
            }
        }
        if (on) { PC[hc + lid] = c; }
    }
    workgroupBarrier();
}
