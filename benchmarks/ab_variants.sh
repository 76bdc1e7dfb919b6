#!/usr/bin/env bash
# ab_variants.sh -- compare builds of the AVX2 matvec table in one process.
#
#   benchmarks/ab_variants.sh DTYPE ROWSxCOLS MODE ROUNDS THREADS NAME "FLAGS" [NAME "FLAGS" ...]
#   e.g. benchmarks/ab_variants.sh q8_row 4096x4096 matvec 10 1 now "" lanes16k "-DCQ_LANE_BYTES=16384"
#   MODE: matvec, or matmat:T (T inputs)
#
# Each variant is csrc/matvec/matvec_avx2.c compiled with its FLAGS (knobs the source
# reads through #ifndef guards, added for the experiment) and its ops renamed, linked
# with the rest of the current build (`python setup.py build_ext --inplace` first).
# The payload comes from cmf.quant.quantize on Gaussian weights. Needs gcc, Linux.
set -euo pipefail
[ $# -ge 7 ] || { sed -n 2,12p "$0"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
dtype=$1 shape=$2 mode=$3 rounds=$4 threads=$5
shift 5
rows=${shape%x*} cols=${shape#*x} t=1
if [[ $mode == matmat:* ]]; then t=${mode#matmat:}; mode=matmat; fi
objs=$(find "$root"/build/temp.*/csrc -name '*.o' 2>/dev/null || true)  # (the built table too: dispatch.o names it)
[ -n "$objs" ] || { echo "no build objects: run python setup.py build_ext --inplace" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
code=$(python - "$dtype" "$rows" "$cols" "$work/payload.bin" <<'PY'
import sys, numpy as np
from cortiq.cmf.quant import quantize
dt, rows, cols, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
codes = {"f32": 0, "f16": 1, "bf16": 2, "q8_row": 3, "q4_block": 4, "q8_2f": 9, "q4_tiled": 11, "q4tp": 15, "q2tp": 16}
if dt not in codes:
    sys.exit(f"dtype {dt!r}: one of {', '.join(codes)}")
w = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
np.asarray(quantize(w, dt)).tofile(out)
print(codes[dt])
PY
)
cflags="-O3 -std=gnu11 -ffp-contract=off -fno-math-errno -Wno-unused-function -mavx2 -mfma -mf16c -pthread"
cflags="$cflags -DCORTIQ_HAVE_AVX2=1 -I$root/csrc"
decl="" list="" names="" vobjs=""
while [ $# -ge 2 ]; do
    name=$1 flags=$2
    shift 2
    # shellcheck disable=SC2086
    gcc $cflags $flags "-Dcq_matvec_avx2=ab_$name" -c "$root/csrc/matvec/matvec_avx2.c" -o "$work/$name.o"
    decl="$decl ab_$name," list="$list &ab_$name," names="$names \"$name\"," vobjs="$vobjs $work/$name.o"
done
# shellcheck disable=SC2086
gcc -O2 -pthread -I"$root/csrc" "-DAB_DECL=${decl%,}" "-DAB_LIST=${list%,}" "-DAB_NAMES=${names%,}" \
    "$root/benchmarks/ab_variants.c" $vobjs $objs -lm -o "$work/ab"
"$work/ab" "$mode" "$code" "$work/payload.bin" "$rows" "$cols" "$rounds" "$threads" "$t"
