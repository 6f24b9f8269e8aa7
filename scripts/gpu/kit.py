"""The GPU kit's measurements and predictions (GPU.md, "Long blocks"; run by ``kit.sh``).

A synthetic target bigger than the card (a Qwen2.5-32B shape, random Q4_K_M blocks) split at
two ``-ngl`` values the memory planner gives under ``--budget`` (beside the qualifier, the
two-model chain's; beside the draft and qualifier, the pyramid's), its CPU-held weights
memory-mapped (llama.cpp's default) and pinned (``--no-mmap``: the GPU's host buffer). Each
stage's figures go into ``--out``/kit.json as soon as they are taken (a key per stage), so a
run cut by its deadline keeps what it measured:

- ``meta``: the build, the GPU, threads, the date, whether this is the CPU rehearsal;
- ``plans``: the planner's ``n_gpu_layers`` for the target alone, beside the qualifier and
  beside both smaller tiers (no GPU needed);
- ``curves``: our verification curve (every row's logits, as a verification reads them) of
  the target at both splits, mapped and pinned, ``k`` = 1..128 (op offload on: from 32 tokens
  llama.cpp copies the CPU-held weights to the GPU), and the draft and qualifier whole;
- ``bench``: llama.cpp's ``llama-bench`` beside it: prompt processing of ``k`` tokens at each
  split and load mode, token generation of the target alone at its own best ``-ngl``;
- ``predict``: ``auto`` replayed over stand-in traces (the shipped traces of the default
  ladder, recorded on real models: acceptance never comes from random weights) on those
  measured curves: the best two-model chain, the pyramid, ``auto``'s pick, and llama.cpp's
  ``-md`` at its best ``--spec-draft-n-max`` (1..64) and ``-p-min`` in the same placement
  (:mod:`pyramid_gguf.planning.peer`), and the issue's ratios.

    python scripts/gpu/kit.py --models-dir /tmp/kit/models --bench .../llama-bench \\
        --out "$OUT" -t 8 --budget 12GiB --deadline "$(($(date +%s) + 300))"
    python scripts/gpu/kit.py predict --from "$OUT/kit.json"      # the prediction alone

``--cpu`` is the rehearsal on a machine without a GPU (``kit.sh --cpu``): the tiny synthetic
ladder, short curves, the same stages and the same JSON. Timings of random weights are real;
their acceptance is meaningless and never used.
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.decoding.offline.replay import replay_trace
from pyramid_gguf.decoding.offline.traces import TraceSet
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.planning.memory import model_memory, parse_size
from pyramid_gguf.planning.peer import PeerWalks
from pyramid_gguf.planning.sources import traces_for
from pyramid_gguf.planning.vram import make_plan

#: Block sizes of a verification curve: around the op-offload threshold (32) and past auto's
#: longest block (64).
SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
#: The CPU rehearsal's (the same stages, a minute on two cores).
CPU_SIZES = (1, 2, 4, 8, 16)
#: Tier -> synthetic shape (synth_ladder.py), on a GPU and in the CPU rehearsal.
LADDERS = {
    "gpu": {"draft": "qwen-0.5b", "qualifier": "qwen-7b", "target": "qwen-32b"},
    "cpu": {"draft": "tiny-s", "qualifier": "tiny-m", "target": "tiny-l"},
}
LOAD_MODES = {"mapped": True, "pinned": False}  # -> LoadConfig.use_mmap
#: Issue 48's goals (predicted until a GPU measures them).
GOALS = {"pyramid_vs_two": 1.15, "auto_vs_ngl": 3.0, "auto_vs_md": 1.15}
#: Seconds kept for the prediction (no GPU, a few seconds) when a measurement is cut.
RESERVE_S = 25
#: The stand-in traces' ladder (shipped with the package, recorded on real models).
STAND_IN = "qwen2.5-coder-demo"


class Run:
    """The files, threads, sizes and deadline every stage shares; ``kit.json`` rewritten after
    each stage (the device tool brings back files, not a stream)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.dir: Path = args.models_dir
        self.out: Path = args.out
        self.threads: int = args.threads
        self.deadline: float = args.deadline
        self.bench: Path | None = args.bench if args.bench and args.bench.exists() else None
        self.cpu: bool = args.cpu
        self.budget = parse_size(args.budget)
        self.sizes = CPU_SIZES if args.cpu else SIZES
        self.repeats = 1 if args.cpu else 2
        self.sets: tuple[str, ...] = tuple(args.sets or ())
        names = LADDERS["cpu" if args.cpu else "gpu"]
        self.paths = {t: self.dir / f"synthetic-{n}-q4_k_m.gguf" for t, n in names.items()}
        self.out.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self, stage: str, doc: Any) -> None:
        self.results[stage] = doc
        text = json.dumps(self.results, indent=1) + "\n"
        (self.out / "kit.json").write_text(text, encoding="utf-8")

    def curve(self, tier: str, ngl: int, weights: str) -> dict[str, Any]:
        """Milliseconds of one evaluation of k tokens (the median of the repeats) for each k,
        and the load's seconds, measured in a process of its own (a crash in llama.cpp costs
        one curve, and faulthandler says where)."""
        cmd = [sys.executable, "-X", "faulthandler", __file__, "one", tier, str(ngl), weights,
               ",".join(map(str, self.sizes)), str(self.repeats), "--models-dir", str(self.dir),
               "-t", str(self.threads)] + (["--cpu"] if self.cpu else [])  # fmt: skip
        head = {"tier": tier, "ngl": ngl, "weights": weights}
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=max(self.left() - RESERVE_S, 5)
            )
        except subprocess.TimeoutExpired:
            print(f"  {tier} -ngl {ngl} {weights}: cut by the deadline", flush=True)
            return head | {"error": "deadline"}
        if out.returncode != 0:
            print(f"  {tier} -ngl {ngl} {weights}: exit {out.returncode}\n{out.stderr[-1500:]}")
            return head | {"error": f"exit {out.returncode}", "stderr": out.stderr[-3000:]}
        row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {tier} -ngl {ngl} {weights}: {row['ms']} (load {row['load_s']} s)", flush=True)
        return row


def plans(run: Run) -> dict[str, Any]:
    """The planner's ``n_gpu_layers`` per tier: the target alone, the two-model chain (the
    qualifier drafts), the pyramid. The CPU rehearsal plans with no VRAM margin (its models
    are a few MiB)."""
    mm = {t: model_memory(p) for t, p in run.paths.items()}
    load = LoadConfig(n_ctx=4096)
    margin = 0 if run.cpu else None
    doc: dict[str, Any] = {"budget_bytes": run.budget}
    for label, tiers in (
        ("alone", ("target",)),
        ("two", ("qualifier", "target")),
        ("pyramid", ("draft", "qualifier", "target")),
    ):
        plan = make_plan([(t, mm[t]) for t in tiers], run.budget, load, margin_bytes=margin)
        doc[label] = {t.tier: t.n_gpu_layers for t in plan.tiers}
    print(f"  {doc}", flush=True)
    return doc


def splits(planned: Mapping[str, Any]) -> list[int]:
    """The two ``-ngl`` values of the target the kit measures: the pyramid's, the two-model
    chain's (one when they coincide)."""
    return list(dict.fromkeys([planned["pyramid"]["target"], planned["two"]["target"]]))


def curves(run: Run, planned: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for tier in ("draft", "qualifier"):
        rows.append(run.curve(tier, -1, "mapped"))
        run.save("curves", rows)
    for ngl in splits(planned):
        for weights in LOAD_MODES:
            if run.left() < 40:
                print(f"  skipped -ngl {ngl} {weights}: {run.left():.0f} s left")
                return rows
            rows.append(run.curve("target", ngl, weights))
            run.save("curves", rows)
    return rows


def _bench(run: Run, args: list[str]) -> list[dict[str, Any]]:
    assert run.bench is not None
    cmd = [str(run.bench), "-m", str(run.paths["target"]), "-t", str(run.threads), "-o", "json",
           "-r", str(run.repeats), *args]  # fmt: skip
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=max(run.left() - RESERVE_S, 5)
        )
        res = json.loads(out.stdout)
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        print(f"  llama-bench {' '.join(args)}: {type(e).__name__}")
        return []
    keep = ("n_gpu_layers", "load_mode", "n_prompt", "n_gen", "avg_ts", "stddev_ts", "avg_ns",
            "cpu_info", "gpu_info", "build_commit", "use_mmap")  # fmt: skip
    return [{k: r.get(k) for k in keep if k in r} for r in res]


def bench(run: Run, planned: Mapping[str, Any]) -> dict[str, Any]:
    """llama-bench beside our curves: ``pp`` of k tokens at each split, mapped and pinned
    (``-lm mmap`` / ``-lm none``), and token generation of the target alone at its ``-ngl``."""
    if run.bench is None:
        return {"skipped": "no llama-bench (kit.sh builds it; --bench names it)"}
    sizes = ",".join(map(str, run.sizes))
    doc: dict[str, Any] = {"tg": [], "pp": []}
    alone = planned["alone"]["target"]
    doc["tg"] = _bench(run, ["-ngl", str(alone), "-p", "0", "-n", "16", "-lm", "mmap,none"])
    run.save("bench", doc)
    for ngl in splits(planned):
        if run.left() < 40:
            break
        doc["pp"] += _bench(run, ["-ngl", str(ngl), "-p", sizes, "-n", "0", "-lm", "mmap,none"])
        run.save("bench", doc)
    return doc


# --- the prediction (no GPU, no model: measured curves and stand-in traces) -------------------


def to_curve(ms: Mapping[str, float], n_max: int = max(SIZES)) -> CostCurve:
    """Measured milliseconds at some sizes as a cost curve for ``n = 1..n_max`` (linear
    between measured sizes; past the last, the cost curve's own extrapolation)."""
    xs = sorted(int(k) for k in ms)
    ys = [ms[str(k)] / 1e3 for k in xs]
    top = min(n_max, xs[-1])
    return CostCurve(tuple(float(v) for v in np.interp(range(1, top + 1), xs, ys)))


def replay(traces: TraceSet, costs: Mapping[str, CostCurve], spec: SpecConfig) -> dict[str, Any]:
    """``auto`` over every trace on ``costs``: tokens per second, and the tokens each chain
    committed."""
    tokens, seconds = 0, 0.0
    chains: dict[str, int] = {}
    for trace in traces.traces:
        only = trace if set(trace.tiers) <= set(costs) else _only(trace, costs)
        r = replay_trace(only, costs, spec)
        tokens, seconds = tokens + len(r.tokens), seconds + r.seconds
        if r.stats.auto is not None:
            for c in r.stats.auto.choices.values():
                chains[c.chain] = chains.get(c.chain, 0) + c.committed
    main = max((c for c in chains if c != "target"), key=lambda c: chains[c], default="target")
    return {"tps": tokens / seconds if seconds else 0.0, "chains": chains, "main_chain": main}


def _only(trace: Any, costs: Mapping[str, CostCurve]) -> Any:
    from dataclasses import replace

    return replace(trace, tiers={t: v for t, v in trace.tiers.items() if t in costs})


def predict(doc: Mapping[str, Any], traces: TraceSet, spec: SpecConfig) -> dict[str, Any]:
    """The issue's comparisons on the measured curves (per CPU-weights placement, and the best
    of them): the two-model chain (the qualifier drafts; target at the two-model split), the
    pyramid (target at the pyramid's split), ``auto`` (the faster placement), llama.cpp
    ``-md`` at its best knobs in each, and llama.cpp's best ``-ngl`` alone (llama-bench's
    token generation when measured, else our one-token cost at the pyramid's split)."""
    planned = doc["plans"]
    rows = [r for r in doc.get("curves", []) if "ms" in r]
    small = {r["tier"]: to_curve(r["ms"]) for r in rows if r["tier"] != "target"}
    target = {(r["ngl"], r["weights"]): to_curve(r["ms"]) for r in rows if r["tier"] == "target"}
    if not {"draft", "qualifier"} <= set(small) or not target:
        raise UserError("kit.json holds no curves of the small tiers and the target to price")
    walks = PeerWalks(traces)
    out: dict[str, Any] = {"traces": f"{traces.ladder}: {len(traces.traces)} traces"}
    placements: dict[str, Any] = {}
    for weights in LOAD_MODES:
        two_t = target.get((planned["two"]["target"], weights))
        three_t = target.get((planned["pyramid"]["target"], weights))
        for name, costs in (
            ("two", {"qualifier": small["qualifier"], "target": two_t}),
            ("pyramid", {"draft": small["draft"], "qualifier": small["qualifier"],
                         "target": three_t}),
        ):  # fmt: skip
            if costs["target"] is None:
                continue
            priced = {k: v for k, v in costs.items() if v is not None}
            got = replay(traces, priced, spec)
            peer = walks.best(priced)
            got["peer"] = None if peer is None else peer.to_dict()
            placements[f"{name}, {weights}"] = got
    if not placements:
        raise UserError("kit.json holds no target curve at the planned splits")
    out["placements"] = placements

    def best(prefix: str) -> tuple[str, float]:
        cands = {k: v["tps"] for k, v in placements.items() if k.startswith(prefix)}
        k = max(cands, key=lambda c: cands[c]) if cands else ""
        return k, cands.get(k, float("nan"))

    two_at, two = best("two")
    three_at, three = best("pyramid")
    auto_at, auto = best("")
    md_at = max(
        (k for k, v in placements.items() if v["peer"]),
        key=lambda k: placements[k]["peer"]["tps"],
        default="",
    )
    md = placements[md_at]["peer"]["tps"] if md_at else float("nan")
    tg = [r["avg_ts"] for r in doc.get("bench", {}).get("tg", []) if r.get("avg_ts")]
    if tg:
        ngl, ngl_how = max(tg), "llama-bench tg of the target alone at its -ngl (measured)"
    else:
        one = min(c(1) for c in target.values())
        ngl, ngl_how = 1.0 / one, "our one-token cost at the measured splits (no llama-bench)"
    out["figures"] = {
        "ngl_tps": ngl, "ngl_how": ngl_how, "two_model": {"tps": two, "at": two_at},
        "pyramid": {"tps": three, "at": three_at}, "auto": {"tps": auto, "at": auto_at},
        "md": {"tps": md, "at": md_at},
    }  # fmt: skip
    ratios = {
        "pyramid_vs_two": three / two if two else float("nan"),
        "auto_vs_ngl": auto / ngl,
        "auto_vs_md": auto / md if md else float("nan"),
    }
    out["ratios"] = {k: round(v, 3) for k, v in ratios.items()}
    out["goals_met"] = {k: bool(ratios[k] >= g) for k, g in GOALS.items()}
    print(f"  {out['figures']}\n  ratios {out['ratios']}", flush=True)
    return out


def stand_in(sets: Sequence[str]) -> TraceSet:
    traces = traces_for(STAND_IN)
    return traces.select(list(sets)) if sets else traces


# --- entry points ----------------------------------------------------------------------------


def one(args: argparse.Namespace) -> None:
    """``one TIER NGL WEIGHTS SIZES REPEATS``: one curve, printed as a JSON line."""
    from pyramid_gguf.decoding.runtime.calibrate import measure_curve
    from pyramid_gguf.native import NativeModel

    tier, ngl, weights, sizes_text, repeats = args.rest
    sizes = tuple(int(k) for k in sizes_text.split(","))
    names = LADDERS["cpu" if args.cpu else "gpu"]
    load = LoadConfig(n_gpu_layers=int(ngl), n_threads=args.threads,
                      n_threads_batch=args.threads, use_mmap=LOAD_MODES[weights])  # fmt: skip
    t0 = time.perf_counter()
    with NativeModel(args.models_dir / f"synthetic-{names[tier]}-q4_k_m.gguf", load) as m:
        loaded = time.perf_counter() - t0
        curve = measure_curve(m, sizes=sizes, repeats=int(repeats)).curve
    print(json.dumps({"tier": tier, "ngl": int(ngl), "weights": weights, "repeats": int(repeats),
                      "load_s": round(loaded, 2),
                      "ms": {str(k): round(curve(k) * 1e3, 3) for k in sizes}}))  # fmt: skip


def measure(args: argparse.Namespace) -> None:
    from pyramid_gguf.native import build_id, gpu_device

    run = Run(args)
    device = gpu_device()
    run.save("meta", {"build": build_id(), "gpu": device[0] if device else None,
                      "threads": run.threads, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                      "cpu_rehearsal": run.cpu, "sizes": list(run.sizes),
                      "models": {t: p.name for t, p in run.paths.items()}})  # fmt: skip
    print(f"{build_id()}; GPU: {device[0] if device else 'none'}; {run.threads} threads")
    planned: dict[str, Any] = {}
    stages: dict[str, Callable[[], Any]] = {
        "plans": lambda: plans(run),
        "curves": lambda: curves(run, planned),
        "bench": lambda: bench(run, planned),
        "predict": lambda: predict(run.results, stand_in(run.sets), SpecConfig(mode="auto")),
    }
    for name in args.stages.split(","):
        if name not in stages:
            raise UserError(f"--stages: no stage {name!r} (plans, curves, bench, predict)")
        if run.left() < 20:
            print(f"stage {name}: skipped, {run.left():.0f} s left")
            continue
        t0 = time.time()
        print(f"stage {name} ({run.left():.0f} s left)", flush=True)
        try:
            doc = stages[name]()
        except UserError:
            raise
        except Exception as e:  # a stage's failure must not cost the others their time
            print(f"stage {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            run.save(name, {"error": f"{type(e).__name__}: {e}"})
            continue
        if name == "plans":
            planned.update(doc)
        run.save(name, doc)
        print(f"stage {name}: {time.time() - t0:.0f} s", flush=True)


def predict_only(args: argparse.Namespace) -> None:
    path: Path = args.source
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"--from {path}: not a kit.json ({e})") from None
    if "plans" not in doc:
        raise UserError(f"--from {path}: no plans stage (not a kit.json?)")
    spec = SpecConfig(mode="auto", max_block=args.max_block)
    doc["predict"] = predict(doc, stand_in(args.sets or ()), spec)
    out = args.out / "kit.json" if args.out else path
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="measure", choices=("measure", "predict", "one"))
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--models-dir", type=Path, default=Path("/tmp/kit/models"))
    ap.add_argument("--out", type=Path, default=None, help="where kit.json goes")
    ap.add_argument("--from", dest="source", type=Path, default=None, help="predict: kit.json")
    ap.add_argument("--bench", type=Path, default=None, help="llama.cpp's llama-bench")
    ap.add_argument("--threads", "-t", type=int, default=8)
    ap.add_argument("--budget", default="12GiB", help="the VRAM budget the splits come from")
    ap.add_argument("--deadline", type=float, default=time.time() + 420, help="epoch seconds")
    ap.add_argument("--stages", default="plans,curves,bench,predict")
    ap.add_argument("--sets", action="append", help="stand-in traces of these sets only")
    ap.add_argument("--max-block", type=int, default=64, help="predict: auto's longest block")
    ap.add_argument("--cpu", action="store_true", help="the CPU rehearsal (tiny ladder)")
    args = ap.parse_args()
    try:
        if args.command == "one":
            one(args)
        elif args.command == "predict":
            if args.source is None:
                raise UserError("predict needs --from KIT.json")
            predict_only(args)
        else:
            args.out = args.out or Path("/tmp/kit/out")
            measure(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
