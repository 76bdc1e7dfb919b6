#!/usr/bin/env bash
# Cross-build the whole extension (setup.py build_ext: Cython module + every csrc/ file
# with its per-ISA flags) for linux-aarch64 with the cross compiler, into a temporary
# directory, and check what came out: an AArch64 shared object that holds the neon and
# neon_dotprod tables and no x86 code. (It cannot be imported here: that needs an arm64
# Python; the kernels themselves are proven by run.sh under qemu.)
#
#   tests/arm64/cross_build.sh        exit 0: built and checked; 77: no cross toolchain
# Needs the build requirements (Cython, numpy, setuptools) in the running python.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-python3}"
CC="${CC:-aarch64-linux-gnu-gcc}"
READELF="${READELF:-aarch64-linux-gnu-readelf}"
if ! command -v "$CC" >/dev/null || ! command -v "$READELF" >/dev/null; then
    echo "skip: no AArch64 cross toolchain ($CC, $READELF)"
    exit 77
fi
OUT="$(mktemp -d /tmp/cortiq-xbuild.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
cd "$ROOT"
# _PYTHON_HOST_PLATFORM: the target setup.py chooses the ISA files for (and sysconfig's)
_PYTHON_HOST_PLATFORM=linux-aarch64 CC="$CC" LDSHARED="$CC -shared" \
    "$PY" setup.py build_ext --build-lib "$OUT/lib" --build-temp "$OUT/tmp" >"$OUT/log" 2>&1 ||
    { tail -30 "$OUT/log"; echo "FAIL: the aarch64 cross build failed"; exit 1; }
so="$(find "$OUT/lib" -name '_kernels*.so' | head -1)"
[ -n "$so" ] || { echo "FAIL: no extension module built"; exit 1; }
"$READELF" -h "$so" | grep -q 'Machine:.*AArch64' || { echo "FAIL: $so is not AArch64"; exit 1; }
for name in neon neon_dotprod; do
    grep -qa "$name" "$so" || { echo "FAIL: table $name missing from $so"; exit 1; }
done
if grep -E -q '_avx2|_avx512' <(ls "$OUT"/tmp/csrc/*/ 2>/dev/null); then
    echo "FAIL: x86 sources were compiled for aarch64"; exit 1
fi
grep -q -- '-march=armv8.2-a+dotprod' "$OUT/log" || { echo "FAIL: the dotprod file did not get its flags"; exit 1; }
echo "OK: $(basename "$so") for AArch64 ($(du -k "$so" | cut -f1) KiB) with the neon and neon_dotprod tables"
