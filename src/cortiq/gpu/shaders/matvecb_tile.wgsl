// The int8 rows matvec in register tiles: Y[t, row] = (W . X[t]) * rowscale * outscale
// for the decode rows of several sequences (t < S.t), q8_row parts only, the rows
// quantized first (quantrows.wgsl, into XQ). A lane group of 32 lanes (reduced by
// subgroupAdd where the subgroups are 32 wide, else by a tree in shared memory) takes R
// weight rows at once: each lane loads one 32-column group (two 16-byte words) of each of
// the R rows and dots it with the same group of each of the NB input rows, the two
// words' dots summed as integers and scaled once by the group's input scale, so an input
// group is read once for R weight rows and a weight group once for NB input rows.
// The input rows are read from shared memory, CH columns at a time: the workgroup copies
// each chunk of its NB rows there once (codes split into the groups' first and second
// words, so that neighbouring lanes read neighbouring words, and the scales), where its
// eight lane groups would otherwise each read the same input from L2 (eight rows of
// input: 4.5 bytes a weight byte at R = 2, the weights' stream evicting them from L1).
// A lane's weight words of the next chunk are loaded before the current chunk is copied
// and dotted, so the weight stream stays in flight across the chunk's barriers.
// R * NB accumulators a lane, in registers: every loop over the rows (j < R) or the
// input rows (t < NB) is written out when the pipeline is made
// (kernels.unroll_row_loops), so the private arrays are indexed by constants only.
// A workgroup's RPW = 8 * R rows start on a multiple of R, and no R rows straddle two
// parts (the caller checked every part's rows is a multiple of R).

$MATVEC_IO

const RPW: u32 = $RPWu;   // rows a workgroup
const R: u32 = $Ru;       // weight rows a lane group takes at once
const NB: u32 = $NBu;     // input rows a workgroup takes
const CH: u32 = $CHu;     // input columns a chunk in shared memory (a multiple of 32)
const GC: u32 = CH / 32u; // 32-column groups a chunk
const SG: bool = $SG;

var<private> acc: array<f32, $ACCN>;     // acc[j * NB + t]
var<private> w: array<vec4<u32>, $Ru>;   // the R rows' words of the lane's group: the first
var<private> w2: array<vec4<u32>, $Ru>;  // and the second
var<private> nw: array<vec4<u32>, $Ru>;  // the same of the next chunk's group, in flight
var<private> nw2: array<vec4<u32>, $Ru>;
var<private> rsc: array<f32, $Ru>;
var<private> nt: u32;
var<workgroup> xq0: array<vec4<u32>, $XQN>;   // [t][g]: the chunk's first words
var<workgroup> xq1: array<vec4<u32>, $XQN>;   // and second words
var<workgroup> xs: array<f32, $XQN>;          // and scales
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

fn tileload(row: u32, g: u32) {   // the R rows from `row`: group g's words into nw, nw2
$TILES
}

fn rowscales(row: u32) {          // the R rows' scales from `row` into rsc
$ROWSCALES
}

fn tiledots(g: u32) {   // the lane's group g of the chunk (words in w, w2) with its NB rows
    for (var t = 0u; t < NB; t++) {
        if (t < nt) {
            let i = t * GC + g;
            let q = xq0[i];
            let q2 = xq1[i];
            let s = xs[i];
            for (var j = 0u; j < R; j++) {
                acc[j * NB + t] += f32(dot16(w[j], q) + dot16(w2[j], q2)) * s;
            }
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32$SGARGS) {
    let slot = lid / 32u;
    let lane = lid % 32u;
    let row = (wid.x + wid.y * P.nx) * RPW + slot * R;
    let t0 = wid.z * NB;
    nt = min(NB, S.t - t0);
    let n = P.cols / 16u;                     // 16-byte words a row (cols % 32 == 0)
    let ng = n / 2u;
    let blk = n + (P.cols / 32u + 3u) / 4u;   // an input row's block in XQ, vec4s
    for (var j = 0u; j < R; j++) {
        for (var t = 0u; t < NB; t++) { acc[j * NB + t] = 0.0; }
    }
    let live = row < P.total_rows;
    if (live) {
        rowscales(row);
        if (lane < min(GC, ng)) { tileload(row, lane); }
    }
    for (var g0 = 0u; g0 < ng; g0 += GC) {
        let gc = min(GC, ng - g0);
        workgroupBarrier();                   // the last chunk's reads are done
        for (var i = lid; i < NB * GC; i += 256u) {
            let t = i / GC;
            let g = g0 + i % GC;
            if (t < nt && g < ng) {
                let rb = (t0 + t) * blk;
                xq0[i] = XQ[rb + 2u * g];
                xq1[i] = XQ[rb + 2u * g + 1u];
                xs[i] = bitcast<f32>(XQ[rb + n + (g >> 2u)][g & 3u]);
            }
        }
        workgroupBarrier();
        for (var j = 0u; j < R; j++) { w[j] = nw[j]; w2[j] = nw2[j]; }
        if (live && g0 + GC + lane < ng) { tileload(row, g0 + GC + lane); }
        if (live && lane < gc) { tiledots(lane); }
    }
    let sg32 = $W32;
    if (SG && sg32) {
        for (var j = 0u; j < R; j++) {
            for (var t = 0u; t < NB; t++) {
                let d = subgroupAdd(acc[j * NB + t]);
                if (lane == (j * NB + t) % 32u && row < P.total_rows && t < nt) {
                    put(row + j, t0 + t, d, rsc[j]);
                }
            }
        }
        return;
    }
    for (var j = 0u; j < R; j++) {
        for (var t = 0u; t < NB; t++) { red[t * 256u + lid] = acc[j * NB + t]; }
        workgroupBarrier();
        for (var h = 16u; h > 0u; h = h / 2u) {
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
