#!/usr/bin/env bash
# Run the GPU checks and benchmark on a machine with a GPU, from a checkout that carries
# the Vulkan loader .debs in .gl/, the wgpu wheels in .whl/ and the source in .gpu/src
# (see docs/gpu.md, "Measuring on a GPU"). Results go to $OUT (default ./gpu-out).
set -uo pipefail
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
(cd "$SRC" && python3 -m pip install -q --no-build-isolation --no-deps . ) > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }
echo "built cortiq in $(( $(date +%s) - t0 )) s"
cd /tmp
python3 -c "import cortiq; cortiq.show_config()"
PYTHONUNBUFFERED=1 python3 "$SRC/tools/gpu_check.py" 2>&1 | tee "$OUT/check.txt"
PYTHONUNBUFFERED=1 python3 "$SRC/benchmarks/bench_gpu.py" --cache /tmp/cortiq-bench "$@" \
    > "$OUT/bench_gpu.json" 2> "$OUT/bench_gpu.err"
cat "$OUT/bench_gpu.json"; tail -5 "$OUT/bench_gpu.err"
