"""``auto``'s pricing beside the replay, on recorded traces and on independent ones.

For each trace of a recorded set (default: the shipped traces of the default ladder) and each
cost shape, every model chain's best round is priced from the trace's own agreement rates (the
pricing's model: each proposal kept independently at the stage's mean rate), then replayed at
that block size through the real schedulers (:func:`replay_trace`). It prints the replayed
rate over the promised one per chain, and what real traces hold that the pricing does not:
the keep rate after a kept proposal against the mean (runs of agreement), and the best fixed
block the replay finds beside the priced one.

    python scripts/pricing_vs_replay.py [--traces FILE] [--max-block 64]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from dataclasses import replace
from pathlib import Path

from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.decoding.offline.replay import replay_trace
from pyramid_gguf.decoding.offline.traces import Trace, TraceSet
from pyramid_gguf.decoding.pricing.chains import Chain, StageRule
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.runtime.auto import ROUND_OVERHEAD

SHIPPED = Path(__file__).resolve().parents[1] / "pyramid_gguf/data/traces/qwen2.5-coder-demo.json"
EXACT = StageRule("exact")
#: Cost shapes (target, qualifier, draft): this 2-core CPU's (each token most of another) and
#: a split target past op offload (flat), the small tiers on a GPU.
SHAPES = {
    "cpu": (
        CostCurve.shaped(0.045, 0.025),
        CostCurve.shaped(0.030, 0.012),
        CostCurve.shaped(0.012, 0.005),
    ),
    "flat": (
        CostCurve.shaped(0.400, 0.004),
        CostCurve.shaped(0.012, 0.001),
        CostCurve.shaped(0.004, 0.0005),
    ),
}


def rates(lower: tuple[int, ...], upper: tuple[int, ...]) -> tuple[float, float]:
    """The mean keep rate of ``lower``'s argmaxes by ``upper``'s, and the rate after a keep."""
    kept = [a == b for a, b in zip(lower, upper, strict=False)]
    after = [b for a, b in itertools.pairwise(kept) if a]
    return sum(kept) / len(kept), (sum(after) / len(after) if after else 0.0)


Keeps = tuple[tuple[float, float], ...]


def chains(trace: Trace) -> dict[str, tuple[Chain, SpecConfig, Keeps, Trace]]:
    """The qualifier drafting for the target (``sd``, the trace's qualifier as its draft) and
    the pyramid, each with its stages' mean keep rates along this trace."""
    q = trace.tiers["qualifier"].argmax
    a_qt, _ = rates(q, trace.answer)
    a_dq, _ = rates(trace.tiers["draft"].argmax, q)
    alone = replace(trace, tiers={"draft": trace.tiers["qualifier"]})
    sd = Chain("draft", ("draft", "target"), (EXACT,))
    pyramid = Chain("pyramid", ("draft", "qualifier", "target"), (EXACT, EXACT))
    return {
        "sd": (sd, SpecConfig(mode="sd"), ((a_qt, a_qt),), alone),
        "pyramid": (pyramid, SpecConfig(mode="psd-exact"), ((a_dq, a_dq), (a_qt, a_qt)), trace),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=SHIPPED)
    ap.add_argument("--max-block", type=int, default=64)
    args = ap.parse_args()
    traces = TraceSet.load(args.traces).traces
    runs = [rates(t.tiers["qualifier"].argmax, t.answer) for t in traces]
    mean = statistics.mean(r[0] for r in runs)
    after = statistics.mean(r[1] for r in runs)
    print(f"{len(traces)} traces: the qualifier keeps {mean:.2f} of the target's tokens, ", end="")
    print(f"{after:.2f} right after a kept one")
    for shape, (t, q, d) in SHAPES.items():
        for name in ("sd", "pyramid"):
            costs = (
                {"target": t, "qualifier": q, "draft": d}
                if name == "pyramid"
                else {"target": t, "draft": q}
            )
            ratios, gains = [], []
            for recorded in traces:
                chain, spec, keeps, trace = chains(recorded)[name]
                best = chain.price(costs, keeps, args.max_block, overhead=ROUND_OVERHEAD).best
                assert best is not None
                at = spec.with_(l_d=best.l_d or best.k, l_q=best.k)
                replayed = replay_trace(trace, costs, at).tps
                ratios.append(replayed / best.rate)
                longer = spec.with_(l_d=best.l_d or 2 * best.k, l_q=2 * best.k)
                gains.append(replay_trace(trace, costs, longer).tps / replayed)
            print(
                f"{shape:>5} {name:>8}: replayed / priced {statistics.median(ratios):.2f} "
                f"(range {min(ratios):.2f}-{max(ratios):.2f}); "
                f"twice the priced block replays {statistics.median(gains):.2f}x"
            )


if __name__ == "__main__":
    main()
