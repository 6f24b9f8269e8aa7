"""Batch cost curve: how long one ``llama_decode`` of k tokens takes, for k = 1..16.

This is the number that decides whether speculation pays on a machine: verifying k proposals
costs one batch of k + 1 tokens. On a GPU a batch costs about one token (memory bound); on a
small CPU it costs nearly k + 1 tokens (compute bound).

    python scripts/batch_cost.py MODEL.gguf [MODEL.gguf ...] [--threads 2] [--ctx 100] [--json]

Each point is the best of ``--repeats`` decodes after a ``--ctx``-token prefix, the cache
rolled back between decodes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pyramid_gguf.config import LoadConfig
from pyramid_gguf.native import NativeModel

SIZES = (1, 2, 3, 4, 5, 7, 8, 12, 16)


def batch_cost(path: Path, load: LoadConfig, prefix: int, repeats: int) -> dict[int, float]:
    """Milliseconds per decode of k tokens after ``prefix`` tokens, best of ``repeats``."""
    with NativeModel(path, load) as m:
        m.eval(list(range(1000, 1000 + prefix)))
        out = {}
        for k in SIZES:
            best = float("inf")
            for _ in range(repeats):
                m.rollback(prefix)
                t0 = time.perf_counter()
                m.eval(list(range(2000, 2000 + k)), [-1])
                best = min(best, time.perf_counter() - t0)
            out[k] = round(best * 1000, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=100, help="prefix tokens before each decode")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = LoadConfig(n_ctx=max(512, args.ctx + 64), n_gpu_layers=args.n_gpu_layers)
    threads = args.threads or base.n_threads
    load = LoadConfig(
        n_ctx=base.n_ctx,
        n_gpu_layers=args.n_gpu_layers,
        n_threads=threads,
        n_threads_batch=threads,
    )
    results = {str(p): batch_cost(p, load, args.ctx, args.repeats) for p in args.models}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'model':<44}" + "".join(f"{k:>8}" for k in SIZES) + "   (ms per decode of k tokens)")
    for path, row in results.items():
        one = row[1]
        print(f"{Path(path).name[:43]:<44}" + "".join(f"{row[k]:>8}" for k in SIZES))
        print(f"{'  relative to one token':<44}" + "".join(f"{row[k] / one:>8.2f}" for k in SIZES))


if __name__ == "__main__":
    main()
