"""Round costs of a target bigger than the card, measured on a lent GPU (GPU.md, big targets).

A synthetic Qwen2.5-32B-shaped target (random Q4_K_M blocks, 19 GB) is loaded with the
``n_gpu_layers`` the memory planner gives it under consumer budgets, the rest of its blocks in
system RAM, the CPU held to a desktop's share of threads; the 0.5B and 7B tiers run whole on
the GPU. Each stage's figures go into ``--out``/bigtarget.json (a key per stage) as soon as
they are taken, so a run cut by its deadline keeps what it measured:

- ``plans``: the planner's ``n_gpu_layers`` per budget, for the target alone, beside the
  7B (the two-model chain) and beside the 0.5B and 7B (the pyramid);
- ``split``: the target's cost of one evaluation of k = 1..32 tokens at the 8 GiB splits
  (llama.cpp's op offload off, so every CPU-held block runs on the CPU); ``split_more``
  the other budgets' splits, measured last while time lasts;
- ``peer``: llama.cpp's own ``llama-bench`` token generation of the target alone at each
  budget's ``-ngl`` (the baseline a user has today);
- ``small``: the 0.5B and 7B whole on the GPU, k = 1..32;
- ``offload``: the target at the 8 GiB target-only split with op offload on and off at
  k = 16..64 (llama.cpp copies CPU-held weights to the GPU for batches of
  ``GGML_OP_OFFLOAD_MIN_BATCH`` = 32 tokens or more);
- ``cpu``: the 0.5B, 7B and 32B whole on the CPU (the host's CPU profile is fitted to them).

    python scripts/gpu/bigtarget.py --models-dir /tmp/bt/models \\
        --bench /tmp/bt/build/bin/llama-bench --out "$OUT" -t 8 --deadline "$(($(date +%s) + 300))"

Timings are real; acceptance rates of random weights mean nothing (combine these costs with
traces recorded on real models).
"""

from __future__ import annotations

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order": a CUDA
# model load segfaults in the GPU machines' PyTorch environment when numpy came first).
from pyramid_gguf import native  # noqa: F401

# isort: split
import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.decoding.runtime.calibrate import measure_curve
from pyramid_gguf.native import NativeModel, build_id, gpu_device
from pyramid_gguf.planning.memory import GiB, model_memory
from pyramid_gguf.planning.vram import make_plan

SPLIT_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24)
SMALL_SIZES = (*range(1, 9), 12, 16, 24, 32)
CPU_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
OFFLOAD_SIZES = (16, 32, 48, 64)
NAMES = ("qwen-0.5b", "qwen-7b", "qwen-32b")


class Run:
    """The files, threads and deadline every stage shares."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.dir: Path = args.models_dir
        self.out: Path = args.out
        self.threads: int = args.threads
        self.deadline: float = args.deadline
        self.bench: Path | None = args.bench
        self.budgets = [float(b) for b in args.budgets.split(",")]
        self.paths = {n: self.dir / f"synthetic-{n}-q4_k_m.gguf" for n in NAMES}
        self.out.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.time()

    def curve(
        self, name: str, ngl: int, sizes: tuple[int, ...], repeats: int, *, op_offload: bool = True
    ) -> dict[str, Any]:
        """Milliseconds of one evaluation of k tokens (the median of ``repeats``) for each k of
        ``sizes``, and the load's seconds, measured in a process of its own (a crash in
        llama.cpp costs one curve, and faulthandler says where)."""
        cmd = [sys.executable, "-X", "faulthandler", __file__, "--one", name, str(ngl),
               ",".join(map(str, sizes)), str(repeats), str(int(op_offload)),
               "--models-dir", str(self.dir), "-t", str(self.threads)]  # fmt: skip
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(self.left(), 5))
        except subprocess.TimeoutExpired:
            print(f"  {name} -ngl {ngl}: cut by the deadline")
            return {"model": name, "ngl": ngl, "op_offload": op_offload, "error": "deadline"}
        if out.returncode != 0:
            print(f"  {name} -ngl {ngl} op_offload={op_offload}: exit {out.returncode}")
            print(out.stderr[-1500:])
            return {"model": name, "ngl": ngl, "op_offload": op_offload,
                    "error": f"exit {out.returncode}", "stderr": out.stderr[-3000:]}  # fmt: skip
        row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {name} -ngl {ngl} op_offload={op_offload}: {row['ms']} (load {row['load_s']} s)")
        return row

    def save(self, stage: str, doc: Any) -> None:
        """Record ``doc`` as ``stage``'s result and rewrite ``bigtarget.json`` with every
        stage's so far (the device tool brings back a few files, not one per stage)."""
        self.results[stage] = doc
        text = json.dumps(self.results, indent=1) + "\n"
        (self.out / "bigtarget.json").write_text(text, encoding="utf-8")


def plans(run: Run) -> dict[str, Any]:
    """The planner's ``n_gpu_layers`` for the target per budget and ladder (no GPU needed)."""
    mm = {n: model_memory(p) for n, p in run.paths.items()}
    load = LoadConfig(n_ctx=4096)
    doc: dict[str, Any] = {}
    for b in run.budgets:
        row = {}
        for label, tiers in (
            ("alone", [("target", mm["qwen-32b"])]),
            ("with_7b", [("draft", mm["qwen-7b"]), ("target", mm["qwen-32b"])]),
            ("pyramid", [("draft", mm["qwen-0.5b"]), ("qualifier", mm["qwen-7b"]),
                         ("target", mm["qwen-32b"])]),
        ):  # fmt: skip
            plan = make_plan(tiers, int(b * GiB), load)
            row[label] = {t.tier: t.n_gpu_layers for t in plan.tiers}
        doc[f"{b:g}"] = row
        print(f"  {b:g} GiB: {row}")
    return doc


def split(run: Run, planned: dict[str, Any], *, more: bool = False) -> list[dict[str, Any]]:
    """The target at the 8 GiB pyramid split and the 8 GiB target-only split (op offload off);
    ``more``: the other budgets' splits, while time lasts."""
    eight = planned.get("8") or next(iter(planned.values()))
    first = list(dict.fromkeys([eight["pyramid"]["target"], eight["alone"]["target"]]))
    order = first
    if more:
        rest = [row[k]["target"] for row in planned.values() for k in ("pyramid", "alone")]
        order = [n for n in dict.fromkeys(rest) if n not in first]
    stage = "split_more" if more else "split"
    rows: list[dict[str, Any]] = []
    for ngl in order:
        if run.left() < 70:
            print(f"  skipped -ngl {ngl}: {run.left():.0f} s left")
            break
        rows.append(run.curve("qwen-32b", ngl, SPLIT_SIZES, 2))
        run.save(stage, rows)
    return rows


def peer(run: Run, planned: dict[str, Any]) -> list[dict[str, Any]]:
    """llama-bench's token generation of the target alone at each budget's ``-ngl``."""
    if run.bench is None:
        return []
    eight = (planned.get("8") or next(iter(planned.values())))["alone"]["target"]
    ngls = [eight, *(row["alone"]["target"] for row in planned.values()), 0]
    rows: list[dict[str, Any]] = []
    for ngl in dict.fromkeys(ngls):
        if run.left() < 45:
            break
        cmd = [str(run.bench), "-m", str(run.paths["qwen-32b"]), "-ngl", str(ngl),
               "-t", str(run.threads), "-p", "0", "-n", "16", "-r", "2", "-o", "json"]  # fmt: skip
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=max(run.left() - 30, 10)
            )
        except subprocess.TimeoutExpired:
            print(f"  llama-bench -ngl {ngl}: timed out")
            break
        try:
            res = json.loads(out.stdout)
        except json.JSONDecodeError:
            print(f"  llama-bench -ngl {ngl} failed: {out.stderr[-400:]}")
            continue
        for r in res:
            rows.append({"ngl": ngl, "avg_ts": r.get("avg_ts"), "stddev_ts": r.get("stddev_ts"),
                         "n_gen": r.get("n_gen"), "flash_attn": r.get("flash_attn"),
                         "cpu_info": r.get("cpu_info"), "gpu_info": r.get("gpu_info"),
                         "build_commit": r.get("build_commit")})  # fmt: skip
            print(f"  llama-bench -ngl {ngl}: {r.get('avg_ts'):.2f} tok/s")
        run.save("peer", rows)
    return rows


def small(run: Run) -> list[dict[str, Any]]:
    rows = [run.curve(n, -1, SMALL_SIZES, 3) for n in ("qwen-0.5b", "qwen-7b")]
    run.save("small", rows)
    return rows


def offload(run: Run, planned: dict[str, Any]) -> list[dict[str, Any]]:
    ngl = (planned.get("8") or next(iter(planned.values())))["alone"]["target"]
    rows = [run.curve("qwen-32b", ngl, OFFLOAD_SIZES, 1, op_offload=True)]
    run.save("offload", rows)
    if run.left() > 90:
        rows.append(run.curve("qwen-32b", ngl, OFFLOAD_SIZES, 1, op_offload=False))
        run.save("offload", rows)
    return rows


def cpu(run: Run) -> list[dict[str, Any]]:
    rows = []
    for name, sizes, repeats in (
        ("qwen-0.5b", CPU_SIZES, 2),
        ("qwen-7b", CPU_SIZES, 2),
        ("qwen-32b", (1, 2, 4, 8, 16), 1),
    ):
        if run.left() < (90 if name == "qwen-32b" else 40):
            break
        rows.append(run.curve(name, 0, sizes, repeats, op_offload=False))
        run.save("cpu", rows)
    return rows


def one(args: argparse.Namespace) -> None:
    """``--one NAME NGL SIZES REPEATS OFFLOAD``: one curve, printed as a JSON line."""
    name, ngl, sizes_text, repeats, offload_flag = args.one
    sizes = tuple(int(k) for k in sizes_text.split(","))
    load = LoadConfig(
        n_gpu_layers=int(ngl),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        op_offload=offload_flag == "1",
    )
    t0 = time.perf_counter()
    with NativeModel(args.models_dir / f"synthetic-{name}-q4_k_m.gguf", load) as m:
        loaded = time.perf_counter() - t0
        curve = measure_curve(m, sizes=sizes, repeats=int(repeats)).curve
    print(json.dumps({"model": name, "ngl": int(ngl), "op_offload": load.op_offload,
                      "repeats": int(repeats), "load_s": round(loaded, 2),
                      "ms": {k: round(curve(k) * 1e3, 3) for k in sizes}}))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", type=Path, default=Path("/tmp/bt/models"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/bt/out"))
    ap.add_argument("--bench", type=Path, default=None, help="llama.cpp's llama-bench")
    ap.add_argument("--threads", "-t", type=int, default=8)
    ap.add_argument("--budgets", default="6,8,12,16", help="VRAM budgets in GiB")
    ap.add_argument("--deadline", type=float, default=time.time() + 600, help="epoch seconds")
    ap.add_argument("--stages", default="plans,split,small,peer,offload,cpu,split_more")
    ap.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args)
        return
    run = Run(args)
    device = gpu_device()
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    gpu = device[0] if device else None
    run.save("meta", {"build": build_id(), "gpu": gpu, "threads": run.threads, "date": when})
    print(f"{build_id()}; GPU: {device[0] if device else 'none'}; {run.threads} threads")
    wanted = args.stages.split(",")
    planned: dict[str, Any] = {}
    stages: dict[str, Callable[[], Any]] = {
        "plans": lambda: plans(run),
        "split": lambda: split(run, planned),
        "split_more": lambda: split(run, planned, more=True),
        "peer": lambda: peer(run, planned),
        "small": lambda: small(run),
        "offload": lambda: offload(run, planned),
        "cpu": lambda: cpu(run),
    }
    for name in wanted:
        if run.left() < 30:
            print(f"stage {name}: skipped, {run.left():.0f} s left")
            continue
        t0 = time.time()
        print(f"stage {name} ({run.left():.0f} s left)", flush=True)
        try:
            doc = stages[name]()
        except Exception as e:  # a stage's failure must not cost the others their time
            print(f"stage {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if name == "plans":
            planned.update(doc)
        run.save(name, doc)
        print(f"stage {name}: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
