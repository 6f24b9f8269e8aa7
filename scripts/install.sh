#!/usr/bin/env bash
# Install pyramid-gguf, compiling llama-cpp-python once, with what every command and test needs.
#
#   scripts/install.sh          # the package (what the README's first command runs)
#   scripts/install.sh dev      # and the test and lint tools (scripts/test.sh runs this)
#
# llama-cpp-python compiles from source the first time (6-10 minutes on 2 cores) with llama.cpp's
# RPC backend (-DGGML_RPC=on: `--rpc` and its tests need it) plus any CMAKE_ARGS you give
# (CMAKE_ARGS="-DGGML_CUDA=on" for an NVIDIA GPU). pip's wheel cache would hand back any earlier
# build of the same version whatever CMAKE_ARGS say, so the build is kept in a cache of its own,
# one per CPU (the build is tuned to the CPU it runs on) and CMAKE_ARGS, and reinstalled from
# there whenever the llama-cpp-python found lacks the RPC library. The package itself installs
# editable (-e), so a second run recompiles nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
pip_=(python3 -m pip --disable-pip-version-check -q)
version=$(sed -n 's/^llama-cpp-python==//p' scripts/constraints.txt)
cpu=$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m) | md5sum | cut -c1-12)
key="rpc-$cpu"
if [ -n "${CMAKE_ARGS:-}" ]; then
  key="$key-$(printf '%s' "$CMAKE_ARGS" | md5sum | cut -c1-8)"
fi
wheels="${PYRAMID_GGUF_WHEELS:-$HOME/.cache/pyramid-gguf/wheels}/$key"
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
  "${pip_[@]}" install "$wheel"  # its own dependencies (numpy, diskcache, ...) on a fresh machine
  has_rpc || { echo "llama-cpp-python from $wheel has no RPC backend" >&2; exit 1; }
fi
"${pip_[@]}" install -c scripts/constraints.txt -e ".${extras:+[$extras]}"
