// DeepSeek-V4's MoE routing for one token, one workgroup (cortiq.models.deepseek_v4's
// route): scores sqrt(softplus(logit)); the chosen experts are the top k of score + bias
// (masked experts out, finite values only, ties to the lower index) or, on hash
// layers, row IDS[0] of the tid2eid table; weights = the chosen scores renormalised,
// times route_scale. OUT[out_off ..]: ids (u32 bits) of slots 0..k, then their weights;
// slot 0 is the shared expert (id E, weight 1).

struct Params {
    e: u32, k: u32, lg_off: u32, v_bias: u32,
    v_mask: u32, v_hash: u32, hash_rows: u32, out_off: u32,
    scale: f32, pad0: u32, pad1: u32, pad2: u32,
}
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> LG: array<f32>;
@group(0) @binding(2) var<storage, read> V: array<f32>;
@group(0) @binding(3) var<storage, read> IDS: array<u32>;
@group(0) @binding(4) var<storage, read_write> OUT: array<f32>;

var<workgroup> score: array<f32, 1024>;
var<workgroup> shifted: array<f32, 1024>;
var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;
var<workgroup> chosen: array<u32, 64>;

fn finite(x: f32) -> bool { return abs(x) < 3.39e38; }   // masked experts hold -3.4e38

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    let E = P.e;
    for (var e = lid; e < E; e += 256u) {
        let x = LG[P.lg_off + e];
        var sp = x;
        if (x <= 20.0) {
            let ex = exp(x);
            sp = select(log(1.0 + ex), ex * (1.0 - 0.5 * ex), ex < 1e-4);   // log1p
        }
        let s = sqrt(sp);
        score[e] = s;
        var v = s;
        if (P.v_bias != NONE) { v = v + V[P.v_bias + e]; }
        if (P.v_mask != NONE && V[P.v_mask + e] == 0.0) { v = -3.4e38; }
        shifted[e] = v;
    }
    workgroupBarrier();
    if (P.v_hash != NONE) {
        if (lid == 0u) {
            let row = min(IDS[0], P.hash_rows - 1u);
            for (var j = 0u; j < P.k; j++) { chosen[j] = u32(V[P.v_hash + row * P.k + j] + 0.5); }
        }
    } else {
        for (var j = 0u; j < P.k; j++) {
            var best = 0.0;
            var idx = NONE;
            for (var e = lid; e < E; e += 256u) {
                let v = shifted[e];
                if (finite(v) && (idx == NONE || v > best)) { best = v; idx = e; }
            }
            bv[lid] = best;
            bi[lid] = idx;
            workgroupBarrier();
            for (var h = 128u; h > 0u; h = h / 2u) {
                if (lid < h) {
                    let v = bv[lid + h];
                    let i = bi[lid + h];
                    if (i != NONE && (bi[lid] == NONE || v > bv[lid] || (v == bv[lid] && i < bi[lid]))) {
                        bv[lid] = v;
                        bi[lid] = i;
                    }
                }
                workgroupBarrier();
            }
            if (lid == 0u) {
                chosen[j] = bi[0];
                if (bi[0] != NONE) { shifted[bi[0]] = -3.4e38; }
            }
            workgroupBarrier();
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        let k = P.k;
        var sum = 0.0;
        for (var j = 0u; j < k; j++) { if (chosen[j] != NONE) { sum += score[chosen[j]]; } }
        OUT[P.out_off] = bitcast<f32>(E);
        OUT[P.out_off + k + 1u] = 1.0;
        for (var j = 0u; j < k; j++) {
            var w = 0.0;
            var id = 0u;
            if (chosen[j] != NONE) {
                id = chosen[j];
                w = score[id];
                if (sum > 0.0) { w = w / sum * P.scale; }
            }
            OUT[P.out_off + 1u + j] = bitcast<f32>(id);
            OUT[P.out_off + k + 2u + j] = w;
        }
    }
}
