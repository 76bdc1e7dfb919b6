fn embed_$I(r: u32, t: u32, lid: u32) {
    let R = P.part_rows[$I / 4][$I % 4];
    let C = P.cols;
    let rs = W$I_rowscale(r, R, C);
    for (var c = lid; c < C; c += 256u) {
        X[P.x_off + t * C + c] = W$I_elem(r, c, R, C) * rs;
    }
}
