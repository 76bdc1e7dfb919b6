// The input rows of an int8 rows matvec (matvecb.wgsl's I8 variant), quantized once for
// every workgroup of the product: one workgroup a row t < S.t, reading the product's own
// parameters (cols, x_off, x_stride). As matvec1.wgsl's I8 staging (and the CPU's int8
// activations): per 32 columns d = max|x| / 127, q = round-half-even(x * 127 / max|x|),
// a non-finite maximum giving d = max and q = 0. Row t's block in XQ is cols / 16 words
// of four packed codes' quadruples (16 codes a vec4), then its cols / 32 scales as f32
// bits, padded to a whole vec4: rows_block_words(cols) vec4s in all.

$MATVEC_IO_Q

@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> XQ: array<u32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.z;
    let xb = P.x_off + t * P.x_stride;
    let words = P.cols / 16u;
    let qb = t * (words + (P.cols / 32u + 3u) / 4u) * 4u;   // row t's block, in u32s
    for (var c0 = 0u; c0 < P.cols; c0 += 1024u) {
        let c = c0 + 4u * lid;
        var v = vec4<f32>(0.0);
        if (c < P.cols) { v = vec4<f32>(X[xb + c], X[xb + c + 1u], X[xb + c + 2u], X[xb + c + 3u]); }
        let a = abs(v);
        red[lid] = max(max(a.x, a.y), max(a.z, a.w));
        workgroupBarrier();
        let g0 = lid & ~7u;
        var m = red[g0];
        for (var j = 1u; j < 8u; j++) { m = max(m, red[g0 + j]); }
        workgroupBarrier();
        if (c < P.cols) {
            let finite = m <= 3.4028234e38;
            var id = 0.0;
            if (finite && m > 0.0) { id = 127.0 / m; }
            XQ[qb + c / 4u] = pack4xI8(vec4<i32>(round(v * id)));
            if ((lid & 7u) == 0u) {
                XQ[qb + 4u * words + c / 32u] = bitcast<u32>(select(m, m / 127.0, finite));
            }
        }
    }
}
