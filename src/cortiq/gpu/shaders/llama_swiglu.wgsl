// The Llama family's SwiGLU between the gate|up and down products: on each row
// [gate | up] of the gate|up output (biases added where the file has them),
// gate <- silu(gate) * up in place, which the down product then reads.

struct Params { ffn: u32, bg: u32, bu: u32, pad0: u32 }
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read_write> GU: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x * 256u + lid;
    if (c >= P.ffn) { return; }
    let r = wid.y * 2u * P.ffn;
    var g = GU[r + c];
    var u = GU[r + P.ffn + c];
    if (P.bg != 0xffffffffu) { g += V[P.bg + c]; }
    if (P.bu != 0xffffffffu) { u += V[P.bu + c]; }
    GU[r + c] = g / (1.0 + exp(-g)) * u;
}
