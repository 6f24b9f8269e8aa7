"""Fit a device profile (what a byte of weights, a block and an evaluation cost on one device, per
batch size) to measured batch cost curves of whole models, for ``pyramid-gguf plan``.

    python scripts/batch_cost.py a.gguf b.gguf c.gguf --n-gpu-layers 0 --json > cpu.json
    python scripts/device_profile.py cpu.json --models-dir . --name cpu --source "..." \\
        -o ~/.cache/pyramid-gguf/devices/cpu.json

The curves come from ``scripts/batch_cost.py --json`` (``docs/gpu-h100/batch_cost.json`` is
the H100's); the models only need their headers (``scripts/gpu/synth_ladder.py --header-only``
writes them for the synthetic shapes). Prints the fit's largest relative error per model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.planning.compose import MAX_N, DeviceProfile, Shape
from pyramid_gguf.planning.memory import model_memory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("costs", type=Path, help="scripts/batch_cost.py --json output")
    ap.add_argument("--models-dir", type=Path, required=True, help="where the GGUF files are")
    ap.add_argument("--name", required=True, help="device name (cpu, h100, ...)")
    ap.add_argument("--source", required=True, help="machine, build, date of the curves")
    ap.add_argument("--max", type=int, default=MAX_N, help="batch sizes fitted: 1..max")
    ap.add_argument("--no-layer-term", action="store_true", help="fit bytes and fixed only (CPU)")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args()
    ms = json.loads(args.costs.read_text())["ms_per_decode"]
    samples = [
        (Shape.of(model_memory(args.models_dir / name)), CostCurve(tuple(v / 1000 for v in row)))
        for name, row in ms.items()
    ]
    profile = DeviceProfile.fit(
        args.name, args.source, samples, args.max, per_layer=not args.no_layer_term
    )
    profile.save(args.output)
    for name, err in zip(ms, profile.errors(samples), strict=True):
        print(f"{name:<48} largest fit error {err:6.1%}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
