// llama_attn_split.wgsl's key loop, written once for each cache binding KC$KB, VC$KB (a rows
// dispatch binds one pair a row), so that every load names its buffer and the loads of a
// lane can be in flight together: the keys kfrom .. kto - 1 of the workgroup's KV head
// (offset kb4 in rows kvw4 vec4s wide) against q4, in tiles of TILE keys, into the running
// max, sum and values run_m, run_l, run_acc.
fn keys$KB(kfrom: u32, kto: u32, p: u32, own: bool, kvw4: u32, kb4: u32, lid: u32) {
    let hd4 = P.hd / 4u;
    let kl = lid / L;           // scores: this lane's key in the tile
    let kc = lid % L;           // and its first 16-byte piece
    let groups = WG / hd4;      // values: key groups of hd4 lanes
    let vg = lid / hd4;
    let vi = lid % hd4;
    for (var base = kfrom; base < kto; base += TILE) {
        let n = min(TILE, kto - base);
        let j = base + kl;
        var d = 0.0;
        if (kl < n) {
            if (own && j == p) {
                for (var i = kc; i < hd4; i += L) { d += dot(q4[i], kn4[i]); }
            } else {    // the lane's first NP pieces loaded at once, then any more
                let r = j * kvw4 + kb4;
                for (var m = 0u; m < NP; m++) {     // written out (llama.py)
                    if (kc + m * L < hd4) { ka[m] = KC$KB[r + kc + m * L]; }
                }
                for (var m = 0u; m < NP; m++) {
                    if (kc + m * L < hd4) { d += dot(q4[kc + m * L], ka[m]); }
                }
                for (var i = kc + NP * L; i < hd4; i += L) { d += dot(q4[i], KC$KB[r + i]); }
            }
        }
        dots[kc * TILE + kl] = d;
        workgroupBarrier();
        if (lid < n) {
            var s = 0.0;
            for (var c = 0u; c < L; c++) { s += dots[c * TILE + lid]; }
            sc[lid] = s;
        }
        workgroupBarrier();
        var mx = run_m;     // every lane the same maximum (broadcast reads, TILE of them:
        for (var k = 0u; k < TILE; k++) { mx = max(mx, select(-3.0e38, sc[k], k < n)); }
        if (lid < n) { ew[lid] = exp(sc[lid] - mx); }   // a fixed count, so unrolled)
        workgroupBarrier();
        let corr = exp(run_m - mx);
        var es = 0.0;
        for (var k = 0u; k < TILE; k++) { es += select(0.0, ew[k], k < n); }
        run_l = run_l * corr + es;
        run_m = mx;
        run_acc = run_acc * corr;
        if (vg < groups) {      // four keys' values loaded at once
            for (var k = vg; k < n; k += 4u * groups) {
                for (var u = 0u; u < 4u; u++) {
                    let kk = k + u * groups;
                    let jj = base + kk;
                    let v = select(VC$KB[jj * kvw4 + kb4 + vi], vn4[vi], own && jj == p);
                    run_acc += select(vec4<f32>(0.0), ew[min(kk, TILE - 1u)] * v, kk < n);
                }
            }
        }
        workgroupBarrier();     // dots, sc and ew are the next tile's
    }
}
