"""What a drafter kind declares: :class:`DrafterKind`, and the :class:`Lookup` protocol of a
drafter with no model.

A drafter kind is a :class:`~pyramid_gguf.core.ladder.Drafter` (its name on the command line,
what it loads) and how it proposes and is priced:

- a kind that loads a model (the target's MTP head; a GGUF file is the default kind, with no
  entry) is a model tier once loaded: a :class:`~..proposers.DraftProposer` drafts token by
  token, priced by the tier's calibrated cost curve (:func:`~...pricing.chains.price_draft`)
  and the keep rates ``auto`` learns per chain;
- a kind that loads nothing gives each generation a :class:`Lookup`: it offers a block read
  off the text before the round is priced (:class:`Offer`), drafting it costs nothing
  (:func:`~...pricing.chains.price_lookup`), and its own estimator says how much of an offer
  the target keeps and learns from every outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ....core.ladder import Drafter
from ....core.spec import SpecConfig
from ...pricing.chains import Keep
from ..ngram import NGramPool
from ..proposers import Proposer


@dataclass(frozen=True)
class Offer:
    """A block a :class:`Lookup` would propose: its ``continuation`` (tokens), ``copying``
    (the answer visibly copies its source: ``auto`` bets on it with no budget, as llama.cpp's
    ``ngram-simple`` drafts) and ``key``, what its estimator prices it by."""

    continuation: list[int]
    copying: bool = False
    key: Hashable = None


@dataclass(frozen=True)
class DraftSetup:
    """What a generation gives a drafter with no model: ``length``, the longest block it
    proposes; ``spec``, its knobs; ``pool``, earlier answers it may search (a server's shared
    pool); ``auto``: built for ``auto``, which prices each offer (else a fixed mode, which
    proposes whatever it finds that its knobs allow)."""

    length: int
    spec: SpecConfig
    pool: NGramPool | None = None
    auto: bool = False


class Lookup(Protocol):
    """A drafter with no model, for one generation: :meth:`offer` reads a block off the text,
    :attr:`proposer` proposes the last offer (or looks again at another context), :meth:`keep`
    and :meth:`learn` are its acceptance estimator."""

    @property
    def proposer(self) -> Proposer: ...

    def start(self, answer_start: int) -> None:
        """The answer starts at ``answer_start`` in the contexts it is given."""
        ...

    def offer(self, context: Sequence[int], max_tokens: int) -> Offer | None:
        """Up to ``max_tokens`` tokens to propose after ``context``, or None."""
        ...

    def keep(self, offer: Offer) -> Keep:
        """The keep probabilities of ``offer``'s first token and of each one after a kept one."""
        ...

    def learn(self, offer: Offer, proposed: int, kept: int) -> None:
        """The target kept ``kept`` of the first ``proposed`` tokens of ``offer``."""
        ...


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter: ``drafter``, its declaration (name, what it loads, whether
    ``auto`` offers it on every ladder), and ``lookup``, for a kind that loads nothing, its
    drafter of one generation (None for a kind that loads a model: a model tier drafts)."""

    drafter: Drafter
    lookup: Callable[[DraftSetup], Lookup] | None = None

    def __post_init__(self) -> None:
        if self.drafter.model == (self.lookup is not None):
            raise ValueError(f"drafter {self.drafter}: a lookup exactly when it loads nothing")

    @property
    def name(self) -> str:
        return self.drafter.name
