// DeepSeek-V4's KV compressor, one workgroup. Every token pushes its projection and
// gate scores (plus ape[pos % ratio]) into slot pos % ratio of the window being
// filled (two windows alternate in ST when overlapping). The window's last token pools
// each channel over the slots by a softmax of the scores (csrc/mix's pool_by_score;
// overlapping: the previous window's first halves, -inf votes before the first window,
// and the current window's second halves), RMS-norms the entry with its weight,
// RoPEs its tail at the window's first position (R[rope_off ..]) and writes it as
// entry pos / ratio: C[dst_off + (row0 + pos / ratio) * entry ..].

struct Params {
    width: u32, entry: u32, ratio: u32, overlap: u32,
    kv_off: u32, g_off: u32, v_ape: u32, v_norm: u32,
    rd: u32, rope_off: u32, dst_off: u32, row0: u32,
    eps: f32, pad0: u32, pad1: u32, pad2: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> PRJ: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;
@group(0) @binding(4) var<storage, read> R: array<f32>;
@group(0) @binding(5) var<storage, read_write> ST: array<f32>;
@group(0) @binding(6) var<storage, read_write> C: array<f32>;

var<workgroup> red: array<f32, 256>;

fn pooled(d: u32, cur: u32, first: bool) -> f32 {
    let W = P.width;
    let sb = 2u * P.ratio * W;
    var m = -3.4e38;
    var seen = false;
    for (var t = 0u; t < P.ratio; t++) {
        if (P.overlap != 0u && !first) {
            m = max(m, ST[sb + ((1u - cur) * P.ratio + t) * W + d]);
            seen = true;
        }
        var col = d;
        if (P.overlap != 0u) { col = P.entry + d; }
        m = max(m, ST[sb + (cur * P.ratio + t) * W + col]);
        seen = true;
    }
    if (!seen || m <= -3.4e38) { return 0.0; }
    var den = 0.0;
    for (var ph = 0u; ph < 2u; ph++) {
        for (var t = 0u; t < P.ratio; t++) {
            if (ph == 0u) {
                if (P.overlap != 0u && !first) {
                    den += exp(ST[sb + ((1u - cur) * P.ratio + t) * W + d] - m);
                }
            } else {
                var col = d;
                if (P.overlap != 0u) { col = P.entry + d; }
                den += exp(ST[sb + (cur * P.ratio + t) * W + col] - m);
            }
        }
    }
    var acc = 0.0;
    for (var t = 0u; t < P.ratio; t++) {
        if (P.overlap != 0u && !first) {
            let s = ((1u - cur) * P.ratio + t) * W + d;
            acc += (exp(ST[sb + s] - m) / den) * ST[s];
        }
    }
    for (var t = 0u; t < P.ratio; t++) {
        var col = d;
        if (P.overlap != 0u) { col = P.entry + d; }
        let s = (cur * P.ratio + t) * W + col;
        acc += (exp(ST[sb + s] - m) / den) * ST[s];
    }
    return acc;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    let pos = S.pos0;
    let i = pos % P.ratio;
    let win = pos / P.ratio;
    var cur = 0u;
    if (P.overlap != 0u) { cur = win % 2u; }
    let W = P.width;
    let slot = cur * P.ratio + i;
    let sb = 2u * P.ratio * W;
    for (var c = lid; c < W; c += 256u) {
        ST[slot * W + c] = PRJ[P.kv_off + c];
        ST[sb + slot * W + c] = PRJ[P.g_off + c] + V[P.v_ape + i * W + c];
    }
    if (i + 1u != P.ratio) { return; }
    storageBarrier();
    workgroupBarrier();
    let e = P.entry;
    let ob = P.dst_off + (P.row0 + win) * e;
    var ss = 0.0;
    for (var d = lid; d < e; d += 256u) {
        let v = pooled(d, cur, win == 0u);
        C[ob + d] = v;
        ss += v * v;
    }
    storageBarrier();
    red[lid] = ss;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {
        if (lid < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(e) + P.eps);
    let nr = e - P.rd;
    for (var d = lid; d < nr; d += 256u) { C[ob + d] = C[ob + d] * inv * V[P.v_norm + d]; }
    let hr = P.rd / 2u;
    for (var k = lid; k < hr; k += 256u) {
        let c0 = nr + 2u * k;
        let a = C[ob + c0] * inv * V[P.v_norm + c0];
        let b = C[ob + c0 + 1u] * inv * V[P.v_norm + c0 + 1u];
        let cs = R[P.rope_off + k];
        let sn = R[P.rope_off + hr + k];
        C[ob + c0] = a * cs - b * sn;
        C[ob + c0 + 1u] = a * sn + b * cs;
    }
}
