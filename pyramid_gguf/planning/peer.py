"""llama.cpp's own draft-model speculation, priced for a placement: the peer a user would run.

``llama-server -m TARGET -md DRAFT`` speculates with ``draft-simple`` (``common/speculative.cpp``
and ``tools/server/server-context.cpp`` of the llama.cpp bundled with llama-cpp-python 0.3.36).
One round, greedy, as the vendored code runs it:

1. **Draft.** The draft model evaluates the last sampled token, takes its most likely next token
   (a top-10 sampler), and goes on one token an evaluation; it stops when that token's
   probability falls under ``--spec-draft-p-min`` (the evaluation that found it is paid), at
   ``--spec-draft-n-max`` tokens (the last one is not evaluated), or at what the answer has left
   less one (``get_n_draft_max``). A draft shorter than ``--spec-draft-n-min`` is dropped.
2. **Verify.** The target evaluates the last token and the draft in one batch and keeps the
   longest prefix equal to its own argmaxes plus its next token
   (``common_sampler_sample_and_accept_n``: greedy token matching, the engine's
   ``--exact-rule greedy-match``).
3. **Re-evaluate.** The draft model's cache is cut back to before the draft and it evaluates the
   target's batch again (``common_speculative_process``; the server's
   ``TAG_SPEC_AVOID_DRAFT_REEVAL``): every round, one more evaluation of the draft, even a round
   that drafted nothing.

No qualifier, no n-gram drafter, one draft model. Under greedy verification a trace decides
which drafted tokens are kept (the draft's argmax along the target's answer; its top
probability over the whole vocabulary stands in for llama.cpp's over the 10 most likely tokens,
which is at least that, so a ``--spec-draft-p-min`` stops no later than llama.cpp's; off the
answer, once a drafted token missed, the tier's mean top probability, as the replay's scripted
tiers do), so a round's batch sizes follow from the trace alone
(:func:`walk`) and its time from the placement's cost curves (:meth:`Walk.seconds`). No time is
charged outside the models' evaluations (llama.cpp's sampling and scheduling are C++): an upper
bound on the peer. The best of the loaded smaller models as the draft, at its best
``--spec-draft-n-max`` (1 to ``max_draft``) and ``--spec-draft-p-min`` of :data:`P_MINS`
(``--spec-draft-n-min`` 0, the default), is the placement's ``peer_spec_tps``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..decoding.offline.traces import TierTrace, TraceSet
from ..decoding.pricing.costs import CostCurve

#: ``--spec-draft-p-min`` values tried: 0 (the vendored llama.cpp's default) and 0.75 (an
#: earlier llama-server default). The vendored default ``--spec-draft-n-max`` is 3.
P_MINS = (0.0, 0.75)
#: The largest ``--spec-draft-n-max`` tried.
MAX_DRAFT = 16


@dataclass(frozen=True)
class Walk:
    """What llama.cpp's rounds evaluate over a trace set with one draft tier and knobs: per
    batch size, how many target evaluations and draft re-evaluations; single-token draft
    steps; the answer tokens produced (``tokens``) and those the rounds committed
    (``committed``: all but each answer's first, which the prompt's evaluation gives)."""

    tokens: int
    committed: int
    target_batches: Mapping[int, int] = field(default_factory=dict)
    draft_steps: int = 0

    @property
    def rounds(self) -> int:
        """Target evaluations after the prompt (one a round)."""
        return sum(self.target_batches.values())

    @property
    def tokens_per_round(self) -> float:
        """Answer tokens committed per target evaluation."""
        return self.committed / max(self.rounds, 1)

    def seconds(self, target: CostCurve, draft: CostCurve) -> float:
        """The rounds' time on these cost curves: the target's batches, the draft's steps and
        its re-evaluation of every target batch."""
        batches = sum(n * (target(size) + draft(size)) for size, n in self.target_batches.items())
        return batches + self.draft_steps * draft(1)


def _round(
    tt: TierTrace, answer: tuple[int, ...], i: int, n_max: int, p_min: float, off_top: float
) -> tuple[int, int, int]:
    """``(drafted, draft evaluations, kept)`` of the round that starts with ``i`` answer tokens
    committed."""
    cap = min(n_max, len(answer) - i - 1)
    if cap <= 0:
        return 0, 0, 0
    drafted = kept = 0
    evals = 1  # the last sampled token
    on_path = True
    while True:
        pos = i + drafted
        top = tt.top[pos] if on_path and pos < len(tt.top) else off_top
        if top < p_min:
            break
        if on_path:
            on_path = pos < len(tt.argmax) and tt.argmax[pos] == answer[pos]
            kept += on_path
        drafted += 1
        if drafted == cap:
            break
        evals += 1
    return drafted, evals, kept


def walk(traces: TraceSet, tier: str, n_max: int, p_min: float = 0.0, n_min: int = 0) -> Walk:
    """llama.cpp's ``draft-simple`` rounds over every trace of ``traces`` with ``tier`` as the
    draft (the module docstring's rules)."""
    batches: Counter[int] = Counter()
    steps = tokens = committed = 0
    for trace in traces.traces:
        tt = trace.tiers[tier]
        off_top = sum(tt.top) / max(len(tt.top), 1)
        tokens += len(trace.answer)
        i = 1 if trace.answer else 0  # the first answer token comes from the prompt
        committed += len(trace.answer) - i
        while i < len(trace.answer):
            drafted, evals, kept = _round(tt, trace.answer, i, n_max, p_min, off_top)
            if drafted < n_min:
                drafted = kept = 0
            steps += evals
            batches[drafted + 1] += 1
            i += kept + 1
    return Walk(tokens, committed, dict(batches), steps)


@dataclass(frozen=True)
class PeerSpec:
    """llama.cpp's draft-model speculation in one placement: which loaded tier drafts, its
    ``--spec-draft-n-max`` and ``--spec-draft-p-min``, the predicted tokens per second and the
    answer tokens per target evaluation."""

    draft: str
    draft_max: int
    p_min: float
    tps: float
    tokens_per_round: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "draft": self.draft,
            "draft_max": self.draft_max,
            "p_min": self.p_min,
            "tps": round(self.tps, 2),
            "tokens_per_round": round(self.tokens_per_round, 3),
        }


class PeerWalks:
    """The walks of one trace set, computed once per draft tier and knobs and priced for any
    placement (a walk does not depend on costs)."""

    def __init__(self, traces: TraceSet, max_draft: int = MAX_DRAFT) -> None:
        self.traces = traces
        self.max_draft = max_draft
        self._walks: dict[tuple[str, int, float], Walk] = {}

    def tiers(self) -> set[str]:
        """The lower tiers every trace records."""
        if not self.traces.traces:
            return set()
        return set.intersection(*(set(t.tiers) for t in self.traces.traces))

    def get(self, tier: str, n_max: int, p_min: float) -> Walk:
        key = (tier, n_max, p_min)
        if key not in self._walks:
            self._walks[key] = walk(self.traces, tier, n_max, p_min)
        return self._walks[key]

    def best(self, costs: Mapping[str, CostCurve]) -> PeerSpec | None:
        """The fastest draft-model speculation on ``costs`` (a placement's curves): each loaded
        lower tier the traces record, every ``--spec-draft-n-max`` and :data:`P_MINS`; None
        when the placement loads no smaller model."""
        best: PeerSpec | None = None
        for tier in ("draft", "qualifier"):
            if tier not in costs or tier not in self.tiers():
                continue
            for p_min in P_MINS:
                for n_max in range(1, self.max_draft + 1):
                    w = self.get(tier, n_max, p_min)
                    seconds = w.seconds(costs["target"], costs[tier])
                    if seconds <= 0:
                        continue
                    tps = w.tokens / seconds
                    if best is None or tps > best.tps:
                        best = PeerSpec(tier, n_max, p_min, tps, w.tokens_per_round)
        return best
