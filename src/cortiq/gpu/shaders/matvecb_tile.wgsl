// The int8 rows matvec in register tiles: Y[t, row] = (W . X[t]) * rowscale * outscale
// for the decode rows of several sequences (t < S.t), q8_row parts only, the rows
// quantized first (quantrows.wgsl, into XQ). A lane group (a subgroup, or TPR lanes
// reduced by a tree in shared memory) takes R weight rows at once: each lane loads one
// 32-column group (two 16-byte words) of each of the R rows and of each of the NB input
// rows, and dots every pair, so an input word is read once for R weight rows and a
// weight word once for NB input rows (matvecb.wgsl's I8 variant reads the NB input
// words again for every weight row); the two words' dots are summed as integers and
// scaled once by the group's input scale. R * NB accumulators a lane, in registers:
// every loop over the rows
// (j < R) or the input rows (t < NB) is written out when the pipeline is made
// (kernels.unroll_row_loops), so the private arrays are indexed by constants only.
// A workgroup's RPW = (256 / TPR) * R rows start on a multiple of R, and no R rows
// straddle two parts (the caller checked every part's rows is a multiple of R).

$MATVEC_IO

const RPW: u32 = $RPWu;   // rows a workgroup
const R: u32 = $Ru;       // weight rows a lane group takes at once
const TPR: u32 = 32u;     // lanes a group without subgroups
const NB: u32 = $NBu;     // input rows a workgroup takes
const SG: bool = $SG;

var<private> acc: array<f32, $ACCN>;     // acc[j * NB + t]
const U: u32 = $Uu;       // 32-column groups a lane loads at once
var<private> w: array<vec4<u32>, $WN>;    // the R rows' words of the U groups: the first
var<private> w2: array<vec4<u32>, $WN>;   // and the second
var<private> rsc: array<f32, $Ru>;
var<private> nt: u32;
var<private> t0g: u32;    // the first of the workgroup's input rows
var<private> tpr: u32;
var<workgroup> red: array<f32, $REDN>;

fn dot16(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y)
         + dot4I8Packed(a.z, b.z) + dot4I8Packed(a.w, b.w);
}

$PARTFNS

fn put(row: u32, t: u32, d: f32, rs: f32) {
    var v = d * rs;
    if (P.v_out != 0xffffffffu) { v = v * V[P.v_out + row]; }
    Y[P.y_off + t * P.y_stride + row] = v;
}

fn tile(row: u32, lane: u32) {   // the R rows from `row`: dots into acc, scales into rsc
    for (var j = 0u; j < R; j++) {
        for (var t = 0u; t < NB; t++) { acc[j * NB + t] = 0.0; }
    }
$TILES
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32$SGARGS) {
    var slot = lid / TPR;
    var lane = lid % TPR;
    tpr = TPR;
$SGLANES
    let base = (wid.x + wid.y * P.nx) * RPW;
    let t0 = wid.z * NB;
    nt = min(NB, S.t - t0);
    t0g = t0;
    if (SG) {
        for (var g = slot * R; g < RPW; g += (256u / tpr) * R) {
            let row = base + g;
            if (row < P.total_rows) { tile(row, lane); }
            for (var j = 0u; j < R; j++) {
                for (var t = 0u; t < NB; t++) {
                    let d = subgroupAdd(acc[j * NB + t]);
                    if (lane == (j * NB + t) % tpr && row < P.total_rows && t < nt) {
                        put(row + j, t0 + t, d, rsc[j]);
                    }
                }
            }
        }
        return;
    }
    let row = base + slot * R;
    if (row < P.total_rows) { tile(row, lane); }
    for (var j = 0u; j < R; j++) {
        for (var t = 0u; t < NB; t++) { red[t * 256u + lid] = acc[j * NB + t]; }
        workgroupBarrier();
        for (var h = TPR / 2u; h > 0u; h = h / 2u) {
            if (lane < h) {
                for (var t = 0u; t < NB; t++) { red[t * 256u + lid] += red[t * 256u + lid + h]; }
            }
            workgroupBarrier();
        }
        if (lane == 0u && row < P.total_rows) {
            for (var t = 0u; t < NB; t++) {
                if (t < nt) { put(row + j, t0 + t, red[t * 256u + lid], rsc[j]); }
            }
        }
        workgroupBarrier();
    }
}
