// The Llama family's decode attention split over key ranges (flash-decoding): one
// workgroup a (query head h, split s) of the one decode row at position p = pos0. The
// keys max(0, p + 1 - window) .. p (window 0: all) are cut into S = the dispatch's z
// count consecutive ranges; split s takes its range with an online softmax and writes
// the record [m, l, 0, 0, acc[hd]] (running max, sum and unnormalised sum of values) at
// PART[(h * S + s) * (hd + 4)]; a split whose range is empty writes m = -3e38, l = 0.
// The O product's input stage (matvec1.wgsl, PRO 5) merges the records of each head.
// Query head h reads KV head h / (nh / nk); hd % 4 == 0.
// Keys go TILE = 32 at a time. Scores: L = 8 neighbouring lanes a key, each dotting
// every 8th 16-byte piece of the key row, so the 8 lanes read 128 consecutive bytes
// (coalesced) and their partial dots meet in shared memory. Values: 256 / (hd / 4)
// groups of hd / 4 lanes, a group taking every (256 / (hd / 4))-th key of the tile, a
// lane one 16-byte piece of the value row; the groups' sums meet at the end.
// A tile's key and value rows (up to KR pieces of its key and VR value rows a lane) are
// loaded into registers before they are needed: the first tile's before the head's
// preparation, each next tile's before the current one's closing barrier, so a
// workgroup waits on memory about once a tile rather than once a step.
// QK (llama_attn_split_qk): the dispatch also does llama_qk's work for the row (bias,
// q/k norm, rotary of llama_head_prep.wgsl's prep3): each workgroup prepares its query
// head, the split holding p also its KV head's new k and v rows, which it uses from
// shared memory as key p instead of the cache, and its workgroup of the group's first
// query head writes them into the cache at row p. No workgroup reads row p from the
// cache, so none reads what another writes in the dispatch. Without QK, llama_qk ran
// before and key p is in the cache.

struct Params {
    nh: u32, nk: u32, hd: u32, qkv_w: u32,
    window: u32, att_w: u32, scale: f32, pad0: u32,
    bias: u32, qn: u32, kn: u32, interleaved: u32,   // QK only, as in llama_qk.wgsl
    eps: f32, rope_t: u32, pad1: u32, pad2: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> QKV: array<f32>;
@group(0) @binding(3) var<storage, $KV> KC: array<vec4<f32>>;
@group(0) @binding(4) var<storage, $KV> VC: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> PART: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> V: array<f32>;
@group(0) @binding(7) var<storage, read> R: array<f32>;

const QK: bool = $QK;
const L: u32 = 8u;        // lanes a key's score
const TILE: u32 = 32u;    // keys a pass: 256 / L
const KR: u32 = 4u;       // pieces of its key a lane keeps in registers (all of them for hd <= 128)
const VR: u32 = 4u;       // value rows a lane keeps (all of its tile's for hd <= 128)

var<workgroup> dots: array<f32, 256>;    // partial dots, [lane of the key][key]
var<workgroup> sc: array<f32, TILE>;     // the tile's scores
var<workgroup> ew: array<f32, TILE>;     // their softmax weights against the running max
var<workgroup> part: array<vec4<f32>, 256>;
var<private> kr: array<vec4<f32>, KR>;
var<private> vr: array<vec4<f32>, VR>;

$HEAD_PREP

// The tile of keys base .. kto - 1 (at most TILE) into kr and vr: this lane's pieces
// kc, kc + L, ... of key base + kl and its value piece vi of keys base + vg, base + vg +
// groups, ...; key skip (the one held in shared memory, or none) is not read.
fn load_tile(base: u32, kto: u32, skip: u32, kl: u32, kc: u32, vg: u32, vi: u32,
             groups: u32, kb4: u32, kvw4: u32) {
    let n = min(TILE, kto - base);
    let hd4 = P.hd / 4u;
    let j = base + kl;
    for (var m = 0u; m < KR; m++) {
        let i = kc + m * L;
        kr[m] = vec4<f32>(0.0);
        if (kl < n && j != skip && i < hd4) { kr[m] = KC[j * kvw4 + kb4 + i]; }
    }
    for (var m = 0u; m < VR; m++) {
        let k = vg + m * groups;
        vr[m] = vec4<f32>(0.0);
        if (vg < groups && k < n && base + k != skip) { vr[m] = VC[(base + k) * kvw4 + kb4 + vi]; }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let head = wid.x;
    let hd = P.hd;
    let hd4 = hd / 4u;
    let grp = P.nh / P.nk;
    let kvh = head / grp;
    let kvw4 = P.nk * hd4;
    let kb4 = kvh * hd4;
    let p = S.pos0;
    var lo = 0u;
    if (P.window > 0u && p + 1u > P.window) { lo = p + 1u - P.window; }
    let per = (p + 1u - lo + nwg.z - 1u) / nwg.z;      // keys a split
    let kfrom = lo + wid.z * per;
    let kto = min(p + 1u, kfrom + per);                // this split: kfrom .. kto - 1
    let own = QK && kfrom <= p && p < kto;             // key p from shared memory
    var skip = 0xffffffffu;
    if (own) { skip = p; }
    let kl = lid / L;           // scores: this lane's key in the tile
    let kc = lid % L;           // and its first 16-byte piece
    let groups = 256u / hd4;    // values: key groups of hd4 lanes
    let vg = lid / hd4;
    let vi = lid % hd4;
    if (kfrom < kto) { load_tile(kfrom, kto, skip, kl, kc, vg, vi, groups, kb4, kvw4); }
    if (QK) {
        prep3(head, kvh, 0u, own, P.scale, lid);
        if (own && head % grp == 0u) {
            /*$W*/for (var i = lid; i < hd4; i += 256u) { KC[p * kvw4 + kb4 + i] = hk4[i]; VC[p * kvw4 + kb4 + i] = hv4[i]; }
        }
    } else {
        for (var i = lid; i < hd4; i += 256u) {
            let b = head * hd + 4u * i;
            hq4[i] = vec4<f32>(QKV[b], QKV[b + 1u], QKV[b + 2u], QKV[b + 3u]) * P.scale;
        }
        workgroupBarrier();
    }
    var m = -3.0e38;
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var base = kfrom; base < kto; base += TILE) {
        let n = min(TILE, kto - base);
        let j = base + kl;
        var d = 0.0;
        if (kl < n) {
            if (j == skip) {
                for (var i = kc; i < hd4; i += L) { d += dot(hq4[i], hk4[i]); }
            } else {
                for (var r = 0u; r < KR; r++) {
                    if (kc + r * L < hd4) { d += dot(hq4[kc + r * L], kr[r]); }
                }
                let row = j * kvw4 + kb4;
                for (var i = kc + KR * L; i < hd4; i += L) { d += dot(hq4[i], KC[row + i]); }
            }
        }
        dots[kc * TILE + kl] = d;
        workgroupBarrier();
        if (lid < n) {
            var s = 0.0;
            for (var c = 0u; c < L; c++) { s += dots[c * TILE + lid]; }
            sc[lid] = s;
        }
        workgroupBarrier();
        var mx = m;     // every lane the same maximum (broadcast reads)
        for (var k = 0u; k < n; k++) { mx = max(mx, sc[k]); }
        if (lid < n) { ew[lid] = exp(sc[lid] - mx); }
        workgroupBarrier();
        let corr = exp(m - mx);
        var es = 0.0;
        for (var k = 0u; k < n; k++) { es += ew[k]; }
        l = l * corr + es;
        m = mx;
        acc = acc * corr;
        if (vg < groups) {
            for (var r = 0u; r < VR; r++) {
                let k = vg + r * groups;
                if (k < n) {
                    if (base + k == skip) { acc += ew[k] * hv4[vi]; } else { acc += ew[k] * vr[r]; }
                }
            }
            for (var k = vg + VR * groups; k < n; k += groups) {
                let jj = base + k;
                if (jj == skip) {
                    acc += ew[k] * hv4[vi];
                } else {
                    acc += ew[k] * VC[jj * kvw4 + kb4 + vi];
                }
            }
        }
        if (base + TILE < kto) {
            load_tile(base + TILE, kto, skip, kl, kc, vg, vi, groups, kb4, kvw4);
        }
        workgroupBarrier();     // dots, sc and ew are the next tile's
    }
    part[lid] = acc;
    workgroupBarrier();
    let rec = (head * nwg.z + wid.z) * (hd4 + 1u);
    if (lid < hd4) {
        var v = vec4<f32>(0.0);
        for (var g = 0u; g < groups; g++) { v += part[g * hd4 + lid]; }
        PART[rec + 1u + lid] = v;
    }
    if (lid == 0u) { PART[rec] = vec4<f32>(m, l, 0.0, 0.0); }
}
