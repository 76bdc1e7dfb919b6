// Rotary embedding (half-split pairs (i, i + hd/2), cos/sin rows from the host) and
// per-head justnorm of q and k; q heads are scaled by s_q in place, k heads and the v
// rows go to the KV cache at ring row pos % ring. One workgroup per (head, row):
// heads 0..nh-1 are q, nh..nh+nk-1 are k (with their v).

struct Params {
    nh: u32, nk: u32, hd: u32, stride: u32,
    k_off: u32, v_off: u32, sq_off: u32, ring: u32,
    rope: u32, eps: f32, pad0: u32, pad1: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read_write> QKV: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;
@group(0) @binding(4) var<storage, read> ROPE: array<f32>;
@group(0) @binding(5) var<storage, read_write> KC: array<f32>;
@group(0) @binding(6) var<storage, read_write> VC: array<f32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head = wid.x;
    let t = wid.y;
    let hd = P.hd;
    let half = hd / 2u;
    let is_q = head < P.nh;
    var base = t * P.stride + head * hd;
    if (!is_q) { base = t * P.stride + P.k_off + (head - P.nh) * hd; }
    let cb = (P.rope * 2u * S.t + t) * half;      // cos row; sin row S.t*half later
    let sb = cb + S.t * half;
    var s = 0.0;
    for (var i = lid; i < half; i += 64u) {
        let a = QKV[base + i];
        let b = QKV[base + half + i];
        let c = ROPE[cb + i];
        let n = ROPE[sb + i];
        let ra = a * c - b * n;
        let rb = a * n + b * c;
        QKV[base + i] = ra;
        QKV[base + half + i] = rb;
        s += ra * ra + rb * rb;
    }
    red[lid] = s;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h = h / 2u) {
        if (lid < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] + P.eps);
    if (is_q) {
        for (var i = lid; i < hd; i += 64u) {
            QKV[base + i] = QKV[base + i] * inv * V[P.sq_off + head * hd + i];
        }
    } else {
        let kh = head - P.nh;
        let row = (S.pos0 + t) % P.ring;
        let dst = (row * P.nk + kh) * hd;
        let vb = t * P.stride + P.v_off + kh * hd;
        for (var i = lid; i < hd; i += 64u) {
            KC[dst + i] = QKV[base + i] * inv;
            VC[dst + i] = QKV[vb + i];
        }
    }
}
