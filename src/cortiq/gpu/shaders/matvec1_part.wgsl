// Part $I of the decode matvec: a row's chunks, lane-strided. The first NPRE chunks of a
// lane were loaded by prefetch_$I before the input was staged (their latency overlaps
// the staging's); the rest are loaded here.
fn prefetch_$I(r: u32, lane: u32) {
    let R = P.part_rows[$I / 4][$I % 4];
    let n = W$I_cpr(P.cols);
    for (var j = 0u; j < NPRE; j++) {
        let k = lane + j * TPR;
        if (k < n) { pre[j] = W$I_load(r, k, R, P.cols); }
    }
}

fn rowdot_$I(r: u32, lane: u32) {
    let R = P.part_rows[$I / 4][$I % 4];
    let n = W$I_cpr(P.cols);
    var k = lane;
    if (use_pre) {
        for (var j = 0u; j < NPRE; j++) {
            if (k < n) { W$I_use(pre[j], r, k, R, P.cols); }
            k += TPR;
        }
    }
    for (; k < n; k += TPR) {
        W$I_chunk(r, k, R, P.cols);
    }
}
