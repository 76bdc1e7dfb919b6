fn tileload_$I(r0: u32, g: u32) {   // the R rows from r0 of part $I: words of group g
    let n = P.cols / 16u;
    for (var j = 0u; j < R; j++) {
        nw[j] = W$I[(r0 + j) * n + 2u * g];
        nw2[j] = W$I[(r0 + j) * n + 2u * g + 1u];
    }
}
