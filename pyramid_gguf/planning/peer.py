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
``--spec-draft-n-max`` (1 to :data:`MAX_DRAFT`, 64) and ``--spec-draft-p-min`` of
:data:`P_MINS` (``--spec-draft-n-min`` 0, the default), priced on the same curves as ``auto``
in that placement (its ``-ngl`` split, pinned or mapped weights, op offload of long batches),
is the placement's ``peer_spec_tps``: a win over it is the scheduling's, not the placement's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..decoding.offline.traces import TierTrace, TraceSet
from ..decoding.pricing.costs import CostCurve

#: ``--spec-draft-p-min`` values tried: 0 (the vendored llama.cpp's default, ``common.h``), 0.75
#: (``common/speculative``'s earlier default, still what many guides set) and a grid between
#: and around them; the best of them is the peer's.
P_MINS = (0.0, 0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9)
#: The largest ``--spec-draft-n-max`` tried (the vendored default is 3): up to llama.cpp's
#: op-offload batches and past them, so a long block is the peer's too when it pays.
MAX_DRAFT = 64


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


@dataclass(frozen=True)
class _Stops:
    """Where a draft started at each answer position of one trace stops, before any cap, for one
    tier and ``--spec-draft-p-min``: ``event[i]``, the first position ``j >= i`` where the draft
    is under ``p_min`` there (``low[j]``) or proposes another token than the answer's (``len``:
    neither before the answer ends); ``off_stops``: off the answer the draft stops at once
    (its mean top probability is under ``p_min``). Arrays ``[n]`` (``event``: ``[n + 1]``)."""

    event: np.ndarray
    low: np.ndarray
    off_stops: bool

    @classmethod
    def of(cls, tt: TierTrace, answer: tuple[int, ...], p_min: float) -> _Stops:
        n = len(answer)
        off_top = sum(tt.top) / max(len(tt.top), 1)
        top = np.full(n, off_top)
        m = min(n, len(tt.top))
        top[:m] = tt.top[:m]
        match = np.zeros(n, dtype=bool)
        k = min(n, len(tt.argmax))
        match[:k] = np.asarray(tt.argmax[:k]) == np.asarray(answer[:k])
        low = top < p_min
        hit = low | ~match
        # event[i] = the first j >= i with hit[j] (n when none): a reversed running minimum
        idx = np.where(hit, np.arange(n), n)
        event = np.append(np.minimum.accumulate(idx[::-1])[::-1], n)
        return cls(event, low, off_top < p_min)

    def round(self, i: int, n_max: int) -> tuple[int, int, int]:
        """``(drafted, draft evaluations, kept)`` of the round that starts with ``i`` answer
        tokens committed (llama.cpp's rules, the module docstring's step 1)."""
        n = len(self.low)
        cap = min(n_max, n - i - 1)
        if cap <= 0:
            return 0, 0, 0
        j = int(self.event[i])
        if j == n:  # sure and right to the end
            return cap, cap, cap
        if self.low[j]:  # unsure at j: drafted i..j-1, the evaluation that found j paid
            d = j - i
            return (cap, cap, cap) if d >= cap else (d, d + 1, d)
        kept = j - i  # wrong at j (drafted), then off the answer
        if kept + 1 >= cap:
            return cap, cap, min(kept, cap)
        if self.off_stops:
            return kept + 1, kept + 2, kept
        return cap, cap, kept


def walk(traces: TraceSet, tier: str, n_max: int, p_min: float = 0.0, n_min: int = 0) -> Walk:
    """llama.cpp's ``draft-simple`` rounds over every trace of ``traces`` with ``tier`` as the
    draft (the module docstring's rules)."""
    stops = [_Stops.of(t.tiers[tier], t.answer, p_min) for t in traces.traces]
    return _walk(traces, stops, n_max, n_min)


def _walk(traces: TraceSet, stops: list[_Stops], n_max: int, n_min: int = 0) -> Walk:
    batches: Counter[int] = Counter()
    steps = tokens = committed = 0
    for trace, st in zip(traces.traces, stops, strict=True):
        n = len(trace.answer)
        tokens += n
        i = 1 if n else 0  # the first answer token comes from the prompt
        committed += n - i
        while i < n:
            drafted, evals, kept = st.round(i, n_max)
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
    placement (a walk does not depend on costs). ``max_draft``: the largest
    ``--spec-draft-n-max`` tried (llama.cpp's knob, not ``auto``'s ``--max-block``);
    ``p_mins``: the ``--spec-draft-p-min`` values tried."""

    def __init__(
        self, traces: TraceSet, max_draft: int = MAX_DRAFT, p_mins: tuple[float, ...] = P_MINS
    ) -> None:
        if max_draft < 1 or not p_mins:
            raise ValueError("the peer needs --spec-draft-n-max >= 1 and a --spec-draft-p-min")
        self.traces = traces
        self.max_draft = max_draft
        self.p_mins = p_mins
        self._stops: dict[tuple[str, float], list[_Stops]] = {}
        self._walks: dict[tuple[str, int, float], Walk] = {}

    def tiers(self) -> set[str]:
        """The lower tiers every trace records."""
        if not self.traces.traces:
            return set()
        return set.intersection(*(set(t.tiers) for t in self.traces.traces))

    def get(self, tier: str, n_max: int, p_min: float) -> Walk:
        key = (tier, n_max, p_min)
        if key not in self._walks:
            if (tier, p_min) not in self._stops:
                self._stops[tier, p_min] = [
                    _Stops.of(t.tiers[tier], t.answer, p_min) for t in self.traces.traces
                ]
            self._walks[key] = _walk(self.traces, self._stops[tier, p_min], n_max)
        return self._walks[key]

    def best(self, costs: Mapping[str, CostCurve]) -> PeerSpec | None:
        """The fastest draft-model speculation on ``costs`` (a placement's curves, the same the
        pyramid is priced on: its split, its weights' placement, its op offload): each loaded
        lower tier the traces record, every ``--spec-draft-n-max`` up to ``max_draft`` and
        every ``p_mins``; None when the placement loads no smaller model."""
        best: PeerSpec | None = None
        for tier in ("draft", "qualifier"):
            if tier not in costs or tier not in self.tiers():
                continue
            for p_min in self.p_mins:
                for n_max in range(1, self.max_draft + 1):
                    w = self.get(tier, n_max, p_min)
                    seconds = w.seconds(costs["target"], costs[tier])
                    if seconds <= 0:
                        continue
                    tps = w.tokens / seconds
                    if best is None or tps > best.tps:
                        best = PeerSpec(tier, n_max, p_min, tps, w.tokens_per_round)
        return best
