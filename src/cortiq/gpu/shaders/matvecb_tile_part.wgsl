fn tileload_$I(r0: u32, k: u32) {   // the R rows from r0 of part $I: words k and k + GC
    let n = P.cols / 16u;
    for (var j = 0u; j < R; j++) {
        nw[j] = W$I[(r0 + j) * n + k];
        if (k + GC < n) { nw2[j] = W$I[(r0 + j) * n + k + GC]; }
    }
}
