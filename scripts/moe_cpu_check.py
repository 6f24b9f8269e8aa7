"""The MoE pricing of ``planning/moe.py`` checked on this CPU: a real llama.cpp mixture of experts
measured against the curve the planner predicts for it.

The model is ``scripts/moe_model.py``'s (Qwen2.5-Coder 1.5B's FFN as every routed expert, a
random router: a real ``llama`` MoE graph whose answers are the dense model's). This script

1. records its router's choices on real text (``native/routing.record_routes``, the prompts of
   ``pyramid_gguf/data/prompts``) and prints the union of experts a block of k tokens reads, over
   one token's, measured and for random routing;
2. times one evaluation of k consecutive tokens of that text (k = 1, 2, 4, 8, 16; ``--repeats``
   interleaved rounds, the median kept) for the MoE and the dense 1.5B, in one run;
3. prints the curves ``planning/moe.moe_curve`` (MoE) and ``compose.composed_curve`` (dense)
   predict from this machine's CPU profile (``pyramid_gguf/data/devices/cpu.json``, fitted to
   the dense 1.5B's blocks here), with the recorded union and with random routing.

    flock -x /tmp/cpu.lock python scripts/moe_cpu_check.py MOE.gguf DENSE.gguf
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.native import NativeModel
from pyramid_gguf.native.routing import record_routes
from pyramid_gguf.planning.compose import DeviceProfile, composed_curve
from pyramid_gguf.planning.hardware import DEVICES_DIR
from pyramid_gguf.planning.memory import model_memory
from pyramid_gguf.planning.moe import ExpertUnion, moe_curve

SIZES = (1, 2, 4, 8, 16)
PROMPTS = Path(__file__).resolve().parent.parent / "pyramid_gguf" / "data" / "prompts"


def text_tokens(model: NativeModel, n: int) -> list[int]:
    """The first ``n`` tokens of the shipped prompts (code, then prose), concatenated."""
    out: list[int] = []
    for name in ("code", "chat", "qa", "summarize"):
        for p in json.loads((PROMPTS / f"{name}.json").read_text()):
            out += model.vocab.tokenize(p["text"], add_special=False)
            if len(out) >= n:
                return out[:n]
    return out


def timed(model: NativeModel, tokens: list[int], prefix: int, repeats: int) -> dict[int, float]:
    """Median seconds of one evaluation of ``k`` of ``tokens`` after ``prefix`` of them."""
    model.reset()
    model.eval(tokens[:prefix])
    model.eval(tokens[prefix : prefix + 4], range(4))  # warm-up
    rounds: dict[int, list[float]] = {k: [] for k in SIZES}
    for r in range(repeats):
        for k in SIZES:
            start = prefix + 16 * r  # a different window each round
            model.rollback(prefix)
            model.eval(tokens[prefix:start])
            t0 = time.perf_counter()
            model.eval(tokens[start : start + k], range(k))
            rounds[k].append(time.perf_counter() - t0)
    model.reset()
    return {k: float(np.median(v)) for k, v in rounds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("moe", type=Path)
    ap.add_argument("dense", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--routes", type=int, default=512, help="tokens of text routed")
    args = ap.parse_args()
    cfg = LoadConfig(n_ctx=1024, n_threads=2, n_threads_batch=2)
    cpu = DeviceProfile.load(DEVICES_DIR / "cpu.json")
    mm, dm = model_memory(args.moe), model_memory(args.dense)
    assert mm.experts is not None, "not a mixture of experts"
    with NativeModel(args.moe, cfg) as moe:
        tokens = text_tokens(moe, max(args.routes, 64 + 16 * args.repeats + 16))
        routes = record_routes(moe, tokens[: args.routes])
        recorded = ExpertUnion.from_routes(routes, mm.experts.n_expert)
        random = ExpertUnion.random(mm.experts.n_expert, mm.experts.n_used)
        print(f"{args.moe.name}: {mm.experts.n_used} of {mm.experts.n_expert} experts")
        print("union over one token's expert bytes, k =", " ".join(f"{k:>5}" for k in SIZES))
        print(" recorded on", f"{routes.shape[0]} tokens", " ".join(
            f"{recorded.ratio(k):5.2f}" for k in SIZES))  # fmt: skip
        print(" random routing       ", " ".join(f"{random.ratio(k):5.2f}" for k in SIZES))
        with NativeModel(args.dense, cfg) as dense:
            got_moe: dict[int, list[float]] = {k: [] for k in SIZES}
            got_dense: dict[int, list[float]] = {k: [] for k in SIZES}
            for _ in range(2):  # interleaved: MoE, dense, MoE, dense
                for k, s in timed(moe, tokens, 48, args.repeats).items():
                    got_moe[k].append(s)
                for k, s in timed(dense, tokens, 48, args.repeats).items():
                    got_dense[k].append(s)
    pred_rec = moe_curve(mm, 0, 0, cpu, None, union=recorded)
    pred_rnd = moe_curve(mm, 0, 0, cpu, None)
    pred_dense = composed_curve(dm, 0, cpu, None)
    print(f"\nms per evaluation of k tokens (measured: median of {args.repeats} x 2 rounds)")
    print(f"{'k':>3} {'MoE':>8} {'pred rec':>9} {'pred rnd':>9} {'dense':>8} {'pred':>8}")
    for k in SIZES:
        m, d = float(np.median(got_moe[k])), float(np.median(got_dense[k]))
        print(
            f"{k:>3} {m * 1000:8.1f} {pred_rec(k) * 1000:9.1f} {pred_rnd(k) * 1000:9.1f} "
            f"{d * 1000:8.1f} {pred_dense(k) * 1000:8.1f}"
        )


if __name__ == "__main__":
    main()
