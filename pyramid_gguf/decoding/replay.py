"""Replaying a known answer through ``auto``'s scheduler, priced by a cost curve (no model).

A :class:`ScriptedTarget` always predicts the tokens it was given (one-hot logits) and charges
every evaluation its price on a :class:`~.costs.CostCurve`. :func:`replay` decodes the answer
with :class:`~.auto.AutoRounds` against it and returns the speedup the cost model predicts over
plain decoding. Under greedy decoding that is what ``auto`` does with the real target, except
where the target's top two logits nearly tie. ``scripts/replay_auto.py`` tunes the policy on
recorded answers this way in seconds; the tests use it to check the scheduler's decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from ..config import SamplingConfig, SpecConfig
from .auto import ROUND_OVERHEAD, AutoRounds
from .costs import CostCurve
from .sampling import Sampler
from .stats import AutoStats, GenerationStats
from .tiers import Ladder, ModelTier


class ScriptedTarget:
    """A greedy target that always continues ``text``; each :meth:`score` costs its batch's
    price on ``curve`` plus :data:`~.auto.ROUND_OVERHEAD` (summed in ``seconds``)."""

    name = "target"

    def __init__(self, text: Sequence[int], curve: CostCurve) -> None:
        self.text = [int(t) for t in text]
        self.curve = curve
        self.n_vocab = max(self.text) + 1
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
        rows[np.arange(len(tokens) + 1), self.text[n : n + len(tokens) + 1]] = 0.0
        return rows


@dataclass(frozen=True)
class Replay:
    """``tokens``: the answer as decoded; ``speedup``: plain decoding's price over auto's;
    ``evaluations``: target evaluations; ``auto``: what auto chose."""

    tokens: list[int]
    speedup: float
    evaluations: int
    auto: AutoStats


def replay(
    prompt: Sequence[int],
    answer: Sequence[int],
    curve: CostCurve,
    spec: SpecConfig | None = None,
) -> Replay:
    """Decode ``answer`` after ``prompt`` with ``auto`` (greedy) against a scripted target
    priced by ``curve``: a ladder of the target alone, so n-gram or plain rounds only."""
    target = ScriptedTarget([*prompt, *answer], curve)
    stats = GenerationStats(mode="auto")
    sampler = Sampler(SamplingConfig(temperature=0, max_tokens=len(answer)))
    ladder = Ladder(target=cast(ModelTier, target))
    rounds = AutoRounds(ladder, spec or SpecConfig(mode="auto"), sampler, stats, {"target": curve})
    committed = [int(t) for t in prompt]
    end = len(prompt) + len(answer)
    while len(committed) < end:
        committed += rounds.run(committed, end - len(committed))[: end - len(committed)]
    plain = len(answer) * (curve(1) + ROUND_OVERHEAD)
    assert stats.auto is not None
    return Replay(committed[len(prompt) :], plain / target.seconds, target.evaluations, stats.auto)
