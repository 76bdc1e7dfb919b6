fn rowdot_$I(r: u32, lane: u32) {
    let R = P.part_rows[$I / 4][$I % 4];
    if (CHUNKED) {
        let n = W$I_cpr(P.cols);
        for (var k = lane; k < n; k += TPR) { W$I_chunk(r, k, R, P.cols); }
    } else {
        for (var c = lane; c < P.cols; c += TPR) { pd += W$I_elem(r, c, R, P.cols) * xat(c); }
    }
}
