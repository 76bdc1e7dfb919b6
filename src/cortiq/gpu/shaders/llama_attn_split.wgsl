// The Llama family's decode attention split over key ranges (flash-decoding): one
// workgroup a (group of GQ query heads, split s) of the one decode row at position p =
// pos0. The n keys max(0, p + 1 - window) .. p (window 0: all) are cut into consecutive
// ranges: S = the dispatch's z count of them, or with P.range_keys > 0 only as many as
// leave each range range_keys keys or more (at least one, at most S), so that a row with
// few keys is not spread thin. Split s takes its range with an online softmax and writes
// for each of its heads h the record [m, l, 0, 0, acc[hd]] (running max, sum and
// unnormalised sum of values) at PART[(h * S + s) * (hd + 4)]; a split whose range is
// empty writes m = -3e38, l = 0, acc = 0 and does nothing else.
// The O product's input stage (matvec1.wgsl, PRO 5) merges the records of each head.
// Query head h reads KV head h / (nh / nk); the GQ heads of a workgroup (GQ divides nh /
// nk: 1, or a whole GQA group, llama.rows_attn_heads) share one KV head, whose keys and
// values the workgroup then loads once for all of them. hd % 4 == 0.
// The key loop is llama_attn_keys.wgsl's keys() (spliced in at KEYS_FNS, once for each
// cache binding). A workgroup has WG lanes (256, or 128 for a rows dispatch, whose many
// workgroups then fit the device at once; llama.ROWS_ATTN_LANES). Keys go
// TILE = 32 at a time. Scores: L = WG / 32 neighbouring lanes a key, each dotting every
// L-th 16-byte piece of the key row with each head's query, so the L lanes read
// consecutive bytes (coalesced) and their partial dots meet in shared memory. Values:
// WG / (hd / 4) groups of hd / 4 lanes, a group taking every (WG / (hd / 4))-th key of
// the tile, a lane one 16-byte piece of the value row for every head; the groups' sums
// meet at the end.
// QK (llama_attn_split_qk): the dispatch also does llama_qk's work for the row (bias,
// q/k norm, rotary of llama_head_prep.wgsl): each workgroup prepares its query heads, the
// split holding p also its KV head's new k and v rows, which it uses from shared memory
// as key p instead of the cache, and its workgroup of the group's first query head
// writes them into the cache at row p. No workgroup reads row p from the cache, so none
// reads what another writes in the dispatch. Without QK, llama_qk ran before and key p
// is in the cache.
// ROWS (llama_attn_rows_qk, QK's work too): one dispatch over G decode rows of a rows
// submission, row b = the workgroup's y, each at its own position (its step block in ST,
// the uniform offset alignment apart) on its own caches (KC, VC for row 0, KC1, VC1, ... after them):
// Q|K|V, the records and the rotary rows are bound from the group's first row, row b's at
// b * P.qkv_w floats, b * P.pad0 vec4s and b * P.pad1 floats on.

struct Params {
    nh: u32, nk: u32, hd: u32, qkv_w: u32,
    window: u32, att_w: u32, scale: f32, pad0: u32,
    bias: u32, qn: u32, kn: u32, interleaved: u32,   // QK only, as in llama_qk.wgsl
    eps: f32, rope_t: u32, pad1: u32, range_keys: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
$STEP_DECL
@group(0) @binding(2) var<storage, read> QKV: array<f32>;
@group(0) @binding(3) var<storage, $KV> KC: array<vec4<f32>>;
@group(0) @binding(4) var<storage, $KV> VC: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> PART: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> V: array<f32>;
@group(0) @binding(7) var<storage, read> R: array<f32>;
$ROWS_DECL

const QK: bool = $QK;
const GQ: u32 = $GQu;     // query heads a workgroup
const WG: u32 = $WGu;     // lanes a workgroup
const L: u32 = WG / 32u;  // lanes a key's score
const TILE: u32 = 32u;    // keys a pass: WG / L
const NP: u32 = 32u / L;  // 16-byte pieces of a key a lane loads at once (hd up to 128)

var<workgroup> q4: array<vec4<f32>, $Q4N>;        // the heads' queries, hd / 4 apart
var<workgroup> kn4: array<vec4<f32>, 128>;
var<workgroup> vn4: array<vec4<f32>, 128>;
var<workgroup> dots: array<f32, $DOTN>;  // partial dots, [head][lane of the key][key]
var<workgroup> sc: array<vec4<f32>, $SCN>;   // the tile's scores, [head][key]
var<workgroup> ew: array<vec4<f32>, $SCN>;   // their softmax weights against the running max
var<workgroup> part: array<vec4<f32>, $WG>;
var<private> run_m: array<f32, GQ>;      // each head's running max, sum and values (keys())
var<private> run_l: array<f32, GQ>;
var<private> run_acc: array<vec4<f32>, GQ>;
var<private> hm: array<f32, GQ>;         // a tile's new maxima
var<private> dh: array<f32, GQ>;         // a lane's partial dots of its key
var<private> ka: array<vec4<f32>, NP>;   // a lane's pieces of a key, in flight together

$HEAD_PREP

$ROW_FNS

// Piece i (dimensions 4i .. 4i + 3) of the head prep() left in tmp.
fn take4(i: u32) -> vec4<f32> {
    return vec4<f32>(tmp[4u * i], tmp[4u * i + 1u], tmp[4u * i + 2u], tmp[4u * i + 3u]);
}

$KEYS_FNS
@compute @workgroup_size($WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let head0 = wid.x * GQ;     // the workgroup's first query head
    let rb = wid.y;             // the row of a rows dispatch (else 0)
    let hd = P.hd;
    let hd4 = hd / 4u;
    let grp = P.nh / P.nk;
    let kvh = head0 / grp;
    let kvw4 = P.nk * hd4;
    let kb4 = kvh * hd4;
    let p = row_pos(rb);
    var lo = 0u;
    if (P.window > 0u && p + 1u > P.window) { lo = p + 1u - P.window; }
    let n = p + 1u - lo;
    var ns = nwg.z;                                    // the ranges taken
    if (P.range_keys > 0u) { ns = clamp((n + P.range_keys - 1u) / P.range_keys, 1u, nwg.z); }
    let per = (n + ns - 1u) / ns;                      // keys a range
    let kfrom = lo + wid.z * per;
    let kto = min(p + 1u, kfrom + per);                // this split: kfrom .. kto - 1
    let rec0 = rb * P.pad0 + (head0 * nwg.z + wid.z) * (hd4 + 1u);
    let rec_h = nwg.z * (hd4 + 1u);                    // one head's records to the next's
    if (kfrom >= kto) {                                // an empty range: its records alone
        for (var h = 0u; h < GQ; h++) {
            if (lid < hd4) { PART[rec0 + h * rec_h + 1u + lid] = vec4<f32>(0.0); }
            if (lid == 0u) { PART[rec0 + h * rec_h] = vec4<f32>(-3.0e38, 0.0, 0.0, 0.0); }
        }
        return;
    }
    let own = QK && kfrom <= p && p < kto;             // key p from shared memory
    if (QK) {
        for (var h = 0u; h < GQ; h++) {
            prep(head0 + h, rb, P.qn, true, lid);
            for (var i = lid; i < hd4; i += WG) { q4[h * hd4 + i] = take4(i) * P.scale; }
            workgroupBarrier();     // tmp is the next prep's
        }
        if (own) {
            prep(P.nh + kvh, rb, P.kn, true, lid);
            for (var i = lid; i < hd4; i += WG) { kn4[i] = take4(i); }
            workgroupBarrier();
            prep(P.nh + P.nk + kvh, rb, 0xffffffffu, false, lid);
            for (var i = lid; i < hd4; i += WG) { vn4[i] = take4(i); }
            workgroupBarrier();
            if (head0 % grp == 0u) {
                /*$W*/for (var i = lid; i < hd4; i += WG) { kvw(rb, p * kvw4 + kb4 + i, kn4[i], vn4[i]); }
            }
        }
    } else {
        for (var h = 0u; h < GQ; h++) {
            for (var i = lid; i < hd4; i += WG) {
                let b = rb * P.qkv_w + (head0 + h) * hd + 4u * i;
                q4[h * hd4 + i] = vec4<f32>(QKV[b], QKV[b + 1u], QKV[b + 2u], QKV[b + 3u]) * P.scale;
            }
        }
    }
    workgroupBarrier();
    for (var h = 0u; h < GQ; h++) {
        run_m[h] = -3.0e38;
        run_l[h] = 0.0;
        run_acc[h] = vec4<f32>(0.0);
    }
    $KEYS_CALL
    let groups = WG / hd4;
    for (var h = 0u; h < GQ; h++) {
        part[lid] = run_acc[h];
        workgroupBarrier();
        if (lid < hd4) {
            var v = vec4<f32>(0.0);
            for (var g = 0u; g < groups; g++) { v += part[g * hd4 + lid]; }
            PART[rec0 + h * rec_h + 1u + lid] = v;
        }
        if (lid == 0u) { PART[rec0 + h * rec_h] = vec4<f32>(run_m[h], run_l[h], 0.0, 0.0); }
        workgroupBarrier();     // part is the next head's
    }
}
