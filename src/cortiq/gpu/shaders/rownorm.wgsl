// Row-wise vector steps of the nGPT stack on the hidden-state buffer H ([region][t][n]),
// one workgroup per row t:
//   mode 0, the residual:  H[d] = (x^ + alpha (o^ - x^))^ with x = H[d1], o = O[o_off],
//                          d = d2 (d1 when d2 is NONE)
//   mode 1, a mix:         H[d1] (and H[d2]) = (H[a] + H[b])^  (b, d2 optional; norm
//                          optional: flags bit 0), x^ = x / sqrt(sum x^2 + eps)

struct Params {
    n: u32, mode: u32, d1: u32, d2: u32,
    a: u32, b: u32, v_alpha: u32, o_off: u32,
    norm: u32, eps: f32, pad0: u32, pad1: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read_write> H: array<f32>;
@group(0) @binding(3) var<storage, read> O: array<f32>;
@group(0) @binding(4) var<storage, read> V: array<f32>;

var<workgroup> red: array<f32, 512>;

fn sum2(lid: u32, a: f32, b: f32) -> vec2<f32> {
    red[lid] = a;
    red[256u + lid] = b;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {
        if (lid < h) { red[lid] += red[lid + h]; red[256u + lid] += red[256u + lid + h]; }
        workgroupBarrier();
    }
    let r = vec2<f32>(red[0], red[256u]);
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    let n = P.n;
    let row = t * n;
    if (P.mode == 0u) {
        let ob = P.o_off + row;
        let xb = P.d1 + row;
        var db = xb;
        if (P.d2 != NONE) { db = P.d2 + row; }
        var sx = 0.0;
        var so = 0.0;
        for (var c = lid; c < n; c += 256u) {
            let x = H[xb + c];
            let o = O[ob + c];
            sx += x * x;
            so += o * o;
        }
        let s = sum2(lid, sx, so);
        let ix = 1.0 / sqrt(s.x + P.eps);
        let io = 1.0 / sqrt(s.y + P.eps);
        var sr = 0.0;
        for (var c = lid; c < n; c += 256u) {
            let xh = H[xb + c] * ix;
            let r = xh + V[P.v_alpha + c] * (O[ob + c] * io - xh);
            H[db + c] = r;
            sr += r * r;
        }
        let s2 = sum2(lid, sr, 0.0);
        let ir = 1.0 / sqrt(s2.x + P.eps);
        for (var c = lid; c < n; c += 256u) { H[db + c] = H[db + c] * ir; }
        return;
    }
    var ss = 0.0;
    for (var c = lid; c < n; c += 256u) {
        var v = H[P.a + row + c];
        if (P.b != NONE) { v += H[P.b + row + c]; }
        ss += v * v;
    }
    var inv = 1.0;
    let s = sum2(lid, ss, 0.0);
    if (P.norm != 0u) { inv = 1.0 / sqrt(s.x + P.eps); }
    for (var c = lid; c < n; c += 256u) {
        var v = H[P.a + row + c];
        if (P.b != NONE) { v += H[P.b + row + c]; }
        v = v * inv;
        H[P.d1 + row + c] = v;
        if (P.d2 != NONE) { H[P.d2 + row + c] = v; }
    }
}
