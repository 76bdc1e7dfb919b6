fn tiledots_$I(r0: u32, lane: u32) {   // rows r0..r0+R-1 of part $I against the NB inputs
    let n = P.cols / 16u;
    let blk = n + (P.cols / 32u + 3u) / 4u;   // an input row's block in XQ, vec4s
    for (var k = lane; k < n; k += tpr) {
        for (var j = 0u; j < R; j++) { w[j] = W$I[(r0 + j) * n + k]; }
        for (var t = 0u; t < NB; t++) {
            if (t < nt) {
                let rb = (t0g + t) * blk;
                let q = XQ[rb + k];
                let s = bitcast<f32>(XQ[rb + n + (k >> 3u)][(k >> 1u) & 3u]);
                for (var j = 0u; j < R; j++) { acc[j * NB + t] += f32(dot16(w[j], q)) * s; }
            }
        }
    }
}
