#!/usr/bin/env bash
# What a GPU session carries in .gpu/ (ignored by git; name it in the device tool's `carry`):
# llama-cpp-python's sdist stripped to what a CUDA build of the shared libraries and llama-bench
# needs (45 MB of the 76), and the wheels of our dependencies the GPU image lacks.
#
#   bash scripts/gpu/pack.sh        # then: device run "bash scripts/gpu/kit.sh", carry .gpu
set -euo pipefail
cd "$(dirname "$0")/../.."
V=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
D=.gpu
mkdir -p "$D" /tmp/gpu-pack
grep -qs "^/$D/" .git/info/exclude || echo "/$D/" >>.git/info/exclude
cd /tmp/gpu-pack
[ -f "llama_cpp_python-$V.tar.gz" ] ||
    python3 -m pip download -q --no-deps --no-binary :all: -d . "llama-cpp-python==$V"
[ -d "llama_cpp_python-$V" ] || tar xzf "llama_cpp_python-$V.tar.gz"
P=llama_cpp_python-$V
L=$P/vendor/llama.cpp
drop=("$L/models" "$L/docs" "$L/benches" "$L/tests" "$L/examples" "$L/tools/ui" "$L/tools/server"
    "$P/docs" "$P/tests" "$P/examples" "$P/docker")
for b in blas cann et hexagon metal opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
    drop+=("$L/ggml/src/ggml-$b")
done
tar czf "$OLDPWD/$D/llama-stripped.tar.gz" "${drop[@]/#/--exclude=}" "$P"
cd "$OLDPWD"
platforms=(--platform manylinux2014_x86_64)
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$D" gguf diskcache "llguidance>=1.9.1" jsonschema \
    jsonschema-specifications referencing rpds-py fastapi starlette pydantic pydantic-core \
    annotated-types typing-inspection uvicorn
du -sh "$D"
