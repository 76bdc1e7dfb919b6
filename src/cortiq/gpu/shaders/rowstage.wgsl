// The input stage of a rows product (matvecb.wgsl) as a pass of its own, one workgroup
// per row t: Y[t] = xin / sqrt(sum xin^2 + eps) with, as matvec.wgsl's input stages,
//   mode 1: xin = x * sigmoid(g * s_g)  (the attention output gate; g in X2),
//   mode 2: xin = silu(a * s_a) * (b * s_b)  (SwiGLU; b at x2_off in X's row).
// Normalising the input equals normalising the product (the products are linear).

struct Params {
    cols: u32, mode: u32, x_off: u32, x_stride: u32,
    x2_off: u32, x2_stride: u32, v_a: u32, v_b: u32,
    y_stride: u32, eps: f32, pad0: u32, pad1: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read> X2: array<f32>;
@group(0) @binding(4) var<storage, read> V: array<f32>;
@group(0) @binding(5) var<storage, read_write> Y: array<f32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    let xb = P.x_off + t * P.x_stride;
    let yb = t * P.y_stride;
    var s = 0.0;
    for (var c = lid; c < P.cols; c += 256u) {
        var v = 0.0;
        if (P.mode == 1u) {
            let g = X2[P.x2_off + t * P.x2_stride + c] * V[P.v_a + c];
            v = X[xb + c] / (1.0 + exp(-g));
        } else {
            let a = X[xb + c] * V[P.v_a + c];
            let b = X[xb + P.x2_off + c] * V[P.v_b + c];
            v = a / (1.0 + exp(-a)) * b;
        }
        Y[yb + c] = v;
        s += v * v;
    }
    red[lid] = s;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {
        if (lid < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] + P.eps);
    for (var c = lid; c < P.cols; c += 256u) { Y[yb + c] = Y[yb + c] * inv; }
}
