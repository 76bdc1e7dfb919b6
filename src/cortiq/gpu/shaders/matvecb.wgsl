// The rows matvec: Y[t, row] = (W . X[t]) * rowscale * outscale for the decode rows of
// several sequences (t < S.t), each workgroup reading its weight rows once for NB input
// rows (wid.z: which NB rows). As matvec1.wgsl (whose chunk decoders, qchunk.wgsl, and
// row dots, matvec1_part.wgsl, it shares): a row's lanes read consecutive 16-byte words
// (or tiles) of the row; each weight chunk is dotted with the NB input rows, read where
// they lie (L1-cached: NB rows of the input do not fit in shared memory). No input
// stage: a transformed input is written first by rowstage.wgsl. SG: a row is one
// subgroup's, reduced by subgroupAdd; otherwise TPR lanes' by a tree in shared memory.
// I8 (q8_row parts, the model's precision "int8"): the rows were quantized before the
// product (quantrows.wgsl, into XQ, bound where the unused second input would be), and a
// row's chunks are dotted with four dot4I8Packed per input row (matvecb_part_i8.wgsl).
// Every loop over the NB input rows is written out when the pipeline is made
// (kernels.unroll_row_loops), so pdv and xbs are indexed by constants only.

$MATVEC_IO

const RPW: u32 = $RPWu;   // rows a workgroup
const RW: u32 = 1u;
const TPR: u32 = $TPRu;
const SG: bool = $SG;
const UNROLL: u32 = $UNROLLu;
const NB: u32 = $NBu;     // input rows a workgroup takes

var<private> pdv: array<f32, NB>;
var<private> xbs: array<u32, NB>;
var<private> nt: u32;
var<private> t0g: u32;    // the first of the workgroup's input rows
var<private> tpr: u32;
var<workgroup> red: array<f32, $REDN>;

fn mac4(w: vec4<f32>, c: u32) {
    for (var t = 0u; t < NB; t++) {
        if (t < nt) {
            let b = xbs[t] + c;
            pdv[t] += dot(w, vec4<f32>(X[b], X[b + 1u], X[b + 2u], X[b + 3u]));
        }
    }
}

$PARTFNS

fn put(row: u32, t: u32, d: f32, rs: f32) {
    var v = d * rs;
    if (P.v_out != 0xffffffffu) { v = v * V[P.v_out + row]; }
    Y[P.y_off + t * P.y_stride + row] = v;
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
    for (var t = 0u; t < NB; t++) { xbs[t] = P.x_off + (t0 + t) * P.x_stride; }
    var rs = 1.0;
    if (SG) {
        for (var rr = slot; rr < RPW; rr += 256u / tpr) {
            let row = base + rr;
            for (var t = 0u; t < NB; t++) { pdv[t] = 0.0; }
            if (row < P.total_rows) {
$DISPATCH
            }
            for (var t = 0u; t < NB; t++) {
                let d = subgroupAdd(pdv[t]);
                if (lane == 0u && row < P.total_rows && t < nt) { put(row, t0 + t, d, rs); }
            }
        }
        return;
    }
    let row = base + slot;
    for (var t = 0u; t < NB; t++) { pdv[t] = 0.0; }
    if (row < P.total_rows) {
$DISPATCH
    }
    for (var t = 0u; t < NB; t++) { red[t * 256u + lid] = pdv[t]; }
    workgroupBarrier();
    for (var h = TPR / 2u; h > 0u; h = h / 2u) {
        if (lane < h) {
            for (var t = 0u; t < NB; t++) { red[t * 256u + lid] += red[t * 256u + lid + h]; }
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < P.total_rows) {
        for (var t = 0u; t < NB; t++) {
            if (t < nt) { put(row, t0 + t, red[t * 256u + lid], rs); }
        }
    }
}
