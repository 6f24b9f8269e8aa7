"""Replaying a recorded answer through the real rounds of any mode, priced by cost curves.

Scripted tiers stand in for the models: a :class:`ScriptedTarget` always predicts the answer it
was given; a :class:`ScriptedTier` predicts what a lower tier's :class:`~.traces.TierTrace`
says it argmaxed at each position of that answer, and, once its context has left the answer
(a block it drafted went its own way), agrees with the tier above it as often as it did along
the answer, decided by a hash of the context so that a replay is deterministic. Every
evaluation is charged its price on the tier's :class:`~.costs.CostCurve` (the target's plus
:data:`~.auto.ROUND_OVERHEAD`), catching up included.

:func:`replay_trace` runs the same rounds a generation runs (``auto`` or a fixed mode, through
:func:`~.engine.make_scheduler`) over one trace, greedy: the first answer token comes from the
prompt's evaluation, as in :func:`~.engine.decode`, and is not charged. Under greedy
verification the committed tokens are the answer, so what a replay predicts is the time: what
the mode would do with the real models on a machine with these cost curves, except where the
target's top two logits nearly tie. :func:`replay` is the n-gram-only form ``auto``'s tests and
``scripts/lab/replay_auto.py`` use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from ...core.sampling import SamplingConfig
from ...core.spec import SpecConfig
from ..pricing.costs import CostCurve
from ..pricing.estimates import KeepMemory
from ..runtime.auto import ROUND_OVERHEAD
from ..runtime.engine import make_scheduler
from ..runtime.sampling import Sampler
from ..runtime.stats import AutoStats, GenerationStats
from ..runtime.tiers import Ladder, ModelTier, common_prefix
from .traces import TierTrace, Trace

#: Token ids reserved for what a scripted tier predicts off the answer.
OFF_SPAN = 64


def _row(n_vocab: int, token: int, top: float) -> np.ndarray:
    """Logits ``[n_vocab]`` whose softmax gives ``token`` probability ``top``, the rest alike."""
    top = min(max(top, 1.0 / n_vocab), 1.0 - 1e-6)
    low = math.log((1.0 - top) / (top * (n_vocab - 1)))
    row = np.full(n_vocab, low, dtype=np.float32)
    row[token] = 0.0
    return row


def _mix(context: Sequence[int]) -> int:
    """A deterministic hash of a context's last tokens and length."""
    h = len(context) * 0x9E3779B1
    for t in context[-4:]:
        h = (h ^ (int(t) + 0x7F4A7C15)) * 0x85EBCA6B & 0xFFFFFFFF
    return h


class ScriptedTarget:
    """A greedy target that always continues ``text``; each :meth:`score` costs its batch's
    price on ``curve`` plus :data:`~.auto.ROUND_OVERHEAD` (summed in ``seconds``)."""

    name = "target"

    def __init__(self, text: Sequence[int], curve: CostCurve, n_vocab: int | None = None) -> None:
        self.text = [int(t) for t in text]
        self.curve = curve
        self.n_vocab = n_vocab or max(self.text) + 1
        self.evaluations = 0
        self.seconds = 0.0

    def score(self, context: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """One-hot logits ``[len(tokens) + 1, n_vocab]``: row ``i`` predicts the script's token
        at ``len(context) + i``."""
        n = len(context)
        if list(context) != self.text[:n]:
            raise ValueError("scored a context that leaves the script")
        self.evaluations += 1
        self.seconds += self.curve(len(tokens) + 1) + ROUND_OVERHEAD
        rows = np.full((len(tokens) + 1, self.n_vocab), -20.0, dtype=np.float32)
        want = self.text[n : n + len(tokens) + 1]
        rows[np.arange(len(want)), want] = 0.0
        return rows

    def sync(self, committed: Sequence[int]) -> None:
        return None

    def is_eog(self, token: int) -> bool:
        return False


class ScriptedTier:
    """A lower tier following ``trace`` along ``text`` (the prompt's ``start`` tokens, then the
    answer); off the answer it agrees with ``above`` (the tier it proposes to, if scripted) at
    rate ``agree``. Its cache is tracked like a model's, so catching up is charged."""

    def __init__(
        self,
        name: str,
        text: Sequence[int],
        start: int,
        trace: TierTrace,
        curve: CostCurve,
        n_vocab: int,
        *,
        above: ScriptedTier | None = None,
        agree: float = 0.0,
    ) -> None:
        self.name = name
        self.text = [int(t) for t in text]
        self.start = start
        self.trace = trace
        self.curve = curve
        self.n_vocab = n_vocab
        self.above = above
        self.agree = agree
        self.off_top = sum(trace.top) / max(len(trace.top), 1)
        self.tokens: list[int] = []
        self.seconds = 0.0

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def predict(self, context: Sequence[int]) -> tuple[int, float]:
        """This tier's argmax after ``context`` and its top probability."""
        n = len(context) - self.start
        if (
            0 <= n < len(self.trace.argmax)
            and list(context[self.start :]) == self.text[self.start : len(context)]
        ):
            return self.trace.argmax[n], self.trace.top[n]
        h = _mix(context)
        own = self.n_vocab - OFF_SPAN + h % OFF_SPAN
        if self.above is None:
            return own, self.off_top
        theirs, _ = self.above.predict(context)
        if (h >> 12) % 10_000 < self.agree * 10_000:
            return theirs, self.off_top
        if own == theirs:
            own = self.n_vocab - OFF_SPAN + (h + 1) % OFF_SPAN
        return own, self.off_top

    def _charge(self, n: int) -> None:
        self.seconds += self.curve(n)

    def sync(self, committed: Sequence[int]) -> None:
        self.tokens = self.tokens[: common_prefix(self.tokens, committed[:-1])]

    def lag(self, committed: Sequence[int]) -> int:
        return max(len(committed) - 1 - self.n_past, 0)

    def score(self, context: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Rows ``[len(tokens) + 1, n_vocab]`` after ``context`` and each of ``tokens``."""
        self.sync(context)
        self._charge(len(context) - self.n_past + len(tokens))
        full = [*context, *tokens]
        self.tokens = [int(t) for t in full]
        rows = [
            _row(self.n_vocab, *self.predict(full[: len(context) + i]))
            for i in range(len(tokens) + 1)
        ]
        return np.stack(rows)

    def step(self, token: int) -> np.ndarray:
        self.tokens.append(int(token))
        self._charge(1)
        return _row(self.n_vocab, *self.predict(self.tokens))

    def is_eog(self, token: int) -> bool:
        return False


@dataclass(frozen=True)
class Replay:
    """``tokens``: the answer as decoded; ``seconds``: what its rounds cost by the curves;
    ``speedup``: plain decoding's price over that; ``evaluations``: target evaluations;
    ``stats``: the generation's statistics (``auto``: what it chose)."""

    tokens: list[int]
    seconds: float
    speedup: float
    evaluations: int
    stats: GenerationStats

    @property
    def auto(self) -> AutoStats:
        assert self.stats.auto is not None, "not an auto replay"
        return self.stats.auto

    @property
    def tps(self) -> float:
        """Generated tokens per second, as ``bench`` counts them."""
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


def _compact(trace: Trace) -> tuple[dict[int, int], list[int]]:
    """A dense renumbering of the ids in ``trace`` (equality is all a replay looks at)."""
    ids = dict.fromkeys([*trace.prompt, *trace.answer])
    for t in trace.tiers.values():
        ids |= dict.fromkeys(t.argmax)
    order = list(ids)
    return {t: i for i, t in enumerate(order)}, order


def replay_trace(
    trace: Trace,
    costs: Mapping[str, CostCurve],
    spec: SpecConfig | None = None,
    *,
    first_free: bool = True,
    memory: KeepMemory | None = None,
) -> Replay:
    """Decode ``trace``'s answer greedily with ``spec``'s rounds over scripted tiers: the
    target, and each lower tier of the trace that ``costs`` prices (a placement without a
    qualifier passes no qualifier curve). ``first_free``: the first answer token comes from
    the prompt's evaluation, as in a real generation, and is not charged. ``memory``: ``auto``
    starts from (and teaches) these keep rates, as a loaded ladder's next generation does."""
    spec = spec or SpecConfig(mode="auto")
    ids, back = _compact(trace)
    n_vocab = len(back) + OFF_SPAN
    prompt = [ids[t] for t in trace.prompt]
    text = [*prompt, *(ids[t] for t in trace.answer)]
    start = len(prompt)
    target = ScriptedTarget(text, costs["target"], n_vocab)
    scripted: dict[str, ScriptedTier] = {}
    for name in ("qualifier", "draft"):  # the tier above first: a draft follows it off-path
        if name in trace.tiers and name in costs:
            tt = trace.tiers[name]
            above = scripted.get("qualifier") if name == "draft" else None
            agree = _agreement(tt, trace.tiers["qualifier"]) if above is not None else 0.0
            remapped = TierTrace(tuple(ids[t] for t in tt.argmax), tt.top, tt.overlap)
            scripted[name] = ScriptedTier(
                name, text, start, remapped, costs[name], n_vocab, above=above, agree=agree
            )
    ladder = Ladder(
        cast(ModelTier, target),
        cast(ModelTier | None, scripted.get("qualifier")),
        cast(ModelTier | None, scripted.get("draft")),
    )
    stats = GenerationStats(mode=spec.mode)
    sampler = Sampler(SamplingConfig(temperature=0, max_tokens=len(trace.answer)))
    scheduler, prefill = make_scheduler(
        ladder, spec, sampler, stats, costs=dict(costs), memory=memory
    )
    for tier in prefill:  # the prompt, evaluated before generation starts
        if isinstance(tier, ScriptedTier):
            tier.tokens = list(prompt)
    committed = list(prompt)
    end = len(text)
    if first_free and end > start:
        committed.append(text[start])
    while len(committed) < end:
        scheduler.sync(committed)
        committed += scheduler.run(committed, end - len(committed))[: end - len(committed)]
    seconds = target.seconds + sum(t.seconds for t in scripted.values())
    rounds_plain = len(trace.answer) - (1 if first_free else 0)
    plain = rounds_plain * (costs["target"](1) + ROUND_OVERHEAD)
    speedup = plain / seconds if seconds > 0 else 1.0
    tokens = [back[t] for t in committed[start:]]
    return Replay(tokens, seconds, speedup, target.evaluations, stats)


def _agreement(lower: TierTrace, upper: TierTrace) -> float:
    """Share of positions where two tiers' argmaxes agree along the answer."""
    pairs = list(zip(lower.argmax, upper.argmax, strict=False))
    return sum(a == b for a, b in pairs) / max(len(pairs), 1)


def replay(
    prompt: Sequence[int],
    answer: Sequence[int],
    curve: CostCurve,
    spec: SpecConfig | None = None,
) -> Replay:
    """Decode ``answer`` after ``prompt`` with ``auto`` (greedy) against a scripted target
    priced by ``curve``, every token a round: a ladder of the target alone, so n-gram or plain
    rounds only."""
    trace = Trace("", "", tuple(int(t) for t in prompt), tuple(int(t) for t in answer))
    return replay_trace(trace, {"target": curve}, spec, first_free=False)
