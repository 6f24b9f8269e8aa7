#!/usr/bin/env bash
# The big-target GPU check (GPU.md, "Models bigger than the card"), one call of the device tool:
#
#   carry .gpu/ = llama-stripped.tar.gz (llama-cpp-python 0.3.36's sdist without the vendored
#   models, docs, tests, examples, server and unused backends; scripts/gpu/pack.sh) plus the
#   wheels the image lacks; then: bash scripts/gpu/bigtarget.sh
#
# It builds the vendored llama.cpp with CUDA for Hopper (the shared libraries llama-cpp-python
# loads through LLAMA_CPP_LIB_PATH, and llama-bench, in one CMake build), writes a synthetic
# Qwen2.5 0.5B / 7B / 32B ladder while that compiles, and runs scripts/gpu/bigtarget.py until
# BT_BUDGET seconds after its start. On a CPU with AMX the build leaves the AMX kernels out
# (llama.cpp issue #20824; both sides then run the same CPU kernels). Results: $OUT/bigtarget.json,
# $OUT/log.txt, host.txt, smoke.txt (the run --vram command), cmake.txt.
set -u
T0=$(date +%s)
DEADLINE=$((T0 + ${BT_BUDGET:-580}))
REPO=$(pwd)
W=${BT_WORK:-/tmp/bt}
OUT=${OUT:-$W/out}
PY=${PY:-python3}
THREADS=${BT_THREADS:-8}
mkdir -p "$W/models" "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
log() { echo "[+$(($(date +%s) - T0))s] $*"; }

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/*.whl ||
    log "wheel install failed"
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 PYRAMID_GGUF_HOME=$W/home

# 1. The CUDA build, detached: it outlasts everything else before the measurements.
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
tar xzf .gpu/llama-stripped.tar.gz -C "$W"
PKG=$(ls -d "$W"/llama_cpp_python-*/)
SRC=$PKG/vendor/llama.cpp
CPU_FLAGS=(-DGGML_NATIVE=ON)
if grep -q amx_int8 /proc/cpuinfo; then
    CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON
        -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
fi
if [ -n "${BT_PREBUILT:-}" ]; then  # a rehearsal on a CPU: an existing build of the same tree
    mkdir -p "$W/build" && ln -sfn "$BT_PREBUILT" "$W/build/bin" && echo 0 >"$W/build.rc"
else
    log "building $SRC (${CPU_FLAGS[*]})"
    setsid nohup bash -c "cmake -S $SRC -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON ${CPU_FLAGS[*]} >$OUT/cmake.txt 2>&1 &&
        cmake --build $W/build -j$(nproc) --target llama llama-bench >$W/build.log 2>&1;
        echo \$? >$W/build.rc" >/dev/null 2>&1 &
fi

# 2. The host, and the synthetic ladder while it compiles.
{ lscpu; free -g; nvidia-smi; nproc; } >"$OUT/host.txt" 2>&1
$PY scripts/gpu/synth_ladder.py --out "$W/models" --ladder qwen-32b \
    --layers-scale "${BT_LAYERS_SCALE:-1}" >"$W/synth.log" 2>&1 &
SYNTH=$!

while [ ! -e "$W/build.rc" ] && [ $(($(date +%s) + 120)) -lt "$DEADLINE" ]; do sleep 5; done
if [ ! -e "$W/build.rc" ] || [ "$(cat "$W/build.rc")" != 0 ]; then
    log "build not done: $(grep -c 'Building CUDA' "$W/build.log" 2>/dev/null) CUDA objects"
    tail -n 30 "$W/build.log" "$OUT/cmake.txt"
    exit 1
fi
log "built"
wait $SYNTH
cat "$W/synth.log"
log "ladder written"

export LLAMA_CPP_LIB_PATH=$W/build/bin PYTHONPATH=/tmp/site:$PKG:$REPO
$PY scripts/gpu/bigtarget.py --models-dir "$W/models" --bench "$W/build/bin/llama-bench" \
    --out "$OUT" -t "$THREADS" --deadline "$((DEADLINE - ${BT_SMOKE_S:-75}))"
[ "${BT_SMOKE_S:-75}" = 0 ] && { log "done"; exit 0; }
# 3. The user's command: run --vram loads the plan's pick of the big ladder and decodes with it.
M=$W/models/synthetic-qwen
timeout $((DEADLINE - $(date +%s))) $PY -m pyramid_gguf run --draft "$M-0.5b-q4_k_m.gguf" \
    --qualifier "$M-7b-q4_k_m.gguf" --target "$M-32b-q4_k_m.gguf" --vram 8GiB --threads "$THREADS" \
    --raw -p "the model reads the file" -n 24 --temp 0 --ignore-eos --mode psd-exact -v \
    >"$OUT/smoke.txt" 2>&1
log "smoke: exit $?"
tail -n 15 "$OUT/smoke.txt"
log "done"
