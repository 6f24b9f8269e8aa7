"""Batch cost curve of any GGUF files: how long one ``llama_decode`` of k tokens takes.

This is the number that decides whether speculation pays on a machine: verifying k proposals
costs one batch of k + 1 tokens. ``pyramid-gguf calibrate`` measures the same curve for a
loaded ladder (k = 1..16) and caches it for ``auto``; this script is for arbitrary files and
longer batches (the GPU check uses k = 1..32), with JSON or CSV output to commit as data.

    python scripts/batch_cost.py MODEL.gguf [MODEL.gguf ...] [--threads 2] [--max 32] \\
        [--n-gpu-layers -1] [--json | --csv]

Each point is the best of ``--repeats`` decodes after a 48-token prefix, every logits row read
(as a verification reads them), the cache rolled back between decodes.
"""

from __future__ import annotations

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order": a CUDA
# model load segfaults in the GPU machines' PyTorch environment when numpy came first).
from pyramid_gguf import native  # noqa: F401

# isort: split
import argparse
import csv
import json
import sys
from pathlib import Path

from pyramid_gguf.core.load import LoadConfig, default_threads
from pyramid_gguf.decoding.runtime.calibrate import measure_curve
from pyramid_gguf.native import NativeModel, build_id

SHOWN = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--max", type=int, default=16, help="largest batch timed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--every", action="store_true", help="time every k (else 1..8 and a few)")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true")
    args = ap.parse_args()
    load = LoadConfig(
        n_ctx=512,
        n_gpu_layers=args.n_gpu_layers,
        n_threads=args.threads,
        n_threads_batch=args.threads,
    )
    shown = range(1, args.max + 1) if args.every else (k for k in SHOWN if k <= args.max)
    sizes = tuple(sorted({*range(1, 9), *shown, args.max}))
    curves = {}
    for path in args.models:
        with NativeModel(path, load) as m:
            curves[path.name] = measure_curve(m, sizes=sizes, repeats=args.repeats).curve.seconds
    if args.json:
        meta = {"build": build_id(), "threads": args.threads, "n_gpu_layers": args.n_gpu_layers}
        ms = {name: [round(s * 1000, 3) for s in row] for name, row in curves.items()}
        print(json.dumps({"meta": meta, "ms_per_decode": ms}, indent=2))
        return
    if args.csv:
        w = csv.writer(sys.stdout)
        w.writerow(["model", "k", "ms"])
        for name, row in curves.items():
            w.writerows([name, k, round(s * 1000, 3)] for k, s in enumerate(row, start=1))
        return
    table = [k for k in SHOWN if k <= args.max]
    print(f"{'model':<44}" + "".join(f"{k:>8}" for k in table) + "   (ms per decode of k tokens)")
    for name, row in curves.items():
        print(f"{name[:43]:<44}" + "".join(f"{row[k - 1] * 1000:>8.1f}" for k in table))
        rel = "".join(f"{row[k - 1] / row[0]:>8.2f}" for k in table)
        print(f"{'  relative to one token':<44}" + rel)


if __name__ == "__main__":
    main()
