#!/usr/bin/env bash
# The README benchmark: every mode of the default preset side by side, greedy, on the shipped
# prompt sets (code, edit, chat, qa), 3 interleaved repeats; table on stdout, JSON/CSV/PNG in
# bench-out/. Extra flags are passed through (e.g. --threads 8, --humaneval 20, --preset NAME).
set -euo pipefail
out="${BENCH_OUT:-bench-out}"
mkdir -p "$out"
pyramid-gguf bench \
  --max-tokens 128 --temperature 0 --repeats 3 \
  --csv "$out/bench.csv" --plot "$out/bench.png" \
  "$@" | tee "$out/bench.txt"
echo "wrote $out/bench.txt $out/bench.csv $out/bench.png" >&2
