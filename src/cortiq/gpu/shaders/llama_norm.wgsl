// The Llama family's residual and RMSNorm of a chunk's rows: x += o (+ bias) when P.add
// is set (the previous product's output), the new residual written at P.x_out, then
// y = x / sqrt(mean(x^2) + eps) * w, the input of the next product. The first norm of the
// stack reads x as the embedding left it (add 0).
// Two ways to dispatch it: a workgroup a row (one workgroup along y) takes every
// 1024-column round of its row, and may write the residual in place (x_out == x_off:
// each lane rewrites only the columns it read); a workgroup a round (one workgroup
// along y for each 1024 columns) takes round wid.y of its row, each of the row's
// workgroups summing the squares of the whole row alike (the same order as one
// workgroup a row, so the same bits), and needs x_out apart from x_off, since the row's
// other workgroups still read the old residual. Four times the workgroups for a row of
// 4096 columns: the norm of a few rows is a chain of dependent memory round trips, and
// more workgroups run more of them at once.
// The llama_norm_q variant (the lines marked Q) also writes y quantized for an int8
// rows matvec (quant4.wgsl; row t's block in XQ as quantrows.wgsl lays it out), so that
// the product needs no quantrows pass of its own.

struct Params {
    cols: u32, x_off: u32, y_off: u32, add: u32,
    o_off: u32, bias: u32, w: u32, eps: f32,
    x_out: u32, pad0: u32, pad1: u32, pad2: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read_write> X: array<f32>;
@group(0) @binding(3) var<storage, read> O: array<f32>;
@group(0) @binding(4) var<storage, read> V: array<f32>;
@group(0) @binding(5) var<storage, read_write> Y: array<f32>;
/*$Q*/@group(0) @binding(6) var<storage, read_write> XQ: array<u32>;

var<workgroup> red: array<f32, 256>;

$QUANT4
$QUANT4_PUT

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    let xb = P.x_off + t * P.cols;
    let nb = P.x_out + t * P.cols;
    let rounds = (P.cols + 1023u) / 1024u;
    let whole = nwg.y == 1u;                      // a workgroup a row
    let r0 = select(wid.y, 0u, whole);            // the rounds this workgroup writes
    let r1 = select(wid.y + 1u, rounds, whole);
    let moved = P.add != 0u || P.x_out != P.x_off;
    // four neighbouring columns a lane a round (1024 a round): four independent loads in
    // flight where one column a round waited for each load in turn
    var ss = 0.0;
    for (var r = 0u; r < rounds; r++) {
        for (var k = 0u; k < 4u; k++) {
            let c = 1024u * r + 4u * lid + k;
            if (c < P.cols) {
                var x = X[xb + c];
                if (P.add != 0u) {
                    x += O[P.o_off + t * P.cols + c];
                    if (P.bias != 0xffffffffu) { x += V[P.bias + c]; }
                }
                if (moved && r >= r0 && r < r1) { X[nb + c] = x; }
                ss += x * x;
            }
        }
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h = h / 2u) {
        if (lid < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(P.cols) + P.eps);
/*$Q*/workgroupBarrier();     // red[0] read by every lane before quant4 reuses red
    // rounds every lane takes together (quant4 meets the whole workgroup at its barriers);
    // the residual read back from where this lane wrote it
    for (var r = r0; r < r1; r++) {
        let c0 = 1024u * r + 4u * lid;
        var y = vec4<f32>(0.0);
        for (var k = 0u; k < 4u; k++) {
            let c = c0 + k;
            if (c < P.cols) {
                y[k] = X[nb + c] * inv * V[P.w + c];
                Y[P.y_off + t * P.cols + c] = y[k];
            }
        }
/*$Q*/  quant4_put(y, lid, t, P.cols, c0, c0 < P.cols);
    }
}
