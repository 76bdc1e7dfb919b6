// Y[t, row] = (W . xin(t)) * rowscale * outscale, for the rows of up to 8 stored
// matrices (parts) that share one input: the fused Q/K/V/G or gate/up products, or the
// pieces of a matrix split to fit the storage-binding limit. A workgroup takes RPW rows,
// TPR lanes a row, NT tokens at once (NT = 1: the decode matvec; NT > 1: a matmat over
// a prompt chunk). The input transform PRO makes the matrix read what the previous
// kernel left:  0: x;  1: justnorm(y * sigmoid(g * s_g)) (attention output gate);
// 2: justnorm(silu(a * s_a) * (b * s_b)) (SwiGLU). The norm is the row's lanes'
// sum of squares, so it costs no extra pass.

$MATVEC_IO

const RPW: u32 = $RPWu;
const TPR: u32 = $TPRu;
const NT: u32 = $NTu;
const PRO: u32 = $PROu;

var<private> acc: array<f32, NT>;
var<private> ssq: array<f32, NT>;
var<workgroup> red: array<f32, $REDN>;

fn xbase(t: u32) -> u32 {
    if (P.last_row != 0u) { return P.x_off + (S.t - 1u) * P.x_stride; }
    return P.x_off + t * P.x_stride;
}

fn xval(t: u32, xb: u32, c: u32) -> f32 {
    if (PRO == 1u) {
        let g = X2[P.x2_off + t * P.x2_stride + c] * V[P.v_a + c];
        return X[xb + c] / (1.0 + exp(-g));
    } else if (PRO == 2u) {
        let a = X[xb + c] * V[P.v_a + c];
        let b = X[xb + P.x2_off + c] * V[P.v_b + c];
        return a / (1.0 + exp(-a)) * b;
    }
    return X[xb + c];
}

$PARTFNS

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let slot = lid / TPR;
    let lane = lid % TPR;
    let row = (wid.x + wid.y * P.nx) * RPW + slot;
    let t0 = wid.z * NT;
    var nt = NT;
    if (P.last_row != 0u) { nt = 1u; } else if (S.t - t0 < NT) { nt = S.t - t0; }
    for (var t = 0u; t < NT; t++) { acc[t] = 0.0; ssq[t] = 0.0; }
    var rs = 1.0;
    if (row < P.total_rows) {
$DISPATCH
    }
    for (var t = 0u; t < NT; t++) {
        red[(t * 2u) * 256u + lid] = acc[t];
        red[(t * 2u + 1u) * 256u + lid] = ssq[t];
    }
    workgroupBarrier();
    for (var h = TPR / 2u; h > 0u; h = h / 2u) {
        if (lane < h) {
            for (var t = 0u; t < NT; t++) {
                let a = (t * 2u) * 256u + lid;
                red[a] += red[a + h];
                red[a + 256u] += red[a + 256u + h];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < P.total_rows) {
        var os = 1.0;
        if (P.v_out != 0xffffffffu) { os = V[P.v_out + row]; }
        for (var t = 0u; t < nt; t++) {
            var v = red[(t * 2u) * 256u + lid] * rs;
            if (PRO != 0u) { v = v / sqrt(red[(t * 2u + 1u) * 256u + lid] + P.eps); }
            Y[P.y_off + (t0 + t) * P.y_stride + row] = v * os;
        }
    }
}
