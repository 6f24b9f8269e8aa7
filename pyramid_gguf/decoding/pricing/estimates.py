"""Online estimates of how likely a proposed token is to be kept by its verifier.

Each estimate is a Beta-Bernoulli mean (kept / tried, started from a prior worth a few
observations), updated after every verification. Pure Python: no models here.

- :class:`NGramAcceptance`: by the length of the suffix match behind the proposal and whether
  it quotes the prompt or echoes the answer, separately for the first proposed token and for
  each token after a kept one (copying, once it starts, tends to continue).
- :class:`ChainAcceptance`: per model chain (``draft->target``, ``draft->qualifier``, ...),
  one rate, and a calibration of the draft's own top probability as a per-token predictor.
- :class:`KeepMemory`: what a loaded ladder's earlier generations learned of its chains, for
  the next one to start from (worth at most :data:`CARRY_TRIED` tokens).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class Rate:
    """A kept / tried estimate started from ``prior`` worth ``strength`` observations."""

    kept: float
    tried: float

    @classmethod
    def prior(cls, mean: float, strength: float = 4.0) -> Rate:
        return cls(mean * strength, strength)

    @property
    def mean(self) -> float:
        return self.kept / self.tried

    def add(self, kept: float, tried: float) -> None:
        self.kept += kept
        self.tried += tried

    def capped(self, tried: float) -> Rate:
        """The same mean worth at most ``tried`` observations."""
        scale = min(1.0, tried / self.tried) if self.tried > 0 else 1.0
        return Rate(self.kept * scale, self.tried * scale)


#: Lower bounds of the match-length buckets of :class:`NGramAcceptance`.
MATCH_BUCKETS = (2, 3, 4, 6, 9, 16, 32)
#: Prior keep probabilities of the first proposed token per bucket, for matches in the text the
#: answer was given (the prompt, the pool) and for matches in the answer itself. Measured with
#: Qwen2.5-Coder 1.5B, greedy, over the 15 shipped prompts and the README's first one, 256
#: tokens, every match proposed: quoted 0.64, 0.90, 0.78, 0.87, 0.95, 0.94, 0.89; echoed 0.40,
#: 0.51, 0.62, 0.79, 0.89, 0.97, 0.88. Rounded down, echoes further: an answer that repeats its
#: own short phrase rarely goes on copying it.
QUOTED_PRIOR = (0.6, 0.75, 0.75, 0.85, 0.9, 0.9, 0.9)
ECHO_PRIOR = (0.3, 0.4, 0.5, 0.7, 0.85, 0.9, 0.85)
#: Prior keep probability of each token after a kept one (0.75 for 2-token matches, 0.8-0.96
#: for longer ones, measured as above and rounded down).
NEXT_PRIOR = (0.75, 0.8, 0.85, 0.85, 0.9, 0.9, 0.9)


def _rates(priors: tuple[float, ...]) -> list[Rate]:
    return [Rate.prior(p) for p in priors]


@dataclass
class NGramAcceptance:
    """Keep probabilities of n-gram proposals by match length and source, and how well they
    predict.

    ``first[quoted]`` / ``after[quoted]``: per bucket, the first token's keep rate and that of
    each token after a kept one, apart for quoted matches (prompt, pool) and echoes (the answer
    itself). Each bucket learns only from its own rounds, real and shadow. (Until issue 22 a
    generation-wide ratio of kept to promised tokens also scaled every bucket: one refused long
    block, which promises about seven tokens, cut every estimate to a third, and a RAG answer
    then copied 20 tokens of a passage without a single proposal. Replayed over the six
    shipped sets without it, with :data:`~.ngram.COPY_EVIDENCE`: ``rag/bridge`` 1.06x ->
    1.12x, ``summarize`` 1.49x -> 1.53x, no set slower by more than 0.02x.)
    """

    first: dict[bool, list[Rate]] = field(
        default_factory=lambda: {True: _rates(QUOTED_PRIOR), False: _rates(ECHO_PRIOR)}
    )
    after: dict[bool, list[Rate]] = field(
        default_factory=lambda: {True: _rates(NEXT_PRIOR), False: _rates(NEXT_PRIOR)}
    )

    @staticmethod
    def bucket(match_len: int) -> int:
        return max(0, bisect.bisect_right(MATCH_BUCKETS, match_len) - 1)

    def estimate(self, match_len: int, *, quoted: bool = False) -> tuple[float, float]:
        """``(first, next)``: keep probability of the first token and of each one after."""
        b = self.bucket(match_len)
        return min(0.99, self.first[quoted][b].mean), self.after[quoted][b].mean

    def record(self, match_len: int, proposed: int, kept: int, *, quoted: bool = False) -> None:
        """One verification of ``proposed`` tokens from a match of ``match_len``: ``kept``."""
        if proposed <= 0:
            return
        b = self.bucket(match_len)
        self.first[quoted][b].add(int(kept > 0), 1)
        if kept > 0:
            tried_after = min(kept + 1, proposed) - 1  # tokens 2.. that were tested
            self.after[quoted][b].add(kept - 1, tried_after)


#: Prior keep rate of a model chain stage (same-family models agree on most tokens).
CHAIN_PRIOR = 0.6
#: A model chain's stages are priced at an upper confidence bound of their keep rates,
#: ``mean + EXPLORE * sqrt(ln(1 + rounds) / tried)`` (UCB1), so that a chain never run gets
#: tried once its bonus outgrows the evidence behind the chain that runs, and the bonus fades
#: as its own evidence comes in. Without it a pyramid whose qualifier agrees with the target
#: 0.97 of the time was never tried beside a draft keeping 0.5 (replayed on GPU-shaped curves:
#: 1.45x where the pyramid alone gives 2.8x).
EXPLORE = 0.3
#: The bound never promises more than this, so chains that pay only above it (model drafts on
#: a 2-core CPU: 93% and more) are never run on optimism alone.
OPTIMISM_CAP = 0.9


@dataclass
class ChainAcceptance:
    """Per-stage keep rates of model chains, and the draft's confidence calibration.

    ``calibration`` relates the draft's top probability to what the verifier keeps: the
    expected keep probability of a drafted token is ``min(1, top_p * calibration)``.
    """

    rates: dict[str, Rate] = field(default_factory=dict)
    confidence: Rate = field(default_factory=lambda: Rate(4.0, 4.0))
    kept_seen: Rate = field(default_factory=lambda: Rate(4.0, 4.0))

    def rate(self, stage: str) -> float:
        return self.rates.setdefault(stage, Rate.prior(CHAIN_PRIOR)).mean

    def optimistic(self, stage: str, rounds: int) -> float:
        """The keep rate of ``stage`` at its upper confidence bound after ``rounds`` rounds of
        the generation (:data:`EXPLORE`, capped at :data:`OPTIMISM_CAP`), to 0.01."""
        r = self.rates.setdefault(stage, Rate.prior(CHAIN_PRIOR))
        bonus = EXPLORE * math.sqrt(math.log1p(rounds) / r.tried)
        return round(max(r.mean, min(OPTIMISM_CAP, r.mean + bonus)), 2)

    def record(self, stage: str, proposed: int, kept: int) -> None:
        """One verification: ``kept`` of ``proposed`` tokens (the first refusal ends the
        block, so ``kept + 1`` tokens were tested when ``kept < proposed``)."""
        if proposed <= 0:
            return
        self.rates.setdefault(stage, Rate.prior(CHAIN_PRIOR)).add(kept, min(kept + 1, proposed))

    def record_confidence(self, top_probs: list[float], kept: int) -> None:
        """The draft's top probabilities of a verified block and how many were kept."""
        tested = top_probs[: min(kept + 1, len(top_probs))]
        self.confidence.add(sum(tested), len(tested))
        self.kept_seen.add(kept, len(tested))

    @property
    def calibration(self) -> float:
        """Observed keep rate over mean predicted top probability (1: well calibrated)."""
        return self.kept_seen.mean / max(self.confidence.mean, 1e-6)

    def token(self, top_p: float) -> float:
        """Expected keep probability of one drafted token whose top probability is ``top_p``."""
        return min(1.0, top_p * self.calibration)

    def carried(self, tried: float) -> ChainAcceptance:
        """A copy to start another generation from: every estimate's mean, each worth at most
        ``tried`` observations (so the new generation's own text soon outweighs it)."""
        rates = list(self.rates.items())  # one copy: another slot's generation may add a stage
        return ChainAcceptance(
            {stage: r.capped(tried) for stage, r in rates},
            self.confidence.capped(tried),
            self.kept_seen.capped(tried),
        )


#: Observations of each keep rate a new generation inherits from the ladder's earlier ones.
CARRY_TRIED = 24.0


class KeepMemory:
    """A loaded ladder's memory of how its model chains fare, across generations.

    Each generation of ``auto`` starts its :class:`ChainAcceptance` from the last one started
    with the same ``key`` (:meth:`start`; ``auto`` keys by its knobs and whether it samples:
    a greedy answer keeps what a sampled one would not, and two ``bench`` rows of other knobs
    do not teach each other), each estimate worth at most :data:`CARRY_TRIED` tokens, instead
    of from the priors: a draft or an MTP head that never agrees is priced as such from the
    first round of the next request, rather than explored again in each (on a hybrid with a head
    that never agreed, each new answer's tries cost its first catch-up over the whole prompt),
    and one that agrees is trusted sooner. Shared by the slots of one ladder (a lock guards the
    hand-over; the estimates themselves are one generation's, written by its slot alone)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[Hashable, ChainAcceptance] = {}

    def start(self, key: Hashable = None) -> ChainAcceptance:
        """The estimates a new generation of ``key`` starts from (and that the next one of
        ``key`` will start from, as this one teaches them)."""
        with self._lock:
            last = self._last.get(key)
            fresh = ChainAcceptance() if last is None else last.carried(CARRY_TRIED)
            self._last[key] = fresh
        return fresh
