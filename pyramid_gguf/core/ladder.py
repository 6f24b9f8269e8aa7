"""What a ladder is made of, before anything is loaded: its tier names and its files.

:data:`TIERS` is the one list of tier names. A :class:`LadderPaths` says what fills each tier:
a GGUF file, or in the draft tier's place a named :class:`Drafter` that is no file of its own
(``--draft ngram``: :data:`NGRAM`; ``--draft mtp``: :data:`MTP`). :data:`DRAFTERS` is the table
of those names; the drafter kinds that run them (how each proposes and what it costs) are the
registry of :mod:`pyramid_gguf.decoding.runtime.drafters`, which declares its kinds here.
Presets resolve to a :class:`LadderPaths`, the CLI builds one from
``--draft/--qualifier/--target``, and the memory planner, ``tune`` and the loader take one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from .errors import UserError
from .modes import MODES, Mode, mode_info

#: Tier names, smallest first (also the planner's placement order).
TIERS: Final = ("draft", "qualifier", "target")

#: What a named drafter needs loaded: nothing (it drafts from the text: a tier of its own name
#: in the chains), or the target's own head (a model tier named ``draft`` once loaded).
Loads = Literal["nothing", "target-head"]


@dataclass(frozen=True)
class Drafter:
    """A drafter in the draft tier's place that is no model file of its own, as a user names
    it (``--draft NAME``). ``summary``: what it is, for ``--help``. ``loads``: what it needs
    loaded (:data:`Loads`). ``everywhere``: ``auto`` offers it on every ladder, whatever fills
    the draft tier (it needs nothing loaded)."""

    name: str
    summary: str
    loads: Loads = "nothing"
    everywhere: bool = False

    def __post_init__(self) -> None:
        if self.everywhere and self.loads != "nothing":
            raise ValueError(
                f"drafter {self.name}: only a drafter that loads nothing is everywhere"
            )

    @property
    def model(self) -> bool:
        """Once loaded it is a model tier (named ``draft``), not a tier of its own name."""
        return self.loads != "nothing"

    def __repr__(self) -> str:
        return self.name.upper()

    def __str__(self) -> str:
        return self.name


#: The named drafters by name, in declaration order (:func:`declare`).
DRAFTERS: dict[str, Drafter] = {}


def declare(drafter: Drafter) -> Drafter:
    """Add ``drafter`` to :data:`DRAFTERS` (again: no change); another drafter of the same
    name is an error."""
    known = DRAFTERS.setdefault(drafter.name, drafter)
    if known != drafter:
        raise ValueError(f"two drafters named {drafter.name!r}: {known} and {drafter}")
    return drafter


def withdraw(name: str) -> None:
    """Remove the drafter ``name`` from :data:`DRAFTERS` (a test's toy kind)."""
    DRAFTERS.pop(name, None)


#: The n-gram (prompt lookup) drafter; ``--draft ngram`` on the command line.
NGRAM: Final = declare(
    Drafter("ngram", "prompt lookup (what followed the text's last words before)", everywhere=True)
)
#: The target's own MTP (NextN) head (native/mtp.py); ``--draft mtp`` on the command line.
MTP: Final = declare(Drafter("mtp", "the target's own MTP head", "target-head"))


def draft_source(value: str | Path | Drafter | None) -> Path | Drafter | None:
    """A draft given by a user: the name of a drafter in :data:`DRAFTERS` (``"ngram"``,
    ``"mtp"``) is that drafter, anything else a path."""
    if value is None or isinstance(value, Drafter):
        return value
    return DRAFTERS.get(str(value)) or Path(value)


@dataclass(frozen=True)
class LadderShape:
    """Which tiers a ladder holds, before or after loading: its model tiers by name (smallest
    first, the target last) and ``drafter``, the name of the drafter with no model that fills
    the draft tier (None: a model, or nothing)."""

    models: tuple[str, ...] = ("target",)
    drafter: str | None = None

    @property
    def has_draft(self) -> bool:
        return self.drafter is not None or "draft" in self.models

    @property
    def has_qualifier(self) -> bool:
        return "qualifier" in self.models

    @property
    def n_tiers(self) -> int:
        """Tiers present: 1 (target), 2 (+ draft) or 3 (+ draft and qualifier)."""
        return 1 + self.has_draft + (self.has_draft and self.has_qualifier)

    @property
    def lookups(self) -> tuple[str, ...]:
        """The drafters with no model this ladder can run, by name: those that are everywhere
        (:attr:`Drafter.everywhere`, in :data:`DRAFTERS`' order), then its draft tier's."""
        out = [d.name for d in DRAFTERS.values() if d.everywhere]
        return (*out, self.drafter) if self.drafter and self.drafter not in out else tuple(out)

    def check(self, mode: str) -> None:
        """A one-line :class:`~pyramid_gguf.core.errors.UserError` when ``mode`` is unknown or
        needs a tier this ladder lacks: the one answer to "can this ladder run this mode"."""
        info = mode_info(mode)
        if info.n_tiers >= 2 and not self.has_draft:
            named = " or ".join(f"--draft {d}" for d in DRAFTERS.values() if not d.model)
            raise UserError(f"mode {mode} needs a draft model (--draft GGUF or {named})")
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
    """The files of a ladder: a target, optionally a qualifier and a draft (a file, or a
    :class:`Drafter` such as :data:`NGRAM` or :data:`MTP`)."""

    target: Path
    qualifier: Path | None = None
    draft: Path | Drafter | None = None

    @classmethod
    def of(
        cls,
        target: str | Path,
        qualifier: str | Path | None = None,
        draft: str | Path | Drafter | None = None,
    ) -> LadderPaths:
        """From user values (strings are paths; ``draft="ngram"`` is the n-gram drafter,
        any name in :data:`DRAFTERS` that drafter)."""
        return cls(
            Path(target), None if qualifier is None else Path(qualifier), draft_source(draft)
        )

    @property
    def n_tiers(self) -> int:
        """Tiers present: 1 (target), 2 (+ draft) or 3 (+ draft and qualifier)."""
        return self.shape.n_tiers

    @property
    def drafter(self) -> Drafter | None:
        """The named drafter in the draft tier's place (None: a file, or no draft)."""
        return self.draft if isinstance(self.draft, Drafter) else None

    @property
    def ngram(self) -> bool:
        """The draft tier is a drafter with no model (the n-gram drafter or another that
        loads nothing): it takes no memory (the planner keeps it)."""
        return self.drafter is not None and not self.drafter.model

    @property
    def shape(self) -> LadderShape:
        d = self.drafter
        files = self.model_files()
        models = tuple(t for t in TIERS if t in files or (t == "draft" and d and d.model))
        return LadderShape(models, d.name if d and not d.model else None)

    def get(self, tier: str) -> Path | Drafter | None:
        """The file (or drafter) of ``tier``."""
        value: Path | Drafter | None = getattr(self, tier)
        return value

    def model_files(self) -> dict[str, Path]:
        """``{tier: path}`` of the tiers that are model files, smallest first."""
        return {t: p for t in TIERS if isinstance(p := self.get(t), Path)}
