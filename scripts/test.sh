#!/usr/bin/env bash
# Install pyramid-gguf with its test dependencies, then run the whole test suite.
# llama-cpp-python compiles from source the first time (several minutes); pip caches the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --disable-pip-version-check -q -c scripts/constraints.txt -e '.[dev]'
python3 -m pytest "$@"
