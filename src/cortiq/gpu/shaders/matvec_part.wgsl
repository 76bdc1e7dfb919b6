fn rowdot_$I(r: u32, lane: u32, t0: u32, nt: u32) {
    let R = P.part_rows[$I / 4][$I % 4];
    let C = P.cols;
    if ($FAST) {
        for (var g = lane; g < C / 32u; g += TPR) {
            let w = W$I_tile(r, g, R, C);
            for (var t = 0u; t < NT; t++) {
                if (t < nt) {
                    let xb = xbase(t0 + t);
                    var d = 0.0;
                    var s = 0.0;
                    for (var e = 0u; e < 32u; e++) {
                        let xv = xval(t0 + t, xb, g * 32u + e);
                        d += w[e] * xv;
                        s += xv * xv;
                    }
                    acc[t] += d;
                    ssq[t] += s;
                }
            }
        }
    } else {
        for (var c = lane; c < C; c += TPR) {
            let w = W$I_elem(r, c, R, C);
            for (var t = 0u; t < NT; t++) {
                if (t < nt) {
                    let xv = xval(t0 + t, xbase(t0 + t), c);
                    acc[t] += w * xv;
                    ssq[t] += xv * xv;
                }
            }
        }
    }
}
