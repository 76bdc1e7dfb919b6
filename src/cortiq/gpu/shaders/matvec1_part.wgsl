fn rowdot_$I(r: u32, lane: u32) {
    let R = P.part_rows[$I / 4][$I % 4];
    let n = W$I_cpr(P.cols);
    var k = lane;
    if (UNROLL > 1u) {
        for (; k + 3u * tpr < n; k += 4u * tpr) { W$I_chunk4(r, k, tpr, R, P.cols); }
    }
    for (; k < n; k += tpr) {
        W$I_chunk(r, k, R, P.cols);
    }
}
