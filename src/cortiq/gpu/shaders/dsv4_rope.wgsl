// Two jobs in one dispatch (workgroups [0, split) run job a, the rest job b). Per
// vector (one workgroup each, nvec of them at A[src_off + v * width]): an optional
// RMS norm (mean of squares, optional weight), then RoPE on the last rd channels with
// interleaved pairs (2i, 2i+1) from the cos / sin row R[rope_off ..] (inverse: the
// conjugate rotation), in place; with dst_off != NONE the result is also written to
// row pos % ring of D (this token's key/value into the sliding-window ring).

struct Job {
    width: u32, nvec: u32, src_off: u32, v_w: u32,
    norm: u32, rd: u32, rope_off: u32, inverse: u32,
    dst_off: u32, ring: u32, eps: f32, pad0: u32,
}
struct Params { a: Job, b: Job, split: u32, pad0: u32, pad1: u32, pad2: u32 }
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read_write> A: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;
@group(0) @binding(4) var<storage, read> R: array<f32>;
@group(0) @binding(5) var<storage, read_write> D: array<f32>;

var<workgroup> red: array<f32, 256>;

var<private> J: Job;

fn put(b: u32, db: u32, c: u32, v: f32) {
    A[b + c] = v;
    if (J.dst_off != NONE) { D[db + c] = v; }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var vi = wid.x;
    if (wid.x < P.split) { J = P.a; } else { J = P.b; vi = wid.x - P.split; }
    let w = J.width;
    let b = J.src_off + vi * w;
    var db = 0u;
    if (J.dst_off != NONE) { db = J.dst_off + (S.pos0 % J.ring) * w; }
    var inv = 1.0;
    if (J.norm != 0u) {
        var ss = 0.0;
        for (var c = lid; c < w; c += 256u) { let v = A[b + c]; ss += v * v; }
        red[lid] = ss;
        workgroupBarrier();
        for (var h = 128u; h > 0u; h = h / 2u) {
            if (lid < h) { red[lid] += red[lid + h]; }
            workgroupBarrier();
        }
        inv = 1.0 / sqrt(red[0] / f32(w) + J.eps);
    }
    let nr = w - J.rd;
    for (var c = lid; c < nr; c += 256u) {
        var v = A[b + c] * inv;
        if (J.v_w != NONE) { v = v * V[J.v_w + c]; }
        put(b, db, c, v);
    }
    let hr = J.rd / 2u;
    for (var i = lid; i < hr; i += 256u) {
        let c0 = nr + 2u * i;
        var a = A[b + c0] * inv;
        var e = A[b + c0 + 1u] * inv;
        if (J.v_w != NONE) { a = a * V[J.v_w + c0]; e = e * V[J.v_w + c0 + 1u]; }
        let cs = R[J.rope_off + i];
        var sn = R[J.rope_off + hr + i];
        if (J.inverse != 0u) { sn = -sn; }
        put(b, db, c0, a * cs - e * sn);
        put(b, db, c0 + 1u, a * sn + e * cs);
    }
}
