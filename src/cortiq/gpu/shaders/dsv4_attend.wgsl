// DeepSeek-V4's sparse attention with the sink, one workgroup a head (csrc/attn's
// sparse_attend): the rows are the window ring's filled slots (min(pos + 1, W)) and
// the compressed entries finished so far ((pos + 1) / ratio, rows W + i of the cache;
// with the indexer only those SEL marks). The cache row is key and value at once.
// softmax(q . k * scale) with exp(sink - max) in the denominator only, run in chunks
// of 256 rows with a running max; then the inverse RoPE on the output's tail.

struct Params {
    nh: u32, hd: u32, win: u32, ratio: u32,
    indexed: u32, q_off: u32, o_off: u32, v_sink: u32,
    rd: u32, rope_off: u32, scale: f32, pad0: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }
const MAXC: u32 = 4u;     // channels a lane (head_dim <= 1024)

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> Q: array<f32>;
@group(0) @binding(3) var<storage, read> C: array<f32>;
@group(0) @binding(4) var<storage, read> V: array<f32>;
@group(0) @binding(5) var<storage, read> SEL: array<u32>;
@group(0) @binding(6) var<storage, read> R: array<f32>;
@group(0) @binding(7) var<storage, read_write> O: array<f32>;

var<workgroup> qs: array<f32, 1024>;
var<workgroup> red: array<f32, 256>;
var<workgroup> prob: array<f32, 256>;
var<workgroup> rows: array<u32, 256>;

fn wg_reduce(lid: u32, v: f32, is_max: bool) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {
        if (lid < h) {
            if (is_max) { red[lid] = max(red[lid], red[lid + h]); } else { red[lid] += red[lid + h]; }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let hd = P.hd;
    let pos = S.pos0;
    for (var c = lid; c < hd; c += 256u) { qs[c] = Q[P.q_off + h * hd + c]; }
    workgroupBarrier();
    let nwin = min(pos + 1u, P.win);
    var ncomp = 0u;
    if (P.ratio > 0u) { ncomp = (pos + 1u) / P.ratio; }
    let total = nwin + ncomp;
    var m = V[P.v_sink + h];
    var l = 1.0;
    var acc: array<f32, MAXC>;
    for (var k = 0u; k < MAXC; k++) { acc[k] = 0.0; }
    for (var base = 0u; base < total; base += 256u) {
        let r = base + lid;
        var row = 0xffffffffu;
        if (r < nwin) {
            row = r;
        } else if (r < total) {
            let i = r - nwin;
            if (P.indexed == 0u || SEL[i] != 0u) { row = P.win + i; }
        }
        var s = -3.4e38;
        if (row != 0xffffffffu) {
            var d = 0.0;
            for (var c = 0u; c < hd; c++) { d += qs[c] * C[row * hd + c]; }
            s = d * P.scale;
        }
        let mn = max(m, wg_reduce(lid, s, true));
        var p = 0.0;
        if (row != 0xffffffffu) { p = exp(s - mn); }
        prob[lid] = p;
        rows[lid] = row;
        let corr = exp(m - mn);
        l = l * corr + wg_reduce(lid, p, false);
        m = mn;
        let cnt = min(256u, total - base);
        for (var k = 0u; k < MAXC; k++) {
            let c = lid + k * 256u;
            if (c < hd) {
                var a = acc[k] * corr;
                for (var t = 0u; t < cnt; t++) {
                    if (rows[t] != 0xffffffffu) { a += prob[t] * C[rows[t] * hd + c]; }
                }
                acc[k] = a;
            }
        }
        workgroupBarrier();
    }
    for (var k = 0u; k < MAXC; k++) {
        let c = lid + k * 256u;
        if (c < hd) { qs[c] = acc[k] / l; }
    }
    workgroupBarrier();
    let nr = hd - P.rd;
    let ob = P.o_off + h * hd;
    for (var c = lid; c < nr; c += 256u) { O[ob + c] = qs[c]; }
    let hr = P.rd / 2u;
    for (var i = lid; i < hr; i += 256u) {
        let c0 = nr + 2u * i;
        let a = qs[c0];
        let b = qs[c0 + 1u];
        let cs = R[P.rope_off + i];
        let sn = -R[P.rope_off + hr + i];
        O[ob + c0] = a * cs - b * sn;
        O[ob + c0 + 1u] = a * sn + b * cs;
    }
}
