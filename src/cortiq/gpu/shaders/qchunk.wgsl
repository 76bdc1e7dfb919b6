// ---- the decode matvec's chunks: 16 payload bytes (f32 4, f16/bf16 8, int8 16 values)
// or one 32-weight tile (the 4- and 2-bit dtypes), read as whole words by consecutive
// lanes. $W_mac4 feeds four weights at columns c..c+3 to mac() (matvec1.wgsl).
fn $W_cpr(C: u32) -> u32 {
    switch ($DTYPE) {
        case 0u: { return C / 4u; }
        case 1u, 2u: { return C / 8u; }
        case 3u, 9u: { return C / 16u; }
        default: { return C / 32u; }
    }
}

fn $W_q8x4(u: u32) -> vec4<f32> {
    return vec4<f32>(f32((i32(u) << 24u) >> 24u), f32((i32(u) << 16u) >> 24u),
                     f32((i32(u) << 8u) >> 24u), f32(i32(u) >> 24u));
}
fn $W_n8(u: u32, s: f32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(
        vec4<f32>(f32(u & 15u), f32((u >> 4u) & 15u), f32((u >> 8u) & 15u), f32((u >> 12u) & 15u)) * s - 8.0 * s,
        vec4<f32>(f32((u >> 16u) & 15u), f32((u >> 20u) & 15u), f32((u >> 24u) & 15u), f32(u >> 28u)) * s - 8.0 * s);
}

fn $W_chunk(r: u32, k: u32, R: u32, C: u32) {
    switch ($DTYPE) {
        case 0u: {
            let v = $W[(r * C) / 4u + k];
            mac4(bitcast<vec4<f32>>(v), 4u * k);
        }
        case 1u: {
            let v = $W[(r * C) / 8u + k];
            let c = 8u * k;
            mac4(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)), c);
            mac4(vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)), c + 4u);
        }
        case 2u: {
            let v = $W[(r * C) / 8u + k];
            let c = 8u * k;
            let lo = bitcast<vec4<f32>>(v << vec4<u32>(16u));
            let hi = bitcast<vec4<f32>>(v & vec4<u32>(0xffff0000u));
            mac4(vec4<f32>(lo.x, hi.x, lo.y, hi.y), c);
            mac4(vec4<f32>(lo.z, hi.z, lo.w, hi.w), c + 4u);
        }
        case 3u, 9u: {
            let v = $W[(r * C) / 16u + k];
            let c = 16u * k;
            var a = $W_q8x4(v.x); var b = $W_q8x4(v.y); var d = $W_q8x4(v.z); var e = $W_q8x4(v.w);
            if ($DTYPE == 9u) {
                let cb = R * C + 2u * R + 2u * c;
                a = a * vec4<f32>($W_half(cb), $W_half(cb + 2u), $W_half(cb + 4u), $W_half(cb + 6u));
                b = b * vec4<f32>($W_half(cb + 8u), $W_half(cb + 10u), $W_half(cb + 12u), $W_half(cb + 14u));
                d = d * vec4<f32>($W_half(cb + 16u), $W_half(cb + 18u), $W_half(cb + 20u), $W_half(cb + 22u));
                e = e * vec4<f32>($W_half(cb + 24u), $W_half(cb + 26u), $W_half(cb + 28u), $W_half(cb + 30u));
            }
            mac4(a, c); mac4(b, c + 4u); mac4(d, c + 8u); mac4(e, c + 12u);
        }
        case 4u, 11u, 15u: {
            let gpr = C / 32u;
            let gi = r * gpr + k;
            var s = 0.0;
            var v: vec4<u32>;
            if ($DTYPE == 4u) {
                v = $W[gi];
                s = $W_half(R * C / 2u + 2u * gi);
            } else if ($DTYPE == 11u) {
                let b = 18u * gi;
                s = $W_half(b);
                v = vec4<u32>($W_word_at(b + 2u), $W_word_at(b + 6u), $W_word_at(b + 10u),
                              $W_word_at(b + 14u));
            } else {
                v = $W[gi];
                let pb = R * gpr * 16u;
                let lh = unpack2x16float($W_u32(pb / 4u + r));
                let code = $W_code(pb + 4u * R + r * ((5u * gpr + 7u) / 8u), k);
                s = exp2(lh.x + f32(code) * lh.y);
            }
            let c = 32u * k;
            let a = $W_n8(v.x, s); mac4(a[0], c); mac4(a[1], c + 4u);
            let b = $W_n8(v.y, s); mac4(b[0], c + 8u); mac4(b[1], c + 12u);
            let d = $W_n8(v.z, s); mac4(d[0], c + 16u); mac4(d[1], c + 20u);
            let e = $W_n8(v.w, s); mac4(e[0], c + 24u); mac4(e[1], c + 28u);
        }
        case 16u: {
            let gpr = C / 32u;
            let gi = r * gpr + k;
            let pb = R * gpr * 8u;
            let lh = unpack2x16float($W_u32(pb / 4u + r));
            let code = $W_code(pb + 4u * R + r * ((5u * gpr + 7u) / 8u), k);
            var s = 0.0;
            if (code > 0u) { s = exp2(lh.x + f32(code - 1u) * lh.y); }
            let c = 32u * k;
            for (var j = 0u; j < 2u; j++) {
                let u = $W_u32(2u * gi + j);
                for (var q = 0u; q < 4u; q++) {
                    let y = u >> (8u * q);
                    mac4((vec4<f32>(f32(y & 3u), f32((y >> 2u) & 3u), f32((y >> 4u) & 3u),
                                    f32((y >> 6u) & 3u)) - 1.5) * s, c + 16u * j + 4u * q);
                }
            }
        }
        default: {}
    }
}

// Chunks k, k + s, k + 2s, k + 3s of row r: for q8_row the four 16-byte loads are all
// issued before the first is decoded (more of a lane's reads in flight); the other
// dtypes go through $W_chunk one at a time.
fn $W_chunk4(r: u32, k: u32, s: u32, R: u32, C: u32) {
    if ($DTYPE == 3u) {
        let b = (r * C) / 16u;
        let v = array<vec4<u32>, 4>($W[b + k], $W[b + k + s], $W[b + k + 2u * s],
                                    $W[b + k + 3u * s]);
        for (var j = 0u; j < 4u; j++) {
            let c = 16u * (k + j * s);
            mac4($W_q8x4(v[j].x), c); mac4($W_q8x4(v[j].y), c + 4u);
            mac4($W_q8x4(v[j].z), c + 8u); mac4($W_q8x4(v[j].w), c + 12u);
        }
        return;
    }
    $W_chunk(r, k, R, C);
    $W_chunk(r, k + s, R, C);
    $W_chunk(r, k + 2u * s, R, C);
    $W_chunk(r, k + 3u * s, R, C);
}
