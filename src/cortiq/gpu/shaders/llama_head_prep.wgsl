// A head's preparation, shared by llama_qk.wgsl and the Llama attention kernels (spliced
// in at their HEAD_PREP marker): head slot j of the Q|K|V product with its bias, q/k
// RMSNorm and rotary, into tmp. The kernel declares Params P (bias,
// interleaved, eps, rope_t), QKV, V (vectors) and R (the rows' cos rows then their sin
// rows; a rows dispatch: each row's cos then sin, P.pad1 floats a row) and runs WG lanes
// a workgroup (a power of two, at most 256, declared by the kernel).

var<workgroup> red: array<f32, 256>;
var<workgroup> tmp: array<f32, 512>;

fn reduce_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k / 2u) {
        if (lid < k) { red[lid] += red[lid + k]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// Head slot j of row t of the Q|K|V product into tmp: bias, RMSNorm with weight nw (none:
// NONE), rotary when rot.
fn prep(j: u32, t: u32, nw: u32, rot: bool, lid: u32) {
    let hd = P.hd;
    var ss = 0.0;
    for (var c = lid; c < hd; c += WG) {
        var v = QKV[t * P.qkv_w + j * hd + c];
        if (P.bias != 0xffffffffu) { v += V[P.bias + j * hd + c]; }
        tmp[c] = v;
        ss += v * v;
    }
    if (nw != 0xffffffffu) {
        let tot = reduce_sum(ss, lid);
        let inv = 1.0 / sqrt(tot / f32(hd) + P.eps);
        for (var c = lid; c < hd; c += WG) { tmp[c] = tmp[c] * inv * V[nw + c]; }
    }
    workgroupBarrier();
    let hh = hd / 2u;
    if (rot) {
        for (var i = lid; i < hh; i += WG) {
            var a = i;
            var b = i + hh;
            if (P.interleaved != 0u) { a = 2u * i; b = 2u * i + 1u; }
            let co = R[$ROPE_COS];
            let si = R[$ROPE_SIN];
            let x = tmp[a];
            let y = tmp[b];
            tmp[a] = x * co - y * si;
            tmp[b] = x * si + y * co;
        }
    }
    workgroupBarrier();
}
