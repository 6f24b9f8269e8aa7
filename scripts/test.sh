#!/usr/bin/env bash
# The whole test suite (CI runs this: .ci/run), on the install the README's set-up made:
# scripts/install.sh reuses its llama-cpp-python build (compiling it only where none is there
# yet) and adds the test tools; then pytest with any arguments given.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh dev
python3 -m pytest "$@"
