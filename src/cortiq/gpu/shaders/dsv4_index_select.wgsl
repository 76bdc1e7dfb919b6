// Top-k of the indexer's n scores on the device (ties to the lower index, finite scores
// only, as cortiq's CPU topk): SEL[i] = 1 when fewer than k entries outrank entry i.

struct Params { n: u32, k: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: vec4<u32>;
@group(0) @binding(2) var<storage, read> SC: array<f32>;
@group(0) @binding(3) var<storage, read_write> SEL: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let n = (S.y + 1u) / P.n;    // P.n: the compression ratio; entries finished so far
    if (i >= n) { return; }
    let v = SC[i];
    var keep = 0u;
    if (abs(v) <= 3.4e38) {
        var rank = 0u;
        for (var j = 0u; j < n; j++) {
            let u = SC[j];
            if (abs(u) <= 3.4e38 && (u > v || (u == v && j < i))) { rank++; }
        }
        if (rank < P.k) { keep = 1u; }
    }
    SEL[i] = keep;
}
