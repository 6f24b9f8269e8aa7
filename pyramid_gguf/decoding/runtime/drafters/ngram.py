"""The n-gram drafter kind (``--draft ngram``, and ``auto`` on every ladder): prompt lookup.

It proposes what followed the longest earlier match of the text's suffix
(:class:`~..proposers.NGramProposer`, over the index of :mod:`..ngram`) and costs nothing to
draft; what the target keeps of it is estimated by the match's length and whether it quotes
the prompt (:class:`~...pricing.estimates.NGramAcceptance`). ``auto`` takes every match of
:data:`~..ngram.KEY` tokens or more and sizes its block by the estimate; a fixed mode proposes
matches of ``ngram_min`` tokens or more.
"""

from __future__ import annotations

from collections.abc import Sequence

from ....core.ladder import NGRAM
from ...pricing.chains import Keep
from ...pricing.estimates import NGramAcceptance
from ..ngram import KEY
from ..proposers import NGramProposer
from .kind import DrafterKind, DraftSetup, Offer


class NGramLookup:
    """The n-gram drafter of one generation (a :class:`~.kind.Lookup`)."""

    def __init__(self, setup: DraftSetup) -> None:
        min_match = KEY if setup.auto else setup.spec.ngram_min
        self.ngram = NGramProposer(setup.length, min_match=min_match, pool=setup.pool)
        self.estimates = NGramAcceptance()

    @property
    def proposer(self) -> NGramProposer:
        return self.ngram

    def start(self, answer_start: int) -> None:
        self.ngram.answer_start = answer_start

    def offer(self, context: Sequence[int], max_tokens: int) -> Offer | None:
        match = self.ngram.match(context, max_tokens)
        if match is None:
            return None
        return Offer(match.continuation, match.copying, (match.length, match.quoted))

    def keep(self, offer: Offer) -> Keep:
        length, quoted = _key(offer)
        return self.estimates.estimate(length, quoted=quoted)

    def learn(self, offer: Offer, proposed: int, kept: int) -> None:
        length, quoted = _key(offer)
        self.estimates.record(length, proposed, kept, quoted=quoted)


def _key(offer: Offer) -> tuple[int, bool]:
    """The match length and source an offer of :class:`NGramLookup` was found with."""
    key = offer.key
    if not (isinstance(key, tuple) and len(key) == 2):
        raise ValueError(f"not an n-gram offer: {offer}")
    return int(key[0]), bool(key[1])


#: The n-gram drafter's entry in the registry (:mod:`.`).
NGRAM_KIND = DrafterKind(NGRAM, NGramLookup)
