// The input rows of an int8 rows matvec (matvecb.wgsl's I8 variant), quantized once for
// every workgroup of the product: one workgroup 1024 columns (wid.x) of a row t < S.t
// (wid.z), the quantization groups of 32 columns being independent, reading the
// product's own parameters (cols, x_off, x_stride), by quant4.wgsl as matvec1.wgsl's I8
// staging. Row t's block in XQ is cols / 16 vec4 words of packed codes (16 a word), then
// its cols / 32 scales as f32 bits, padded to a whole vec4: rows_block_words(cols) vec4s
// in all.

$MATVEC_IO_Q

@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> XQ: array<u32>;

var<workgroup> red: array<f32, 256>;

$QUANT4
$QUANT4_PUT

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.z;
    let xb = P.x_off + t * P.x_stride;
    let c = wid.x * 1024u + 4u * lid;
    var v = vec4<f32>(0.0);
    if (c < P.cols) { v = vec4<f32>(X[xb + c], X[xb + c + 1u], X[xb + c + 2u], X[xb + c + 3u]); }
    quant4_put(v, lid, t, P.cols, c, c < P.cols);
}
