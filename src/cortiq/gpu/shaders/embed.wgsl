// X[t, :] = row ids[t] of the embedding matrix, decoded from its stored dtype
// (parts: row pieces of a matrix split to fit the storage-binding limit).

struct Params {
    cols: u32, x_off: u32, nparts: u32, pad0: u32,
    part_start: array<vec4<u32>, 2>,
    part_rows: array<vec4<u32>, 2>,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> IDS: array<u32>;
@group(0) @binding(3) var<storage, read_write> X: array<f32>;
$BINDINGS

$PARTFNS

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    let id = IDS[t];
    let C = P.cols;
$DISPATCH
}
