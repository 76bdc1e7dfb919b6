fn rowdot_$I(r: u32, lane: u32) {   // q8_row codes against the quantized input (I8)
    let n = P.cols / 16u;
    let b = (r * P.cols) / 16u;
    var k = lane;
    if (UNROLL >= 8u) {     // eight 16-byte loads in flight before the first dot
        for (; k + 7u * tpr < n; k += 8u * tpr) {
            let w0 = W$I[b + k];
            let w1 = W$I[b + k + tpr];
            let w2 = W$I[b + k + 2u * tpr];
            let w3 = W$I[b + k + 3u * tpr];
            let w4 = W$I[b + k + 4u * tpr];
            let w5 = W$I[b + k + 5u * tpr];
            let w6 = W$I[b + k + 6u * tpr];
            let w7 = W$I[b + k + 7u * tpr];
            pd += dq(w0, k) + dq(w1, k + tpr) + dq(w2, k + 2u * tpr) + dq(w3, k + 3u * tpr)
                + dq(w4, k + 4u * tpr) + dq(w5, k + 5u * tpr) + dq(w6, k + 6u * tpr)
                + dq(w7, k + 7u * tpr);
        }
    }
    for (; k + 3u * tpr < n; k += 4u * tpr) {
        let w0 = W$I[b + k];
        let w1 = W$I[b + k + tpr];
        let w2 = W$I[b + k + 2u * tpr];
        let w3 = W$I[b + k + 3u * tpr];
        pd += dq(w0, k) + dq(w1, k + tpr) + dq(w2, k + 2u * tpr) + dq(w3, k + 3u * tpr);
    }
    for (; k < n; k += tpr) { pd += dq(W$I[b + k], k); }
}
