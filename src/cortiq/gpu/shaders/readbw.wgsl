// Device read bandwidth: every workgroup sums a contiguous span of 16-byte words
// (coalesced, many loads in flight) and writes one value so nothing is optimized away.

struct Params { words: u32, per_wg: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> A: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> OUT: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let b0 = wid.x * P.per_wg;
    var s = vec4<u32>(0u);
    for (var i = lid; i < P.per_wg; i += 256u) {
        let k = b0 + i;
        if (k < P.words) { s ^= A[k]; }
    }
    let v = s.x ^ s.y ^ s.z ^ s.w;
    if (v == 0x9e3779b9u) { OUT[wid.x] = v; }
}
