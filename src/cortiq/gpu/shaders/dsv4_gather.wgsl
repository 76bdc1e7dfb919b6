// The gathered decode matvec: slot j (workgroup row wid.y) computes the RPE rows of
// block id_j of a stack of equally shaped matrices (the parts, as in matvec1.wgsl)
// against its own input row:
//     Y[y_off + j * y_stride + r] = W[id_j * RPE + r] . xin_j,   r < RPE
// id_j = j (v_a = NONE: the grouped low-rank output projection, one block a group) or
// the expert ids the router left in V[v_a + j] (the MoE: every chosen expert of a
// token in one dispatch). Parameters (matvec_io.wgsl's block, read as):
//   x_off + j * x_stride  slot j's input;  v_b = RPE;  x2_stride = slots;
//   PRO 3: xin = swiglu_clamp(x[c], x[x2_off + c]) * V[v_a + slots + j] (limit in eps).

$MATVEC_IO

const RPW: u32 = $RPWu;
const TPR: u32 = $TPRu;
const PRO: u32 = $PROu;
const XS: u32 = $XSu;
const CHUNKED: bool = $CHUNKED;

var<private> pd: f32;
var<private> xb: u32;
var<private> sj: u32;
var<workgroup> red: array<f32, 256>;
var<workgroup> xs: array<f32, $XSN>;

fn xval(c: u32) -> f32 {
    if (PRO == 3u) {
        var g = X[xb + c];
        var u = X[xb + P.x2_off + c];
        if (P.eps > 0.0) {
            g = min(g, P.eps);
            u = clamp(u, -P.eps, P.eps);
        }
        return g / (1.0 + exp(-g)) * u * V[P.v_a + P.x2_stride + sj];
    }
    return X[xb + c];
}

fn xat(c: u32) -> f32 {
    if (XS > 0u) { return xs[c + (c >> 5u)]; }
    return xval(c);
}

fn mac4(w: vec4<f32>, c: u32) {
    pd += dot(w, vec4<f32>(xat(c), xat(c + 1u), xat(c + 2u), xat(c + 3u)));
}

$PARTFNS

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let slot = lid / TPR;
    let lane = lid % TPR;
    sj = wid.y;
    var id = sj;
    if (P.v_a != 0xffffffffu) { id = bitcast<u32>(V[P.v_a + sj]); }
    xb = P.x_off + sj * P.x_stride;
    if (XS > 0u) {
        for (var c = lid; c < P.cols; c += 256u) { xs[c + (c >> 5u)] = xval(c); }
        workgroupBarrier();
    }
    let vr = wid.x * RPW + slot;
    pd = 0.0;
    var rs = 1.0;
    if (vr < P.v_b) {
        let row = id * P.v_b + vr;
$DISPATCH
    }
    red[lid] = pd;
    workgroupBarrier();
    for (var h = TPR / 2u; h > 0u; h = h / 2u) {
        if (lane < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    if (lane == 0u && vr < P.v_b) { Y[P.y_off + sj * P.y_stride + vr] = red[lid] * rs; }
}
