// A head's preparation, shared by llama_qk.wgsl and the Llama attention kernels (spliced
// in at their HEAD_PREP marker): head slot j of the Q|K|V product with its bias, q/k
// RMSNorm and rotary. The kernel declares Params P (bias, qn, kn, interleaved, eps,
// rope_t), QKV, V (vectors) and R (cos then sin rows) and runs 256 lanes a workgroup;
// hd <= 512.
// prep: one head into tmp. prep3 (the attention kernels): a query head and, when asked,
// its KV head's k and v at once into hq4, hk4 and hv4, every load of the three (values,
// biases, norm weights, rotary factors) issued before the first is used, so the
// workgroup waits on memory once, not once a head and step.

var<workgroup> red: array<f32, 512>;
var<workgroup> tmp: array<f32, 512>;
var<workgroup> hq4: array<vec4<f32>, 128>;   // prep3's heads, four dimensions a word
var<workgroup> hk4: array<vec4<f32>, 128>;
var<workgroup> hv4: array<vec4<f32>, 128>;

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

// reduce_sum of two values at once
fn reduce_sum2(a: f32, b: f32, lid: u32) -> vec2<f32> {
    red[lid] = a;
    red[256u + lid] = b;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k = k / 2u) {
        if (lid < k) { red[lid] += red[lid + k]; red[256u + lid] += red[256u + lid + k]; }
        workgroupBarrier();
    }
    let r = vec2<f32>(red[0], red[256]);
    workgroupBarrier();
    return r;
}

// Dimension c of head slot j of row t of the Q|K|V product, with its bias.
fn head_in(j: u32, t: u32, c: u32) -> f32 {
    var v = QKV[t * P.qkv_w + j * P.hd + c];
    if (P.bias != 0xffffffffu) { v += V[P.bias + j * P.hd + c]; }
    return v;
}

// Dimension c of prep3's heads.
fn hq(c: u32) -> f32 { return hq4[c >> 2u][c & 3u]; }
fn hk(c: u32) -> f32 { return hk4[c >> 2u][c & 3u]; }
fn hv(c: u32) -> f32 { return hv4[c >> 2u][c & 3u]; }

// The two dimensions rotary pair i turns: halves (i, i + hd/2) or adjacent (2i, 2i + 1).
fn rot_pair(i: u32) -> vec2<u32> {
    if (P.interleaved != 0u) { return vec2<u32>(2u * i, 2u * i + 1u); }
    return vec2<u32>(i, i + P.hd / 2u);
}

// Head slot j of row t of the Q|K|V product into tmp: bias, RMSNorm with weight nw (none:
// NONE), rotary when rot.
fn prep(j: u32, t: u32, nw: u32, rot: bool, lid: u32) {
    let hd = P.hd;
    var ss = 0.0;
    for (var c = lid; c < hd; c += 256u) {
        let v = head_in(j, t, c);
        tmp[c] = v;
        ss += v * v;
    }
    if (nw != 0xffffffffu) {
        let inv = 1.0 / sqrt(reduce_sum(ss, lid) / f32(hd) + P.eps);
        for (var c = lid; c < hd; c += 256u) { tmp[c] = tmp[c] * inv * V[nw + c]; }
    }
    workgroupBarrier();
    let hh = hd / 2u;
    if (rot) {
        for (var i = lid; i < hh; i += 256u) {
            let ab = rot_pair(i);
            let co = R[t * hh + i];
            let si = R[(P.rope_t + t) * hh + i];
            let x = tmp[ab.x];
            let y = tmp[ab.y];
            tmp[ab.x] = x * co - y * si;
            tmp[ab.y] = x * si + y * co;
        }
    }
    workgroupBarrier();
}

// Row t's query head qh into hq4 (times qscale) and, when kv, KV head kvh's k into hk4
// and v into hv4: the values prep(qh, t, P.qn, true), prep(nh + kvh, t, P.kn, true) and
// prep(nh + nk + kvh, t, NONE, false) give, bit for bit. Lane i < hd / 2 turns rotary
// pair i of q and k.
fn prep3(qh: u32, kvh: u32, t: u32, kv: bool, qscale: f32, lid: u32) {
    let hd = P.hd;
    let hh = hd / 2u;
    let qn = P.qn != 0xffffffffu;
    let kn = kv && P.kn != 0xffffffffu;
    // this lane's rotary pair: its factors and norm weights
    var ab = vec2<u32>(0u);
    var cs = vec2<f32>(0.0);
    var wq = vec2<f32>(1.0);
    var wk = vec2<f32>(1.0);
    if (lid < hh) {
        ab = rot_pair(lid);
        cs = vec2<f32>(R[t * hh + lid], R[(P.rope_t + t) * hh + lid]);
        if (qn) { wq = vec2<f32>(V[P.qn + ab.x], V[P.qn + ab.y]); }
        if (kn) { wk = vec2<f32>(V[P.kn + ab.x], V[P.kn + ab.y]); }
    }
    // the heads as the product left them: q into tmp, k and v where they end
    var sq = 0.0;
    var sk = 0.0;
    for (var c = lid; c < hd; c += 256u) {
        let q = head_in(qh, t, c);
        tmp[c] = q;
        sq += q * q;
        if (kv) {
            let k = head_in(P.nh + kvh, t, c);
            hk4[c >> 2u][c & 3u] = k;
            hv4[c >> 2u][c & 3u] = head_in(P.nh + P.nk + kvh, t, c);
            sk += k * k;
        }
    }
    var iq = 1.0;
    var ik = 1.0;
    if (qn || kn) {
        let s = reduce_sum2(sq, sk, lid);
        if (qn) { iq = 1.0 / sqrt(s.x / f32(hd) + P.eps); }
        if (kn) { ik = 1.0 / sqrt(s.y / f32(hd) + P.eps); }
    }
    workgroupBarrier();
    if (lid < hh) {
        // the norm (weights 1 and iq 1 when there is none: exact), then the rotation
        let x = tmp[ab.x] * iq * wq.x;
        let y = tmp[ab.y] * iq * wq.y;
        hq4[ab.x >> 2u][ab.x & 3u] = (x * cs.x - y * cs.y) * qscale;
        hq4[ab.y >> 2u][ab.y & 3u] = (x * cs.y + y * cs.x) * qscale;
        if (kv) {
            let kx = hk4[ab.x >> 2u][ab.x & 3u] * ik * wk.x;
            let ky = hk4[ab.y >> 2u][ab.y & 3u] * ik * wk.y;
            hk4[ab.x >> 2u][ab.x & 3u] = kx * cs.x - ky * cs.y;
            hk4[ab.y >> 2u][ab.y & 3u] = kx * cs.y + ky * cs.x;
        }
    }
    workgroupBarrier();
}
