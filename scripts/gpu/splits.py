"""Measured ``-ngl`` splits against the planner's composed prediction (run on a lent GPU).

The planner prices a target split by llama.cpp's ``n_gpu_layers`` as its CPU part, plus its GPU
part, plus one hidden-state transfer (ALGORITHMS.md, "Placements"). This measures what it
composes from:

1. every model of the ladder whole on the GPU (``-ngl`` all) and whole on the CPU (``-ngl 0``,
   op offload off), batches of 1..16; a GPU profile (with a per-block term) and a CPU profile
   (without) are fitted to those whole-model curves, as ``calibrate --device-profile`` would;
2. the target at several splits, and what the composition of the two profiles predicts for
   each, per batch size; then, per VRAM budget, the split the memory planner gives the target
   alone (llama.cpp's best ``-ngl`` in that budget, more GPU layers being faster) measured
   against predicted.

    python scripts/gpu/splits.py --ladder llama --models-dir /tmp/gs/models -t 8 \\
        --json results/splits-llama.json
    python scripts/gpu/splits.py --models a.gguf b.gguf c.gguf -t 2      # any files, smallest first

On a CPU build ``-ngl`` changes nothing: the run then only checks the script end to end.
"""

from __future__ import annotations

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order": a CUDA
# model load segfaults in the GPU machines' PyTorch environment when numpy came first).
from pyramid_gguf import native  # noqa: F401

# isort: split
import argparse
import json
from pathlib import Path
from typing import Any

from synth_ladder import LADDERS

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.runtime.calibrate import measure_curve
from pyramid_gguf.native import NativeModel, build_id, gpu_device
from pyramid_gguf.planning.compose import DeviceProfile, Link, Shape, composed_curve
from pyramid_gguf.planning.memory import GiB, model_memory
from pyramid_gguf.planning.vram import make_plan

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
SHOWN = (1, 2, 4, 8, 16)


def curve(path: Path, ngl: int, threads: int) -> CostCurve:
    """``path``'s batch cost curve (1..16 tokens) loaded with ``n_gpu_layers = ngl``."""
    load = LoadConfig(
        n_ctx=1024,
        n_gpu_layers=ngl,
        n_threads=threads,
        n_threads_batch=threads,
        op_offload=ngl != 0,
    )
    with NativeModel(path, load) as m:
        return measure_curve(m, sizes=SIZES, repeats=3).curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ladder", choices=sorted(LADDERS))
    ap.add_argument("--models-dir", type=Path, default=Path("/tmp/gs/models"))
    ap.add_argument("--models", type=Path, nargs="+", help="GGUF files, smallest first")
    ap.add_argument("--threads", "-t", type=int, default=8)
    ap.add_argument("--budgets", default="4,6,8", help="VRAM budgets in GiB")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.models:
        paths = list(args.models)
    elif args.ladder:
        paths = [args.models_dir / f"synthetic-{n}-q4_k_m.gguf" for n in LADDERS[args.ladder]]
    else:
        ap.error("give --ladder or --models")
    mms = {p: model_memory(p) for p in paths}
    target = paths[-1]
    mm = mms[target]
    whole_gpu = {p: curve(p, -1, args.threads) for p in paths}
    whole_cpu = {p: curve(p, 0, args.threads) for p in paths}
    gpu = DeviceProfile.fit(
        "gpu", "whole models, -ngl all", [(Shape.of(mms[p]), c) for p, c in whole_gpu.items()]
    )
    cpu = DeviceProfile.fit(
        "cpu", "whole models, -ngl 0", [(Shape.of(mms[p]), c) for p, c in whole_cpu.items()],
        per_layer=False,
    )  # fmt: skip
    n = mm.n_layer
    splits = sorted({0, 1, n // 4, n // 2, 3 * n // 4, n, n + 1})
    budgets = [float(b) for b in args.budgets.split(",")]
    planned = {
        b: make_plan([("target", mm)], int(b * GiB), LoadConfig(n_ctx=4096)).tier("target")
        for b in budgets
    }
    splits = sorted({*splits, *(t.n_gpu_layers for t in planned.values())})
    device = gpu_device()
    print(
        f"{build_id()}; GPU: {device[0] if device else 'none (CPU build)'}; {args.threads} threads"
    )
    print(f"target {target.name}: {n} blocks; profiles fitted to {len(paths)} whole models")
    head = f"{'-ngl':>5} " + " ".join(f"{'n=' + str(k):>17}" for k in SHOWN)
    print(head + "   (measured / predicted ms)")
    rows: list[dict[str, Any]] = []
    measured: dict[int, CostCurve] = {}
    for ngl in splits:
        got = whole_gpu[target] if ngl == n + 1 else curve(target, ngl, args.threads)
        measured[ngl] = got
        want = composed_curve(mm, ngl, cpu, gpu, Link())
        cells = []
        for k in SHOWN:
            rows.append(
                {"ngl": ngl, "n": k, "measured_ms": round(got(k) * 1e3, 3),
                 "predicted_ms": round(want(k) * 1e3, 3)}
            )  # fmt: skip
            cells.append(f"{got(k) * 1e3:7.2f}/{want(k) * 1e3:7.2f}")
        print(f"{ngl:>5} " + " ".join(f"{c:>17}" for c in cells))
    errs = [abs(r["predicted_ms"] / r["measured_ms"] - 1) for r in rows]
    print(f"splits: median |error| {sorted(errs)[len(errs) // 2]:.1%}, worst {max(errs):.1%}")
    best = []
    for b, tier in planned.items():
        ngl = tier.n_gpu_layers
        tok_m = 1 / measured[ngl](1)
        tok_p = 1 / composed_curve(mm, ngl, cpu, gpu, Link())(1)
        fastest = max(measured, key=lambda g: 1 / measured[g](1) if g <= ngl else 0.0)
        best.append({"budget_gib": b, "ngl": ngl, "measured_tps": tok_m, "predicted_tps": tok_p,
                     "fastest_measured_ngl_within": fastest})  # fmt: skip
        print(
            f"{b:g} GiB: plan's target-only -ngl {ngl}: measured {tok_m:.1f} tok/s, predicted "
            f"{tok_p:.1f} ({tok_p / tok_m - 1:+.1%}); fastest measured -ngl within: {fastest}"
        )
    if args.json:
        doc = {
            "build": build_id(),
            "gpu": device[0] if device else None,
            "threads": args.threads,
            "target": target.name,
            "gpu_profile": gpu.to_dict(),
            "cpu_profile": cpu.to_dict(),
            "rows": rows,
            "budgets": best,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
