"""Placements of a ladder in a VRAM budget, ranked by the speed they are predicted to decode at.

VRAM is the currency: a qualifier's gigabytes could instead hold target layers. A
:class:`Placement` is one way to spend the budget (every tier, the draft first; no qualifier;
the qualifier as the only draft; the draft on the CPU; the target alone; for a mixture of
experts, each of those with every layer on the GPU but the experts of the first blocks,
:func:`~pyramid_gguf.planning.moe.expert_plan`), fitted by the memory planner
(:func:`~pyramid_gguf.planning.vram.make_plan`). :func:`rank` prices each one: the cost
curve of every tier at its layer split, composed from device profiles
(:mod:`.compose`), then ``auto`` replayed over acceptance traces recorded on real models
(:func:`~pyramid_gguf.decoding.offline.replay.replay_trace`): the same rounds, decisions and budget
a generation would run, priced by those curves. Beside ``auto``, each placement is priced for
llama.cpp's own draft-model speculation (``llama-server -md``, :mod:`.peer`), the peer a user
would run there. Greedy decoding; every figure is a prediction and says what it was predicted
from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.errors import UserError
from ..core.ladder import LadderShape
from ..core.load import LoadConfig
from ..core.spec import SpecConfig
from ..decoding.offline.replay import replay_trace
from ..decoding.offline.traces import TraceSet
from ..decoding.pricing.costs import CostCurve
from ..decoding.runtime.auto import ROUND_OVERHEAD
from .compose import CURVE_N, DeviceProfile, Link
from .links import PINNED_EFFICIENCY, WEIGHTS, Pcie, Weights, describe_weights, plain_kernels
from .memory import GiB, ModelMemory
from .moe import ExpertUnion, expert_plan, tier_curve
from .peer import PeerSpec, PeerWalks
from .ram import RamBudget
from .vram import KvQuant, Plan, make_plan, tier_plan

#: Placement names, in the order they are tried.
ALL = "all tiers"
NO_QUALIFIER = "no qualifier"
QUALIFIER_DRAFTS = "qualifier as draft"
DRAFT_ON_CPU = "draft on CPU"
TARGET_ONLY = "target only"
#: A placement's name with a mixture of experts' experts of the first blocks in CPU memory.
EXPERTS_ON_CPU = ", experts on CPU"


#: Prompt tokens the time to a first token is predicted for (llama-bench's ``pp512``).
PROMPT_N = 512


@dataclass(frozen=True)
class Placement:
    """One way to spend the budget: the tiers loaded, the layers each has on the GPU, and
    where the weights left on the CPU sit (``weights``: :mod:`.links`)."""

    name: str
    plan: Plan
    weights: Weights = "mapped"

    @property
    def label(self) -> str:
        """The name, with the weights' placement when it is not llama.cpp's default."""
        return self.name if self.weights == "mapped" else f"{self.name}, {self.weights}"

    @property
    def load_flags(self) -> dict[str, bool]:
        """The :class:`~..core.load.LoadConfig` fields that load this placement's weights."""
        return {"use_mmap": self.weights != "pinned", "no_host": self.weights == "repacked"}

    def holds_cpu_weights(self) -> bool:
        """Whether any tier keeps blocks, its output head or experts in host memory (only then
        does ``weights`` matter: the embedding table stays there anyway, read a row a token)."""
        return any(t.n_gpu_layers < t.n_layer + 1 or t.n_cpu_moe for t in self.plan.tiers)

    @property
    def tiers(self) -> tuple[str, ...]:
        """The tiers loaded, smallest first."""
        return tuple(t for t in ("draft", "qualifier", "target") if t in self.plan.tier_names)

    @property
    def shape(self) -> LadderShape:
        return LadderShape(self.tiers)

    def n_gpu_layers(self, tier: str) -> int:
        return self.plan.tier(tier).n_gpu_layers

    def n_cpu_moe(self, tier: str) -> int:
        """Blocks of ``tier`` whose routed experts stay in CPU memory (llama.cpp's
        ``--n-cpu-moe``; 0 for a dense tier)."""
        return self.plan.tier(tier).n_cpu_moe


def placements(
    models: Mapping[str, ModelMemory],
    budget: int,
    load: LoadConfig,
    *,
    kv_quant: KvQuant = "off",
    margin: int | None = None,
) -> list[Placement]:
    """Every way this ladder's tiers (``models``: tier -> memory facts) can share ``budget``
    bytes of VRAM, each fitted by the memory planner (the tiers it places first fill first).
    A mixture-of-experts target adds each order with its experts partly in CPU memory
    (``load.n_cpu_moe`` / ``load.cpu_moe`` given by hand: exactly those blocks)."""

    def fit(order: Sequence[str]) -> Plan:
        return make_plan(
            [(t, models[t]) for t in order], budget, load, kv_quant=kv_quant, margin_bytes=margin
        )

    has_d, has_q = "draft" in models, "qualifier" in models
    out: list[Placement] = []
    if has_d and has_q:
        out.append(Placement(ALL, fit(("draft", "qualifier", "target"))))
        spent = fit(("qualifier", "target"))
        cpu_draft = tier_plan("draft", models["draft"], 0, spent.load, op_offload=False)
        out.append(Placement(DRAFT_ON_CPU, replace(spent, tiers=(cpu_draft, *spent.tiers))))
    if has_d:
        out.append(Placement(NO_QUALIFIER, fit(("draft", "target"))))
    if has_q:
        out.append(Placement(QUALIFIER_DRAFTS, fit(("qualifier", "target"))))
    out.append(Placement(TARGET_ONLY, fit(("target",))))
    target = models["target"]
    if target.experts is None:
        if load.n_cpu_moe or load.cpu_moe:
            raise UserError(
                f"--n-cpu-moe/--cpu-moe: the target {target.path} is not a mixture of experts"
            )
        return out
    fixed = target.n_layer if load.cpu_moe else (load.n_cpu_moe or None)
    orders = {
        ALL: ("draft", "qualifier", "target"),
        NO_QUALIFIER: ("draft", "target"),
        QUALIFIER_DRAFTS: ("qualifier", "target"),
        TARGET_ONLY: ("target",),
    }
    for name, order in orders.items():
        if not all(t in models for t in order):
            continue
        plan = expert_plan(
            [(t, models[t]) for t in order], budget, load,
            kv_quant=kv_quant, margin_bytes=margin, n_cpu_moe=fixed,
        )  # fmt: skip
        if plan is not None:
            out.append(Placement(name + EXPERTS_ON_CPU, plan))
    return out


@dataclass(frozen=True)
class Prediction:
    """What one placement is predicted to do.

    ``costs``: each tier's composed cost curve. ``tps``: ``auto``'s generated tokens per second
    over the traces (greedy); ``plain_tps``: plain decoding's in this placement; ``chains``:
    tokens ``auto`` committed per chain; ``speedup``: ``tps`` over the best plain decoding of
    any placement (filled by :func:`rank`); ``peer``: llama.cpp's draft-model speculation in
    this placement (:mod:`.peer`; None without a smaller model loaded).
    """

    placement: Placement
    costs: Mapping[str, CostCurve]
    tps: float
    plain_tps: float
    chains: Mapping[str, int]
    speedup: float = 0.0
    peer: PeerSpec | None = None
    #: Seconds each loaded tier takes to evaluate a :data:`PROMPT_N`-token prompt (in
    #: ``n_batch`` chunks): the engine prefills the target, then every other tier, before the
    #: first token. Empty: not predicted.
    prompt_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def pp512_tps(self) -> float:
        """The target's prompt speed, tokens/s over a 512-token prompt (llama-bench's pp512)."""
        t = self.prompt_s.get("target", 0.0)
        return PROMPT_N / t if t > 0 else 0.0

    @property
    def ttft_s(self) -> float:
        """Seconds to a first token after a 512-token prompt: every tier's prompt, then one
        target step."""
        if not self.prompt_s:
            return 0.0
        return sum(self.prompt_s.values()) + self.costs["target"](1)

    @property
    def peer_tps(self) -> float | None:
        """``peer_spec_tps``: llama.cpp's draft-model speculation here (None: no draft)."""
        return self.peer.tps if self.peer is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "placement": self.placement.name,
            "weights": self.placement.weights,
            "load_flags": self.placement.load_flags,
            "tiers": {
                t: {
                    "n_gpu_layers": self.placement.n_gpu_layers(t),
                    "n_cpu_moe": self.placement.n_cpu_moe(t),
                    "gpu_bytes": self.placement.plan.tier(t).gpu_bytes,
                    "ms_per_token": round(self.costs[t](1) * 1000, 3),
                }
                for t in self.placement.tiers
            },
            "type_k": self.placement.plan.load.type_k,
            "type_v": self.placement.plan.load.type_v,
            "host_bytes": self.placement.plan.host_bytes,
            "host_memory": {
                "mapped": "page cache (shared, evictable)",
                "pinned": "pinned (locked, not shared)",
                "repacked": "anonymous (swappable)",
            }[self.placement.weights],
            "plain_tps": round(self.plain_tps, 2),
            "auto_tps": round(self.tps, 2),
            "pp512_tps": round(self.pp512_tps, 1),
            "ttft_512_s": round(self.ttft_s, 3),
            "peer_spec_tps": None if self.peer is None else round(self.peer.tps, 2),
            "peer_spec": None if self.peer is None else self.peer.to_dict(),
            "speedup": round(self.speedup, 3),
            "committed_by_chain": dict(self.chains),
            "main_chain": self.main_chain,
        }

    @property
    def main_chain(self) -> str:
        """The chain that committed most tokens beyond plain decoding (``target`` if none)."""
        spec = {c: n for c, n in self.chains.items() if c != "target" and n > 0}
        return max(spec, key=lambda c: spec[c]) if spec else "target"


def placement_costs(
    placement: Placement,
    models: Mapping[str, ModelMemory],
    cpu: DeviceProfile,
    gpu: DeviceProfile | None,
    link: Link | None = None,
    unions: Mapping[str, ExpertUnion] | None = None,
    *,
    pcie: Pcie | None = None,
    n_max: int | None = None,
) -> dict[str, CostCurve]:
    """The composed cost curve of every tier of ``placement`` (a mixture of experts priced by
    the union its blocks read: ``unions[tier]``, else random routing; :mod:`.moe`).

    ``pcie``: the card's link, priced per tier for the placement's ``weights`` (op offload at
    the rate they copy at, where the tier's plan keeps it on; CPU layers at the plain kernels'
    cost unless repacked, :func:`~.links.plain_kernels`); without it ``link`` as given, the CPU
    profile as it is, no op offload (the earlier pricing). ``n_max``: sizes covered
    (default :data:`~.compose.CURVE_N` with ``pcie``, else the profiles' own)."""
    unions = unions or {}
    on_cpu = cpu
    if pcie is not None and gpu is not None and placement.weights != "repacked":
        on_cpu = plain_kernels(cpu)
    out = {}
    for t in placement.tiers:
        tier_link = link
        if pcie is not None:
            tier_link = pcie.link(placement.weights, op_offload=placement.plan.tier(t).op_offload)
        kwargs = {} if n_max is None and pcie is None else {"n_max": n_max or CURVE_N}
        out[t] = tier_curve(
            models[t],
            placement.n_gpu_layers(t),
            placement.n_cpu_moe(t),
            on_cpu,
            gpu,
            tier_link,
            unions.get(t),
            **kwargs,
        )
    return out


def prompt_seconds(
    placement: Placement,
    models: Mapping[str, ModelMemory],
    cpu: DeviceProfile,
    gpu: DeviceProfile | None,
    pcie: Pcie | None = None,
    unions: Mapping[str, ExpertUnion] | None = None,
    prompt: int = PROMPT_N,
) -> dict[str, float]:
    """Seconds each tier of ``placement`` takes to evaluate a ``prompt``-token prompt, in
    chunks of the plan's ``n_batch`` (llama.cpp's micro-batch): where op offload prices the
    CPU layers, one copy of their weights per chunk."""
    chunk = max(1, min(prompt, placement.plan.load.n_batch))
    curves = placement_costs(placement, models, cpu, gpu, None, unions, pcie=pcie, n_max=chunk)
    full, rest = divmod(prompt, chunk)
    return {t: full * c(chunk) + (c(rest) if rest else 0.0) for t, c in curves.items()}


def predict(
    placement: Placement,
    costs: Mapping[str, CostCurve],
    traces: TraceSet,
    spec: SpecConfig | None = None,
) -> Prediction:
    """Replay ``auto`` (or ``spec``) over every trace with ``costs``: tokens per second as
    ``bench`` counts them, summed over the traces."""
    spec = spec or SpecConfig(mode="auto")
    tokens = 0
    seconds = 0.0
    chains: dict[str, int] = {}
    for trace in traces.traces:
        r = replay_trace(trace, costs, spec)
        tokens += len(r.tokens)
        seconds += r.seconds
        if r.stats.auto is not None:
            for c in r.stats.auto.choices.values():
                chains[c.chain] = chains.get(c.chain, 0) + c.committed
    plain = replay_plain(costs["target"])
    return Prediction(placement, dict(costs), tokens / seconds if seconds else 0.0, plain, chains)


def replay_plain(target: CostCurve) -> float:
    """Plain decoding's tokens per second on ``target``'s curve (one evaluation a token)."""
    return 1.0 / (target(1) + ROUND_OVERHEAD)


def rank(
    options: Sequence[Placement],
    models: Mapping[str, ModelMemory],
    traces: TraceSet,
    cpu: DeviceProfile,
    gpu: DeviceProfile | None,
    *,
    spec: SpecConfig | None = None,
    link: Link | None = None,
    unions: Mapping[str, ExpertUnion] | None = None,
    pcie: Pcie | None = None,
) -> list[Prediction]:
    """``options`` predicted and sorted fastest first (fewer tiers first among equals); each
    speedup is over the fastest plain decoding of any option (the best a user gets today by
    fitting the target alone). Each carries llama.cpp's draft-model speculation in it.
    ``unions``: a mixture of experts' measured union per tier (else random routing).
    ``pcie``: the card's link: each option priced for its weights' placement, op offload
    included, and its prompt speed predicted (:func:`placement_costs`)."""
    spec = spec or SpecConfig(mode="auto")
    walks = PeerWalks(traces)  # llama.cpp drafts up to 64 whatever auto's --max-block
    preds = []
    for p in options:
        costs = placement_costs(p, models, cpu, gpu, link, unions, pcie=pcie)
        pred = replace(predict(p, costs, traces, spec), peer=walks.best(costs))
        if pcie is not None or gpu is None:
            pred = replace(pred, prompt_s=prompt_seconds(p, models, cpu, gpu, pcie, unions))
        preds.append(pred)
    baseline = max(p.plain_tps for p in preds)
    preds = [replace(p, speedup=p.tps / baseline) for p in preds]
    return sorted(preds, key=lambda p: (-round(p.tps, 6), len(p.placement.tiers)))


@dataclass(frozen=True)
class Unfit:
    """A placement left out of the ranking because its host memory (``host_bytes``) exceeds
    the RAM budget by ``over_bytes``: what plain decoding would reach if it fit
    (``plain_tps``), and re-reading the overflow from disk every token (``ssd_tps``, at
    :data:`~.ram.SSD_BYTES_PER_S`: an upper bound)."""

    placement: Placement
    host_bytes: int
    over_bytes: int
    plain_tps: float
    ssd_tps: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "placement": self.placement.name,
            "weights": self.placement.weights,
            "host_bytes": self.host_bytes,
            "over_bytes": self.over_bytes,
            "plain_tps": round(self.plain_tps, 2),
            "ssd_plain_tps": round(self.ssd_tps, 3),
        }


@dataclass(frozen=True)
class Ranking:
    """A ladder's placements in one budget, fastest first, with what predicted them.

    ``ladder``: its name; ``cpu_how`` / ``gpu_how``: how each profile was chosen, in words;
    ``models``: where each tier's memory facts came from (a file, a shipped shape, the hub);
    ``ram``: the host memory budget the placements were checked against (None: unknown, not
    checked); ``unfit``: the placements left out because they exceed it.
    """

    predictions: tuple[Prediction, ...]
    traces: TraceSet
    cpu: DeviceProfile
    gpu: DeviceProfile | None
    ladder: str = ""
    cpu_how: str = ""
    gpu_how: str = ""
    models: tuple[str, ...] = ()
    ram: RamBudget | None = None
    unfit: tuple[Unfit, ...] = ()
    #: A mixture-of-experts target: where the union of experts its blocks read came from.
    experts: str = ""
    #: The card's link the placements were priced over (None: no GPU, or priced without one).
    pcie: Pcie | None = None

    @property
    def best(self) -> Prediction:
        return self.predictions[0]

    @property
    def best_peer(self) -> Prediction | None:
        """The placement where llama.cpp's draft-model speculation is fastest (None: no
        placement loads a smaller model)."""
        with_peer = [p for p in self.predictions if p.peer is not None]
        return max(with_peer, key=lambda p: p.peer.tps if p.peer else 0.0) if with_peer else None

    def to_dict(self) -> dict[str, Any]:
        peer = self.best_peer
        return {
            "sources": self.sources(),
            "profiles": {"cpu": self.cpu.name, "gpu": self.gpu.name if self.gpu else None},
            "ram": self.ram.to_dict() if self.ram is not None else None,
            "placements": [p.to_dict() for p in self.predictions],
            "not_fitting_ram": [u.to_dict() for u in self.unfit],
            "best": self.best.placement.name,
            "best_weights": self.best.placement.weights,
            "pcie": None
            if self.pcie is None
            else {"link": self.pcie.spec, "source": self.pcie.source},
            "best_peer_spec": None
            if peer is None or peer.peer is None
            else {"placement": peer.placement.name, **peer.peer.to_dict()},
            "plan": self.best.placement.plan.to_dict(),
        }

    def sources(self) -> list[str]:
        """One line per source of the predictions (what they were predicted from)."""
        sets = ", ".join(self.traces.sets())
        stand_in = ""
        if self.ladder and self.traces.ladder != self.ladder:
            stand_in = (
                f"; standing in for {self.ladder}'s own, which are not recorded "
                "(pyramid-gguf traces records them)"
            )
        lines = [
            f"acceptance: auto replayed (greedy) over {len(self.traces.traces)} traces of "
            f"{self.traces.ladder} ({sets}), recorded on {self.traces.machine or 'unknown'}"
            + stand_in,
            _profile_line("CPU", self.cpu, self.cpu_how),
        ]
        if self.gpu is not None:
            lines.append(_profile_line("GPU", self.gpu, self.gpu_how))
        lines += [f"memory: {m}" for m in self.models]
        if self.experts:
            lines.append(f"experts: {self.experts}")
        if self.ram is None:
            lines.append("RAM: not known, so not checked (--ram SIZE checks it)")
        else:
            need = self.best.placement.plan.host_bytes
            lines.append(
                f"RAM: {self.ram.describe()}; the best placement needs {need / GiB:.1f} GiB "
                "(CPU layers' weights, mapped from the file, their KV cache and buffers)"
            )
        if self.pcie is not None:
            lines.append(weights_line(self.pcie))
        lines.append(
            "prompt: pp512 is the target's prompt speed over 512 tokens, TTFT the time to a "
            "first token after them (every loaded tier evaluates the prompt in --batch-size "
            "chunks): predicted from the same profiles, op offload included"
        )
        lines.append(
            "llama.cpp -md: llama-server's draft-model speculation (draft-simple, greedy "
            "matching) replayed over the same traces and costs, the best smaller tier as its "
            "draft at its best --spec-draft-n-max and -p-min, no per-round overhead (an upper "
            "bound)"
        )
        return lines


def with_weights(
    options: Sequence[Placement], allowed: Sequence[Weights] = WEIGHTS
) -> list[Placement]:
    """Each option once per placement of its CPU weights in ``allowed`` (an option with no
    weights in host memory once, mapped: where they sit changes nothing there)."""
    out = []
    for p in options:
        modes = allowed if p.holds_cpu_weights() else allowed[:1]
        out += [replace(p, weights=w) for w in modes]
    return out


def weights_line(pcie: Pcie) -> str:
    """The sources line of the link and the weights' placements."""
    rates = ", ".join(
        f"{w} {r / 1e9:.1f} GB/s" if (r := pcie.copy_rate(w)) else f"{w} none" for w in WEIGHTS
    )
    return (
        f"link: {pcie.name} ({pcie.source}); op offload (batches of 32+ tokens copy the CPU "
        f"layers' weights to the GPU) at {rates} (predicted: pinned {PINNED_EFFICIENCY:.0%} "
        "of the raw rate, mapped at most the H200 host's measured 7.6 GB/s); CPU layers: "
        + "; ".join(describe_weights(w) for w in WEIGHTS)
    )


def _profile_line(kind: str, profile: DeviceProfile, how: str) -> str:
    line = f"{kind} costs: profile {profile.name} ({profile.source})"
    return f"{line}; {how}" if how else line
