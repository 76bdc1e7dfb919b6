// Causal windowed grouped-query attention over the KV cache, one workgroup per
// (query head, row, key split): softmax(scale q.k) v over positions
// max(0, p + 1 - window) .. p (window 0: all), online softmax over tiles of 128 keys.
// Query head h reads KV head h / (nh / nk); position j sits at ring row j % ring.
// Scores: one key a lane; the weighted sum of values: 4 groups of 32 lanes take every
// 4th key, each lane 4 consecutive dimensions (16-byte loads), the groups summed at the
// end. hd % 4 == 0.
// Splits (flash-decoding): with S = the dispatch's z count > 1, the positions are cut
// into S consecutive ranges, one workgroup each, and each writes its partial
// (running max m, sum l, unnormalized sum of values) as a record of hd + 4 floats
// [m, l, 0, 0, acc...] at PART[((t * nh + h) * S + s) * (hd + 4)]; the O product's
// input stage (matvec1.wgsl, PRO 3) merges them. S = 1 writes softmax(.) v to Y.
// Generated twice (kernels.py): "attention" reads q and the KV ring as qk_prep.wgsl
// left them; "attention_qk" (decode rows, t = 1) does qk_prep's work itself. Each
// workgroup rotates and justnorms its own q head and scales it by s_q; the workgroup
// whose split holds the new position p rotates and justnorms its KV head's new k row,
// takes it and the v row from the Q|K|V|G output as one more key (from shared memory,
// after its ring keys), and the one of the first query head of the group writes both
// to ring row p % ring. No workgroup reads what another writes in the dispatch: the
// ring keys read are positions < p, whose rows differ from p's (ring > window).

struct Params {
    nh: u32, nk: u32, hd: u32, stride: u32,
    window: u32, ring: u32, y_stride: u32, scale: f32,
    k_off: u32, v_off: u32, sq_off: u32, rope: u32,   // attention_qk only
    eps: f32, pad0: u32, pad1: u32, pad2: u32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> QKV: array<f32>;
@group(0) @binding(3) var<storage, $KV> KC: array<vec4<f32>>;
@group(0) @binding(4) var<storage, $KV> VC: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> Y: array<f32>;
@group(0) @binding(6) var<storage, read_write> PART: array<f32>;
@group(0) @binding(7) var<storage, read> V: array<f32>;       // s_q (attention_qk)
@group(0) @binding(8) var<storage, read> ROPE: array<f32>;    // cos/sin rows (attention_qk)

const QK: bool = $QK;

const TILE: u32 = 128u;
var<workgroup> qs: array<vec4<f32>, 128>;
var<workgroup> sc: array<f32, 128>;
var<workgroup> red: array<f32, 128>;
var<workgroup> part: array<vec4<f32>, 512>;
var<workgroup> knew: array<vec4<f32>, 128>;     // the new position's k and v (attention_qk)
var<workgroup> vnew: array<vec4<f32>, 128>;

// Dimensions 4i..4i+3 of the head row at QKV[base..] rotated (half-split pairs
// (d, d + half), cos row at ROPE[cb..], sin row at ROPE[sb..]), as qk_prep.wgsl does.
fn rot4(base: u32, i: u32, half: u32, cb: u32, sb: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        let d = 4u * i + c;
        if (d < half) {
            r[c] = QKV[base + d] * ROPE[cb + d] - QKV[base + d + half] * ROPE[sb + d];
        } else {
            let e = d - half;
            r[c] = QKV[base + e] * ROPE[sb + e] + QKV[base + d] * ROPE[cb + e];
        }
    }
    return r;
}

fn row4(base: u32, i: u32) -> vec4<f32> {
    return vec4<f32>(QKV[base + 4u * i], QKV[base + 4u * i + 1u], QKV[base + 4u * i + 2u],
                     QKV[base + 4u * i + 3u]);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let hd4 = P.hd / 4u;
    let kvh = h / (P.nh / P.nk);
    let p = S.pos0 + t;
    var lo = 0u;
    if (P.window > 0u && p + 1u > P.window) { lo = p + 1u - P.window; }
    let per = (p + 1u - lo + nwg.z - 1u) / nwg.z;     // positions a split
    let kfrom = lo + wid.z * per;
    let kto = min(p + 1u, kfrom + per);              // this split: kfrom .. kto - 1
    let qb = t * P.stride + h * P.hd;
    // attention_qk: this split holds p, whose key comes from shared memory after the
    // ring keys kfrom .. kend - 1
    let own = QK && kfrom <= p && p < kto;
    var kend = kto;
    if (own) { kend = p; }
    if (QK) {
        let half = P.hd / 2u;
        let cb = (P.rope * 2u * S.t + t) * half;
        let sb = cb + S.t * half;
        var qv = vec4<f32>(0.0);
        var kv = vec4<f32>(0.0);
        if (lid < hd4) {            // hd4 <= 128: one 4-dimension piece a lane
            qv = rot4(qb, lid, half, cb, sb);
            if (own) {
                kv = rot4(t * P.stride + P.k_off + kvh * P.hd, lid, half, cb, sb);
                vnew[lid] = row4(t * P.stride + P.v_off + kvh * P.hd, lid);
            }
        }
        red[lid] = dot(qv, qv);
        sc[lid] = dot(kv, kv);
        workgroupBarrier();
        for (var w = TILE / 2u; w > 0u; w = w / 2u) {
            if (lid < w) { red[lid] += red[lid + w]; sc[lid] += sc[lid + w]; }
            workgroupBarrier();
        }
        let iq = 1.0 / sqrt(red[0] + P.eps);
        let ik = 1.0 / sqrt(sc[0] + P.eps);
        if (lid < hd4) {
            let sq = P.sq_off + h * P.hd + 4u * lid;
            qs[lid] = qv * iq * vec4<f32>(V[sq], V[sq + 1u], V[sq + 2u], V[sq + 3u]);
            knew[lid] = kv * ik;
            if (own && h % (P.nh / P.nk) == 0u) {
                let dst = ((p % P.ring) * P.nk + kvh) * hd4 + lid;
                /*$W*/ KC[dst] = kv * ik; VC[dst] = vnew[lid];
            }
        }
    } else {
        for (var i = lid; i < hd4; i += TILE) { qs[i] = row4(qb, i); }
    }
    let grp = lid / 32u;
    let lane = lid % 32u;
    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    var m = -3.0e38;
    var l = 0.0;
    workgroupBarrier();
    for (var base = kfrom; base < kend; base += TILE) {
        let j = base + lid;
        var s = -3.0e38;
        if (j < kend) {
            let kb = ((j % P.ring) * P.nk + kvh) * hd4;
            var d = vec4<f32>(0.0);   // four independent loads in flight (hd4 % 4 == 0 or a tail)
            var i = 0u;
            for (; i + 4u <= hd4; i += 4u) {
                let k0 = KC[kb + i]; let k1 = KC[kb + i + 1u];
                let k2 = KC[kb + i + 2u]; let k3 = KC[kb + i + 3u];
                d += vec4<f32>(dot(qs[i], k0), dot(qs[i + 1u], k1), dot(qs[i + 2u], k2),
                               dot(qs[i + 3u], k3));
            }
            for (; i < hd4; i++) { d.x += dot(qs[i], KC[kb + i]); }
            s = (d.x + d.y + d.z + d.w) * P.scale;
        }
        red[lid] = s;
        workgroupBarrier();
        for (var w = TILE / 2u; w > 0u; w = w / 2u) {
            if (lid < w) { red[lid] = max(red[lid], red[lid + w]); }
            workgroupBarrier();
        }
        let mn = max(m, red[0]);
        let corr = exp(m - mn);
        workgroupBarrier();
        var e = 0.0;
        if (j < kend) { e = exp(s - mn); }
        sc[lid] = e;
        red[lid] = e;
        workgroupBarrier();
        for (var w = TILE / 2u; w > 0u; w = w / 2u) {
            if (lid < w) { red[lid] += red[lid + w]; }
            workgroupBarrier();
        }
        l = l * corr + red[0];
        m = mn;
        let n = min(TILE, kend - base);
        for (var k = 0u; k < 4u; k++) {
            let i = lane + 32u * k;
            if (i < hd4) {
                var a = acc[k] * corr;
                var b = vec4<f32>(0.0);
                var jj = grp;
                for (; jj + 4u < n; jj += 8u) {   // two keys a step: independent loads
                    let v0 = VC[(((base + jj) % P.ring) * P.nk + kvh) * hd4 + i];
                    let v1 = VC[(((base + jj + 4u) % P.ring) * P.nk + kvh) * hd4 + i];
                    a += sc[jj] * v0;
                    b += sc[jj + 4u] * v1;
                }
                if (jj < n) { a += sc[jj] * VC[(((base + jj) % P.ring) * P.nk + kvh) * hd4 + i]; }
                acc[k] = a + b;
            }
        }
        workgroupBarrier();
    }
    if (own) {      // the new position: one more online-softmax step
        var d = 0.0;
        if (lid < hd4) { d = dot(qs[lid], knew[lid]); }
        red[lid] = d;
        workgroupBarrier();
        for (var w = TILE / 2u; w > 0u; w = w / 2u) {
            if (lid < w) { red[lid] += red[lid + w]; }
            workgroupBarrier();
        }
        let s = red[0] * P.scale;
        let mn = max(m, s);
        let corr = exp(m - mn);
        let e = exp(s - mn);
        l = l * corr + e;
        m = mn;
        for (var k = 0u; k < 4u; k++) {
            let i = lane + 32u * k;
            if (i < hd4) {
                acc[k] = acc[k] * corr;
                if (grp == 0u) { acc[k] += e * vnew[i]; }
            }
        }
    }
    for (var k = 0u; k < 4u; k++) { part[lid * 4u + k] = acc[k]; }
    workgroupBarrier();
    if (grp == 0u) {
        let rec = ((t * P.nh + h) * nwg.z + wid.z) * (P.hd + 4u);
        if (nwg.z > 1u && lane == 0u) { PART[rec] = m; PART[rec + 1u] = l; }
        for (var k = 0u; k < 4u; k++) {
            let i = lane + 32u * k;
            if (i < hd4) {
                var v = vec4<f32>(0.0);
                for (var g = 0u; g < 4u; g++) { v += part[(g * 32u + lane) * 4u + k]; }
                if (nwg.z > 1u) {
                    let pb = rec + 4u + 4u * i;
                    PART[pb] = v.x; PART[pb + 1u] = v.y; PART[pb + 2u] = v.z; PART[pb + 3u] = v.w;
                } else {
                    v = v / l;
                    let yb = t * P.y_stride + h * P.hd + 4u * i;
                    Y[yb] = v.x; Y[yb + 1u] = v.y; Y[yb + 2u] = v.z; Y[yb + 3u] = v.w;
                }
            }
        }
    }
}
