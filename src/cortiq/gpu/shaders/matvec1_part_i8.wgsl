fn rowdot_$I(r: u32, lane: u32) {   // q8_row codes against the quantized input (I8)
    let n = P.cols / 16u;
    let b = (r * P.cols) / 16u;
    var k = lane;
    for (; k + 3u * tpr < n; k += 4u * tpr) {
        let w0 = W$I[b + k];
        let w1 = W$I[b + k + tpr];
        let w2 = W$I[b + k + 2u * tpr];
        let w3 = W$I[b + k + 3u * tpr];
        pd += dq(w0, k) + dq(w1, k + tpr) + dq(w2, k + 2u * tpr) + dq(w3, k + 3u * tpr);
    }
    for (; k < n; k += tpr) { pd += dq(W$I[b + k], k); }
}
