"""What a ladder is made of, before anything is loaded: its tier names and its files.

:data:`TIERS` is the one list of tier names. A :class:`LadderPaths` says which GGUF file
(or the n-gram drafter, :data:`NGRAM`) fills each tier; presets resolve to one, the CLI builds
one from ``--draft/--qualifier/--target``, and the memory planner, ``tune`` and the loader
take one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .errors import UserError
from .modes import MODES, Mode, mode_info

#: Tier names, smallest first (also the planner's placement order).
TIERS: Final = ("draft", "qualifier", "target")


class NGram:
    """The n-gram (prompt lookup) drafter in the draft tier's place: no model file."""

    _instance: NGram | None = None

    def __new__(cls) -> NGram:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NGRAM"

    def __str__(self) -> str:
        return "ngram"


#: The one :class:`NGram` value; ``--draft ngram`` on the command line.
NGRAM: Final = NGram()


class Mtp:
    """The target's own MTP (NextN) head in the draft tier's place: no file of its own, a
    model tier named ``draft`` once loaded (native/mtp.py)."""

    _instance: Mtp | None = None

    def __new__(cls) -> Mtp:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MTP"

    def __str__(self) -> str:
        return "mtp"


#: The one :class:`Mtp` value; ``--draft mtp`` on the command line.
MTP: Final = Mtp()


def draft_source(value: str | Path | NGram | Mtp | None) -> Path | NGram | Mtp | None:
    """A draft given by a user: ``"ngram"`` is the n-gram drafter, ``"mtp"`` the target's MTP
    head, anything else a path."""
    if value is None or isinstance(value, NGram | Mtp):
        return value
    if str(value) == "ngram":
        return NGRAM
    return MTP if str(value) == "mtp" else Path(value)


@dataclass(frozen=True)
class LadderShape:
    """Which tiers a ladder holds, before or after loading: its model tiers by name (smallest
    first, the target last) and whether the n-gram drafter fills the draft tier."""

    models: tuple[str, ...] = ("target",)
    ngram: bool = False

    @property
    def has_draft(self) -> bool:
        return self.ngram or "draft" in self.models

    @property
    def has_qualifier(self) -> bool:
        return "qualifier" in self.models

    @property
    def n_tiers(self) -> int:
        """Tiers present: 1 (target), 2 (+ draft) or 3 (+ draft and qualifier)."""
        return 1 + self.has_draft + (self.has_draft and self.has_qualifier)

    def check(self, mode: str) -> None:
        """A one-line :class:`~pyramid_gguf.core.errors.UserError` when ``mode`` is unknown or
        needs a tier this ladder lacks: the one answer to "can this ladder run this mode"."""
        info = mode_info(mode)
        if info.n_tiers >= 2 and not self.has_draft:
            raise UserError(f"mode {mode} needs a draft model (--draft GGUF or --draft ngram)")
        if info.n_tiers == 3 and not self.has_qualifier:
            raise UserError(f"mode {mode} needs a qualifier model (--qualifier GGUF)")

    def runs(self, mode: str) -> bool:
        """Whether this ladder can run ``mode`` (:meth:`check` without the error)."""
        return mode_info(mode).n_tiers <= self.n_tiers

    @property
    def modes(self) -> list[Mode]:
        """The modes this ladder can run, in the mode table's order."""
        return [m.name for m in MODES.values() if self.runs(m.name)]


@dataclass(frozen=True)
class LadderPaths:
    """The files of a ladder: a target, optionally a qualifier and a draft (or :data:`NGRAM`,
    or :data:`MTP`)."""

    target: Path
    qualifier: Path | None = None
    draft: Path | NGram | Mtp | None = None

    @classmethod
    def of(
        cls,
        target: str | Path,
        qualifier: str | Path | None = None,
        draft: str | Path | NGram | Mtp | None = None,
    ) -> LadderPaths:
        """From user values (strings are paths; ``draft="ngram"`` is the n-gram drafter)."""
        return cls(
            Path(target), None if qualifier is None else Path(qualifier), draft_source(draft)
        )

    @property
    def n_tiers(self) -> int:
        """Tiers present: 1 (target), 2 (+ draft) or 3 (+ draft and qualifier)."""
        return self.shape.n_tiers

    @property
    def ngram(self) -> bool:
        return isinstance(self.draft, NGram)

    @property
    def mtp(self) -> bool:
        """The draft tier is the target's MTP head."""
        return isinstance(self.draft, Mtp)

    @property
    def shape(self) -> LadderShape:
        models = tuple(t for t in TIERS if t in self.model_files() or (t == "draft" and self.mtp))
        return LadderShape(models, self.ngram)

    def get(self, tier: str) -> Path | NGram | Mtp | None:
        """The file (or drafter) of ``tier``."""
        value: Path | NGram | Mtp | None = getattr(self, tier)
        return value

    def model_files(self) -> dict[str, Path]:
        """``{tier: path}`` of the tiers that are model files, smallest first."""
        return {t: p for t in TIERS if isinstance(p := self.get(t), Path)}
