"""How tokens are sampled and when generation stops: :class:`SamplingConfig`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .errors import UserError
from .grammar import Grammar, Trigger

#: Temperatures below this count as 0 (greedy): dividing logits by them overflows to NaN, and
#: short of that they sample the argmax anyway unless two logits lie within about 1e-5.
MIN_TEMPERATURE = 1e-6

#: Most alternatives per token a log-probability request may ask for (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling warp and stop conditions, shared by every tier so ``p`` and ``q`` compare.

    The warp is temperature, then top-k, then top-p, then min-p (llama.cpp's order and
    defaults). ``temperature == 0`` is greedy: one-hot on the argmax, lowest id on ties.
    ``top_k <= 0`` disables top-k; ``top_p >= 1`` and ``min_p <= 0`` disable theirs.
    Temperatures below :data:`MIN_TEMPERATURE` are stored as 0. ``seed``: None or -1 (llama.cpp's
    convention) draws a random seed; -1 is stored as None. ``grammar`` / ``triggers`` constrain
    the answer (structured output, tool calls; docs/ALGORITHMS.md, "Grammars").
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    #: The whole answer must match this grammar (a JSON schema, any JSON object, GBNF, ...):
    #: every tier samples from its distribution restricted to the allowed tokens.
    grammar: Grammar | None = None
    #: Lazy grammars: the answer is free until one's text appears (a tool call opening).
    triggers: tuple[Trigger, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise UserError(f"--temperature must be >= 0, got {self.temperature}")
        if not math.isfinite(self.temperature):
            raise UserError(f"--temperature must be a finite number, got {self.temperature}")
        if self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        if self.seed == -1:
            object.__setattr__(self, "seed", None)
        elif self.seed is not None and self.seed < 0:
            raise UserError(f"--seed must be >= 0, or -1 for a random seed, got {self.seed}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise UserError(f"--min-p must be in [0, 1], got {self.min_p}")
        if self.max_tokens < 1:
            raise UserError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise UserError("stop strings must not be empty")
        if self.grammar is not None and self.triggers:
            raise UserError("an answer has one grammar: a whole-answer one or lazy triggers")
        if self.ignore_eos and (self.grammar is not None or self.triggers):
            raise UserError("ignore_eos cannot go with a grammar: the grammar ends the answer")

    def with_(self, **changes: object) -> SamplingConfig:
        """A copy with some fields replaced (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]
