#!/usr/bin/env bash
# Cross-compile csrc/ for AArch64 (the ref table plus the neon and neon_dotprod twins,
# each file with the flags setup.py gives it) together with tests/arm64/kernel_check.c,
# and run the checker under qemu-aarch64 twice: on a CPU with the dot product extension
# (both tables tested, neon_dotprod chosen) and on a Cortex-A53 without it (neon only,
# and dispatch must not offer neon_dotprod). Natively on an arm64 Linux machine it
# runs the binary directly (the CPU decides which tables it covers).
#
#   tests/arm64/run.sh [SEED]      exit 0: every check passed; 77: no cross toolchain
# Environment: CC (default aarch64-linux-gnu-gcc, or cc on an arm64 host), QEMU
# (default qemu-aarch64), BUILD (default a temporary directory).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SEED="${1:-20261201}"
native=0
case "$(uname -m)" in aarch64|arm64) native=1 ;; esac
CC="${CC:-$([ $native = 1 ] && echo cc || echo aarch64-linux-gnu-gcc)}"
QEMU="${QEMU:-qemu-aarch64}"
if ! command -v "$CC" >/dev/null; then echo "skip: no AArch64 C compiler ($CC)"; exit 77; fi
if [ $native = 0 ] && ! command -v "$QEMU" >/dev/null; then echo "skip: no $QEMU"; exit 77; fi
BUILD="${BUILD:-$(mktemp -d /tmp/cortiq-arm64.XXXXXX)}"
mkdir -p "$BUILD"
# the flags of setup.py (BuildKernels): no FMA contraction, so ref computes what it says
COMMON=(-O3 -std=gnu11 -ffp-contract=off -fno-math-errno -fvisibility=hidden -Wall -Wno-unused-function
        -I"$ROOT/csrc" -DCORTIQ_HAVE_NEON=1 -DCORTIQ_HAVE_NEON_DOTPROD=1)
objs=()
for src in "$ROOT"/csrc/*.c "$ROOT"/csrc/*/*.c; do
    case "$src" in
        *_avx2.c|*_avx512.c) continue ;;
        *_neon_dotprod.c) isa=(-march=armv8.2-a+dotprod) ;;
        *) isa=(-march=armv8-a) ;;
    esac
    obj="$BUILD/$(basename "${src%.c}").o"
    rm -f "$obj" # (a failed compile must not leave an old object to link)
    "$CC" "${COMMON[@]}" "${isa[@]}" -c "$src" -o "$obj" &
    objs+=("$obj")
    # two compilers at a time (shared machines)
    if (( ${#objs[@]} % 2 == 0 )); then wait; fi
done
wait
"$CC" "${COMMON[@]}" -march=armv8-a -O2 -c "$ROOT/tests/arm64/kernel_check.c" -o "$BUILD/kernel_check.o"
static=(-static)
[ $native = 1 ] && static=()
"$CC" ${static[@]+"${static[@]}"} -o "$BUILD/kernel_check" "$BUILD/kernel_check.o" "${objs[@]}" -lm -pthread
echo "built $BUILD/kernel_check"
if [ $native = 1 ]; then
    "$BUILD/kernel_check" "$SEED"
else
    echo "== qemu-aarch64 -cpu max (with the dot product extension)"
    "$QEMU" -cpu max "$BUILD/kernel_check" "$SEED" dotprod
    echo "== qemu-aarch64 -cpu cortex-a53 (armv8.0: no dot product)"
    "$QEMU" -cpu cortex-a53 "$BUILD/kernel_check" "$((SEED + 1))" nodotprod
fi
