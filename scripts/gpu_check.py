"""Check the memory planner against what llama.cpp really allocates on a GPU.

Run on a machine with a CUDA build of llama-cpp-python (builds nothing)::

    python scripts/gpu_check.py --out /tmp/gpu_check [--models 1b,3b,8b] [--budgets 2GiB,6GiB]

It writes random-weight f16 GGUF ladders shaped like Llama 3.2 1B / 3B and Llama 3.1 8B
(128k vocabulary; 1B and 3B with tied embeddings, as the real ones) with
``tests/synth.py``, quantizes them to Q4_K_M with llama.cpp, plans each budget, loads
every tier with the planned ``n_gpu_layers`` and records llama.cpp's own log lines
(``offloaded k/n layers``, ``CUDA0 model/KV/compute buffer size``) next to the plan's
predictions in ``<out>/report.json``. ``--layers-scale 0.25`` keeps a quarter of the blocks
(same widths) when disk or time is short. Needs ~25 GB of disk and RAM for the 8B at full scale.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from pyramid_gguf import native
from pyramid_gguf.config import LoadConfig
from pyramid_gguf.ladder import LadderPaths
from pyramid_gguf.models.memory import model_memory, parse_size
from pyramid_gguf.models.planner import plan_ladder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from synth import TinySpec, tiny_vocab, write_tiny_llama

N_VOCAB = 128256
SHAPES = {  # n_embd, n_layer, n_head, n_head_kv, n_ff, tied, seed
    "1b": (2048, 16, 32, 8, 8192, True, 1),
    "3b": (3072, 28, 24, 8, 8192, True, 3),
    "8b": (4096, 32, 32, 8, 14336, False, 8),
}
_LOG = re.compile(r"offload|buffer size|KV self size|llama_kv_cache: size", re.IGNORECASE)


def build(name: str, out: Path, scale: float) -> Path:
    dst = out / f"llama-{name}-q4_k_m.gguf"
    if dst.exists():
        return dst
    n_embd, n_layer, n_head, n_head_kv, n_ff, tied, seed = SHAPES[name]
    base_tokens = len(tiny_vocab(0)[0])
    spec = TinySpec(
        n_embd=n_embd, n_layer=max(1, round(n_layer * scale)), n_head=n_head,
        n_head_kv=n_head_kv, n_ff=n_ff, n_ctx_train=131072,
        n_extra_tokens=N_VOCAB - base_tokens, dtype="f16", tied_output=tied,
    )  # fmt: skip
    f16 = out / f"llama-{name}-f16.gguf"
    print(f"writing {f16} ...", flush=True)
    write_tiny_llama(f16, seed=seed, spec=spec, name=f"synthetic-llama-{name}")
    print(f"quantizing to {dst} ...", flush=True)
    native.quantize(f16, dst, native.ftype_names()["Q4_K_M"], threads=os.cpu_count() or 4)
    f16.unlink()
    return dst


def load_and_capture(path: Path, ngl: int, n_ctx: int, type_k: str) -> list[str]:
    """Load ``path`` and return llama.cpp's offload and buffer-size log lines."""
    os.environ["PYRAMID_GGUF_VERBOSE"] = "1"  # native's log sink prints to sys.stdout
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            cfg = LoadConfig(
                n_ctx=n_ctx,
                n_gpu_layers=ngl,
                type_k=type_k,
                type_v=type_k,  # type: ignore[arg-type]
                flash_attn=True if type_k not in ("f16", "f32") else None,
            )
            with native.NativeModel(path, cfg):
                pass  # buffers are reserved when the context is created
    finally:
        os.environ.pop("PYRAMID_GGUF_VERBOSE", None)
    return [line.strip() for line in log.getvalue().splitlines() if _LOG.search(line)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/gpu_check"))
    ap.add_argument("--models", default="1b,3b,8b", help="Ladder, smallest first.")
    ap.add_argument("--budgets", default="1GiB,3GiB,6GiB,12GiB")
    ap.add_argument("--ctx-size", type=int, default=4096)
    ap.add_argument("--layers-scale", type=float, default=1.0)
    ap.add_argument("--allow-cpu", action="store_true", help="Smoke-test on a CPU build.")
    args = ap.parse_args()
    if not native.supports_gpu_offload() and not args.allow_cpu:
        sys.exit("this llama.cpp build has no GPU offload; nothing to check")
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.models.split(",")
    paths = [build(n, args.out, args.layers_scale) for n in names]
    tiers = dict(zip(("draft", "qualifier", "target")[-len(paths) :], paths, strict=True))
    models = {}
    for n, p in zip(names, paths, strict=True):
        mm = model_memory(p)
        models[n] = {"path": str(p), "weight_bytes": mm.weight_bytes, "n_layer": mm.n_layer}
    report: dict[str, Any] = {"models": models, "runs": []}
    for budget in args.budgets.split(","):
        paths = LadderPaths(tiers["target"], tiers.get("qualifier"), tiers.get("draft"))
        load = LoadConfig(n_ctx=args.ctx_size)
        plan = plan_ladder(parse_size(budget), paths, load, kv_quant="auto")
        kv = plan.load.type_k
        for tp in plan.tiers:
            lines = load_and_capture(Path(tp.path), tp.n_gpu_layers, args.ctx_size, kv)
            run = {"budget": budget, "plan": tp.to_dict(), "type_k": kv, "llama": lines}
            report["runs"].append(run)
            print(json.dumps(run, indent=1), flush=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out / 'report.json'}")


if __name__ == "__main__":
    main()
