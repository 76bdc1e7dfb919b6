// The key ranges of split decode attentions merged into attention rows: one workgroup a
// (query head h, row r) of a rows submission. Row r's records (llama_attn_split.wgsl)
// start at PART[r * P.part_stride], [m, l, 0, 0, acc[hd]] per (head, range); the row's
// attention output for head h is sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s
// (M: the largest m_s; an empty range, m_s = -3e38, adds nothing and its values are not
// read), as the O product's input stage PRO 5 takes it (matvec1.wgsl),
// written to ATT[r * P.att_stride + h * hd ..], four neighbouring columns a lane. The
// llama_attn_merge_q variant (the lines marked Q; for head dims of whole 32-column
// groups) also writes the rows quantized for the O product's int8 rows matvec
// (quant4.wgsl; row r's block in XQ as quantrows.wgsl lays out the heads' nh * hd
// columns), so that the product needs no quantrows pass of its own.

struct Params { hd: u32, splits: u32, part_stride: u32, att_stride: u32 }
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> PART: array<f32>;
@group(0) @binding(3) var<storage, read_write> ATT: array<f32>;
/*$Q*/@group(0) @binding(4) var<storage, read_write> XQ: array<u32>;

var<workgroup> red: array<f32, 256>;
var<workgroup> wts: array<f32, 256>;   // exp(m_s - M) of each range, -1 for an empty one

$QUANT4
$QUANT4_PUT

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let h = wid.x;
    let r = wid.y;
    let rec = P.hd + 4u;
    let base = r * P.part_stride + h * P.splits * rec;
    var mx = -3.0e38;
    for (var s = 0u; s < P.splits; s++) { mx = max(mx, PART[base + s * rec]); }
    for (var s = lid; s < P.splits; s += 256u) {
        let m = PART[base + s * rec];
        wts[s] = select(exp(m - mx), -1.0, m == -3.0e38);
    }
    workgroupBarrier();
    var den = 0.0;
    for (var s = 0u; s < P.splits; s++) {
        let w = wts[s];
        if (w != -1.0) { den += w * PART[base + s * rec + 1u]; }
    }
    let cols = nwg.x * P.hd;       // the heads' columns, the O product's
    // rounds every lane takes together (quant4 meets the whole workgroup at its barriers)
    for (var c00 = 0u; c00 < P.hd; c00 += 1024u) {
        let c0 = c00 + 4u * lid;
        var y = vec4<f32>(0.0);
        for (var k = 0u; k < 4u; k++) {
            let c = c0 + k;
            if (c < P.hd) {
                var a = 0.0;
                for (var s = 0u; s < P.splits; s++) {     // empty ranges' values unread
                    let w = wts[s];
                    if (w != -1.0) { a += w * PART[base + s * rec + 4u + c]; }
                }
                y[k] = a / den;
                ATT[r * P.att_stride + h * P.hd + c] = y[k];
            }
        }
/*$Q*/  quant4_put(y, lid, r, cols, h * P.hd + c0, c0 < P.hd);
    }
}
