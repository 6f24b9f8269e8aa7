"""Per-generation statistics: stage acceptance, per-tier cost, scheduler overhead, throughput.

Names follow llama-server where it has one (``draft_n``, ``draft_n_accepted``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageStats:
    """One proposer -> verifier stage (``name`` like ``draft->qualifier``)."""

    name: str
    draft_n: int = 0
    draft_n_accepted: int = 0
    verifications: int = 0
    #: ``histogram[n]``: verifications that accepted exactly ``n`` proposals.
    histogram: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int) -> None:
        self.draft_n += proposed
        self.draft_n_accepted += accepted
        self.verifications += 1
        if len(self.histogram) <= accepted:
            self.histogram.extend([0] * (accepted + 1 - len(self.histogram)))
        self.histogram[accepted] += 1

    def merge(self, other: StageStats) -> None:
        """Add another generation's counts of the same stage."""
        self.draft_n += other.draft_n
        self.draft_n_accepted += other.draft_n_accepted
        self.verifications += other.verifications
        if len(self.histogram) < len(other.histogram):
            self.histogram.extend([0] * (len(other.histogram) - len(self.histogram)))
        for n, count in enumerate(other.histogram):
            self.histogram[n] += count

    @property
    def acceptance_rate(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted proposals per verification (the verifier's own token not counted)."""
        return self.draft_n_accepted / self.verifications if self.verifications else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "verifications": self.verifications,
            "mean_accepted": round(self.mean_accepted, 3),
            "histogram": list(self.histogram),
        }


@dataclass
class TierStats:
    """Work one model did during a generation (time inside llama.cpp)."""

    name: str
    n_evals: int = 0
    n_tokens: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "n_evals": self.n_evals,
            "n_tokens": self.n_tokens,
            "seconds": round(self.seconds, 4),
        }


@dataclass
class ChoiceStats:
    """How often ``auto`` ran one chain in a generation, and what it got."""

    chain: str
    rounds: int = 0
    #: Tokens proposed to the target over those rounds, and tokens they committed.
    proposed: int = 0
    committed: int = 0
    #: The chain's fuzzy stages (``draft->target js <= 0.05``) when it is lossy, else empty.
    lossy: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "rounds": self.rounds,
            "proposed": self.proposed,
            "committed": self.committed,
            "lossy": self.lossy,
        }


@dataclass
class AutoStats:
    """What ``auto`` chose in a generation and why.

    ``choices``: rounds per chain. ``outlook``: each chain's best predicted speedup over
    plain decoding at its last evaluation (cost curves x learned acceptance), the reason
    behind the choices. ``savings``: seconds the speculative rounds saved over plain decoding,
    by the cost model (negative: lost). ``shadows``: n-gram blocks settled against plainly
    decoded tokens instead of proposed, crediting the budget ``shadow_credit`` seconds.
    ``unfunded``: rounds decoded plainly because the budget allowed no block worth running.
    """

    choices: dict[str, ChoiceStats] = field(default_factory=dict)
    outlook: dict[str, float] = field(default_factory=dict)
    savings: float = 0.0
    shadows: int = 0
    shadow_credit: float = 0.0
    unfunded: int = 0

    def record(self, chain: str, proposed: int, committed: int, lossy: str = "") -> None:
        """One round of ``chain``; ``lossy`` names its fuzzy stages when it has any."""
        c = self.choices.setdefault(chain, ChoiceStats(chain, lossy=lossy))
        c.rounds += 1
        c.proposed += proposed
        c.committed += committed

    def summary(self) -> str:
        """``auto ngram 12 rounds (k 3.1) target 40 rounds``, most used first."""
        parts = []
        for c in sorted(self.choices.values(), key=lambda c: -c.rounds):
            k = f" (k {c.proposed / c.rounds:.1f})" if c.proposed else ""
            parts.append(f"{c.chain} {c.rounds}{k}")
        return "auto: " + ", ".join(parts) + " rounds"

    def details(self) -> list[str]:
        """``-v`` lines: each chain's rounds and yield, and the predicted speedups behind them."""
        lines = []
        for c in sorted(self.choices.values(), key=lambda c: -c.rounds):
            per_round = c.committed / c.rounds if c.rounds else 0.0
            lines.append(
                f"auto: {c.chain}: {c.rounds} rounds, {c.proposed} proposed, "
                f"{c.committed} committed ({per_round:.2f} per round)"
                + (f", LOSSY ({c.lossy})" if c.lossy else "")
            )
        lossy = sum(c.rounds for c in self.choices.values() if c.lossy)
        if lossy:
            lines.append(
                f"auto: {lossy} rounds ran a lossy chain (--allow-lossy): this answer may differ "
                "from the target's"
            )
        outlook = ", ".join(
            f"{k} {v:.2f}x" for k, v in sorted(self.outlook.items(), key=lambda kv: -kv[1])
        )
        lines.append(f"auto: predicted speedup over target: {outlook or 'no chain to try'}")
        lines.append(
            f"auto: budget: speculation saved {self.savings:.3f} s by the cost model, "
            f"{self.shadows} shadow blocks credited {self.shadow_credit:.3f} s; "
            f"{self.unfunded} rounds plain for lack of budget"
        )
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "choices": [c.to_dict() for c in self.choices.values()],
            "outlook": {k: round(v, 3) for k, v in self.outlook.items()},
            "savings_s": round(self.savings, 4),
            "shadows": self.shadows,
            "shadow_credit_s": round(self.shadow_credit, 4),
            "unfunded": self.unfunded,
        }


@dataclass
class GenerationStats:
    """Everything measured about one generation."""

    mode: str
    #: ``stop`` (end of generation or a stop string), ``length`` (max tokens or context full),
    #: ``cancelled``; None while running.
    finish_reason: str | None = None
    prompt_tokens: int = 0
    #: Prompt tokens the target actually evaluated (the rest was already in its cache).
    prompt_evaluated: int = 0
    generated_tokens: int = 0
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    stages: list[StageStats] = field(default_factory=list)
    tiers: list[TierStats] = field(default_factory=list)
    #: ``auto`` only: the chains it chose.
    auto: AutoStats | None = None
    #: Tokens a grammar forced and that were verified as free drafts, and how many the target
    #: kept (all of them, unless a forced tokenization is not the model's own).
    forced_n: int = 0
    forced_n_accepted: int = 0
    #: Seconds spent in the grammar engine (masks, checks, forced tokens).
    grammar_seconds: float = 0.0

    @property
    def prompt_tps(self) -> float:
        """Prompt processing speed over the tokens actually evaluated (cache hits excluded)."""
        return self.prompt_evaluated / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        return (
            self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0
        )

    @property
    def native_seconds(self) -> float:
        return sum(t.seconds for t in self.tiers)

    @property
    def scheduler_seconds(self) -> float:
        """Wall time outside llama.cpp (prompt processing included on both sides)."""
        return max(self.prompt_seconds + self.generation_seconds - self.native_seconds, 0.0)

    def stage(self, name: str) -> StageStats:
        for s in self.stages:
            if s.name == name:
                return s
        s = StageStats(name)
        self.stages.append(s)
        return s

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "prompt_evaluated": self.prompt_evaluated,
            "generated_tokens": self.generated_tokens,
            "prompt_seconds": round(self.prompt_seconds, 4),
            "generation_seconds": round(self.generation_seconds, 4),
            "prompt_tps": round(self.prompt_tps, 2),
            "generation_tps": round(self.generation_tps, 2),
            "scheduler_seconds": round(self.scheduler_seconds, 4),
            "stages": [s.to_dict() for s in self.stages],
            "tiers": [t.to_dict() for t in self.tiers],
            "forced_n": self.forced_n,
            "forced_n_accepted": self.forced_n_accepted,
            "grammar_seconds": round(self.grammar_seconds, 4),
            **({"auto": self.auto.to_dict()} if self.auto is not None else {}),
        }

    def summary(self) -> str:
        """One line for stderr, llama.cpp style."""
        cached = self.prompt_tokens - self.prompt_evaluated
        reused = f" ({cached} cached)" if 0 < cached < self.prompt_tokens else ""
        parts = [
            f"prompt {self.prompt_tokens} tok{reused} {self.prompt_tps:.1f} tok/s",
            f"gen {self.generated_tokens} tok {self.generation_tps:.1f} tok/s",
            f"mode {self.mode}",
        ]
        parts += [
            f"{s.name} {s.draft_n_accepted}/{s.draft_n} ({100 * s.acceptance_rate:.0f}%)"
            for s in self.stages
        ]
        if self.forced_n:
            parts.append(f"forced {self.forced_n_accepted}/{self.forced_n}")
        if self.auto is not None and self.auto.choices:
            parts.append(self.auto.summary())
        return " | ".join(parts)
