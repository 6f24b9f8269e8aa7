"""Greedy answers of the default ladder, to compare two versions of the code token for token.

Records ``target``, ``sd``, ``psd-exact`` and ``auto`` answers (48 tokens, greedy,
``--strict-identity``) to three prompts on the real default ladder, as JSON; run it once on the
old code and once on the new and compare (a refactor must not move a token):

    PYTHONPATH=/tmp/old-checkout python scripts/lab/identity_check.py > before.json
    python scripts/lab/identity_check.py --compare before.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig

PROMPTS = (
    "def quicksort(xs):",
    "Explain what a mutex is in one paragraph.",
    "import numpy as np\n\ndef moving_average(x, n):",
)
MODES = ("target", "sd", "psd-exact", "auto")


def answers(threads: int) -> dict[str, list[int]]:
    load = LoadConfig(strict_identity=True, n_threads=threads, n_threads_batch=threads, n_ctx=1024)
    greedy = SamplingConfig(temperature=0, max_tokens=48)
    out = {}
    for mode in MODES:
        with Pyramid.from_preset("qwen2.5-coder-demo", load=load, spec=SpecConfig(mode=mode)) as p:
            for i, prompt in enumerate(PROMPTS):
                out[f"{mode}/{i}"] = p.generate(prompt, greedy).token_ids
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", type=Path, default=None, help="answers recorded before")
    ap.add_argument("--threads", "-t", type=int, default=2)
    args = ap.parse_args()
    got = answers(args.threads)
    if args.compare is None:
        print(json.dumps(got))
        return
    before = json.loads(args.compare.read_text(encoding="utf-8"))
    differ = [k for k in before if before[k] != got.get(k)]
    tokens = sum(len(v) for v in before.values())
    print(f"{len(before) - len(differ)} of {len(before)} answers identical ({tokens} tokens)")
    for k in differ:
        print(f"  {k} differs")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
