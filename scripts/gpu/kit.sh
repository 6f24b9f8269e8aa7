#!/usr/bin/env bash
# The GPU kit (docs/GPU-KIT.md): one call of the device tool, under 8 minutes with the build.
#
#   bash scripts/gpu/pack.sh          # once, here: .gpu/ = the stripped sdist and the wheels
#   run: bash scripts/gpu/kit.sh      # carry [".gpu"], timeout_s 560
#   bash scripts/gpu/kit.sh --cpu     # the rehearsal on a machine without a GPU (no .gpu/)
#
# It builds the vendored llama.cpp with CUDA for the GPU it finds (the shared libraries
# llama-cpp-python loads through LLAMA_CPP_LIB_PATH, and llama-bench, in one CMake build,
# detached), writes the synthetic Qwen2.5 0.5B / 7B / 32B ladder while that compiles, then runs
# scripts/gpu/kit.py until KIT_BUDGET seconds after its start: the planner's splits, the
# target's verification curve at 1..128 tokens at two -ngl values, mapped and pinned, llama-bench
# beside it, and auto / the best two-model chain / the pyramid / llama.cpp -md predicted on
# those curves with the stand-in traces. Results: $OUT/kit.json, $OUT/log.txt, host.txt,
# cmake.txt. A second call on a still-held machine reuses the build and the ladder.
#
# --cpu: no build (the installed llama-cpp-python, llama-bench from ~/.cache/llama-peer when
# there), the tiny ladder, curves at 1..16, the same stages and the same kit.json.
set -u
T0=$(date +%s)
CPU=0
[ "${1:-}" = "--cpu" ] && CPU=1
REPO=$(pwd)
W=${KIT_WORK:-/tmp/kit}
OUT=${OUT:-$W/out}
PY=${PY:-python3}
THREADS=${KIT_THREADS:-8}
mkdir -p "$W/models" "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
log() { echo "[+$(($(date +%s) - T0))s] $*"; }
export PYTHONUNBUFFERED=1 PYRAMID_GGUF_HOME=$W/home

if [ $CPU = 1 ]; then
    DEADLINE=$((T0 + ${KIT_BUDGET:-300}))
    THREADS=${KIT_THREADS:-2}
    BENCH=${KIT_BENCH:-$HOME/.cache/llama-peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench}
    $PY scripts/gpu/synth_ladder.py --out "$W/models" --ladder tiny >"$W/synth.log" 2>&1 ||
        { cat "$W/synth.log"; exit 1; }
    log "tiny ladder written"
    $PY scripts/gpu/kit.py --cpu --models-dir "$W/models" --out "$OUT" --bench "$BENCH" \
        -t "$THREADS" --budget "${KIT_VRAM:-128MiB}" --deadline "$DEADLINE" ${KIT_SETS:+--sets $KIT_SETS}
    rc=$?
    log "done: exit $rc"
    exit $rc
fi

DEADLINE=$((T0 + ${KIT_BUDGET:-470}))
$PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/*.whl ||
    log "wheel install failed"
export PYTHONPATH=/tmp/site:$REPO

# 1. The CUDA build, detached: it outlasts everything before the measurements.
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
if [ ! -e "$W/build.started" ]; then
    tar xzf .gpu/llama-stripped.tar.gz -C "$W"
    touch "$W/build.started"
    PKG=$(ls -d "$W"/llama_cpp_python-*/)
    SRC=$PKG/vendor/llama.cpp
    CPU_FLAGS=(-DGGML_NATIVE=ON)
    if grep -q amx_int8 /proc/cpuinfo; then  # AMX kernels crash on batched decodes (#20824)
        CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
            -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON
            -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
    fi
    ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
    log "building $SRC for sm_${ARCH:-90} (${CPU_FLAGS[*]})"
    setsid nohup bash -c "cmake -S $SRC -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${ARCH:-90} \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON ${CPU_FLAGS[*]} \
        >$OUT/cmake.txt 2>&1 && cmake --build $W/build -j$(nproc) --target llama llama-bench \
        >$W/build.log 2>&1; echo \$? >$W/build.rc" >/dev/null 2>&1 &
fi
PKG=$(ls -d "$W"/llama_cpp_python-*/)

# 2. The host, and the synthetic ladder while it compiles (19 GB of random blocks: minutes).
{ lscpu; free -g; nvidia-smi; nproc; } >"$OUT/host.txt" 2>&1
$PY scripts/gpu/synth_ladder.py --out "$W/models" --ladder qwen-32b >"$W/synth.log" 2>&1 &
SYNTH=$!

while [ ! -e "$W/build.rc" ] && [ $(($(date +%s) + 150)) -lt "$DEADLINE" ]; do sleep 5; done
if [ ! -e "$W/build.rc" ] || [ "$(cat "$W/build.rc")" != 0 ]; then
    log "build not done: $(grep -c 'Building CUDA' "$W/build.log" 2>/dev/null) CUDA objects"
    tail -n 30 "$W/build.log" "$OUT/cmake.txt"
    wait $SYNTH
    exit 1
fi
log "built"
wait $SYNTH
cat "$W/synth.log"
log "ladder written"

export LLAMA_CPP_LIB_PATH=$W/build/bin PYTHONPATH=/tmp/site:$PKG:$REPO
$PY scripts/gpu/kit.py --models-dir "$W/models" --bench "$W/build/bin/llama-bench" --out "$OUT" \
    -t "$THREADS" --budget "${KIT_VRAM:-12GiB}" --deadline "$DEADLINE" ${KIT_SETS:+--sets $KIT_SETS}
log "done: exit $?"
