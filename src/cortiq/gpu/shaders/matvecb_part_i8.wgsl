fn rowdot_$I(r: u32, lane: u32) {   // q8_row codes against the quantized rows (I8)
    let n = P.cols / 16u;
    let b = (r * P.cols) / 16u;
    let blk = n + (P.cols / 32u + 3u) / 4u;   // a row's block in XQ, vec4s
    for (var k = lane; k < n; k += tpr) {
        let w = W$I[b + k];
        for (var t = 0u; t < NB; t++) {
            if (t < nt) {
                let rb = (t0g + t) * blk;
                let q = XQ[rb + k];
                let s = dot4I8Packed(w.x, q.x) + dot4I8Packed(w.y, q.y)
                      + dot4I8Packed(w.z, q.z) + dot4I8Packed(w.w, q.w);
                pdv[t] += f32(s) * bitcast<f32>(XQ[rb + n + (k >> 3u)][(k >> 1u) & 3u]);
            }
        }
    }
}
