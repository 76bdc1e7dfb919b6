// The Llama family's causal grouped-query attention, one workgroup a (query head,
// row): the row at position p = pos0 + t attends the cached positions
// max(0, p + 1 - window) .. p (window 0: all), query head h reading KV head
// h / (nh / nk). Keys go 256 at a time (a lane a key), with a running maximum and sum
// (online softmax); lane c accumulates output dimensions c and c + 256.

struct Params {
    nh: u32, nk: u32, hd: u32, qkv_w: u32,
    window: u32, att_w: u32, scale: f32, pad0: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> QKV: array<f32>;
@group(0) @binding(3) var<storage, read> KC: array<f32>;
@group(0) @binding(4) var<storage, read> VC: array<f32>;
@group(0) @binding(5) var<storage, read_write> ATT: array<f32>;

var<workgroup> q: array<f32, 512>;
var<workgroup> pw: array<f32, 256>;
var<workgroup> red: array<f32, 256>;

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

fn reduce_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k = k / 2u) {
        if (lid < k) { red[lid] += red[lid + k]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

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
    for (var c = lid; c < hd; c += 256u) { q[c] = QKV[t * P.qkv_w + head * hd + c] * P.scale; }
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
            for (var c = 0u; c < hd; c++) { d += q[c] * KC[kr + c]; }
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
            if (lid < hd) { acc0 += w * VC[vr + lid]; }
            if (lid + 256u < hd) { acc1 += w * VC[vr + lid + 256u]; }
        }
        m = mn;
        workgroupBarrier();
    }
    let ob = t * P.att_w + head * hd;
    if (lid < hd) { ATT[ob + lid] = acc0 / l; }
    if (lid + 256u < hd) { ATT[ob + lid + 256u] = acc1 / l; }
}
