fn tiledots_$I(r0: u32, lane: u32) {   // rows r0..r0+R-1 of part $I against the NB inputs
    let n = P.cols / 16u;                     // 16-byte words a row (cols % 32 == 0)
    let ng = n / 2u;                          // 32-column groups a row
    let blk = n + (P.cols / 32u + 3u) / 4u;   // an input row's block in XQ, vec4s
    // a lane takes U 32-column groups a step (tpr apart), the two words an input scale
    // covers each: every weight word of the step is loaded before the first is used,
    // and a group's two dots are summed as integers and scaled once
    for (var g0 = lane; g0 < ng; g0 += U * tpr) {
        for (var u = 0u; u < U; u++) {
            let k = 2u * min(g0 + u * tpr, ng - 1u);
            for (var j = 0u; j < R; j++) {
                w[u * R + j] = W$I[(r0 + j) * n + k];
                w2[u * R + j] = W$I[(r0 + j) * n + k + 1u];
            }
        }
        for (var u = 0u; u < U; u++) {
            let g = g0 + u * tpr;
            if (g < ng) {
                let k = 2u * g;
                for (var t = 0u; t < NB; t++) {
                    if (t < nt) {
                        let rb = (t0g + t) * blk;
                        let q = XQ[rb + k];
                        let q2 = XQ[rb + k + 1u];
                        let s = bitcast<f32>(XQ[rb + n + (g >> 2u)][g & 3u]);
                        for (var j = 0u; j < R; j++) {
                            acc[j * NB + t] += f32(dot16(w[u * R + j], q)
                                                   + dot16(w2[u * R + j], q2)) * s;
                        }
                    }
                }
            }
        }
    }
}
