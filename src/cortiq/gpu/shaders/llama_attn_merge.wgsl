// The key ranges of split decode attentions merged into attention rows: one workgroup a
// (query head h, row r) of a rows submission. Row r's records (llama_attn_split.wgsl)
// start at PART[r * P.part_stride], [m, l, 0, 0, acc[hd]] per (head, range); the row's
// attention output for head h is sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s
// (M: the largest m_s), as the O product's input stage PRO 5 takes it (matvec1.wgsl),
// written to ATT[r * P.att_stride + h * hd ..].

struct Params { hd: u32, splits: u32, part_stride: u32, att_stride: u32 }
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> PART: array<f32>;
@group(0) @binding(3) var<storage, read_write> ATT: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let r = wid.y;
    let rec = P.hd + 4u;
    let base = r * P.part_stride + h * P.splits * rec;
    var mx = -3.0e38;
    for (var s = 0u; s < P.splits; s++) { mx = max(mx, PART[base + s * rec]); }
    var den = 0.0;
    for (var s = 0u; s < P.splits; s++) {
        den += exp(PART[base + s * rec] - mx) * PART[base + s * rec + 1u];
    }
    for (var c = lid; c < P.hd; c += 256u) {
        var y = 0.0;
        for (var s = 0u; s < P.splits; s++) {
            y += exp(PART[base + s * rec] - mx) * PART[base + s * rec + 4u + c];
        }
        ATT[r * P.att_stride + h * P.hd + c] = y / den;
    }
}
