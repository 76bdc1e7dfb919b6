// Four consecutive columns of an input quantized as the CPU's int8 activations are (per
// 32 columns: d = max|x| / 127, q = round-half-even(x * 127 / max|x|), a non-finite
// maximum giving d = max and q = 0), spliced in at a QUANT4 marker of a kernel that runs
// 256 lanes a workgroup and declares `red` (at least 256 floats) in shared memory. Lane
// l holds columns 4l .. 4l + 3 of a 1024-column round, so a 32-column group is eight
// neighbouring lanes, which meet in `red` for the group's largest magnitude. Every lane
// calls it (it holds barriers): the packed codes and the group's d.
struct Quant4 { codes: u32, d: f32 }

fn quant4(v: vec4<f32>, lid: u32) -> Quant4 {
    let a = abs(v);
    red[lid] = max(max(a.x, a.y), max(a.z, a.w));
    workgroupBarrier();
    let g0 = lid & ~7u;
    var m = red[g0];
    for (var j = 1u; j < 8u; j++) { m = max(m, red[g0 + j]); }
    workgroupBarrier();
    let finite = m <= 3.4028234e38;
    var id = 0.0;
    if (finite && m > 0.0) { id = 127.0 / m; }
    return Quant4(pack4xI8(vec4<i32>(round(v * id))), select(m, m / 127.0, finite));
}
