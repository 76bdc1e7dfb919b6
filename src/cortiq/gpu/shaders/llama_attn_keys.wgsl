// llama_attn_split.wgsl's key loop, written once for each cache binding KC$KB, VC$KB (a rows
// dispatch binds one pair a row), so that every load names its buffer and the loads of a
// lane can be in flight together: the keys kfrom .. kto - 1 of the workgroup's KV head
// (offset kb4 in rows kvw4 vec4s wide) against the GQ query heads in q4, in tiles of TILE
// keys, into each head's running max, sum and values run_m, run_l, run_acc. Each key and
// value is loaded once for the GQ heads. Every loop over h is written out (llama.py), so
// the per-head arrays are indexed by constants.
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
        for (var h = 0u; h < GQ; h++) { dh[h] = 0.0; }
        if (kl < n) {
            if (own && j == p) {
                for (var i = kc; i < hd4; i += L) {
                    let k4 = kn4[i];
                    for (var h = 0u; h < GQ; h++) { dh[h] += dot(q4[h * hd4 + i], k4); }
                }
            } else {    // the lane's first NP pieces loaded at once, then any more
                let r = j * kvw4 + kb4;
                for (var m = 0u; m < NP; m++) {     // written out (llama.py)
                    if (kc + m * L < hd4) { ka[m] = KC$KB[r + kc + m * L]; }
                }
                for (var m = 0u; m < NP; m++) {
                    if (kc + m * L < hd4) {
                        for (var h = 0u; h < GQ; h++) { dh[h] += dot(q4[h * hd4 + kc + m * L], ka[m]); }
                    }
                }
                for (var i = kc + NP * L; i < hd4; i += L) {
                    let k4 = KC$KB[r + i];
                    for (var h = 0u; h < GQ; h++) { dh[h] += dot(q4[h * hd4 + i], k4); }
                }
            }
        }
        for (var h = 0u; h < GQ; h++) { dots[(h * L + kc) * TILE + kl] = dh[h]; }
        workgroupBarrier();
        // head h's score of key k at sc[h * TILE + k]; keys past n score -3e38, so that
        // the maxima read whole vec4s
        for (var i = lid; i < GQ * TILE; i += WG) {
            let hk = i / TILE;
            let k = i % TILE;
            var s = 0.0;
            for (var c = 0u; c < L; c++) { s += dots[(hk * L + c) * TILE + k]; }
            sc[i / 4u][i % 4u] = select(-3.0e38, s, k < n);
        }
        workgroupBarrier();
        for (var h = 0u; h < GQ; h++) {     // every lane each head's new maximum
            var mx = run_m[h];              // (broadcast reads, a fixed count: unrolled)
            for (var k4 = 0u; k4 < TILE / 4u; k4++) {
                let s4 = sc[h * (TILE / 4u) + k4];
                mx = max(mx, max(max(s4.x, s4.y), max(s4.z, s4.w)));
            }
            hm[h] = mx;
        }
        for (var i = lid; i < GQ * TILE; i += WG) {
            let s = sc[i / 4u][i % 4u];
            var e = 0.0;
            for (var h = 0u; h < GQ; h++) { if (i / TILE == h) { e = exp(s - hm[h]); } }
            ew[i / 4u][i % 4u] = select(0.0, e, i % TILE < n);
        }
        workgroupBarrier();
        for (var h = 0u; h < GQ; h++) {
            let corr = exp(run_m[h] - hm[h]);
            var es = 0.0;
            for (var k4 = 0u; k4 < TILE / 4u; k4++) {
                let e4 = ew[h * (TILE / 4u) + k4];
                es += (e4.x + e4.y) + (e4.z + e4.w);
            }
            run_l[h] = run_l[h] * corr + es;
            run_m[h] = hm[h];
            run_acc[h] = run_acc[h] * corr;
        }
        if (vg < groups) {      // four keys' values loaded at once
            for (var k = vg; k < n; k += 4u * groups) {
                for (var u = 0u; u < 4u; u++) {
                    let kk = k + u * groups;
                    let jj = base + kk;
                    let v = select(VC$KB[jj * kvw4 + kb4 + vi], vn4[vi], own && jj == p);
                    let kt = min(kk, TILE - 1u);
                    for (var h = 0u; h < GQ; h++) {
                        let w = ew[h * (TILE / 4u) + kt / 4u][kt % 4u];
                        run_acc[h] += select(vec4<f32>(0.0), w * v, kk < n);
                    }
                }
            }
        }
        workgroupBarrier();     // dots, sc and ew are the next tile's
    }
}
