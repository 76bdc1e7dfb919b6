// The Lightning indexer's score of compressed entry i (one workgroup each):
//   OUT[i] = sum_h relu(q_h . k_i) * W[w_off + h] * scale
// q_h: the RoPE'd index queries Q[q_off + h * hd ..]; k_i: C[c_off + i * hd ..].

struct Params { nh: u32, hd: u32, q_off: u32, w_off: u32, c_off: u32, scale: f32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> W: array<f32>;
@group(0) @binding(3) var<storage, read> C: array<f32>;
@group(0) @binding(4) var<storage, read_write> OUT: array<f32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wid.x;
    let kb = P.c_off + i * P.hd;
    var s = 0.0;
    for (var h = lid; h < P.nh; h += 64u) {
        var d = 0.0;
        for (var c = 0u; c < P.hd; c++) { d += Q[P.q_off + h * P.hd + c] * C[kb + c]; }
        s += max(d, 0.0) * (W[P.w_off + h] * P.scale);
    }
    red[lid] = s;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h = h / 2u) {
        if (lid < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    if (lid == 0u) { OUT[i] = red[0]; }
}
