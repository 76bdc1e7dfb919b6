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

struct Params {
    nh: u32, nk: u32, hd: u32, stride: u32,
    window: u32, ring: u32, y_stride: u32, scale: f32,
}
struct Step { t: u32, pos0: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<uniform> S: Step;
@group(0) @binding(2) var<storage, read> QKV: array<f32>;
@group(0) @binding(3) var<storage, read> KC: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> VC: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> Y: array<f32>;
@group(0) @binding(6) var<storage, read_write> PART: array<f32>;

const TILE: u32 = 128u;
var<workgroup> qs: array<vec4<f32>, 128>;
var<workgroup> sc: array<f32, 128>;
var<workgroup> red: array<f32, 128>;
var<workgroup> part: array<vec4<f32>, 512>;

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
    for (var i = lid; i < hd4; i += TILE) {
        qs[i] = vec4<f32>(QKV[qb + 4u * i], QKV[qb + 4u * i + 1u], QKV[qb + 4u * i + 2u],
                          QKV[qb + 4u * i + 3u]);
    }
    let grp = lid / 32u;
    let lane = lid % 32u;
    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    var m = -3.0e38;
    var l = 0.0;
    workgroupBarrier();
    for (var base = kfrom; base < kto; base += TILE) {
        let j = base + lid;
        var s = -3.0e38;
        if (j < kto) {
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
        if (j < kto) { e = exp(s - mn); }
        sc[lid] = e;
        red[lid] = e;
        workgroupBarrier();
        for (var w = TILE / 2u; w > 0u; w = w / 2u) {
            if (lid < w) { red[lid] += red[lid + w]; }
            workgroupBarrier();
        }
        l = l * corr + red[0];
        m = mn;
        let n = min(TILE, kto - base);
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
