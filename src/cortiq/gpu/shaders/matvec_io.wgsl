// The parameters and bindings matvec.wgsl and matvec1.wgsl share (spliced in at their
// MATVEC_IO marker); the BINDINGS marker below becomes one binding per stored part.

struct Params {
    cols: u32, x_off: u32, x_stride: u32, x2_off: u32,
    x2_stride: u32, y_off: u32, y_stride: u32, v_a: u32,
    v_b: u32, v_out: u32, last_row: u32, nx: u32,
    total_rows: u32, eps: f32, hd: u32, splits: u32,   // hd, splits: PRO 3
    part_start: array<vec4<u32>, 2>,
    part_rows: array<vec4<u32>, 2>,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, $XMODE> X: array<f32>;   // read_write: PRO 4
@group(0) @binding(3) var<storage, read> X2: array<f32>;
@group(0) @binding(4) var<storage, read> V: array<f32>;
@group(0) @binding(5) var<storage, read_write> Y: array<f32>;
$BINDINGS
