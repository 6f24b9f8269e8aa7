"""The drafter kinds, declared once: every kind of drafter a ladder's bottom may hold, by name.

:data:`KINDS` is the registry: each :class:`~.kind.DrafterKind` says how it is named on the
command line and what it loads (its :class:`~pyramid_gguf.core.ladder.Drafter`), how it
proposes and how it is priced (a model tier, or a :class:`~.kind.Lookup` with its own
estimator). A GGUF file given as ``--draft`` is the default kind, a model tier, with no entry.
The chains of a ladder (:func:`~...pricing.chains.ladder_chains`), ``auto``
(:mod:`..auto`) and the fixed modes (:mod:`..rounds`) are built from it.

Adding a kind: a module here with its :class:`~.kind.DrafterKind` (and, when it loads nothing,
its :class:`~.kind.Lookup`), and one line in :data:`BUILT_IN` (or :func:`register` elsewhere).
"""

from __future__ import annotations

from ....core.ladder import declare, withdraw
from .kind import DrafterKind, DraftSetup, Lookup, Offer
from .mtp import MTP_KIND
from .ngram import NGRAM_KIND

#: The kinds that ship, in the order ``auto`` lists them.
BUILT_IN = (NGRAM_KIND, MTP_KIND)

#: The registry: every drafter kind by name.
KINDS: dict[str, DrafterKind] = {}


def register(kind: DrafterKind) -> DrafterKind:
    """Add ``kind`` to :data:`KINDS` and its name to the drafters a ladder may name
    (:data:`~pyramid_gguf.core.ladder.DRAFTERS`: ``--draft NAME``)."""
    declare(kind.drafter)
    KINDS[kind.name] = kind
    return kind


def forget(name: str) -> None:
    """Remove the kind ``name`` (a test's toy kind)."""
    KINDS.pop(name, None)
    withdraw(name)


def lookup(name: str, setup: DraftSetup) -> Lookup:
    """The drafter of one generation of kind ``name``, which loads nothing."""
    kind = KINDS.get(name)
    if kind is None or kind.lookup is None:
        raise ValueError(f"{name!r} is no drafter kind that loads nothing ({', '.join(KINDS)})")
    return kind.lookup(setup)


for _kind in BUILT_IN:
    register(_kind)

__all__ = [
    "BUILT_IN",
    "KINDS",
    "DraftSetup",
    "DrafterKind",
    "Lookup",
    "Offer",
    "forget",
    "register",
]
