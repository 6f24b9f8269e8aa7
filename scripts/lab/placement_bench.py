"""Decoding speed of one model under three weight placements, interleaved token by token.

- ``default``: what a plain load does here (on a CPU without AMX: llama.cpp's own choice).
- ``overrides``: the AMX-safe placement forced on any CPU (extra buffer types off, the weights
  the repacking kernels take put in CPU_REPACK by tensor overrides; native/buffers.py).
- ``off``: extra buffer types off, no overrides (no repacked kernels: the old AMX workaround).

All three stay loaded and evaluate a code prompt, then decode the same tokens one at a time
(``default``'s greedy answer, fed to all: the same work at the same positions), as ``target``
decodes. Each step runs the three in an order that rotates from step to step, so a busy
neighbour slows all alike. Prints, per placement, the median milliseconds of a one-token step,
tokens per second from it, its ratio to ``default``, and whether its logits equal
``default``'s at every step (bit for bit) or only its greedy choice.

    python scripts/lab/placement_bench.py [-n 128] [-t 2] [--target PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from pyramid_gguf import LoadConfig
from pyramid_gguf.models.presets import DEFAULT_PRESET, resolve_preset
from pyramid_gguf.native import NativeModel

PROMPT = 'def merge_sorted(xs, ys):\n    """Merge two sorted lists into one sorted list."""\n'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=None, help="default: the default ladder's")
    ap.add_argument("-n", "--tokens", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    target = args.target or resolve_preset(DEFAULT_PRESET).paths.target
    base = LoadConfig(n_threads=args.threads, n_threads_batch=args.threads, n_gpu_layers=0)
    loads = {
        "default": base,
        "overrides": replace(base, force_repack_overrides=True),
        "off": replace(base, extra_buffers=False),
    }
    models = {name: NativeModel(target, cfg) for name, cfg in loads.items()}
    try:
        names = list(models)
        for name, m in models.items():
            print(f"{name:<10} {m.describe_weights()}")
        ref = models["default"]
        prompt = ref.vocab.tokenize(PROMPT)
        rows = {name: m.eval(prompt, [-1])[0] for name, m in models.items()}
        seconds: dict[str, list[float]] = {name: [] for name in names}
        exact = {name: True for name in names}
        greedy = {name: True for name in names}
        for step in range(args.tokens):
            token = int(np.argmax(rows["default"]))
            for name in names:
                exact[name] &= bool(np.array_equal(rows[name], rows["default"]))
                greedy[name] &= int(np.argmax(rows[name])) == token
            k = step % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                rows[name] = models[name].eval([token], [0])[0]
                seconds[name].append(time.perf_counter() - t0)
        one = statistics.median(seconds["default"])
        for name in names:
            med = statistics.median(seconds[name])
            same = "logits = default's" if exact[name] else "greedy = default's"
            if not greedy[name]:
                same = "greedy != default's"
            print(
                f"{name:<10} {med * 1000:7.1f} ms/token  {1 / med:6.2f} tok/s  "
                f"{one / med:.3f}x default  {same}"
            )
    finally:
        for m in models.values():
            m.close()


if __name__ == "__main__":
    main()
