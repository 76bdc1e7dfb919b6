// Four columns quantized (quant4.wgsl) into row `row`'s block of XQ, whose cols columns
// are laid out as quantrows.wgsl lays them (cols / 16 vec4 words of packed codes, then
// the cols / 32 scales as f32 bits, padded to a whole vec4): the codes of columns at ..
// at + 3, and the first lane of each eight its group's scale. Spliced in at a
// QUANT4_PUT marker of a kernel that binds XQ (array<u32>) and splices quant4.wgsl.
// Every lane calls it (quant4 holds barriers); `live`: the lane's columns exist.
fn quant4_put(v: vec4<f32>, lid: u32, row: u32, cols: u32, at: u32, live: bool) {
    let q = quant4(v, lid);
    let words = cols / 16u;
    let qb = row * (words + (cols / 32u + 3u) / 4u) * 4u;   // the row's block, u32s
    if (live) {
        XQ[qb + at / 4u] = q.codes;
        if ((lid & 7u) == 0u) { XQ[qb + 4u * words + at / 32u] = bitcast<u32>(q.d); }
    }
}
