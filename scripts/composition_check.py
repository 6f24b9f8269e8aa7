"""Does a part of a model cost what the planner composes for it? Checked on this CPU.

The planner prices a tier split between CPU and GPU as its CPU part plus its GPU part plus a
transfer (ALGORITHMS.md, "Placements"); each part's cost is a device profile's
``per_byte[n] * bytes + per_layer[n] * blocks + fixed[n]``. Without a GPU, what can be checked
is the CPU half: that a model cut to ``k`` of its blocks (``derive --keep-layers``: the CPU part
of a split at ``n_gpu_layers = n_layer + 1 - k``, plus the head and embeddings a CPU part of a
split would not have) costs what a profile predicts from its bytes.

Cuts of one model keeping its first ``k`` blocks are written (once) to ``--work``; all are
loaded and timed in interleaved rounds (the machine is shared: every model sees the same
minutes), each size the median of the rounds. A profile is fitted (no block term, as for a CPU)
to the ``--fit`` cuts and predicts the rest, held out; the shipped profile of the build VM
(``cpu-2core-epyc``, fitted on 2026-11-23 to 7, 14 and 28 blocks) predicts all, for scale.
``--other`` adds held-out models: one of other quantization types (the 0.5B is Q5_0 / Q8_0:
how far a profile's bytes carry across kernels), or a big one (a synthetic Qwen2.5-14B, 8.4 GiB,
from ``scripts/gpu/synth_ladder.py qwen-14b``: whether a profile fitted to small models prices
a model that no cache holds, whose verifications turn compute-bound).

    python scripts/composition_check.py MODEL.gguf --keep 4,7,14,21,28 --fit 7,28 \\
        --other qwen2.5-coder-0.5b-instruct.gguf --work /tmp/cuts --json out.json
    python scripts/composition_check.py 1.5B.gguf --keep 7,28 --fit 7,28 --sizes 1-16 \\
        --other synthetic-qwen-14b-q4_k_m.gguf --rounds 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.runtime.calibrate import measure_curve
from pyramid_gguf.models.derive import keep_layers
from pyramid_gguf.native import NativeModel, build_id
from pyramid_gguf.planning.compose import DeviceProfile, Shape
from pyramid_gguf.planning.devices import catalogue
from pyramid_gguf.planning.memory import model_memory

SIZES = (1, 2, 4, 8, 16)


def parse_sizes(text: str) -> tuple[int, ...]:
    """``1,2,4`` or ``1-16``."""
    if "-" in text:
        lo, hi = (int(v) for v in text.split("-"))
        return tuple(range(lo, hi + 1))
    return tuple(int(v) for v in text.split(","))


def cut(src: Path, k: int, work: Path) -> Path:
    """``src`` with its first ``k`` blocks (the whole model when ``k`` is all of them)."""
    n = model_memory(src).n_layer
    if k >= n:
        return src
    out = work / f"{src.stem}-first{k}.gguf"
    if not out.exists():
        keep_layers(src, out, layer_spec=f"0-{k - 1}")
    return out


def timed(
    paths: list[Path], threads: int, rounds: int, sizes: tuple[int, ...] = SIZES
) -> dict[str, CostCurve]:
    """Each model's cost curve, the median of ``rounds`` interleaved rounds."""
    load = LoadConfig(n_ctx=512, n_threads=threads, n_threads_batch=threads)
    models = [NativeModel(p, load) for p in paths]
    try:
        runs: dict[str, list[tuple[float, ...]]] = {p.name: [] for p in paths}
        for _ in range(rounds):
            for p, m in zip(paths, models, strict=True):
                runs[p.name].append(measure_curve(m, sizes=sizes, repeats=1).curve.seconds)
    finally:
        for m in models:
            m.close()
    return {
        name: CostCurve(tuple(float(v) for v in np.median(np.array(r), axis=0)))
        for name, r in runs.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--keep", default="4,7,14,21,28", help="blocks kept by each cut")
    ap.add_argument("--fit", default="7,28", help="cuts the fresh profile is fitted to")
    ap.add_argument("--other", type=Path, action="append", default=[], help="held-out models")
    ap.add_argument("--work", type=Path, default=Path("/tmp/composition-cuts"))
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="1,2,4,8,16", help="batch sizes: 1,2,4 or 1-16")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    keep = [int(k) for k in args.keep.split(",")]
    fit_k = {int(k) for k in args.fit.split(",")}
    cuts = {k: cut(args.model, k, args.work) for k in keep}
    paths = [*cuts.values(), *args.other]
    sizes = parse_sizes(args.sizes)
    curves = timed(paths, args.threads, args.rounds, sizes)
    shapes = {p.name: Shape.of(model_memory(p)) for p in paths}
    samples = [(shapes[cuts[k].name], curves[cuts[k].name]) for k in keep if k in fit_k]
    fresh = DeviceProfile.fit("this-run", "this run", samples, max(sizes), per_layer=False)
    shipped = DeviceProfile.load(catalogue("cpu")["cpu-2core-epyc"].path)
    rows = []
    print(f"{build_id()}; {args.threads} threads, median of {args.rounds} interleaved rounds")
    head = f"{'model':<46} {'blocks':>6} {'use':<8} {'n':>3} {'ms':>8} {'fresh':>8} {'err':>7}"
    head += f" {'shipped':>8} {'err':>7}"
    print(head)
    print("-" * len(head))
    for p in paths:
        shape, curve = shapes[p.name], curves[p.name]
        k = next((k for k, c in cuts.items() if c == p), None)
        use = "fit" if k in fit_k else "held out"
        for n in sizes:
            ms = curve(n) * 1000
            f, s = fresh.cost(n, shape) * 1000, shipped.cost(n, shape) * 1000
            rows.append(
                {
                    "model": p.name,
                    "blocks": shape.n_layer,
                    "weight_bytes": shape.weight_bytes,
                    "use": use,
                    "n": n,
                    "measured_ms": round(ms, 3),
                    "fresh_ms": round(f, 3),
                    "shipped_ms": round(s, 3),
                }
            )
            print(
                f"{p.name[:46]:<46} {shape.n_layer:>6} {use:<8} {n:>3} {ms:>8.1f} {f:>8.1f} "
                f"{f / ms - 1:>+7.1%} {s:>8.1f} {s / ms - 1:>+7.1%}"
            )
    cut_names = {c.name for c in cuts.values()}
    held = [r for r in rows if r["use"] == "held out" and r["model"] in cut_names]
    if held:
        errs = [abs(r["fresh_ms"] / r["measured_ms"] - 1) for r in held]
        print(
            f"held-out cuts: median |error| {np.median(errs):.1%}, worst {max(errs):.1%} "
            f"({len(errs)} points)"
        )
    for other in args.other:
        mine = [r for r in rows if r["model"] == other.name]
        errs = [abs(r["fresh_ms"] / r["measured_ms"] - 1) for r in mine]
        print(
            f"{other.name} (held out): median |error| {np.median(errs):.1%}, worst "
            f"{max(errs):.1%} ({len(errs)} points)"
        )
    if args.json:
        doc = {"build": build_id(), "threads": args.threads, "rounds": args.rounds, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
