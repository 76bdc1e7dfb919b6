// The decode matvec (one input row): Y[row] = (W . xin) * rowscale * outscale over
// the rows of up to 8 parts, like matvec.wgsl, but each row's TPR lanes read
// consecutive 16-byte words (or tiles) of the row, so a warp's loads are contiguous,
// and a lane keeps one running sum in registers. The transformed input is staged once
// per workgroup in shared memory (XS > 0), at c + c/32 so that the lanes' reads hit
// distinct banks for every chunk size; its sum of squares is taken while staging.
// PRO 3 (staged only) is PRO 1 over an attention output still in splits
// (attention.wgsl): X holds per (head, split) records [m, l, 0, 0, acc[hd]]; the
// workgroup first takes each record's softmax weight exp(m - M) / sum(exp(m - M) l)
// (M: the head's largest m), then y[c] = sum over splits of weight * acc[c % hd].
// PRO 5 (staged only) is PRO 3 with no gate and no norm: the merged attention output as
// it is (the Llama family's split decode attention, llama_attn_split.wgsl).
// PRO 4 (staged only) is the nGPT residual of the previous sub-layer, which would
// otherwise be a rownorm pass: xin = justnorm(x^ + alpha (o^ - x^)) with x = X[x_off..],
// o = X2[x2_off..], alpha = V[v_a..], x^ = justnorm(x); the first workgroup also writes
// xin to X[v_b..] (another region of the hidden-state buffer) for the next sub-layer
// (X is read_write in that variant only: XWRITE is empty in the others).
// PRO 6 (staged only) is the Llama family's residual add and RMSNorm, which would
// otherwise be a llama_norm pass: r = x + o with x = X[x_off..], o = X2[x2_off..], the
// product's input r * w (w = V[v_a..]) and its output scaled by 1 / sqrt(mean(r^2) + eps);
// the first workgroup also writes r to X[v_b..] (the residual stream's other region).
// PRO 7 is SwiGLU with no scales: silu(X[c]) * X[x2_off + c] (the Llama family's
// gate|up output, the down product's input).
// SG (the adapter's `subgroup` feature): a row is one subgroup's, its lanes' partial
// sums added by subgroupAdd with no shared memory and no barrier; the workgroup's
// RPW * RW rows go round its 256 / subgroup_size subgroups, whatever that size is.
// Otherwise a row is TPR lanes', added by a tree in shared memory. UNROLL > 1: a lane
// issues that many 16-byte loads of its row before it uses the first.
// I8 (q8_row parts, the model's precision "int8"): the transformed input is staged
// quantized instead, as the CPU's int8 activations are (quant4.wgsl), and a
// row's 16-byte chunks are dotted with four dot4I8Packed each, their integer sum scaled
// by the chunk's d: a quarter of the arithmetic and of the input reads of the float path.
// QOUT and QIN split an I8 product in two dispatches, so that its input stage runs once
// rather than in every workgroup: QOUT (no rows) stages and quantizes 1024 columns a
// workgroup into Y (a u32 array here): cols / 16 words of codes, then the cols / 32
// scales as f32 bits padded to whole words, then each workgroup's share of the staged
// sum of squares, and writes its columns' residual back (PRO 6; PRO 4, whose write-back
// needs the whole norm, is not split); QIN is the product over that input, read where it
// lies (XQ, bound where X2 is), with no stage of its own.

$MATVEC_IO

const RPW: u32 = $RPWu;   // row slots (lane groups) a workgroup
const RW: u32 = $RWu;     // rows each slot takes in turn (the staged input is shared by RPW * RW rows)
const TPR: u32 = $TPRu;
const PRO: u32 = $PROu;
const XS: u32 = $XSu;
const SG: bool = $SG;
const UNROLL: u32 = $UNROLLu;
const I8: bool = $I8;
const QOUT: bool = $QOUT;
const QIN: bool = $QIN;
// the input stages whose output is RMS-normalised (nGPT's justnorm): 1 to 4
const NORM: bool = PRO != 0u && PRO < 5u;

var<private> pd: f32;
var<private> ps: f32;
var<private> xb: u32;
var<private> x2b: u32;
var<private> ixn: f32;   // PRO 4: 1 / |x| and 1 / |o|
var<private> ion: f32;
var<private> tpr: u32;   // lanes a row: TPR, or the subgroup size under SG
var<private> nsq: f32;   // the staged input's sum of squares (`staged`)
var<workgroup> red: array<f32, 512>;
var<workgroup> xs: array<f32, $XSN>;
var<workgroup> wts: array<f32, $WTSN>;
var<workgroup> xq: array<vec4<u32>, $XQN>;   // I8: the quantized input, 16 columns a word
var<workgroup> xd: array<f32, $XDN>;         // I8: its scale per 32 columns

$QUANT4

// I8: chunk k (columns 16k .. 16k + 15) of a row's int8 codes dotted with the staged input.
fn dq(w: vec4<u32>, k: u32) -> f32 {
    let q = $XQWORD;
    let s = dot4I8Packed(w.x, q.x) + dot4I8Packed(w.y, q.y) + dot4I8Packed(w.z, q.z)
          + dot4I8Packed(w.w, q.w);
    return f32(s) * $XQSCALE;
}

// QIN: 1 / the staged input's norm (the output's scale), from the QOUT workgroups' sums.
fn qin_inv() -> f32 {
    if (!(NORM || PRO == 6u)) { return 1.0; }
    let at = 4u * (P.cols / 16u + (P.cols / 32u + 3u) / 4u);
    var s = 0.0;
    for (var i = 0u; i < (P.cols + 1023u) / 1024u; i++) { s += $XQSUM; }
    if (PRO == 6u) { return 1.0 / sqrt(s / f32(P.cols) + P.eps); }
    return 1.0 / sqrt(s + P.eps);
}

fn merged(c: u32) -> f32 {
    let h = c / P.hd;
    let n = P.splits;
    var y = 0.0;
    for (var s = 0u; s < n; s++) {
        y += wts[h * n + s] * X[xb + (h * n + s) * (P.hd + 4u) + 4u + c % P.hd];
    }
    return y;
}

fn xval(c: u32) -> f32 {
    if (PRO == 4u) {
        let xh = X[xb + c] * ixn;
        return xh + V[P.v_a + c] * (X2[x2b + c] * ion - xh);
    }
    if (PRO == 5u) { return merged(c); }
    if (PRO == 7u) {
        let a = X[xb + c];
        return a / (1.0 + exp(-a)) * X[xb + P.x2_off + c];
    }
    if (PRO == 3u) {
        let g = X2[x2b + c] * V[P.v_a + c];
        return merged(c) / (1.0 + exp(-g));
    }
    if (PRO == 1u) {
        let g = X2[x2b + c] * V[P.v_a + c];
        return X[xb + c] / (1.0 + exp(-g));
    } else if (PRO == 2u) {
        let a = X[xb + c] * V[P.v_a + c];
        let b = X[xb + P.x2_off + c] * V[P.v_b + c];
        return a / (1.0 + exp(-a)) * b;
    }
    return X[xb + c];
}

// Column c of the staged input, its square added to nsq, the sum the output's norm
// takes: the staged value's (NORM), or for PRO 6 the residual's before the norm's
// weight (the weight staged with it, the norm applied to the row dots).
fn staged(c: u32) -> f32 {
    if (PRO == 6u) {
        let r = X[xb + c] + X2[x2b + c];
        nsq += r * r;
$QWRITEBACK
        return r * V[P.v_a + c];
    }
    let v = xval(c);
    nsq += v * v;
    return v;
}

// Columns c .. c + 3 of the merged attention output (c % 4 == 0: one head's), as
// `merged` gives them, with the loads of four splits issued before their sums.
fn merged4(c: u32) -> vec4<f32> {
    let h = c / P.hd;
    let n = P.splits;
    let step = P.hd + 4u;
    let a0 = xb + h * n * step + 4u + c % P.hd;
    var y = vec4<f32>(0.0);
    var s = 0u;
    for (; s + 4u <= n; s += 4u) {
        let a = a0 + s * step;
        let v0 = vec4<f32>(X[a], X[a + 1u], X[a + 2u], X[a + 3u]);
        let v1 = vec4<f32>(X[a + step], X[a + step + 1u], X[a + step + 2u], X[a + step + 3u]);
        let b = a + 2u * step;
        let v2 = vec4<f32>(X[b], X[b + 1u], X[b + 2u], X[b + 3u]);
        let v3 = vec4<f32>(X[b + step], X[b + step + 1u], X[b + step + 2u], X[b + step + 3u]);
        y += wts[h * n + s] * v0;
        y += wts[h * n + s + 1u] * v1;
        y += wts[h * n + s + 2u] * v2;
        y += wts[h * n + s + 3u] * v3;
    }
    for (; s < n; s++) {
        let a = a0 + s * step;
        y += wts[h * n + s] * vec4<f32>(X[a], X[a + 1u], X[a + 2u], X[a + 3u]);
    }
    return y;
}

// Columns c .. c + 3 as `staged` gives them (zero past the input's end).
fn staged4(c: u32) -> vec4<f32> {
    if (c >= P.cols) { return vec4<f32>(0.0); }
    if ((PRO == 3u || PRO == 5u) && P.hd % 4u == 0u) {
        var v = merged4(c);
        if (PRO == 3u) {
            let g = vec4<f32>(X2[x2b + c] * V[P.v_a + c], X2[x2b + c + 1u] * V[P.v_a + c + 1u],
                              X2[x2b + c + 2u] * V[P.v_a + c + 2u],
                              X2[x2b + c + 3u] * V[P.v_a + c + 3u]);
            v = v / (1.0 + exp(-g));
        }
        nsq += v.x * v.x;
        nsq += v.y * v.y;
        nsq += v.z * v.z;
        nsq += v.w * v.w;
        return v;
    }
    return vec4<f32>(staged(c), staged(c + 1u), staged(c + 2u), staged(c + 3u));
}

fn mac4(w: vec4<f32>, c: u32) {
    if (XS > 0u) {
        let a = c + (c >> 5u);   // c % 4 == 0: the four stay inside one 32-column run
        pd += dot(w, vec4<f32>(xs[a], xs[a + 1u], xs[a + 2u], xs[a + 3u]));
        return;
    }
    let x = vec4<f32>(xval(c), xval(c + 1u), xval(c + 2u), xval(c + 3u));
    pd += dot(w, x);
    if (NORM) { ps += dot(x, x); }
}

$PARTFNS

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32$SGARGS) {
    var slot = lid / TPR;
    var lane = lid % TPR;
    tpr = TPR;
$SGLANES
    let base = (wid.x + wid.y * P.nx) * RPW * RW;
    xb = P.x_off;
    if (P.last_row != 0u) { xb = P.x_off + (S.t - 1u) * P.x_stride; }
    x2b = P.x2_off;
    var rs = 1.0;
    var inv = 1.0;
    if (QIN) { inv = qin_inv(); }
    if ((PRO == 3u || PRO == 5u) && !QIN) {
        // each record's m and l read once (one load each, all lanes at once), then
        // each lane's head from shared memory rather than n dependent loads a lane
        let n = P.splits;
        let nr = (P.cols / P.hd) * n;
        if (lid < nr) {
            let r = xb + lid * (P.hd + 4u);
            red[lid] = X[r];
            red[256u + lid] = X[r + 1u];
        }
        workgroupBarrier();
        if (lid < nr) {
            let h0 = (lid / n) * n;
            var mx = -3.0e38;
            for (var s = 0u; s < n; s++) { mx = max(mx, red[h0 + s]); }
            var den = 0.0;
            for (var s = 0u; s < n; s++) { den += exp(red[h0 + s] - mx) * red[256u + h0 + s]; }
            wts[lid] = exp(red[lid] - mx) / den;
        }
        workgroupBarrier();
    }
    if (PRO == 4u && !QIN) {
        var sx = 0.0;
        var so = 0.0;
        for (var c = lid; c < P.cols; c += 256u) {
            let x = X[xb + c];
            let o = X2[x2b + c];
            sx += x * x;
            so += o * o;
        }
        red[lid] = sx;
        red[256u + lid] = so;
        workgroupBarrier();
        for (var h = 128u; h > 0u; h = h / 2u) {
            if (lid < h) { red[lid] += red[lid + h]; red[256u + lid] += red[256u + lid + h]; }
            workgroupBarrier();
        }
        ixn = 1.0 / sqrt(red[0] + P.eps);
        ion = 1.0 / sqrt(red[256] + P.eps);
        workgroupBarrier();
    }
    if (XS > 0u) {
        for (var c = lid; c < P.cols; c += 256u) { xs[c + (c >> 5u)] = staged(c); }
    }
    // QOUT: this workgroup's 1024 columns; otherwise every column
    var cb = 0u;
    var ce = P.cols;
    if (QOUT) { cb = (wid.x + wid.y * P.nx) * 1024u; ce = min(P.cols, cb + 1024u); }
    if (I8 && !QIN) {
        // 256 lanes take 1024 columns a round, four each (quant4.wgsl)
        for (var c0 = cb; c0 < ce; c0 += 1024u) {
            let c = c0 + 4u * lid;
            let v = staged4(c);
            let q = quant4(v, lid);
            if (c < P.cols) {
$XQSTORE
            }
        }
    }
    if ((XS > 0u || I8) && !QIN) {   // the staged input's norm, and PRO 4's and PRO 6's write-back
        if (NORM || PRO == 6u) {
            var sum = 0.0;
            if (SG) {     // each subgroup's sum, then theirs
                let s = subgroupAdd(nsq);
                if (lane == 0u) { red[lid / tpr] = s; }
                workgroupBarrier();
                for (var i = 0u; i < 256u / tpr; i++) { sum += red[i]; }
            } else {
                red[lid] = nsq;
                workgroupBarrier();
                for (var h = 128u; h > 0u; h = h / 2u) {
                    if (lid < h) { red[lid] += red[lid + h]; }
                    workgroupBarrier();
                }
                sum = red[0];
            }
            if (PRO == 6u) {
                inv = 1.0 / sqrt(sum / f32(P.cols) + P.eps);
            } else {
                inv = 1.0 / sqrt(sum + P.eps);
            }
$XQSUMSTORE
        }
        workgroupBarrier();
        // the residual written back (QOUT: PRO 6's, while staging)
        if ((PRO == 4u || PRO == 6u) && !QOUT && wid.x + wid.y == 0u) {
            for (var c = lid; c < P.cols; c += 256u) { $XWRITE }
        }
    }
    if (QOUT) { return; }
    if (SG) {
        for (var rr = slot; rr < RPW * RW; rr += 256u / tpr) {
            let row = base + rr;
            pd = 0.0;
            ps = 0.0;
            if (row < P.total_rows) {
$DISPATCH
            }
            let d = subgroupAdd(pd);
            var q = 0.0;
            if (XS == 0u && !I8 && NORM) { q = subgroupAdd(ps); }
            if (lane == 0u && row < P.total_rows) {
                var v = d * rs;
                if (XS > 0u || I8) { v = v * inv; } else if (NORM) { v = v / sqrt(q + P.eps); }
                if (P.v_out != 0xffffffffu) { v = v * V[P.v_out + row]; }
                Y[P.y_off + row] = $YVAL;
            }
        }
        return;
    }
    for (var rr = 0u; rr < RW; rr++) {
    let row = base + rr * RPW + slot;
    pd = 0.0;
    ps = 0.0;
    if (row < P.total_rows) {
$DISPATCH
    }
    red[lid] = pd;
    red[256u + lid] = ps;
    workgroupBarrier();
    for (var h = TPR / 2u; h > 0u; h = h / 2u) {
        if (lane < h) {
            red[lid] += red[lid + h];
            red[256u + lid] += red[256u + lid + h];
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < P.total_rows) {
        var v = red[lid] * rs;
        if (XS > 0u || I8) { v = v * inv; } else if (NORM) { v = v / sqrt(red[256u + lid] + P.eps); }
        if (P.v_out != 0xffffffffu) { v = v * V[P.v_out + row]; }
        Y[P.y_off + row] = $YVAL;
    }
    workgroupBarrier();
    }
}
