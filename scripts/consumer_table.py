"""The planner's answer per consumer card: target-only at llama.cpp's best -ngl against auto.

For each ladder and card (its shipped profile, its whole VRAM as the budget, the default
desktop CPU profile for layers left on the CPU, a 4096-token context), ``plan --preset``'s
set-up (:func:`pyramid_gguf.planning.plan.plan_preset`) ranks every placement, with no model
file and no network. Per row: the best target-only placement (llama.cpp's best ``-ngl``: one
evaluation a token, no scheduler overhead), plan's pick, lossless ``auto``'s tokens/s there
(greedy, replayed over the traces), their ratio, the best two-model placement (no qualifier,
or the qualifier as the draft) and the best three-model one (the pyramid), and what the
pyramid adds over the two-model one. Every figure is predicted.

``--draft-agreement R`` re-draws the draft's argmax along the traces so that it agrees with the
target's answer at rate ``R`` (where it agreed and must not, a wrong token; the qualifier's
tier and the texts unchanged): how the answer moves with a draft better than the shipped
traces' (35%), for ladders whose own traces are not recorded. With ``--draft-follows
qualifier`` the draft copies the qualifier's argmax at rate ``R`` instead (agreeing with the
target at about ``R`` times the qualifier's rate): a draft closer to the qualifier than to the
target, the premise of the pyramid; re-drawn toward the target, a draft agrees with the
qualifier only where both agree with the target, which understates what the pyramid can do.

    python scripts/consumer_table.py                         # both ladders, Markdown
    python scripts/consumer_table.py --ladder llama3-1b-3b-8b --json
    python scripts/consumer_table.py --draft-agreement 0.7 --ladder llama3-1b-3b-8b
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.decoding.offline.traces import TierTrace, TraceSet
from pyramid_gguf.planning.devices import DEFAULT, catalogue
from pyramid_gguf.planning.plan import PlanInputs, plan_preset
from pyramid_gguf.planning.rank import DRAFT_ON_CPU, NO_QUALIFIER, QUALIFIER_DRAFTS, Ranking
from pyramid_gguf.planning.sources import traces_for

#: The cards issue 35 asks about, in its order.
CARDS = (
    "rtx-2060-6gb", "rtx-3050-8gb", "rtx-3060-12gb", "rtx-3060-ti-8gb", "rtx-3070-8gb",
    "rtx-3080-10gb", "rtx-4060-8gb", "rtx-4060-ti-8gb", "rtx-4060-ti-16gb", "rtx-4070-12gb",
    "rtx-4090-24gb", "rtx-4050-laptop-6gb", "rtx-4060-laptop-8gb",
)  # fmt: skip
LADDERS = ("llama3-1b-3b-8b", "qwen2.5-1.5b-3b-7b")
TWO_MODELS = (NO_QUALIFIER, QUALIFIER_DRAFTS)
THREE_MODELS = ("all tiers", DRAFT_ON_CPU)
#: The goal issue 35 set: lossless auto at this multiple of the best target-only placement.
GOAL = 1.5


@dataclass(frozen=True)
class Row:
    """One card's answer for one ladder (tokens/s, predicted)."""

    ladder: str
    card: str
    vram_gib: float
    target_layers: str
    target_only_tps: float
    pick: str
    pick_chain: str
    auto_tps: float
    two_model: str
    two_model_tps: float
    pyramid_tps: float

    @property
    def ratio(self) -> float:
        return self.auto_tps / self.target_only_tps

    @property
    def pyramid_gain(self) -> float:
        return self.pyramid_tps / self.two_model_tps

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return out | {"ratio": round(self.ratio, 3), "pyramid_gain": round(self.pyramid_gain, 3)}


def row(ladder: str, card: str, ranking: Ranking) -> Row:
    by_name = {p.placement.name: p for p in ranking.predictions}
    only = by_name["target only"]
    tier = only.placement.plan.tier("target")
    two = max((by_name[n] for n in TWO_MODELS if n in by_name), key=lambda p: p.tps)
    three = max(by_name[n].tps for n in THREE_MODELS if n in by_name)
    best = ranking.best
    return Row(
        ladder=ladder,
        card=card,
        vram_gib=round(catalogue("gpu")[card].vram_bytes / 2**30, 1),
        target_layers=f"{tier.n_gpu_layers}/{tier.n_layer + 1}",
        target_only_tps=round(1.0 / only.costs["target"](1), 2),
        pick=best.placement.name,
        pick_chain=best.main_chain,
        auto_tps=round(best.tps, 2),
        two_model=two.placement.name,
        two_model_tps=round(two.tps, 2),
        pyramid_tps=round(three, 2),
    )


def with_agreement(
    traces: TraceSet, rate: float, follows: str = "target", seed: int = 0
) -> TraceSet:
    """``traces`` with the draft's argmax re-drawn to agree at ``rate`` with what ``follows``
    (``target``: each answer; ``qualifier``: the qualifier's argmax) says at each position;
    elsewhere a token that differs from it (the recorded one where that already differs)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in traces.traces:
        d = t.tiers["draft"]
        ref = t.answer if follows == "target" else t.tiers["qualifier"].argmax
        hits = rng.random(len(ref)) < rate
        argmax = tuple(
            r if hit else (m if m != r else r + 1)
            for r, m, hit in zip(ref, d.argmax, hits, strict=False)
        )
        tiers = dict(t.tiers) | {"draft": TierTrace(argmax, d.top, d.overlap)}
        out.append(replace(t, tiers=tiers))
    label = f"{traces.ladder} (draft re-drawn to follow the {follows} at {rate:.0%})"
    return replace(traces, traces=tuple(out), ladder=label)


def draft_qualifier(traces: TraceSet) -> float:
    """Share of answer positions where the draft's argmax is the qualifier's."""
    pairs = [
        (a, b)
        for t in traces.traces
        for a, b in zip(t.tiers["draft"].argmax, t.tiers["qualifier"].argmax, strict=False)
    ]
    return sum(a == b for a, b in pairs) / max(len(pairs), 1)


def stand_in(
    ladder: str, tmp: Path, rate: float | None, follows: str
) -> tuple[TraceSet, Path | None]:
    """The shipped traces of ``ladder``, with the draft re-drawn at ``rate`` (None: as
    recorded) and saved under ``tmp`` for the planner: ``(traces, their file or None)``."""
    shipped = traces_for(ladder)
    if rate is None:
        return shipped, None
    path = tmp / "traces.json"
    remapped = with_agreement(shipped, rate, follows)
    remapped.save(path)
    return remapped, path


def acceptance(traces: TraceSet) -> str:
    """What stands in for each ladder's own acceptance, in one sentence."""
    return (
        f"acceptance: the shipped traces of {traces.ladder}, standing in for each ladder's own: "
        f"agreement with the target's tokens, draft {traces.agreement('draft'):.0%}, qualifier "
        f"{traces.agreement('qualifier'):.0%}; draft with qualifier {draft_qualifier(traces):.0%}."
    )


def run(ladders: tuple[str, ...], cards: tuple[str, ...], traces: Path | None) -> list[Row]:
    rows = []
    for ladder in ladders:
        for card in cards:
            inputs = PlanInputs(traces=traces, gpu=card, cpu=DEFAULT["cpu"], detect=False)
            inputs = replace(inputs, gpu_offload=True)
            vram = catalogue("gpu")[card].vram_bytes
            ranking = plan_preset(ladder, vram, LoadConfig(), inputs=inputs)
            rows.append(row(ladder, card, ranking))
            print(f"  {ladder} {card}: done", file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[Row]) -> str:
    head = (
        "| card | VRAM | target only: -ngl, tok/s | plan's pick (auto ran) | auto tok/s | "
        "auto / target only | best two-model | pyramid | pyramid / two-model |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r.card} | {r.vram_gib:g} GiB | {r.target_layers}, {r.target_only_tps:.1f} | "
            f"{r.pick} ({r.pick_chain}) | {r.auto_tps:.1f} | {r.ratio:.2f}x | "
            f"{r.two_model_tps:.1f} ({r.two_model}) | {r.pyramid_tps:.1f} | "
            f"{r.pyramid_gain:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ladder", action="append", choices=LADDERS, help="default: both")
    ap.add_argument("--card", action="append", choices=CARDS, help="default: all")
    ap.add_argument("--draft-agreement", type=float, default=None, metavar="R")
    ap.add_argument("--draft-follows", choices=("target", "qualifier"), default="target")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ladders = tuple(args.ladder or LADDERS)
    cards = tuple(args.card or CARDS)
    with tempfile.TemporaryDirectory() as tmp:
        shipped, path = stand_in(ladders[0], Path(tmp), args.draft_agreement, args.draft_follows)
        rows = run(ladders, cards, path)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=1))
        return
    print(
        f"Predicted (greedy) with each card's shipped profile and the {DEFAULT['cpu']} CPU "
        f"profile; {acceptance(shipped)}\n"
    )
    for ladder in ladders:
        print(f"{ladder}\n")
        print(markdown([r for r in rows if r.ladder == ladder]))
        print()


if __name__ == "__main__":
    main()
