"""Targets bigger than the card: the planner's answer per card, against what users run today.

For each big-target ladder (Qwen2.5 0.5B / 3B / 14B and 0.5B / 7B / 32B, Llama 3.2 1B / 3.1 8B
/ 3.3 70B) and consumer card (the 2060 6GB, 4060 8GB, 3060 12GB, 4060 Ti 16GB and 5060 Ti
16GB), ``plan --preset``'s set-up (:func:`pyramid_gguf.planning.plan.plan_preset`) ranks every
placement (``-ngl`` splits, and the CPU-held weights mapped, pinned or repacked where the
planner offers them) with no model file and no network: the card's shipped profile (its PCIe
link, or ``--pcie``), a desktop CPU profile for the layers left in system RAM, ``--ram`` of
system memory, a 4096-token context. Per row, all predicted, each with the placement it used:

- llama.cpp's best ``-ngl`` for the target alone (one evaluation a token, no overhead);
- llama.cpp's own draft-model speculation (``llama-server -md``; :mod:`pyramid_gguf.planning.peer`):
  the better of the ladder's smaller models as its draft, its best ``--spec-draft-n-max`` up
  to 64 and ``--spec-draft-p-min``, in its best placement, priced on the same curves as ours
  (whatever ``--max-block`` caps ``auto`` at);
- lossless ``auto`` in plan's pick (``--max-block``, default 64), its ratio to both;
- the best two-model placement and the best three-model one (``auto`` there; the chain it
  committed most tokens with is named), and their ratio.

Acceptance: the shipped traces of the default ladder (a pruned 0.5B under the 0.5B under the
1.5B) stand in for each ladder's own. ``--sweep`` re-draws the draft's and the qualifier's
argmax to agree with the target at each ``D:Q`` point (independently per position; the tops
stay as recorded) and re-prices the row's placements, so a reader sees whether a verdict hangs
on the stand-in. ``--h200-shape`` prices every row again with the CPU profile's batch shape
replaced by the one measured on the lent H200 host (``docs/gpu-big/bigtarget-h200.json``).

    python scripts/big_table.py                               # Markdown, every ladder and card
    python scripts/big_table.py --ladder qwen2.5-0.5b-7b-32b --card rtx-3060-12gb --json
    python scripts/big_table.py --sweep 0.6:0.7,0.8:0.9 --h200-shape --pcie 4:16
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from consumer_table import THREE_MODELS, TWO_MODELS, acceptance, stand_in

from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.load import LoadConfig, parse_pcie
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.decoding.offline.traces import TierTrace, TraceSet
from pyramid_gguf.planning.compose import DeviceProfile
from pyramid_gguf.planning.devices import catalogue
from pyramid_gguf.planning.peer import PeerSpec, PeerWalks
from pyramid_gguf.planning.plan import PlanInputs, plan_preset
from pyramid_gguf.planning.rank import Prediction, Ranking, predict
from pyramid_gguf.planning.sources import cpu_profile

LADDERS = ("qwen2.5-0.5b-3b-14b", "qwen2.5-0.5b-7b-32b", "llama3-1b-8b-70b")
#: The cards issue 48's table names, smallest first.
CARDS = ("rtx-2060-6gb", "rtx-4060-8gb", "rtx-3060-12gb", "rtx-4060-ti-16gb", "rtx-5060-ti-16gb")
#: Issue 48's goals (predicted): the pyramid >= 1.15x the best two-model chain and auto >= 3x
#: llama.cpp's best -ngl (a 32B on a 12 or 16 GB card, pinned weights, PCIe 4.0 x16 or 5.0
#: x8); lossless auto >= 1.15x llama.cpp -md at its best settings on every card.
GOALS = {"auto_vs_ngl": 3.0, "auto_vs_md": 1.15, "pyramid_vs_two": 1.15}
#: Agreement with the target's greedy tokens published for same-family draft/target pairs at
#: temperature 0: T5-small, -base and -large drafting for T5-XXL, 0.62-0.82 over translation
#: and summarisation (Leviathan, Kalman and Matias 2023, "Fast Inference from Transformers via
#: Speculative Decoding", table 3). ``D:Q``: the draft's, then the qualifier's (a qualifier is
#: the larger model, so the higher of a pair).
SWEEP = ((0.6, 0.7), (0.7, 0.8), (0.8, 0.9))
#: The lent H200 host's figures (the CPU's batch shape comes from its 0.5B and 7B whole there).
H200 = Path(__file__).resolve().parents[1] / "docs" / "gpu-big" / "bigtarget-h200.json"


@dataclass(frozen=True)
class Verdicts:
    """The three ratios the issue's goals are about, at one acceptance point."""

    auto_vs_ngl: float
    auto_vs_md: float
    pyramid_vs_two: float


@dataclass(frozen=True)
class Row:
    """One card's answer for one ladder (tokens/s, predicted), with the placement of each."""

    ladder: str
    card: str
    vram_gib: float
    ngl_tps: float
    ngl_at: str
    md_tps: float
    md_how: str
    md_at: str
    auto_tps: float
    auto_at: str
    two_model_tps: float
    two_model_at: str
    pyramid_tps: float
    pyramid_at: str
    #: ``D:Q`` -> the verdicts with the agreements re-drawn there (``--sweep``).
    sweep: dict[str, Verdicts] = field(default_factory=dict)

    @property
    def verdicts(self) -> Verdicts:
        return Verdicts(
            self.auto_tps / self.ngl_tps,
            self.auto_tps / self.md_tps if self.md_tps > 0 else math.nan,
            self.pyramid_tps / self.two_model_tps if self.two_model_tps > 0 else math.nan,
        )


def _layers(p: Prediction, tier: str = "target") -> str:
    t = p.placement.plan.tier(tier)
    return f"{t.n_gpu_layers}/{t.n_layer + 1}"


def where(p: Prediction) -> str:
    """A placement in a table cell: its name, the target's GPU layers, the CPU weights."""
    weights = getattr(p.placement, "weights", "mapped")
    return f"{p.placement.name}, target -ngl {_layers(p)}, {weights}"


def _best(preds: Iterable[Prediction], names: Sequence[str]) -> Prediction | None:
    chosen = [p for p in preds if p.placement.name in names]
    return max(chosen, key=lambda p: p.tps) if chosen else None


@dataclass(frozen=True)
class Picks:
    """The placements a row reports: the target alone at its fastest, ``auto``'s pick, the
    best two-model and three-model placements."""

    alone: Prediction
    auto: Prediction
    two: Prediction | None
    three: Prediction | None

    @classmethod
    def of(cls, ranking: Ranking) -> Picks:
        alone = [p for p in ranking.predictions if p.placement.name == "target only"]
        if not alone:
            raise UserError("the ranking has no target-only placement")
        fastest = max(alone, key=lambda p: 1.0 / p.costs["target"](1))
        return cls(
            fastest,
            ranking.best,
            _best(ranking.predictions, TWO_MODELS),
            _best(ranking.predictions, THREE_MODELS),
        )


def best_peer(walks: PeerWalks, preds: Iterable[Prediction]) -> tuple[Prediction, PeerSpec] | None:
    """llama.cpp ``-md`` at its best knobs in its best placement (None: nothing to draft)."""
    found: list[tuple[Prediction, PeerSpec]] = []
    for p in preds:
        s = walks.best(p.costs)
        if s is not None:
            found.append((p, s))
    return max(found, key=lambda ps: ps[1].tps) if found else None


def row(ladder: str, card: str, ranking: Ranking, walks: PeerWalks) -> Row:
    picks = Picks.of(ranking)
    peer = best_peer(walks, ranking.predictions)
    md_tps, md_how, md_at = math.nan, "-", "-"
    if peer is not None:
        p, s = peer
        md_tps, md_at = s.tps, where(p)
        md_how = f"{s.draft} drafts, n-max {s.draft_max}, p-min {s.p_min:g}"
    two, three = picks.two, picks.three
    return Row(
        ladder=ladder,
        card=card,
        vram_gib=round(catalogue("gpu")[card].vram_bytes / 2**30, 1),
        ngl_tps=1.0 / picks.alone.costs["target"](1),
        ngl_at=where(picks.alone),
        md_tps=md_tps,
        md_how=md_how,
        md_at=md_at,
        auto_tps=picks.auto.tps,
        auto_at=f"{where(picks.auto)}; {picks.auto.main_chain}",
        two_model_tps=two.tps if two else math.nan,
        two_model_at=f"{where(two)}; {two.main_chain}" if two else "-",
        pyramid_tps=three.tps if three else math.nan,
        pyramid_at=f"{where(three)}; {three.main_chain}" if three else "-",
    )


# --- acceptance sweep ------------------------------------------------------------------------


def redrawn(traces: TraceSet, rates: dict[str, float], seed: int = 0) -> TraceSet:
    """``traces`` with each tier of ``rates`` re-drawn to take the target's token at that rate,
    independently per position, and another token elsewhere (the recorded one where it already
    differs); top probabilities as recorded."""
    rng = np.random.default_rng(seed)
    out = []
    for t in traces.traces:
        tiers = dict(t.tiers)
        for tier, rate in rates.items():
            tt = tiers[tier]
            n = len(tt.argmax)
            hits = rng.random(n) < rate
            argmax = tuple(
                a if hit else (m if m != a else a + 1)
                for a, m, hit in zip(t.answer[:n], tt.argmax, hits, strict=False)
            )
            tiers[tier] = TierTrace(argmax, tt.top[: len(argmax)], tt.overlap[: len(argmax)])
        out.append(replace(t, tiers=tiers))
    label = ", ".join(f"{k} {v:.0%}" for k, v in rates.items())
    return replace(traces, traces=tuple(out), ladder=f"{traces.ladder} (re-drawn: {label})")


def swept(r: Row, ranking: Ranking, points: Sequence[tuple[float, float]], spec: SpecConfig) -> Row:
    """``r`` with its verdicts at each ``(draft, qualifier)`` agreement: the row's placements
    (target alone, auto's pick, the best two- and three-model ones) replayed over the re-drawn
    traces, llama.cpp -md searched again over every placement."""
    picks = Picks.of(ranking)
    ngl = 1.0 / picks.alone.costs["target"](1)
    out: dict[str, Verdicts] = {}
    for d, q in points:
        traces = redrawn(ranking.traces, {"draft": d, "qualifier": q})
        again: dict[str, float] = {}
        for p in (picks.auto, picks.two, picks.three):
            if p is not None and where(p) not in again:
                again[where(p)] = predict(p.placement, p.costs, traces, spec).tps
        auto = max(again.values())  # auto's pick may move with the agreement
        two = again[where(picks.two)] if picks.two else math.nan
        three = again[where(picks.three)] if picks.three else math.nan
        peer = best_peer(PeerWalks(traces), ranking.predictions)
        md = peer[1].tps if peer else math.nan
        out[f"{d:g}:{q:g}"] = Verdicts(auto / ngl, auto / md, three / two)
    return replace(r, sweep=out)


# --- the H200 host's batch shape -------------------------------------------------------------


def h200_cpu_shape(figures: Path = H200) -> tuple[float, ...]:
    """Per-byte cost of ``n = 1..16`` tokens over one token's on the H200 host's CPU: a CPU
    profile fitted (as ``scripts/gpu/big_check.py`` fits it) to the 0.5B and 7B measured whole
    on that CPU."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
    from big_check import curve
    from synth_ladder import ladder_paths

    from pyramid_gguf.planning.compose import Shape
    from pyramid_gguf.planning.memory import model_memory

    doc = json.loads(figures.read_text(encoding="utf-8"))
    on_cpu = {r["model"]: curve(r) for r in doc.get("cpu", []) if r["ngl"] == 0}
    names = ("qwen-0.5b", "qwen-7b")
    with tempfile.TemporaryDirectory() as tmp:
        paths = ladder_paths(Path(tmp), names, header_only=True)
        samples = [
            (Shape.of(model_memory(p)), on_cpu[n]) for n, p in zip(names, paths, strict=True)
        ]
    fit = DeviceProfile.fit("h200-host-cpu", str(figures), samples, per_layer=False)
    return tuple(b / fit.per_byte[0] for b in fit.per_byte)


def h200_shaped(cpu: str, out: Path) -> Path:
    """The ``cpu`` profile with its per-byte batch shape replaced by the H200 host's (its
    one-token cost kept; past 16 tokens the H200 shape's last-quarter slope): written to
    ``out``, for ``PlanInputs(cpu=out)``."""
    base = cpu_profile(cpu).profile
    shape = h200_cpu_shape()
    n = min(len(shape), len(base.per_byte))
    per_byte = tuple(base.per_byte[0] * s for s in shape[:n])
    tail = base.per_byte[0] * max((shape[n - 1] - shape[n - 1 - n // 4]) / (n // 4), 0.0)
    scale = [p / b if b > 0 else 1.0 for p, b in zip(per_byte, base.per_byte, strict=False)]
    fixed = tuple(f * s for f, s in zip(base.fixed, scale, strict=False))
    profile = replace(
        base,
        name=f"{base.name}, H200 shape",
        source=f"{base.source}; batch shape of the H200 host's CPU ({H200.name})",
        per_byte=per_byte,
        per_layer=base.per_layer[:n],
        fixed=fixed[:n],
        tail=tail,
    )
    profile.save(out)
    return out


# --- output ----------------------------------------------------------------------------------


def _x(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}x"


def _t(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}"


def markdown(rows: list[Row]) -> str:
    head = (
        "| card | llama.cpp best -ngl | llama.cpp -md (best knobs) | lossless auto (pick) | "
        "best two-model | best three-model | auto / -ngl | auto / -md | three / two |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        v = r.verdicts
        lines.append(
            f"| {r.card} | {_t(r.ngl_tps)} ({r.ngl_at}) | {_t(r.md_tps)} ({r.md_how}; {r.md_at}) "
            f"| {_t(r.auto_tps)} ({r.auto_at}) | {_t(r.two_model_tps)} ({r.two_model_at}) | "
            f"{_t(r.pyramid_tps)} ({r.pyramid_at}) | {_x(v.auto_vs_ngl)} | {_x(v.auto_vs_md)} | "
            f"{_x(v.pyramid_vs_two)} |"
        )
    return "\n".join(lines)


def sweep_markdown(rows: list[Row], recorded: str) -> str:
    points = list(dict.fromkeys(k for r in rows for k in r.sweep))
    cols = [recorded, *points]
    head = "| ladder, card | verdict | " + " | ".join(cols) + " |"
    lines = [head, "|" + "---|" * (2 + len(cols))]
    for r in rows:
        for name, goal in GOALS.items():
            cells = [getattr(r.verdicts, name)] + [getattr(r.sweep[k], name) for k in points]
            marks = [f"{_x(c)}{'' if math.isnan(c) or c >= goal else ' (under)'}" for c in cells]
            lines.append(
                f"| {r.ladder}, {r.card} | {name} >= {goal:g} | " + " | ".join(marks) + " |"
            )
    return "\n".join(lines)


def goals_summary(rows: list[Row]) -> list[str]:
    """One line per goal: where the table meets it and where not."""
    out = []
    for name, goal in GOALS.items():
        vals = [(r, getattr(r.verdicts, name)) for r in rows]
        vals = [(r, v) for r, v in vals if not math.isnan(v)]
        if not vals:
            continue
        met = sum(v >= goal for _, v in vals)
        lo = min(vals, key=lambda rv: rv[1])
        hi = max(vals, key=lambda rv: rv[1])
        out.append(
            f"- {name} >= {goal:g}: met in {met} of {len(vals)} rows; lowest {lo[1]:.2f}x "
            f"({lo[0].ladder}, {lo[0].card}), highest {hi[1]:.2f}x ({hi[0].ladder}, {hi[0].card})"
        )
    return out


def _points(text: str) -> tuple[tuple[float, float], ...]:
    try:
        pts = tuple((float(d), float(q)) for d, _, q in (p.partition(":") for p in text.split(",")))
    except ValueError:
        pts = ()
    if not pts or any(not (0 <= v <= 1) for pt in pts for v in pt):
        raise UserError(
            f"--sweep takes D:Q agreement pairs in 0..1 (0.6:0.7,0.8:0.9), got {text!r}"
        )
    return pts


def table(args: argparse.Namespace, tmp: Path, cpu: str | Path) -> tuple[list[Row], TraceSet]:
    shipped, path = stand_in("qwen2.5-coder-demo", tmp, args.draft_agreement, args.draft_follows)
    spec = SpecConfig(mode="auto", max_block=args.max_block)
    load = LoadConfig(pcie=args.pcie) if args.pcie else LoadConfig()
    rows: list[Row] = []
    walks = PeerWalks(shipped)
    points = _points(args.sweep) if args.sweep else ()
    for ladder in args.ladder or LADDERS:
        for card in args.card or CARDS:
            inputs = PlanInputs(traces=path, gpu=card, cpu=cpu, detect=False, ram=args.ram)
            inputs = replace(inputs, gpu_offload=True, sets=tuple(args.sets or ()))
            vram = catalogue("gpu")[card].vram_bytes
            ranking = plan_preset(ladder, vram, load, spec=spec, inputs=inputs)
            if ranking.traces is not shipped:
                walks = PeerWalks(ranking.traces)
            r = row(ladder, card, ranking, walks)
            if points:
                r = swept(r, ranking, points, spec)
            rows.append(r)
            print(f"  {ladder} {card}: done", file=sys.stderr, flush=True)
    return rows, shipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ladder", action="append", choices=LADDERS, help="default: all")
    ap.add_argument("--card", action="append", help="default: the five cards of issue 48")
    ap.add_argument("--cpu", default="ddr5-8core", help="the desktop CPU profile")
    ap.add_argument("--ram", default="64GiB", help="system RAM of the desktop")
    ap.add_argument("--pcie", default=None, metavar="GEN:LANES", help="default: each card's")
    ap.add_argument("--max-block", type=int, default=64, help="auto's longest block (64)")
    ap.add_argument("--sets", action="append", help="only these prompt sets of the traces")
    ap.add_argument("--sweep", nargs="?", const=",".join(f"{d}:{q}" for d, q in SWEEP),
                    default=None, metavar="D:Q,...",
                    help="verdicts at re-drawn agreements (bare: the published range)")  # fmt: skip
    ap.add_argument("--h200-shape", action="store_true",
                    help="also price with the H200 host's CPU batch shape")  # fmt: skip
    ap.add_argument("--draft-agreement", type=float, default=None, metavar="R")
    ap.add_argument("--draft-follows", choices=("target", "qualifier"), default="target")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    try:
        if args.max_block < 1:
            raise UserError(f"--max-block must be at least 1, got {args.max_block}")
        if args.pcie:
            parse_pcie(args.pcie)
        unknown = [c for c in args.card or () if c not in catalogue("gpu")]
        if unknown:
            raise UserError(f"--card: no shipped profile {', '.join(unknown)}")
        if args.sweep:
            _points(args.sweep)
        with tempfile.TemporaryDirectory() as tmp:
            rows, shipped = table(args, Path(tmp), args.cpu)
            shaped: list[Row] = []
            if args.h200_shape:
                prof = h200_shaped(args.cpu, Path(tmp) / "h200-shape.json")
                shaped, _ = table(replace_ns(args, sweep=None), Path(tmp), prof)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    doc: dict[str, Any] = {"rows": [_row_dict(r) for r in rows]}
    if shaped:
        doc["h200_shape"] = [_row_dict(r) for r in shaped]
    if args.json_out:
        args.json_out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    link = f"PCIe {args.pcie}" if args.pcie else "each card's PCIe link"
    print(
        f"Predicted (greedy) with each card's shipped profile ({link}), the {args.cpu} CPU "
        f"profile and {args.ram} of RAM, auto's --max-block {args.max_block}; "
        f"{acceptance(shipped)}\n"
    )
    for ladder in args.ladder or LADDERS:
        print(f"{ladder}\n")
        print(markdown([r for r in rows if r.ladder == ladder]))
        print()
    print("\n".join(goals_summary(rows)))
    if args.sweep:
        print(
            "\nVerdicts with the agreements re-drawn (draft:qualifier), the row's placements held\n"
        )
        print(sweep_markdown(rows, "recorded"))
    if shaped:
        print("\nThe same, the CPU's batch shape the H200 host's\n")
        for ladder in args.ladder or LADDERS:
            print(f"{ladder}\n")
            print(markdown([r for r in shaped if r.ladder == ladder]))
            print()
        print("\n".join(goals_summary(shaped)))


def replace_ns(ns: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    return argparse.Namespace(**(vars(ns) | changes))


def _row_dict(r: Row) -> dict[str, Any]:
    d = asdict(r)
    d["verdicts"] = asdict(r.verdicts)
    return d


if __name__ == "__main__":
    main()
