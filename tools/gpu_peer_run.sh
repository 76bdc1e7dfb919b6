#!/usr/bin/env bash
# llama.cpp's CUDA backend as the GPU peer (benchmarks/gpu_peer.py), on a machine with an
# NVIDIA GPU, nvcc and cmake, from a checkout that carries llama.cpp's source as
# .peer/llama.cpp.tar.gz (the llama-cpp-python sdist's vendor/llama.cpp, trimmed to the
# library and tools/llama-bench) and the gguf wheel in .whl/.
#   tools/gpu_peer_run.sh build        build llama-bench into /tmp/peer/build (log: $OUT)
#   tools/gpu_peer_run.sh bench [ARGS] write the Q8_0 files and run llama-bench on them;
#                                      ARGS go to gpu_peer.py; JSON: $OUT/gpu_peer.json
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
REPO="$PWD"
case "${1:-}" in
build)
    t0=$(date +%s)
    rm -rf /tmp/peer && mkdir -p /tmp/peer && tar xzf .peer/llama.cpp.tar.gz -C /tmp/peer
    cd /tmp/peer/llama.cpp || exit 1
    cmake -S . -B /tmp/peer/build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_GRAPHS=ON \
        -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
        -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
        > "$OUT/peer_build.log" 2>&1 \
      && cmake --build /tmp/peer/build --target llama-bench -j "$(nproc)" \
        >> "$OUT/peer_build.log" 2>&1
    rc=$?
    echo "peer build $(( $(date +%s) - t0 )) s, rc $rc" | tee -a "$OUT/timing.txt"
    [ $rc -eq 0 ] || tail -30 "$OUT/peer_build.log"
    exit $rc
    ;;
bench)
    shift
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site-peer .whl/gguf-*.whl || exit 1
    exe=$(find /tmp/peer/build -name llama-bench -type f -perm -u+x | head -1)
    [ -n "$exe" ] || { echo "no llama-bench built"; exit 1; }
    PYTHONPATH=/tmp/site-peer:${PYTHONPATH:-} PYTHONUNBUFFERED=1 timeout 300 python3 \
        "$REPO/benchmarks/gpu_peer.py" --llama-bench "$exe" --cache /tmp/cortiq-bench \
        --out "$OUT/gpu_peer.json" "$@" 2> "$OUT/gpu_peer.err" | tail -40
    tail -5 "$OUT/gpu_peer.err"
    ;;
*)
    echo "usage: $0 build | bench [gpu_peer.py args]" >&2
    exit 2
    ;;
esac
