// Decoding of one stored matrix (binding $W, CMF dtype $DTYPE) as its functions
// $W_tile (32 weights of tile g of row r, cols % 32 == 0), $W_elem (one weight, any
// shape) and $W_rowscale (the per-row factor applied after the dot product). Layouts:
// docs/cmf-format.md section 7. R and C are the part's rows and cols.

fn $W_u32(i: u32) -> u32 { return $W[i >> 2u][i & 3u]; }
fn $W_byte(b: u32) -> u32 { return ($W_u32(b >> 2u) >> ((b & 3u) * 8u)) & 0xffu; }
fn $W_sbyte(b: u32) -> f32 { return f32((i32($W_byte(b)) << 24u) >> 24u); }
fn $W_half(b: u32) -> f32 {   // f16 at an even byte offset
    return unpack2x16float(($W_u32(b >> 2u) >> ((b & 2u) * 8u)) & 0xffffu).x;
}
fn $W_word_at(b: u32) -> u32 {  // 4 bytes at an even byte offset
    let w = $W_u32(b >> 2u);
    if ((b & 2u) == 0u) { return w; }
    return (w >> 16u) | ($W_u32((b >> 2u) + 1u) << 16u);
}
fn $W_code(b0: u32, g: u32) -> u32 {  // 5-bit ladder code of tile g, LSB-first
    let bit = 5u * g;
    let b = b0 + (bit >> 3u);
    let v = $W_byte(b) | ($W_byte(b + 1u) << 8u);
    return (v >> (bit & 7u)) & 31u;
}

fn $W_rowscale(r: u32, R: u32, C: u32) -> f32 {
    switch ($DTYPE) {
        case 3u, 9u: { return $W_half(R * C + 2u * r); }   // q8_row, q8_2f
        default: { return 1.0; }
    }
}

fn $W_tile(r: u32, g: u32, R: u32, C: u32) -> array<f32, 32> {
    var w: array<f32, 32>;
    let gpr = C / 32u;
    switch ($DTYPE) {
        case 0u: {   // f32
            let b = (r * C + g * 32u) / 4u;
            for (var k = 0u; k < 8u; k++) {
                let v = $W[b + k];
                w[4u*k] = bitcast<f32>(v.x); w[4u*k+1u] = bitcast<f32>(v.y);
                w[4u*k+2u] = bitcast<f32>(v.z); w[4u*k+3u] = bitcast<f32>(v.w);
            }
        }
        case 1u: {   // f16
            let b = (r * C + g * 32u) / 8u;
            for (var k = 0u; k < 4u; k++) {
                let v = $W[b + k];
                let a0 = unpack2x16float(v.x); let a1 = unpack2x16float(v.y);
                let a2 = unpack2x16float(v.z); let a3 = unpack2x16float(v.w);
                w[8u*k] = a0.x; w[8u*k+1u] = a0.y; w[8u*k+2u] = a1.x; w[8u*k+3u] = a1.y;
                w[8u*k+4u] = a2.x; w[8u*k+5u] = a2.y; w[8u*k+6u] = a3.x; w[8u*k+7u] = a3.y;
            }
        }
        case 2u: {   // bf16
            let b = (r * C + g * 32u) / 8u;
            for (var k = 0u; k < 4u; k++) {
                let v = $W[b + k];
                for (var j = 0u; j < 4u; j++) {
                    w[8u*k+2u*j] = bitcast<f32>(v[j] << 16u);
                    w[8u*k+2u*j+1u] = bitcast<f32>(v[j] & 0xffff0000u);
                }
            }
        }
        case 3u, 9u: {   // q8_row, q8_2f (int8 codes; q8_2f's column factors here)
            let b = (r * C + g * 32u) / 16u;
            for (var k = 0u; k < 2u; k++) {
                let v = $W[b + k];
                for (var j = 0u; j < 4u; j++) {
                    let u = v[j];
                    w[16u*k+4u*j] = f32((i32(u) << 24u) >> 24u);
                    w[16u*k+4u*j+1u] = f32((i32(u) << 16u) >> 24u);
                    w[16u*k+4u*j+2u] = f32((i32(u) << 8u) >> 24u);
                    w[16u*k+4u*j+3u] = f32(i32(u) >> 24u);
                }
            }
            if ($DTYPE == 9u) {
                let cb = R * C + 2u * R + 2u * g * 32u;
                for (var e = 0u; e < 32u; e++) { w[e] = w[e] * $W_half(cb + 2u * e); }
            }
        }
        case 4u, 11u, 15u: {   // q4_block, q4_tiled, q4tp: nibbles, element 2k low
            let gi = r * gpr + g;
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
                let code = $W_code(pb + 4u * R + r * ((5u * gpr + 7u) / 8u), g);
                s = exp2(lh.x + f32(code) * lh.y);
            }
            for (var j = 0u; j < 4u; j++) {
                let u = v[j];
                for (var e = 0u; e < 8u; e++) {
                    w[8u*j+e] = (f32((u >> (4u * e)) & 15u) - 8.0) * s;
                }
            }
        }
        case 16u: {   // q2tp: four values a byte, LSB-first; code 0 is an all-zero tile
            let gi = r * gpr + g;
            let pb = R * gpr * 8u;
            let lh = unpack2x16float($W_u32(pb / 4u + r));
            let code = $W_code(pb + 4u * R + r * ((5u * gpr + 7u) / 8u), g);
            var s = 0.0;
            if (code > 0u) { s = exp2(lh.x + f32(code - 1u) * lh.y); }
            for (var j = 0u; j < 2u; j++) {
                let u = $W_u32(2u * gi + j);
                for (var e = 0u; e < 16u; e++) {
                    w[16u*j+e] = (f32((u >> (2u * e)) & 3u) - 1.5) * s;
                }
            }
        }
        default: {}
    }
    return w;
}

fn $W_elem(r: u32, c: u32, R: u32, C: u32) -> f32 {
    let n = r * C + c;
    switch ($DTYPE) {
        case 0u: { return bitcast<f32>($W_u32(n)); }
        case 1u: { return $W_half(2u * n); }
        case 2u: { return bitcast<f32>((($W_u32(n >> 1u) >> ((n & 1u) * 16u)) & 0xffffu) << 16u); }
        case 3u: { return $W_sbyte(n); }
        case 9u: { return $W_sbyte(n) * $W_half(R * C + 2u * R + 2u * c); }
        case 4u, 11u: {
            let gi = n / 32u;
            let k = n % 32u;
            var b = 16u * gi + k / 2u;
            var s = 0.0;
            if ($DTYPE == 4u) { s = $W_half(16u * ((R * C + 31u) / 32u) + 2u * gi); }
            else { b = 18u * gi + 2u + k / 2u; s = $W_half(18u * gi); }
            return (f32(($W_byte(b) >> ((k & 1u) * 4u)) & 15u) - 8.0) * s;
        }
        default: {   // the tiled dtypes: decode the tile
            let t = $W_tile(r, c / 32u, R, C);
            return t[c % 32u];
        }
    }
}

