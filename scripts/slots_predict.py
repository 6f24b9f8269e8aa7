"""What batch-priced speculation is predicted to gain with N parallel slots on a consumer card.

For each ladder, card (its shipped profile: a consumer GPU, with the default desktop CPU for any
layers left on the CPU, or a shipped CPU class alone) and number of slots ``N``, every tier's
cost curve is composed from the card's profile (``composed_curve`` of
:mod:`pyramid_gguf.planning.compose`). Where the tiers sit: ``--placement gpu`` (default) puts
every tier whole on the card, the question of compute alone; ``--placement planned`` takes the
layers the memory planner gives each tier (:func:`pyramid_gguf.planning.rank.placements`: the
target alone for plain decoding, draft and target together for speculation) in the card's whole
VRAM with the KV cache of ``N`` slots of ``--ctx`` cells each, one cache of ``N * ctx`` cells as
``LoadConfig.parallel`` lays it out (the planner reads ``n_ctx``, so it is given that). The
verdict is printed under both. Shipped profiles cover batches of 1..16 tokens; one fitted by
:mod:`pyramid_gguf.planning.hardware` is rebuilt from the model it stores (its ``model`` key and
the device's spec sheet) out to the largest batch asked for (``N * 17`` tokens), so long
verification batches are priced by the physical model (MMQ tiles of 128 tokens, tensor-core
compute), not extrapolated; a measured profile without a stored model falls back to
:class:`~pyramid_gguf.decoding.pricing.costs.CostCurve`'s linear extrapolation. No model file,
no network, no replay: about a second.

The model (``c_T``, ``c_D``: seconds of one evaluation of ``n`` tokens on target and draft;
``a``: per-token keep rate; ``E(k) = expected_tokens(a, a, k)`` from
:mod:`pyramid_gguf.decoding.pricing.policy`; ``o``: ``--overhead`` seconds per step, 0 by
default):

- ``N`` symmetric slots decode at once. Without speculation one step evaluates ``N`` tokens
  on the target (target-only placement): ``N / (c_T(N) + o)`` tokens per second.
- With speculation every slot drafts ``k`` tokens (the draft steps of all slots batched:
  ``k * c_D(N)``), then the target verifies every slot's block in one batch of ``N (k + 1)``
  tokens: ``c_T(N (k + 1))``; the step commits ``N * E(k)`` tokens in expectation
  (draft + target placement; ``k = 0`` is plain decoding in that placement, where the draft
  still holds its VRAM).
- Batch-priced choice: the ``k`` in 0..16 maximising
  ``N E(k) / (c_T(N (k + 1)) + k c_D(N) + o)`` (pricing each slot's tokens at the marginal
  cost of the combined batch chooses this for symmetric slots). Solo-priced choice, for
  contrast: the ``k`` maximising ``E(k) / (c_T(k + 1) + k c_D(1) + o)`` (a single sequence's
  curve), and what that ``k`` gives at batch ``N``: a solo-priced ``k`` can lose at large
  ``N``.
- Ratio: speculation's tokens/s over plain decoding's, both at ``N`` slots.

Keep rates: the draft's agreement with the target's tokens in the shipped traces (those of the
ladder they were recorded on, standing in for the others' as in ``plan``), and a sweep
(``--keep``, default 0.5, 0.6, 0.7, 0.8). Not priced: the KV cache each step reads (the
profiles price weights; attention over long contexts adds the same per step to both modes,
plus the draft's over its ``k`` steps), sampling, and slots that finish or differ. Every
figure is predicted.

    python scripts/slots_predict.py                              # default cards, both ladders
    python scripts/slots_predict.py --card rtx-4060-8gb --ladder llama3-1b-3b-8b --slots 1,8
    python scripts/slots_predict.py --keep 0.6,0.7 --json /tmp/slots.json
    python scripts/slots_predict.py --placement planned --ctx 1024 --kv-quant auto
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.pricing.policy import expected_tokens
from pyramid_gguf.models.registry import get_preset
from pyramid_gguf.planning.compose import DeviceProfile, composed_curve
from pyramid_gguf.planning.devices import DEFAULT, DeviceEntry, catalogue
from pyramid_gguf.planning.hardware import CpuModel, GpuModel, Spec, load_specs
from pyramid_gguf.planning.memory import ModelMemory
from pyramid_gguf.planning.rank import NO_QUALIFIER, QUALIFIER_DRAFTS, TARGET_ONLY, placements
from pyramid_gguf.planning.sources import traces_for
from pyramid_gguf.planning.tiers import preset_memory
from pyramid_gguf.planning.vram import KvQuant

LADDERS = ("llama3-1b-3b-8b", "qwen2.5-1.5b-3b-7b")
#: Default cards: the goal's 4060-class card, two more consumer GPUs and the desktop CPU class
#: ``plan`` prices CPU layers with.
CARDS = ("rtx-4060-8gb", "rtx-3060-12gb", "rtx-4090-24gb", DEFAULT["cpu"])
SLOTS = (1, 2, 4, 8, 16)
KEEPS = (0.5, 0.6, 0.7, 0.8)
#: Longest block a slot drafts.
MAX_K = 16
#: The goal: batch-priced speculation at this multiple of plain decoding, at GOAL_SLOTS slots
#: on GOAL_CARD.
GOAL, GOAL_SLOTS, GOAL_CARD = 1.3, 8, "rtx-4060-8gb"


# --- device profiles of any length -------------------------------------------------------------


def _gpu_model(m: Mapping[str, Any]) -> GpuModel:
    """The inverse of :meth:`GpuModel.to_dict` (as stored in a shipped profile)."""
    return GpuModel(
        eta={str(a): float(v) for a, v in m["eta"].items()},
        per_layer=float(m["per_layer_us"]) * 1e-6,
        fixed=float(m["fixed_us"]) * 1e-6,
        vec_rate=float(m["vec_rate_gb_per_sm_ghz"]) * 1e9,
        tile_rate=float(m["tile_rate_gb_per_sm_ghz"]) * 1e9,
        tensor_eff=float(m["tensor_eff"]),
        softness=float(m["softness"]),
    )


def _cpu_model(m: Mapping[str, Any]) -> CpuModel:
    """The inverse of :meth:`CpuModel.to_dict`."""
    return CpuModel(
        eta=float(m["eta"]),
        fixed=float(m["fixed_us"]) * 1e-6,
        core_rate=float(m["core_rate_gb"]) * 1e9,
        batch_slope=float(m["batch_slope"]),
        softness=float(m["softness"]),
    )


@dataclass(frozen=True)
class Profile:
    """A device profile as long as asked for, and how it was made (``rebuilt``: from its
    stored model, ``deviation``: largest relative difference from the shipped per-byte costs
    over the shipped sizes; else the shipped profile, extrapolated by the cost curves)."""

    profile: DeviceProfile
    entry: DeviceEntry
    rebuilt: bool
    deviation: float = 0.0


def long_profile(entry: DeviceEntry, n_max: int, specs: Mapping[str, Spec]) -> Profile:
    """``entry``'s profile over batches of 1..``n_max`` tokens."""
    shipped = DeviceProfile.load(entry.path)
    data = json.loads(entry.path.read_text(encoding="utf-8"))
    stored, spec = data.get("model"), specs.get(entry.slug)
    if not isinstance(stored, dict) or spec is None:
        return Profile(shipped, entry, rebuilt=False)
    model = _gpu_model(stored) if entry.kind == "gpu" else _cpu_model(stored)
    built = model.profile(spec, shipped.source, max(n_max, len(shipped.per_byte)))
    deviation = max(
        abs(b / s - 1.0) for b, s in zip(built.per_byte, shipped.per_byte, strict=False)
    )
    return Profile(built, entry, rebuilt=True, deviation=deviation)


@dataclass(frozen=True)
class Setup:
    """What every prediction of a run shares: the tier that drafts, where the tiers sit
    (``gpu``: whole on the card; ``planned``: by the memory planner, ``ctx`` KV cells per
    slot, ``kv_quant``), the overhead per step and the keep rates (rate, where from)."""

    draft_tier: str
    placement: str
    ctx: int
    kv_quant: KvQuant
    overhead: float
    keeps: tuple[tuple[float, str], ...]

    def describe(self) -> str:
        if self.placement == "gpu":
            return "every tier whole on the GPU (KV cache not counted against VRAM)"
        return (
            f"tiers placed by the memory planner in the card's VRAM, {self.ctx} KV cells per "
            f"slot, KV quantization {self.kv_quant}"
        )


# --- cost curves per placement -----------------------------------------------------------------


@dataclass(frozen=True)
class Curves:
    """One card, ladder and slot count: the target alone (plain decoding) and draft + target
    (speculation), each tier's curve at the layers the memory planner gives it."""

    plain_target: CostCurve
    target: CostCurve
    draft: CostCurve
    layers: str
    kv: str


def _curve(
    mm: ModelMemory, layers: int, cpu: DeviceProfile, gpu: DeviceProfile | None
) -> CostCurve:
    n_max = min(len(cpu.per_byte), len(gpu.per_byte)) if gpu is not None else len(cpu.per_byte)
    return composed_curve(mm, layers, cpu, gpu, n_max=n_max)


def curves(
    models: Mapping[str, ModelMemory],
    draft_tier: str,
    device: Profile,
    cpu: Profile,
    slots: int,
    setup: Setup,
) -> Curves:
    """Each tier's curve on ``device`` for ``slots`` slots: a CPU device holds every layer; on
    a GPU every tier is whole on the card (``setup.placement == "gpu"``), or placed by the
    memory planner in the card's VRAM with ``slots`` slots of ``setup.ctx`` cells (target
    alone for plain decoding, draft + target for speculation)."""
    if device.entry.kind == "cpu":
        t = _curve(models["target"], 0, device.profile, None)
        d = _curve(models[draft_tier], 0, device.profile, None)
        return Curves(t, t, d, "CPU only", "-")
    gpu = device.profile

    def of(tier: str, layers: int) -> CostCurve:
        return _curve(models[tier], layers, cpu.profile, gpu)

    if setup.placement == "gpu":
        t = of("target", models["target"].n_layer + 1)
        d = of(draft_tier, models[draft_tier].n_layer + 1)
        return Curves(t, t, d, "all on GPU", "-")
    load = LoadConfig(n_ctx=setup.ctx * slots)
    found = placements(models, device.entry.vram_bytes, load, kv_quant=setup.kv_quant)
    by_name = {p.name: p for p in found}
    two_name = NO_QUALIFIER if draft_tier == "draft" else QUALIFIER_DRAFTS
    alone, two = by_name[TARGET_ONLY], by_name[two_name]
    t_alone, t_two = alone.n_gpu_layers("target"), two.n_gpu_layers("target")
    d_two = two.n_gpu_layers(draft_tier)

    def frac(tier: str, layers: int) -> str:
        return f"{layers}/{models[tier].n_layer + 1}"

    layers = (
        f"T {frac('target', t_alone)} / D {frac(draft_tier, d_two)} + T {frac('target', t_two)}"
    )
    kv_alone, kv_two = alone.plan.load.type_k, two.plan.load.type_k
    kv = kv_alone if kv_two == kv_alone else f"{kv_alone} / {kv_two}"
    return Curves(of("target", t_alone), of("target", t_two), of(draft_tier, d_two), layers, kv)


# --- the model ---------------------------------------------------------------------------------


def step_rate(c: Curves, slots: int, keep: float, k: int, overhead: float) -> float:
    """Committed tokens per second of ``slots`` slots each proposing ``k`` (0: plain decoding
    in the draft + target placement)."""
    seconds = c.target(slots * (k + 1)) + k * c.draft(slots) + overhead
    return slots * expected_tokens(keep, keep, k) / seconds


def best_k(c: Curves, slots: int, keep: float, overhead: float) -> int:
    """The ``k`` in 0..MAX_K with the most tokens per second at ``slots`` (first of equals)."""
    rates = [step_rate(c, slots, keep, k, overhead) for k in range(MAX_K + 1)]
    return max(range(MAX_K + 1), key=lambda k: (rates[k], -k))


@dataclass(frozen=True)
class Row:
    """One ladder, card, slot count and keep rate (tokens/s, predicted)."""

    ladder: str
    card: str
    slots: int
    keep: float
    keep_from: str
    layers: str
    kv: str
    plain_tps: float
    batch_k: int
    batch_tps: float
    solo_k: int
    solo_tps: float

    @property
    def ratio(self) -> float:
        return self.batch_tps / self.plain_tps

    @property
    def solo_ratio(self) -> float:
        return self.solo_tps / self.plain_tps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "ratio": round(self.ratio, 3),
            "solo_ratio": round(self.solo_ratio, 3),
            "predicted": True,
        }


def predict(
    ladder: str, card: str, c: Curves, slots: int, keep: float, keep_from: str, overhead: float
) -> Row:
    plain = slots / (c.plain_target(slots) + overhead)
    kb = best_k(c, slots, keep, overhead)
    ks = best_k(c, 1, keep, overhead)
    return Row(
        ladder=ladder,
        card=card,
        slots=slots,
        keep=round(keep, 4),
        keep_from=keep_from,
        layers=c.layers,
        kv=c.kv,
        plain_tps=round(plain, 2),
        batch_k=kb,
        batch_tps=round(step_rate(c, slots, keep, kb, overhead), 2),
        solo_k=ks,
        solo_tps=round(step_rate(c, slots, keep, ks, overhead), 2),
    )


def run(
    ladders: Sequence[str],
    cards: Sequence[str],
    slots: Sequence[int],
    setup: Setup,
    profiles: Mapping[str, Profile],
    cpu: Profile,
) -> list[Row]:
    rows = []
    for ladder in ladders:
        models = preset_memory(get_preset(ladder)).models
        for card in cards:
            for n in slots:
                c = curves(models, setup.draft_tier, profiles[card], cpu, n, setup)
                for keep, source in setup.keeps:
                    rows.append(predict(ladder, card, c, n, keep, source, setup.overhead))
    return rows


# --- output ------------------------------------------------------------------------------------


def markdown(rows: Sequence[Row]) -> str:
    head = (
        "| slots | keep | GPU layers (plain / spec), KV | plain tok/s | batch-priced k | "
        "batch-priced tok/s | ratio | solo-priced k | solo k at N: tok/s | ratio |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r.slots} | {r.keep:.2f} ({r.keep_from}) | {r.layers}, {r.kv} | "
            f"{r.plain_tps:.1f} | {r.batch_k} | {r.batch_tps:.1f} | {r.ratio:.2f}x | "
            f"{r.solo_k} | {r.solo_tps:.1f} | {r.solo_ratio:.2f}x |"
        )
    return "\n".join(lines)


def verdict(rows: Sequence[Row], where: str) -> list[str]:
    """One line per ladder: is the goal met at GOAL_SLOTS slots on GOAL_CARD (``rows``: that
    card and slot count), and at which keep rates. ``where``: the placement, in words."""
    out = []
    for ladder in dict.fromkeys(r.ladder for r in rows):
        mine = [r for r in rows if r.ladder == ladder]
        layers = "" if mine[0].layers == "all on GPU" else f" ({mine[0].layers}, {mine[0].kv})"
        met = [r for r in mine if r.ratio >= GOAL]
        each = "; ".join(
            f"a={r.keep:.2f} ({r.keep_from}) {r.ratio:.2f}x at k={r.batch_k}" for r in mine
        )
        if met:
            answer = "MET at keep rates " + ", ".join(f"{r.keep:.2f}" for r in met)
        else:
            best = max(mine, key=lambda r: r.ratio)
            answer = (
                f"NOT MET: best {best.ratio:.2f}x (a={best.keep:.2f}), {GOAL - best.ratio:.2f}x "
                f"short; the ratio would have to grow {GOAL / best.ratio - 1:.0%}"
            )
        out.append(
            f"VERDICT (predicted) {ladder}, {where}{layers}: {GOAL_SLOTS} slots "
            f"with batch-priced speculation >= {GOAL}x {GOAL_SLOTS} slots without on "
            f"{GOAL_CARD}: {answer} "
            f"[{each}]"
        )
    return out


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(t) for t in text.split(",") if t.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())


def main() -> None:
    gpus, cpus = catalogue("gpu"), catalogue("cpu")
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ladder", action="append", choices=LADDERS, help="default: both")
    ap.add_argument(
        "--card", action="append", choices=[*gpus, *cpus], help=f"default: {', '.join(CARDS)}"
    )
    ap.add_argument("--slots", type=_ints, default=SLOTS, help="default: 1,2,4,8,16")
    ap.add_argument("--keep", type=_floats, default=KEEPS, help="default: 0.5,0.6,0.7,0.8")
    ap.add_argument(
        "--no-trace-keep", action="store_true", help="leave out the shipped traces' keep rate"
    )
    ap.add_argument(
        "--draft",
        choices=("draft", "qualifier"),
        default="draft",
        help="the tier that drafts (qualifier: the ladder's middle model)",
    )
    ap.add_argument(
        "--placement",
        choices=("gpu", "planned"),
        default="gpu",
        help="gpu: every tier whole on the card; planned: the memory planner's layers",
    )
    ap.add_argument("--ctx", type=int, default=2048, help="planned: KV cells per slot")
    ap.add_argument("--kv-quant", choices=("off", "auto"), default="off", help="planned")
    ap.add_argument(
        "--overhead", type=float, default=0.0, help="seconds per step (auto's ROUND_OVERHEAD: 4e-4)"
    )
    ap.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the rows")
    args = ap.parse_args()
    ladders = tuple(args.ladder or LADDERS)
    cards = tuple(args.card or CARDS)
    slots = tuple(sorted(set(args.slots)))
    if not slots or min(slots) < 1:
        ap.error("--slots needs positive integers")
    if any(not 0.0 <= a <= 1.0 for a in args.keep):
        ap.error("--keep rates must lie in [0, 1]")

    traces = traces_for(ladders[0])
    keeps: list[tuple[float, str]] = []
    if not args.no_trace_keep:
        keeps.append((traces.agreement(args.draft), "traces"))
    keeps += [(a, "sweep") for a in args.keep]
    kv_quant: KvQuant = "auto" if args.kv_quant == "auto" else "off"
    setup = Setup(args.draft, args.placement, args.ctx, kv_quant, args.overhead, tuple(keeps))
    # the verdict under both placements: the compute question and the memory one
    other = replace(setup, placement="planned" if args.placement == "gpu" else "gpu")

    n_max = max(*slots, GOAL_SLOTS) * (MAX_K + 1)
    specs = load_specs()
    entries = gpus | cpus
    profiles = {c: long_profile(entries[c], n_max, specs) for c in {*cards, GOAL_CARD}}
    cpu = long_profile(cpus[DEFAULT["cpu"]], n_max, specs)

    rows = run(ladders, cards, slots, setup, profiles, cpu)
    goals = {
        s.placement: (s, run(ladders, [GOAL_CARD], [GOAL_SLOTS], s, profiles, cpu))
        for s in (setup, other)
    }
    verdicts = [line for s, g in goals.values() for line in verdict(g, s.describe())]

    print(
        f"Predicted: {', '.join(str(n) for n in slots)} symmetric slots, the {args.draft} "
        f"drafting for the target; {setup.describe()}; {args.overhead * 1e3:g} ms overhead "
        f"per step; k up to {MAX_K}. Keep rate 'traces': the {args.draft}'s agreement with the "
        f"target in the shipped traces of {traces.ladder} ({traces.agreement(args.draft):.0%}, "
        f"{len(traces.traces)} traces, standing in for each ladder's own)."
    )
    for card in dict.fromkeys([*cards, DEFAULT["cpu"]]):
        p = profiles.get(card) or cpu
        how = (
            f"rebuilt from its stored model out to {n_max} tokens (within {p.deviation:.3%} of "
            "the shipped 1..16)"
            if p.rebuilt
            else "as shipped, extrapolated linearly past its sizes"
        )
        note = " (also prices the GPU cards' CPU layers)" if card == DEFAULT["cpu"] else ""
        print(f"- profile {card}{note}: {p.entry.basis}, {how}")
    print()
    for ladder in ladders:
        for card in cards:
            mine = [r for r in rows if r.ladder == ladder and r.card == card]
            print(f"### {ladder} on {card} (predicted)\n")
            print(markdown(mine))
            print()
    for line in verdicts:
        print(line)
    if args.json is not None:
        out = {
            "predicted": True,
            "setup": {
                "draft": args.draft,
                "placement": args.placement,
                "ctx_per_slot": args.ctx,
                "kv_quant": args.kv_quant,
                "overhead_s": args.overhead,
                "traces": traces.ladder,
                "max_k": MAX_K,
            },
            "rows": [r.to_dict() for r in rows],
            "goal": {p: [r.to_dict() for r in g] for p, (_, g) in goals.items()},
            "verdict": verdicts,
        }
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
