fn tiledots_$I(r0: u32, lane: u32, g0: u32, gc: u32) {   // rows r0..r0+R-1 of part $I,
    let n = P.cols / 16u;                                 // the chunk's groups g0..g0+gc-1
    for (var g = lane; g < gc; g += 32u) {
        let k = 2u * (g0 + g);
        for (var j = 0u; j < R; j++) {
            w[j] = W$I[(r0 + j) * n + k];
            w2[j] = W$I[(r0 + j) * n + k + 1u];
        }
        for (var t = 0u; t < NB; t++) {
            if (t < nt) {
                let i = t * GC + g;
                let q = xq0[i];
                let q2 = xq1[i];
                let s = xs[i];
                for (var j = 0u; j < R; j++) {
                    acc[j * NB + t] += f32(dot16(w[j], q) + dot16(w2[j], q2)) * s;
                }
            }
        }
    }
}
