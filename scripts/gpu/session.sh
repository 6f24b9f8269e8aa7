#!/usr/bin/env bash
# The GPU check (README, "On a GPU"), as run on a lent H100 through the device tool:
#
#   carry .gpu/ = llama-cpp-python's sdist without vendor/llama.cpp/{models,docs}, plus the
#   gguf and diskcache wheels the image lacks; then call `bash scripts/gpu/session.sh` until it
#   prints "all stages done".
#
# Each call stays under GS_BUDGET seconds (default 560) and resumes where the last one stopped
# (the machine keeps /tmp while it is held): a CUDA build of llama-cpp-python started detached,
# synthetic Llama 3.2 1B / 3B / 3.1 8B and Qwen2.5 0.5B / 1.5B / 7B ladders (random Q4_K_M
# weights), then the stages below. Everything measured so far comes back in $OUT/results.tgz.
set -u
REPO=$(pwd)
W=${GS_WORK:-/tmp/gs}
R=$W/results
OUT=${OUT:-$W/out}
mkdir -p "$R" "$W/models" "$OUT"
T0=$(date +%s)
BUDGET=${GS_BUDGET:-560}
PY=${PY:-python3}
export PYTHONPATH=/tmp/site:$REPO PYRAMID_GGUF_HOME=$W/home PYTHONUNBUFFERED=1

left() { echo $((BUDGET - ($(date +%s) - T0))); }
log() { echo "[$(date +%T) +$(($(date +%s) - T0))s] $*" | tee -a "$R/session.log"; }
finish() {
    tar czf "$OUT/results.tgz" -C "$W" results
    exit 0
}

# A stage runs once; one cut by the deadline runs again from the start on the next call.
stage() {
    local name=$1 t rc
    shift
    [ -e "$W/done.$name" ] && return 0
    if [ -n "${GS_ONLY:-}" ] && [[ " $GS_ONLY " != *" $name "* ]]; then return 0; fi
    t=$(left)
    if [ "$t" -lt 40 ]; then
        log "next: $name (no time left in this call)"
        finish
    fi
    log "stage $name"
    timeout $((t - 15)) "$@" >"$R/$name.txt" 2>&1
    rc=$?
    log "stage $name: exit $rc"
    tail -n 25 "$R/$name.txt"
    [ $rc = 124 ] && finish
    touch "$W/done.$name"
}

# 0. Pure-Python wheels the image lacks.
if [ ! -e "$W/done.deps" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/*.whl &&
        touch "$W/done.deps"
fi

# 1. llama-cpp-python with CUDA for Hopper, built detached (it can outlast one call).
if [ -z "${GS_SKIP_BUILD:-}" ] && [ ! -e "$W/build.started" ]; then
    tar xzf .gpu/llama_cpp_python-*-stripped.tar.gz -C "$W"
    src=$(ls -d "$W"/llama_cpp_python-*/)
    touch "$W/build.started"
    log "building $src"
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=off -DGGML_CUDA_NCCL=off" \
        CMAKE_BUILD_PARALLEL_LEVEL=16 setsid nohup bash -c \
        "$PY -m pip wheel -v --no-build-isolation --no-deps -w $W/wheel $src >$R/build.log 2>&1; echo \$? >$W/build.rc" \
        >/dev/null 2>&1 &
fi

# 2. Synthetic ladders while it builds (CPU and disk only).
for ladder in llama qwen; do
    stage "ladder-$ladder" $PY scripts/gpu/synth_ladder.py --out "$W/models" --ladder "$ladder" \
        --layers-scale "${GS_LAYERS_SCALE:-1}"
done

# 3. Wait for the build and install it (the wheel, ~250 MB with the CUDA kernels, stays there).
if [ -z "${GS_SKIP_BUILD:-}" ]; then
    while [ ! -e "$W/build.rc" ]; do
        if [ "$(left)" -lt 30 ]; then
            log "build still running: $(grep -c 'Building CUDA' "$R/build.log") CUDA objects so far"
            tail -n 3 "$R/build.log"
            finish
        fi
        sleep 5
    done
    if [ "$(cat "$W/build.rc")" != 0 ]; then
        log "build failed"
        tail -n 60 "$R/build.log"
        finish
    fi
    if [ ! -e "$W/done.install" ]; then
        log "built $(ls "$W"/wheel/)"
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$W"/wheel/*.whl &&
            touch "$W/done.install"
    fi
fi

L=$W/models/synthetic-llama
Q=$W/models/synthetic-qwen
LLAMA=(--draft "$L-1b-q4_k_m.gguf" --qualifier "$L-3b-q4_k_m.gguf")
QWEN=(--draft "$Q-0.5b-q4_k_m.gguf" --qualifier "$Q-1.5b-q4_k_m.gguf")
BENCH=(--modes sd,psd-exact,psd-a,psd-f,auto --prompts chat,code --limit 2 -n 128 --ignore-eos
    -r 2 --raw -q)

stage gpu nvidia-smi
stage smoke $PY -m pyramid_gguf run "${LLAMA[@]}" --target "$L-8b-q4_k_m.gguf" --raw \
    -p "the model reads the file" -n 64 --temp 0 --mode psd-exact -v
stage tests $PY -m pytest -q -p no:cacheprovider tests/test_lossless.py tests/test_engine.py \
    tests/test_native.py tests/test_acceptance.py tests/test_sampling.py tests/test_calibrate.py
stage costs $PY scripts/batch_cost.py "$L"-{1b,3b,8b}-q4_k_m.gguf "$Q"-{0.5b,1.5b,7b}-q4_k_m.gguf \
    --max 32 --every --repeats 5 --json
# Composition (issue 35): measured -ngl splits of the 8B against CPU part + GPU part + transfer.
stage splits-llama $PY scripts/gpu/splits.py --ladder llama --models-dir "$W/models" -t 8 \
    --json "$R/splits-llama.json"
stage plan-llama $PY scripts/gpu/check.py --ladder llama --models-dir "$W/models" --out "$R/plan-llama"
stage lossless-llama $PY scripts/gpu/lossless.py "$L"-{1b,3b,8b}-q4_k_m.gguf --json "$R/lossless-llama.json"
stage bench-llama $PY -m pyramid_gguf bench "${LLAMA[@]}" -m "$L-8b-q4_k_m.gguf" "${BENCH[@]}" \
    --csv "$R/bench-llama.csv"
stage plan-qwen $PY scripts/gpu/check.py --ladder qwen --models-dir "$W/models" --out "$R/plan-qwen"
stage lossless-qwen $PY scripts/gpu/lossless.py "$Q"-{0.5b,1.5b,7b}-q4_k_m.gguf --json "$R/lossless-qwen.json"
stage bench-qwen $PY -m pyramid_gguf bench "${QWEN[@]}" -m "$Q-7b-q4_k_m.gguf" "${BENCH[@]}" \
    --csv "$R/bench-qwen.csv"
# Where the scheduler's time goes in the modes that spend most of it in Python.
stage profile bash -c "$PY -m cProfile -s tottime -m pyramid_gguf bench ${LLAMA[*]} \
    -m $L-8b-q4_k_m.gguf --modes psd-f,auto --prompts chat --limit 1 -n 128 --ignore-eos -r 1 \
    --raw -q | head -n 60"
log "all stages done"
finish
