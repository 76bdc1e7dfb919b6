// The Llama family's causal grouped-query attention, one workgroup a (query head,
// row): the row at position p = pos0 + t attends the cached positions
// max(0, p + 1 - window) .. p (window 0: all), query head h reading KV head
// h / (nh / nk). Keys go 256 at a time (a lane a key), with a running maximum and sum
// (online softmax); lane c accumulates output dimensions c and c + 256.
// QK (the decode variant, llama_attn_qk): the dispatch also does llama_qk's work for its
// one row: each workgroup takes its query head and its KV head's new k and v rows from
// the Q|K|V product (bias, q/k norm, rotary as llama_qk.wgsl), uses the new key from
// shared memory instead of the cache, and the first query head of each KV group writes
// k and v into the cache at row p; no workgroup reads row p from the cache, so none
// reads what another writes in the dispatch.

struct Params {
    nh: u32, nk: u32, hd: u32, qkv_w: u32,
    window: u32, att_w: u32, scale: f32, pad0: u32,
    bias: u32, qn: u32, kn: u32, interleaved: u32,   // QK only, as in llama_qk.wgsl
    eps: f32, rope_t: u32, pad1: u32, pad2: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> QKV: array<f32>;
@group(0) @binding(3) var<storage, $KV> KC: array<f32>;
@group(0) @binding(4) var<storage, $KV> VC: array<f32>;
@group(0) @binding(5) var<storage, read_write> ATT: array<f32>;
@group(0) @binding(6) var<storage, read> V: array<f32>;
@group(0) @binding(7) var<storage, read> R: array<f32>;

const QK: bool = $QK;

var<workgroup> q: array<f32, 512>;
var<workgroup> pw: array<f32, 256>;
var<workgroup> kn: array<f32, $KVN>;
var<workgroup> vn: array<f32, $KVN>;

fn reduce_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k = k / 2u) {
        if (lid < k) { red[lid] = max(red[lid], red[lid + k]); }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

const WG: u32 = 256u;    // lanes a workgroup

$HEAD_PREP

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head = wid.x;
    let t = wid.y;
    let hd = P.hd;
    let kvw = P.nk * hd;
    let kb = (head / (P.nh / P.nk)) * hd;
    let p = S.pos0 + t;
    var lo = 0u;
    if (P.window > 0u && p + 1u > P.window) { lo = p + 1u - P.window; }
    if (QK) {
        let kvh = head / (P.nh / P.nk);
        prep(head, t, P.qn, true, lid);
        for (var c = lid; c < hd; c += 256u) { q[c] = tmp[c] * P.scale; }
        workgroupBarrier();
        prep(P.nh + kvh, t, P.kn, true, lid);
        for (var c = lid; c < hd; c += 256u) { kn[c] = tmp[c]; }
        workgroupBarrier();
        prep(P.nh + P.nk + kvh, t, 0xffffffffu, false, lid);
        for (var c = lid; c < hd; c += 256u) { vn[c] = tmp[c]; }
        workgroupBarrier();
        if (head % (P.nh / P.nk) == 0u) {
            /*$W*/for (var c = lid; c < hd; c += 256u) { KC[p * kvw + kb + c] = kn[c]; VC[p * kvw + kb + c] = vn[c]; }
        }
    } else {
        for (var c = lid; c < hd; c += 256u) { q[c] = QKV[t * P.qkv_w + head * hd + c] * P.scale; }
    }
    workgroupBarrier();
    var m = -3.0e38;
    var l = 0.0;
    var acc0 = 0.0;
    var acc1 = 0.0;
    for (var b = lo; b <= p; b += 256u) {
        let key = b + lid;
        var s = -3.0e38;
        if (key <= p) {
            let kr = key * kvw + kb;
            var d = 0.0;
            if (QK && key == p) {
                for (var c = 0u; c < hd; c++) { d += q[c] * kn[c]; }
            } else {
                for (var c = 0u; c < hd; c++) { d += q[c] * KC[kr + c]; }
            }
            s = d;
        }
        let mn = max(m, reduce_max(s, lid));
        var e = 0.0;
        if (key <= p) { e = exp(s - mn); }
        pw[lid] = e;
        let corr = exp(m - mn);
        l = l * corr + reduce_sum(e, lid);
        acc0 *= corr;
        acc1 *= corr;
        let cnt = min(256u, p + 1u - b);
        for (var j = 0u; j < cnt; j++) {
            let vr = (b + j) * kvw + kb;
            let w = pw[j];
            if (QK && b + j == p) {
                if (lid < hd) { acc0 += w * vn[lid]; }
                if (lid + 256u < hd) { acc1 += w * vn[lid + 256u]; }
            } else {
                if (lid < hd) { acc0 += w * VC[vr + lid]; }
                if (lid + 256u < hd) { acc1 += w * VC[vr + lid + 256u]; }
            }
        }
        m = mn;
        workgroupBarrier();
    }
    let ob = t * P.att_w + head * hd;
    if (lid < hd) { ATT[ob + lid] = acc0 / l; }
    if (lid + 256u < hd) { ATT[ob + lid + 256u] = acc1 / l; }
}
