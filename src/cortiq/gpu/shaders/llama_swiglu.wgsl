// The Llama family's SwiGLU between the gate|up and down products: on each row
// [gate | up] of the gate|up output (biases added where the file has them),
// gate <- silu(gate) * up in place, which the down product then reads. One workgroup
// 1024 columns of a row, four neighbouring columns a lane. The llama_swiglu_q variant
// (the lines marked Q) also writes the result quantized for an int8 rows matvec
// (quant4.wgsl; row t's block in XQ as quantrows.wgsl lays it out), so that the down
// product needs no quantrows pass of its own.

struct Params { ffn: u32, bg: u32, bu: u32, pad0: u32 }
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read_write> GU: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;
/*$Q*/@group(0) @binding(4) var<storage, read_write> XQ: array<u32>;

var<workgroup> red: array<f32, 256>;

$QUANT4
$QUANT4_PUT

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * 2u * P.ffn;
    let c0 = wid.x * 1024u + 4u * lid;
    var y = vec4<f32>(0.0);
    for (var k = 0u; k < 4u; k++) {
        let c = c0 + k;
        if (c < P.ffn) {
            var g = GU[r + c];
            var u = GU[r + P.ffn + c];
            if (P.bg != 0xffffffffu) { g += V[P.bg + c]; }
            if (P.bu != 0xffffffffu) { u += V[P.bu + c]; }
            y[k] = g / (1.0 + exp(-g)) * u;
            GU[r + c] = y[k];
        }
    }
/*$Q*/quant4_put(y, lid, wid.y, P.ffn, c0, c0 < P.ffn);
}
