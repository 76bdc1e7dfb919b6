"""Writes quant_vectors.json: byte vectors for q4tp, q2tp, vbit and vbit_ro worked out by
hand from docs/cmf-format.md §7.6 and §7.8 (and the width rule of §7.6).

The inputs are chosen so that every scale is a power of two times an f16-exact value and
every ladder is exact (lo an integer; step 0, or step 1 in the decode-only vectors), so
each quantization decision can be done on paper; the integer codes below are those paper
results, written out literally with the reasoning beside them. This script only packs
them into bytes (bit order per the spec) and formats the file: Python's standard library
alone (struct's 'e' is IEEE binary16), nothing from cortiq or numpy.
Run: python tests/data/make_quant_vectors.py > tests/data/quant_vectors.json
"""
import json
import struct

E = 2.0 ** -14


def f16(*v):
    return b"".join(struct.pack("<e", x) for x in v)


def codes5(codes):
    acc = 0
    for g, c in enumerate(codes):
        acc |= c << (5 * g)
    return acc.to_bytes(-(-5 * len(codes) // 8), "little")


def nibbles(vals):            # 32 nibbles -> 16 bytes, element 2k low
    return bytes(vals[2 * k] | (vals[2 * k + 1] << 4) for k in range(16))


def twobit(vals):             # 32 values -> 8 bytes, element 4k+j at bits 2j
    return bytes(sum(vals[4 * k + j] << (2 * j) for j in range(4)) for k in range(8))


def msb_row(us, b):
    acc, n = 0, 0
    for u in us:
        acc, n = (acc << b) | u, n + b
    pad = -n % 8
    return (acc << pad).to_bytes((n + pad) // 8, "big")


def tile(pairs):              # {index: value}, the rest 0
    out = [0.0] * 32
    for i, v in pairs.items():
        out[i] = v
    return out


vectors = []

# ---------------- q4tp, encoder + decoder: rows 3, cols 64 (gpr 2, S 2)
# row 0: both tiles absmax 0.875 = 7 * 2^-3 -> lg -3 -> lo -3, step f16(0/31) = 0 (no bump:
#        -3 + 0 >= -3), codes 0, 0; t[0] = exp2f(-3) = 0.125. nibble = rne(w * 8) + 8:
#        0.875 -> 7 -> 15; -0.875 -> -7 -> 1; 0.0625 -> 0.5 -> 0 -> 8 (tie to even);
#        0.1875 -> 1.5 -> 2 -> 10; -0.0625 -> -0.5 -> -0 -> 8; -0.1875 -> -1.5 -> -2 -> 6;
#        0.3125 -> 2.5 -> 2 -> 10; 0.125 -> 1 -> 9; 0 -> 8.
# row 1: all zero -> lo 0, step 0, codes 0; t[0] = 1; every nibble rne(0) + 8 = 8 (0x88).
# row 2: tile 0 zero (code 0, left out of the range); tile 1 absmax 3.5 * 2^-14:
#        /7 = 2^-15, f16 2^-15 (subnormal) floored to 2^-14 -> lg -14 -> lo -14, step 0;
#        t[0] = 2^-14: 2^-13 -> 2 -> 10; -3 * 2^-14 -> -3 -> 5; 3.5 * 2^-14 -> 4 (tie) -> 12.
q4_r0t0 = tile({0: 0.875, 1: -0.875, 2: 0.0625, 3: 0.1875, 4: -0.0625, 5: -0.1875,
                6: 0.3125, 7: 0.125})
q4_r0t1 = tile({10: -0.875, 31: 0.3125})
q4_r2t1 = tile({0: 2 * E, 1: -3 * E, 2: 3.5 * E})
n_r0t0 = [15, 1, 8, 10, 8, 6, 10, 9] + [8] * 24
n_r0t1 = [8] * 10 + [1] + [8] * 20 + [10]
n_r2t1 = [10, 5, 12] + [8] * 29
w = [q4_r0t0 + q4_r0t1, [0.0] * 64, [0.0] * 32 + q4_r2t1]
body = nibbles(n_r0t0) + nibbles(n_r0t1) + nibbles([8] * 32) * 2 + nibbles([8] * 32) + \
    nibbles(n_r2t1)
params = f16(-3, 0) + f16(0, 0) + f16(-14, 0)
codes = codes5([0, 0]) * 3
dec = [[(n - 8) * 0.125 for n in n_r0t0 + n_r0t1], [0.0] * 64,
       [0.0] * 32 + [(n - 8) * E for n in n_r2t1]]
vectors.append({"dtype": "q4tp", "shape": [3, 64], "input": w, "encode": True,
                "bytes": (body + params + codes).hex(), "decoded": dec})

# ---------------- q4tp, decoder only: rows 1, cols 128 (gpr 4, S 3): lo -3, step 1
# (exact ladder t[c] = 2^(c-3)), codes 31, 5, 0, 17 (code 1 and code 3 straddle bytes);
# nibbles of tile g: k -> (k + 3g) % 16.
cs = [31, 5, 0, 17]
nb = [[(k + 3 * g) % 16 for k in range(32)] for g in range(4)]
body = b"".join(nibbles(n) for n in nb)
dec = [[(nb[g][k] - 8) * 2.0 ** (cs[g] - 3) for g in range(4) for k in range(32)]]
vectors.append({"dtype": "q4tp", "shape": [1, 128], "encode": False,
                "bytes": (body + f16(-3, 1) + codes5(cs)).hex(), "decoded": dec})

# ---------------- q2tp, encoder + decoder: rows 3, cols 64
# row 0: both tiles absmax 0.1875 = 1.5 * 2^-3 -> lg -3 -> lo -3, step f16(0/30) = 0,
#        codes 1 + rne(0) = 1; s = t[0] = 0.125; v = rne(w * 8 + 1.5) clamped to 0..3:
#        0.1875 -> 3; -0.1875 -> 0; 0 -> rne(1.5) = 2; 0.0625 -> 2; -0.0625 -> 1;
#        0.125 -> rne(2.5) = 2; -0.125 -> rne(0.5) = 0; 0.03125 -> rne(1.75) = 2;
#        -0.03125 -> rne(1.25) = 1.
# row 1: all zero -> lo 0, step 0, codes 0, values 0 (bytes 00); decodes (0 - 1.5) * 0.
# row 2: tile 0 zero (code 0, values 0); tile 1 absmax 2^-14: /1.5 below 2^-14 -> floored
#        -> lg -14, lo -14, step 0, code 1, s = 2^-14: 2^-14 -> rne(2.5) = 2;
#        -2^-15 -> rne(1) = 1; 2^-15 -> rne(2) = 2; 0 -> 2.
q2_r0t0 = tile({0: 0.1875, 1: -0.1875, 2: 0.0, 3: 0.0625, 4: -0.0625, 5: 0.125, 6: -0.125,
                7: 0.03125, 8: -0.03125})
q2_r0t1 = tile({3: -0.1875, 30: 0.1875})
q2_r2t1 = tile({0: E, 1: -E / 2, 2: E / 2})
v_r0t0 = [3, 0, 2, 2, 1, 2, 0, 2, 1] + [2] * 23
v_r0t1 = [2, 2, 2, 0] + [2] * 26 + [3, 2]
v_r2t1 = [2, 1, 2] + [2] * 29
w = [q2_r0t0 + q2_r0t1, [0.0] * 64, [0.0] * 32 + q2_r2t1]
body = twobit(v_r0t0) + twobit(v_r0t1) + twobit([0] * 32) * 3 + twobit(v_r2t1)
params = f16(-3, 0) + f16(0, 0) + f16(-14, 0)
codes = codes5([1, 1]) + codes5([0, 0]) + codes5([0, 1])
dec = [[(v - 1.5) * 0.125 for v in v_r0t0 + v_r0t1], [-0.0] * 64,
       [-0.0] * 32 + [(v - 1.5) * E for v in v_r2t1]]
vectors.append({"dtype": "q2tp", "shape": [3, 64], "input": w, "encode": True,
                "bytes": (body + params + codes).hex(), "decoded": dec})

# ---------------- q2tp, decoder only: rows 1, cols 128: lo -3, step 1, codes 31, 5, 0, 17;
# s = t[code - 1] = 2^(code - 4), 0 for code 0; values of tile g: k -> (k + g) % 4.
vv = [[(k + g) % 4 for k in range(32)] for g in range(4)]
body = b"".join(twobit(v) for v in vv)
dec = [[(vv[g][k] - 1.5) * (0.0 if cs[g] == 0 else 2.0 ** (cs[g] - 4))
        for g in range(4) for k in range(32)]]
vectors.append({"dtype": "q2tp", "shape": [1, 128], "encode": False,
                "bytes": (body + f16(-3, 1) + codes5(cs)).hex(), "decoded": dec})

# ---------------- vbit / vbit_ro, encoder + decoder: rows 3, cols 32
# widths: a = log2(absmax) = [log2 31.75, log2 0.75, log2 0.75] = [4.989, -0.415, -0.415],
# mean 1.386; raw = 4.25 + a - mean = [7.85, 2.45, 2.45] -> levels 8, 3, 3.
# row 0 (b 8, L 127): scale f16(31.75 / 127) = 0.25; u = rne(w * 4) + 127: 31.75 -> 254;
#        -31.75 -> 0; 0.125 -> rne(0.5) = 0 -> 127; 0.375 -> 2 -> 129; -0.375 -> 125;
#        0.625 -> rne(2.5) = 2 -> 129; 0 -> 127.
# rows 1, 2 (b 3, L 3): scale 0.75 / 3 = 0.25; u = rne(w * 4) + 3: 0.75 -> 6; -0.75 -> 0;
#        0.125 -> 3; 0.375 -> 5; -0.375 -> 1; 0.5 -> 5; -0.25 -> 2; 0 -> 3.
r0 = tile({0: 31.75, 1: -31.75, 2: 0.125, 3: 0.375, 4: -0.375, 5: 0.625})
u0 = [254, 0, 127, 129, 125, 129] + [127] * 26
r1 = tile({0: 0.75, 1: -0.75, 2: 0.125, 3: 0.375, 4: -0.375, 5: 0.5, 6: -0.25})
u1 = [6, 0, 3, 5, 1, 5, 2] + [3] * 25
r2 = tile({7: -0.75, 8: 0.375, 31: 0.75})
u2 = [3] * 7 + [0, 5] + [3] * 22 + [6]
rows = [msb_row(u0, 8), msb_row(u1, 3), msb_row(u2, 3)]
head = bytes([8, 3, 3]) + f16(0.25, 0.25, 0.25)
offs = struct.pack("<4I", 0, len(rows[0]), len(rows[0]) + len(rows[1]), sum(map(len, rows)))
dec = [[(u - 127) * 0.25 for u in u0], [(u - 3) * 0.25 for u in u1],
       [(u - 3) * 0.25 for u in u2]]
for dt, extra in (("vbit", b""), ("vbit_ro", offs)):
    vectors.append({"dtype": dt, "shape": [3, 32], "input": [r0, r1, r2], "encode": True,
                    "bytes": (head + extra + b"".join(rows)).hex(), "decoded": dec})

# ---------------- vbit / vbit_ro, one row: cols 64, width 4.25 + 0 -> 4 (L 7)
# group 0 absmax 3.5 * 2^-14: /7 = 2^-15, floored to 2^-14; u = rne(w / 2^-14) + 7:
#        3.5 * 2^-14 -> 4 (tie) -> 11; -2^-14 -> 6; 2^-15 -> rne(0.5) = 0 -> 7;
#        1.5 * 2^-14 -> 2 -> 9; -2.5 * 2^-14 -> -2 -> 5.
# group 1 all zero: scale floored to 2^-14, every u 7.
g0 = tile({0: 3.5 * E, 1: -E, 2: E / 2, 3: 1.5 * E, 4: -2.5 * E})
u = [11, 6, 7, 9, 5] + [7] * 27 + [7] * 32
row = msb_row(u, 4)
head = bytes([4]) + f16(E, E)
for dt, extra in (("vbit", b""), ("vbit_ro", struct.pack("<2I", 0, len(row)))):
    vectors.append({"dtype": dt, "shape": [1, 64], "input": [g0 + [0.0] * 32], "encode": True,
                    "bytes": (head + extra + row).hex(), "decoded": [[(x - 7) * E for x in u]]})

print(json.dumps({
    "note": "Computed by hand from docs/cmf-format.md §7.6 (vbit, vbit_ro, the writer's "
            "width rule) and §7.8 (q4tp, q2tp): inputs chosen so that every scale and "
            "ladder rung is exact, quantization decisions worked on paper (see "
            "tests/data/make_quant_vectors.py, which lists them and packs the bytes with "
            "the Python standard library). 'encode': the writer must produce these bytes "
            "from 'input'; every vector: readers must decode 'bytes' to 'decoded'.",
    "vectors": vectors}, indent=1))
