#!/usr/bin/env bash
# Install pyramid-gguf with its test dependencies, then run the whole test suite.
# llama-cpp-python compiles from source the first time (several minutes): here with llama.cpp's
# RPC backend (-DGGML_RPC=on), which the RPC tests need. pip's wheel cache would hand back any
# earlier build of the same version whatever CMAKE_ARGS say, so the RPC build is kept in a
# cache of its own, one per CPU (the build is tuned to the CPU it runs on), and reinstalled
# whenever the llama-cpp-python found lacks the RPC library.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_=(python3 -m pip --disable-pip-version-check -q)
version=$(sed -n 's/^llama-cpp-python==//p' scripts/constraints.txt)
cpu=$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m) | md5sum | cut -c1-12)
wheels="${PYRAMID_GGUF_WHEELS:-$HOME/.cache/pyramid-gguf/wheels}/rpc-$cpu"
has_rpc() {
  python3 -c "import llama_cpp, pathlib, sys; lib = pathlib.Path(llama_cpp.__file__).parent / 'lib'
sys.exit(llama_cpp.__version__ != '$version' or not any(lib.glob('*ggml-rpc*')))" 2>/dev/null
}
if ! has_rpc; then
  wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $version with the RPC backend (several minutes, once)" >&2
    CMAKE_ARGS="-DGGML_RPC=on ${CMAKE_ARGS:-}" "${pip_[@]}" wheel --no-deps --no-cache-dir \
      --no-binary llama-cpp-python -w "$wheels" "llama-cpp-python==$version"
    wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -n1)
  fi
  "${pip_[@]}" install --no-deps --force-reinstall "$wheel"
  has_rpc || { echo "llama-cpp-python from $wheel has no RPC backend" >&2; exit 1; }
fi
"${pip_[@]}" install -c scripts/constraints.txt -e '.[dev]'
python3 -m pytest "$@"
