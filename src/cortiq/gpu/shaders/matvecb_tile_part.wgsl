fn tiledots_$I(r0: u32, lane: u32) {   // rows r0..r0+R-1 of part $I against the NB inputs
    let n = P.cols / 16u;                     // 16-byte words a row (cols % 32 == 0)
    let blk = n + (P.cols / 32u + 3u) / 4u;   // an input row's block in XQ, vec4s
    // a lane takes one 32-column group a step, the two words its input scale covers:
    // their dots are summed as integers and scaled once, the scale read once
    for (var g = lane; g < n / 2u; g += tpr) {
        let k = 2u * g;
        for (var j = 0u; j < R; j++) {
            w[j] = W$I[(r0 + j) * n + k];
            w2[j] = W$I[(r0 + j) * n + k + 1u];
        }
        for (var t = 0u; t < NB; t++) {
            if (t < nt) {
                let rb = (t0g + t) * blk;
                let q = XQ[rb + k];
                let q2 = XQ[rb + k + 1u];
                let s = bitcast<f32>(XQ[rb + n + (g >> 2u)][g & 3u]);
                for (var j = 0u; j < R; j++) {
                    acc[j * NB + t] += f32(dot16(w[j], q) + dot16(w2[j], q2)) * s;
                }
            }
        }
    }
}
