#!/usr/bin/env bash
# Build cortiq's wheel, repair it with auditwheel when available, install it into a
# fresh virtual environment outside the source tree and run the tests there, twice
# (detected ISA, then CORTIQ_ISA=ref).
#
#   bash wheels/build_and_test.sh [OUT_DIR]      (default: wheelhouse/)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/wheelhouse}"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

echo "== building the wheel"
start=$(date +%s)
"$PY" -m pip wheel --no-deps -w "$WORK/raw" "$ROOT"
echo "   built in $(( $(date +%s) - start )) s"
raw="$(ls "$WORK"/raw/cortiq-*.whl)"

if "$PY" -m auditwheel --version >/dev/null 2>&1; then
    echo "== auditwheel repair"
    "$PY" -m auditwheel repair -w "$OUT" "$raw" || { echo "   repair failed; keeping the raw wheel"; cp "$raw" "$OUT/"; }
else
    echo "== auditwheel not installed: keeping the raw linux wheel (pip install auditwheel to repair)"
    cp "$raw" "$OUT/"
fi
wheel="$(ls -t "$OUT"/cortiq-*.whl | head -1)"
echo "   $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"

echo "== fresh venv + install"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --upgrade pip
"$WORK/venv/bin/python" -m pip install -q "$wheel[test]"
"$WORK/venv/bin/python" -c "import cortiq; cortiq.show_config()"

echo "== tests on the installed wheel"
"$WORK/venv/bin/python" "$ROOT/wheels/run_tests.py" "$ROOT/tests"
