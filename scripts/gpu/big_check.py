"""The composition model against a target bigger than the card, from a lent GPU's figures.

Reads what the big-target run measured (``docs/gpu-big/bigtarget-h200.json``; its stages are now
``scripts/gpu/kit.sh``'s) and checks the planner's composition on it (docs/ALGORITHMS.md,
"Placements"): a CPU profile of that host fitted to the 0.5B and 7B whole on its CPU, a GPU
profile fitted to the same two whole on its GPU, the split 32B priced as its CPU part plus its
GPU part plus one transfer, against the split 32B measured at each ``-ngl`` (k = 1..16), the 32B
whole on the CPU (the big shape priced from small ones), and llama-bench's token generation at
each budget's ``-ngl``. Then the op offload of long verifications: what a batch of 32 or more
costs when llama.cpp copies the CPU-held weights to the GPU, as a transfer rate.

    python scripts/gpu/big_check.py [docs/gpu-big/bigtarget-h200.json] [--json OUT]

No GPU or model file is needed: the synthetic ladder's memory facts come from header-only
copies (``synth_ladder.py --header-only``, sparse files).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_ladder import ladder_paths

from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.planning.compose import MAX_N, DeviceProfile, Link, Shape, composed_curve, split
from pyramid_gguf.planning.memory import ModelMemory, model_memory

NAMES = ("qwen-0.5b", "qwen-7b", "qwen-32b")
SHOWN = (1, 2, 4, 8, 16)


def curve(row: dict[str, Any]) -> CostCurve:
    """A measured row's milliseconds as seconds for n = 1..16, interpolated between sizes."""
    xs = sorted(int(k) for k in row["ms"])
    ys = [row["ms"][str(k)] / 1e3 for k in xs]
    return CostCurve(tuple(float(v) for v in np.interp(range(1, MAX_N + 1), xs, ys)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "figures", nargs="?", type=Path, default=Path("docs/gpu-big/bigtarget-h200.json")
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    doc = json.loads(args.figures.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        paths = ladder_paths(Path(tmp), NAMES, header_only=True)
        mm: dict[str, ModelMemory] = {n: model_memory(p) for n, p in zip(NAMES, paths, strict=True)}
    rows = [r for stage in ("split", "small", "cpu", "split_more") for r in doc.get(stage, [])]
    on_cpu = {r["model"]: curve(r) for r in rows if r["ngl"] == 0}
    on_gpu = {r["model"]: curve(r) for r in rows if r["ngl"] == -1}
    splits = {r["ngl"]: curve(r) for r in rows if r["model"] == "qwen-32b" and r["ngl"] > 0}
    small = ("qwen-0.5b", "qwen-7b")
    cpu_samples = [(Shape.of(mm[n]), on_cpu[n]) for n in small]
    cpu = DeviceProfile.fit("host-cpu", "0.5B, 7B on its CPU", cpu_samples, per_layer=False)
    gpu = DeviceProfile.fit(
        "host-gpu", "0.5B and 7B whole on the GPU", [(Shape.of(mm[n]), on_gpu[n]) for n in small]
    )
    target = mm["qwen-32b"]
    out: dict[str, Any] = {"source": str(args.figures), "meta": doc.get("meta"), "rows": []}
    meta = doc["meta"]
    print(f"{meta['gpu']}, {meta['threads']} CPU threads; {meta['build'][:60]}...")
    print("ms per evaluation of k tokens, measured / predicted (profiles fitted to 0.5B and 7B)")
    print(f"{'placement':<28}" + "".join(f"{'k=' + str(k):>16}" for k in SHOWN))
    cases = [("32B whole on the CPU", 0, on_cpu.get("qwen-32b"))]
    cases += [(f"32B at -ngl {g}", g, c) for g, c in sorted(splits.items())]
    errors = []
    for label, ngl, measured in cases:
        if measured is None:
            continue
        predicted = composed_curve(target, ngl, cpu, gpu if ngl else None, Link())
        cells = []
        for k in SHOWN:
            m, p = measured(k), predicted(k)
            errors.append(abs(p / m - 1))
            cells.append(f"{m * 1e3:7.0f}/{p * 1e3:<7.0f}")
            row = {"placement": label, "ngl": ngl, "k": k, "measured_ms": round(m * 1e3, 1)}
            out["rows"].append(row | {"predicted_ms": round(p * 1e3, 1)})
        on_host, on_card = (part.weight_bytes / 2**30 for part in split(target, ngl))
        where = f"   ({on_host:.1f} GiB on the CPU, {on_card:.1f} on the GPU)"
        print(f"{label:<28}" + "".join(f"{c:>16}" for c in cells) + where)
    print(f"median |error| {np.median(errors):.1%}, worst {max(errors):.1%}")
    print("\nllama-bench token generation of the 32B alone, tok/s: measured / predicted")
    for r in doc.get("peer", []):
        p = 1 / composed_curve(target, r["ngl"], cpu, gpu if r["ngl"] else None, Link())(1)
        print(f"  -ngl {r['ngl']:>3}: {r['avg_ts']:6.2f} / {p:6.2f} ({p / r['avg_ts'] - 1:+.1%})")
        out["rows"].append({"placement": "llama-bench tg", "ngl": r["ngl"], "k": 1,
                            "measured_tps": r["avg_ts"], "predicted_tps": round(p, 3)})  # fmt: skip
    offload = {r["op_offload"]: r["ms"] for r in doc.get("offload", [])}
    if offload:
        ngl = doc["offload"][0]["ngl"]
        cpu_bytes = split(target, ngl)[0].weight_bytes
        print(
            f"\nop offload at -ngl {ngl} ({cpu_bytes / 2**30:.1f} GiB of weights on the CPU), ms:"
        )
        for k in sorted({int(k) for m in offload.values() for k in m}):
            on, off = offload.get(True, {}).get(str(k)), offload.get(False, {}).get(str(k))
            print(f"  k={k:>3}: op offload on {on}, off {off}")
        on32 = offload[True]["32"] / 1e3
        rate = cpu_bytes / on32
        print(
            f"  a batch of 32+ with op offload: {on32:.2f} s, the CPU-held weights crossing at "
            f"{rate / 1e9:.1f} GB/s (a lower bound on the copy rate: GPU compute included)"
        )
        out["op_offload"] = {"ngl": ngl, "cpu_bytes": cpu_bytes, "seconds_32": on32}
        out["op_offload"]["bytes_per_s"] = rate
    out["cpu_profile"], out["gpu_profile"] = cpu.to_dict(), gpu.to_dict()
    out["median_abs_error"], out["worst_abs_error"] = float(np.median(errors)), float(max(errors))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
