// DeepSeek-V4's hyper-connection output step (csrc/mix's hc_expand), one lane a channel:
//   X[j][d] = post[j] * sum_r Y[y_off + r * n + d] + sum_k comb[k][j] * X[k][d]
// (r < rows: 1 for attention, the shared plus the chosen experts for the MoE, whose
// down products the gathered matvec leaves one row each). In place on X.

struct Params { n: u32, hc: u32, rows: u32, y_off: u32, x_off: u32, pc_off: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> Y: array<f32>;
@group(0) @binding(3) var<storage, read> PC: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let d = gid.x;
    let n = P.n;
    let hc = P.hc;
    if (d >= n) { return; }
    var o = 0.0;
    for (var r = 0u; r < P.rows; r++) { o += Y[P.y_off + r * n + d]; }
    var x: array<f32, 8>;
    for (var k = 0u; k < hc; k++) { x[k] = X[P.x_off + k * n + d]; }
    for (var j = 0u; j < hc; j++) {
        var s = PC[P.pc_off + j] * o;
        for (var k = 0u; k < hc; k++) { s += PC[P.pc_off + hc + k * hc + j] * x[k]; }
        X[P.x_off + j * n + d] = s;
    }
}
