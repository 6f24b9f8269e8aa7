"""Which decoding mode runs and its speculative knobs: :class:`SpecConfig`, and
:data:`SPEC_KNOBS`, the one declaration of each knob as users set it (CLI flags, server fields,
sweeps, presets, ``tune``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from .errors import UserError
from .modes import MODE_NAMES, Mode, ModeInfo, mode_info

Divergence = Literal["js", "kl", "tv"]
FuzzyVariant = Literal["reducible", "pure"]
ExactRule = Literal["exact", "greedy-match"]

DIVERGENCES: tuple[Divergence, ...] = ("js", "kl", "tv")
FUZZY_VARIANTS: tuple[FuzzyVariant, ...] = ("reducible", "pure")
EXACT_RULES: tuple[ExactRule, ...] = ("exact", "greedy-match")


@dataclass(frozen=True)
class SpecConfig:
    """Decoding mode and speculative knobs (docs/ALGORITHMS.md; :data:`SPEC_KNOBS` lists them).

    ``mode``: ``auto`` (the default) picks a chain and a block size each round.
    ``l_d``: tokens the bottom proposer drafts per stage-1 verification.
    ``l_q``: tokens the qualifier buffers before the target verifies (three tiers only).
    ``tau_q`` / ``tau_t``: fuzzy thresholds of the stage ending at the qualifier / target;
    they only act in the fuzzy modes. Defaults calibrated on the default ladder (greedy, all
    164 HumanEval problems, 256 tokens): at 0.02 / 0.02 ``psd-a``, ``psd-f`` and ``fsd`` solve
    at least what the target solves (target 84; psd-a 89, psd-f 89, fsd 87); ``tau_q`` 0.3
    cost ``psd-f`` 8 problems; at the papers' ``tau_t`` 0.5 ``psd-a`` solved 7 of the first 12
    and ``fsd`` 1, against 9 (docs/ALGORITHMS.md, "Fuzzy thresholds"; docs/BENCHMARKS.md).
    ``p_min``: stop drafting when the draft's top probability (temperature-1 softmax) falls
    under it; 0 disables. ``exact_rule``: ``greedy-match`` swaps speculative sampling for
    llama.cpp's token matching (comparison).
    """

    mode: Mode = "auto"
    l_d: int = 4
    l_q: int = 8
    tau_q: float = 0.02
    tau_t: float = 0.02
    divergence: Divergence = "js"
    fuzzy_variant: FuzzyVariant = "reducible"
    p_min: float = 0.0
    #: Rule of the lossless stages: speculative sampling, or llama.cpp's token matching.
    exact_rule: ExactRule = "exact"
    #: Fixed modes: shortest suffix match the n-gram drafter proposes from (``auto`` weighs
    #: every match by what its length is worth).
    ngram_min: int = 3
    #: ``auto``: most tokens proposed to the target in one round.
    max_block: int = 64
    #: ``auto``: may also pick lossy chains (fuzzy rules with ``tau_q`` / ``tau_t``).
    allow_lossy: bool = False

    def __post_init__(self) -> None:
        if self.exact_rule not in EXACT_RULES:
            raise UserError(
                f"unknown exact rule {self.exact_rule!r}; valid: {', '.join(EXACT_RULES)}"
            )
        mode_info(self.mode)
        if self.divergence not in DIVERGENCES:
            raise UserError(
                f"unknown divergence {self.divergence!r}; valid: {', '.join(DIVERGENCES)}"
            )
        if self.fuzzy_variant not in FUZZY_VARIANTS:
            raise UserError(
                f"unknown fuzzy variant {self.fuzzy_variant!r}; valid: {', '.join(FUZZY_VARIANTS)}"
            )
        if self.l_d < 1:
            raise UserError(f"--l-d must be at least 1, got {self.l_d}")
        if self.l_q < 1:
            raise UserError(f"--l-q must be at least 1, got {self.l_q}")
        for flag, tau in (("--tau-q", self.tau_q), ("--tau-t", self.tau_t)):
            if not math.isfinite(tau):  # negative is fine: the fuzzy rule then accepts nothing
                raise UserError(f"{flag} must be a finite number, got {tau}")
        if not 0 <= self.p_min < 1:
            raise UserError(f"--p-min must be in [0, 1), got {self.p_min}")
        if self.ngram_min < 2:
            raise UserError(f"--ngram-min must be at least 2, got {self.ngram_min}")
        if self.max_block < 1:
            raise UserError(f"--max-block must be at least 1, got {self.max_block}")

    @property
    def info(self) -> ModeInfo:
        """The mode's row of the mode table (tiers needed, rules, losslessness, knobs)."""
        return mode_info(self.mode)

    @property
    def lossless(self) -> bool:
        """Output distributed exactly as the target's."""
        return self.info.lossless and not (self.info.auto and self.allow_lossy)

    def with_(self, **changes: object) -> SpecConfig:
        """A copy with some fields replaced (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Knob:
    """One :class:`SpecConfig` field as users set it: flag, type, choices and help.

    The CLI, the server's request fields, ``bench --sweep``, ``models.toml`` presets and
    ``tune`` all read this list, so a knob is declared once.
    """

    name: str
    type: type
    help: str
    #: Other spellings accepted in request bodies and presets (``l_D`` for ``l_d``).
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: object, where: str) -> object:
        """``value`` if it has this knob's type (ints pass as floats), else a :class:`UserError`."""
        if self.type is bool:
            if not isinstance(value, bool):
                raise UserError(f"{where}: expected true or false, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (self.type, int)):
            raise UserError(f"{where}: expected {self.type.__name__}, got {value!r}")
        if isinstance(value, int) and self.type is not int:
            if self.type is not float:
                raise UserError(f"{where}: expected {self.type.__name__}, got {value!r}")
            value = float(value)
        if self.choices and value not in self.choices:
            raise UserError(f"{where}: {value!r} is not one of {', '.join(self.choices)}")
        return value

    def from_text(self, text: str, where: str) -> object:
        """A value typed on a command line (``--sweep l_d=2,4``)."""
        if self.type is bool:
            flag = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
            value = flag.get(text.strip().lower())
            if value is None:
                raise UserError(f"{where}: {text.strip()!r} is not true or false")
            return value
        try:
            value = self.type(text.strip())
        except ValueError:
            raise UserError(
                f"{where}: {text.strip()!r} is not a valid {self.type.__name__}"
            ) from None
        return self.check(value, where)


SPEC_KNOBS: tuple[Knob, ...] = (
    Knob("mode", str, "Decoding mode.", choices=MODE_NAMES),
    Knob("l_d", int, "Tokens the draft proposes per check.", aliases=("l_D",)),
    Knob("l_q", int, "Qualified tokens per target check.", aliases=("l_Q",)),
    Knob("tau_q", float, "Fuzzy threshold of the draft->qualifier stage.", aliases=("tau_Q",)),
    Knob("tau_t", float, "Fuzzy threshold of the stage into the target.", aliases=("tau_T",)),
    Knob("divergence", str, "Fuzzy divergence.", choices=DIVERGENCES),
    Knob("fuzzy_variant", str, "reducible or pure (the FSD paper).", choices=FUZZY_VARIANTS),
    Knob("p_min", float, "Stop drafting when the draft's top probability falls under this."),
    Knob("exact_rule", str, "Rule of the lossless stages.", choices=EXACT_RULES),
    Knob("ngram_min", int, "Fixed modes: shortest suffix match the n-gram drafter uses."),
    Knob("max_block", int, "auto: most tokens proposed to the target per round."),
    Knob("allow_lossy", bool, "auto: may also pick lossy (fuzzy) chains."),
)
KNOBS: dict[str, Knob] = {k.name: k for k in SPEC_KNOBS}
