// The greedy token: index of the largest logit of row 0 (the lowest index on ties),
// written to OUT[0] and to IDS[0] so that the next token's embedding can read it on the
// device without a round trip; OUT[1] is 1 where a logit of the row is not finite (told
// by its exponent bits: a shader compiler may assume finite floats in comparisons), as
// the host refuses such a row.

struct Params { n: u32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> L: array<f32>;
@group(0) @binding(2) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<u32>;

var<workgroup> bv: array<f32, 1024>;
var<workgroup> bi: array<u32, 1024>;
var<workgroup> bad: atomic<u32>;

@compute @workgroup_size(1024)
fn main(@builtin(local_invocation_index) lid: u32) {
    var best = -3.4e38;
    var idx = 0xffffffffu;
    var odd = 0u;
    if (lid == 0u) { atomicStore(&bad, 0u); }
    workgroupBarrier();
    for (var i = lid; i < P.n; i += 1024u) {
        let v = L[i];
        odd |= u32((bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u);
        if (v > best || idx == 0xffffffffu) { best = v; idx = i; }
    }
    if (odd != 0u) { atomicOr(&bad, 1u); }
    bv[lid] = best;
    bi[lid] = idx;
    workgroupBarrier();
    for (var h = 512u; h > 0u; h = h / 2u) {
        if (lid < h) {
            let v = bv[lid + h];
            let j = bi[lid + h];
            if (j != 0xffffffffu && (v > bv[lid] || (v == bv[lid] && j < bi[lid]) || bi[lid] == 0xffffffffu)) {
                bv[lid] = v;
                bi[lid] = j;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        IDS[0] = bi[0];
        OUT[0] = bi[0];
        OUT[1] = atomicLoad(&bad);
    }
}
