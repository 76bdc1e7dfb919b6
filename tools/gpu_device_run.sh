#!/usr/bin/env bash
# Run the GPU checks and benchmark on a machine with a GPU, from a checkout that carries
# the Vulkan loader .debs in .gl/, the wgpu wheels in .whl/ and the source in .gpu/src
# (see docs/gpu.md, "Measuring on a GPU"), optionally a cortiq wheel for the machine's
# Python 3.12 in .gpu/ (installed instead of building the source there). Results go to $OUT (default ./gpu-out):
# check.txt (GPU against CPU logits, every architecture the GPU runs), bench_gpu.json
# (written after each part of the benchmark, so a run cut short keeps what it measured),
# timing.txt (seconds each step took). Each step has its own time limit so that the
# whole run ends within 8 minutes; extra arguments go to bench_gpu.py.
set -uo pipefail
start=$(date +%s)
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
if ! ldconfig -p | grep -q libvulkan; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
SRC="$PWD/.gpu/src"
t0=$(date +%s)
# a cortiq wheel built elsewhere for this Python (.gpu/cortiq-*.whl, or the one
# CORTIQ_WHEEL names) saves the compile
wheel=${CORTIQ_WHEEL:-$(ls .gpu/cortiq-*-cp312-*.whl 2>/dev/null | head -1)}
if [ -n "$wheel" ]; then
    python3 -m pip install -q --no-index --no-deps --force-reinstall "$wheel"
else
    (cd "$SRC" && python3 -m pip install -q --no-build-isolation --no-deps . )
fi > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" | tee "$OUT/timing.txt"
cd /tmp
python3 -c "import cortiq; cortiq.show_config()"
t0=$(date +%s)
PYTHONUNBUFFERED=1 timeout 150 python3 "$SRC/tools/gpu_check.py" 2>&1 | tee "$OUT/check.txt"
echo "check $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timing.txt"
t0=$(date +%s)
budget=$(( 440 - $(date +%s) + start ))   # what is left of ~7.5 minutes, at least 60 s
[ "$budget" -lt 60 ] && budget=60
PYTHONUNBUFFERED=1 timeout "$budget" python3 "$SRC/benchmarks/bench_gpu.py" \
    --cache /tmp/cortiq-bench --tokens 64 --no-torch --out "$OUT/bench_gpu.json" "$@" \
    > /dev/null 2> "$OUT/bench_gpu.err"
rc=$?
echo "bench $(( $(date +%s) - t0 )) s (limit ${budget} s, rc $rc)" | tee -a "$OUT/timing.txt"
cat "$OUT/bench_gpu.json"; tail -5 "$OUT/bench_gpu.err"
