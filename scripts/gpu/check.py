"""Check the memory planner against what llama.cpp really allocates on a GPU.

Run on a machine with a CUDA build of llama-cpp-python (builds nothing)::

    python scripts/gpu/check.py --out /tmp/gpu_check [--ladder llama] [--budgets 4GiB,6GiB]

It writes random-weight Q4_K_M ladders shaped like Llama 3.2 1B / 3.2 3B / 3.1 8B (or Qwen2.5
0.5B / 1.5B / 7B) with ``scripts/gpu/synth_ladder.py``, plans each budget, loads every tier with
the planned ``n_gpu_layers`` and records, next to the plan's per-tier GPU bytes, what llama.cpp
reports (its ``CUDA0 ... buffer size`` lines: weights, KV cache, compute) and the device memory
the load took (``nvidia-smi``, CUDA's own context included) in ``<out>/report.json``.
``--layers-scale 0.25`` keeps a quarter of the blocks (same widths) when time is short.
"""

from __future__ import annotations

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order": a CUDA
# model load segfaults in the GPU machines' PyTorch environment when numpy came first).
from pyramid_gguf import native

# isort: split
import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_ladder import LADDERS, ladder_paths

from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.planning.memory import model_memory, parse_size
from pyramid_gguf.planning.vram import fit_ladder

MiB = 1 << 20
_LOG = re.compile(r"offload|buffer size|KV self size|llama_kv_cache: size", re.IGNORECASE)
_GPU_BUFFER = re.compile(r"CUDA0 (\w+) buffer size =\s*([\d.]+) MiB")


def gpu_used_mib() -> float | None:
    """Device memory in use, per ``nvidia-smi`` (None where it is missing)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return float(out.split()[0])


def load_and_capture(
    path: Path, ngl: int, n_ctx: int, type_k: str, op_offload: bool = True
) -> tuple[list[str], float | None]:
    """Load ``path``; return llama.cpp's offload and buffer-size log lines and the device
    memory (MiB) in use while it is loaded minus before."""
    os.environ["PYRAMID_GGUF_VERBOSE"] = "1"  # native's log sink prints to sys.stdout
    log = io.StringIO()
    before = gpu_used_mib()
    delta = None
    try:
        with contextlib.redirect_stdout(log):
            cfg = LoadConfig(
                n_ctx=n_ctx,
                n_gpu_layers=ngl,
                op_offload=op_offload,
                type_k=type_k,  # type: ignore[arg-type]
                type_v=type_k,  # type: ignore[arg-type]
                flash_attn=True if type_k not in ("f16", "f32") else None,
            )
            with native.NativeModel(path, cfg):  # buffers are reserved with the context
                during = gpu_used_mib()
                if before is not None and during is not None:
                    delta = during - before
    finally:
        os.environ.pop("PYRAMID_GGUF_VERBOSE", None)
    lines = [line.strip() for line in log.getvalue().splitlines() if _LOG.search(line)]
    return lines, delta


def reported_gpu_mib(lines: list[str]) -> dict[str, float]:
    """llama.cpp's CUDA0 buffers by kind (model, KV, compute, ...), in MiB."""
    sizes: dict[str, float] = {}
    for line in lines:
        for kind, mib in _GPU_BUFFER.findall(line):
            sizes[kind] = sizes.get(kind, 0.0) + float(mib)
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/gpu_check"))
    ap.add_argument("--ladder", choices=sorted(LADDERS), default="llama")
    ap.add_argument("--models-dir", type=Path, help="where the synthetic GGUFs go [--out]")
    ap.add_argument("--budgets", default="4GiB,6GiB,8GiB,12GiB")
    ap.add_argument("--ctx-size", type=int, default=4096)
    ap.add_argument("--layers-scale", type=float, default=1.0)
    ap.add_argument("--allow-cpu", action="store_true", help="Smoke-test on a CPU build.")
    args = ap.parse_args()
    if not native.supports_gpu_offload() and not args.allow_cpu:
        sys.exit("this llama.cpp build has no GPU offload; nothing to check")
    args.out.mkdir(parents=True, exist_ok=True)
    names = LADDERS[args.ladder]
    files = ladder_paths(args.models_dir or args.out, names, args.layers_scale)
    paths = LadderPaths(files[2], files[1], files[0])
    models = {}
    for n, p in zip(names, files, strict=True):
        mm = model_memory(p)
        models[n] = {"path": str(p), "weight_bytes": mm.weight_bytes, "n_layer": mm.n_layer}
    report: dict[str, Any] = {"ladder": args.ladder, "models": models, "runs": []}
    print(f"{'budget':>7} {'tier':<9} {'ngl':>4} {'planned MiB':>11} {'llama.cpp MiB':>13} "
          f"{'ratio':>6} {'nvidia-smi delta':>16}")  # fmt: skip
    for budget in args.budgets.split(","):
        plan = fit_ladder(
            parse_size(budget), paths, LoadConfig(n_ctx=args.ctx_size), kv_quant="auto"
        )
        kv = plan.load.type_k
        for tp in plan.tiers:
            lines, delta = load_and_capture(
                Path(tp.path), tp.n_gpu_layers, args.ctx_size, kv, tp.op_offload
            )
            got = reported_gpu_mib(lines)
            planned = tp.gpu_bytes / MiB
            actual = sum(got.values())
            run = {
                "budget": budget,
                "plan": tp.to_dict(),
                "type_k": kv,
                "planned_gpu_mib": round(planned, 1),
                "llama_gpu_mib": got,
                "llama_gpu_mib_total": round(actual, 1),
                "ratio": round(actual / planned, 4) if planned else None,
                "nvidia_smi_delta_mib": delta,
                "llama": lines,
            }
            report["runs"].append(run)
            ratio = f"{actual / planned:6.3f}" if planned else "     -"
            print(f"{budget:>7} {tp.tier:<9} {tp.n_gpu_layers:>4} {planned:>11.0f} "
                  f"{actual:>13.0f} {ratio} {delta if delta is not None else '-':>16}",
                  flush=True)  # fmt: skip
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out / 'report.json'}")


if __name__ == "__main__":
    main()
