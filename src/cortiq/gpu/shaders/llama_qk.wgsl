// The Llama family's per-head step between the Q|K|V product and attention, one
// workgroup a (head slot, row): slots 0..nh-1 are query heads, then nk key heads, then
// nk value heads of the product's row [q | k | v]. Each slot adds its bias (Qwen2),
// query and key heads take their RMSNorm with weight (Qwen3) and the rotary embedding
// from the host's cos/sin rows (R: cos [T, hd/2] then sin at rope_t * hd/2; halves
// (i, i + hd/2), or adjacent pairs (2i, 2i + 1) for files in llama.cpp's row order);
// queries are written back in place, keys and values into the KV cache at their
// position's row. The preparation is llama_head_prep.wgsl's, spliced in below.

struct Params {
    nh: u32, nk: u32, hd: u32, qkv_w: u32,
    bias: u32, qn: u32, kn: u32, interleaved: u32,
    eps: f32, rope_t: u32, pad0: u32, pad1: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read_write> QKV: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;
@group(0) @binding(4) var<storage, read> R: array<f32>;
@group(0) @binding(5) var<storage, read_write> KC: array<f32>;
@group(0) @binding(6) var<storage, read_write> VC: array<f32>;

const WG: u32 = 256u;    // lanes a workgroup

$HEAD_PREP

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let j = wid.x;
    let t = wid.y;
    let hd = P.hd;
    var nw = 0xffffffffu;
    if (j < P.nh) { nw = P.qn; } else if (j < P.nh + P.nk) { nw = P.kn; }
    prep(j, t, nw, j < P.nh + P.nk, lid);
    let sb = t * P.qkv_w + j * hd;
    let row = (S.pos0 + t) * P.nk * hd;
    for (var c = lid; c < hd; c += 256u) {
        if (j < P.nh) {
            QKV[sb + c] = tmp[c];
        } else if (j < P.nh + P.nk) {
            KC[row + (j - P.nh) * hd + c] = tmp[c];
        } else {
            VC[row + (j - P.nh - P.nk) * hd + c] = tmp[c];
        }
    }
}
