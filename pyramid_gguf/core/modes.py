"""The mode table: every decoding mode, what it needs, which rules it runs, whether it is lossless.

This is the one home of those facts (docs/ALGORITHMS.md describes the rules). Tiers needed,
losslessness and the knobs a mode reads derive from :data:`MODES`; nothing else lists modes.
Whether a ladder can run a mode is :meth:`pyramid_gguf.core.ladder.LadderShape.check`, asked by
every caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import UserError

Mode = Literal["auto", "target", "sd", "fsd", "psd-exact", "psd-a", "psd-f"]
#: A stage's acceptance rule family: exact (speculative sampling or greedy-match) or fuzzy.
RuleFamily = Literal["exact", "fuzzy"]


@dataclass(frozen=True)
class ModeInfo:
    """One decoding mode.

    ``stage1``: the rule of the draft -> qualifier stage (None without a qualifier).
    ``top``: the rule of the stage that ends at the target (None for plain decoding).
    ``auto``: the cost-aware scheduler, which runs one of the fixed chains each round.
    """

    name: Mode
    summary: str
    stage1: RuleFamily | None = None
    top: RuleFamily | None = None
    auto: bool = False

    @property
    def n_tiers(self) -> int:
        """Models (or the n-gram drafter) the mode needs, the target included."""
        if self.auto or self.top is None:
            return 1
        return 3 if self.stage1 is not None else 2

    @property
    def lossless(self) -> bool:
        """Output distributed exactly as the target's (``auto``: unless lossy chains are
        allowed, see :attr:`~pyramid_gguf.core.spec.SpecConfig.lossless`)."""
        return "fuzzy" not in (self.stage1, self.top)

    @property
    def fuzzy(self) -> bool:
        return not self.lossless

    @property
    def knobs(self) -> frozenset[str]:
        """The :class:`~pyramid_gguf.core.spec.SpecConfig` fields this mode reads."""
        if self.auto:
            return frozenset(
                {"max_block", "allow_lossy", "exact_rule", "tau_q", "tau_t"}
                | {"divergence", "fuzzy_variant"}
            )
        out: set[str] = set()
        if self.n_tiers >= 2:
            out |= {"l_d", "p_min", "ngram_min"}
        if self.n_tiers == 3:
            out.add("l_q")
        if self.stage1 == "fuzzy":
            out.add("tau_q")
        if self.top == "fuzzy":
            out.add("tau_t")
        if self.fuzzy:
            out |= {"divergence", "fuzzy_variant"}
        if "exact" in (self.stage1, self.top):
            out.add("exact_rule")
        return frozenset(out)


MODES: dict[str, ModeInfo] = {
    m.name: m
    for m in (
        ModeInfo("auto", "picks the fastest chain and block size each round (cost model)",
                 auto=True),
        ModeInfo("target", "plain autoregressive decoding of the target"),
        ModeInfo("sd", "speculative decoding: the draft proposes to the target", top="exact"),
        ModeInfo("fsd", "fuzzy speculative decoding, draft -> target", top="fuzzy"),
        ModeInfo("psd-exact", "pyramid, exact at both stages", stage1="exact", top="exact"),
        ModeInfo("psd-a", "pyramid, fuzzy into the target (PSD_A)", stage1="exact", top="fuzzy"),
        ModeInfo("psd-f", "pyramid, fuzzy at both stages (PSD_F)", stage1="fuzzy", top="fuzzy"),
    )
}  # fmt: skip
MODE_NAMES: tuple[Mode, ...] = tuple(m.name for m in MODES.values())


def mode_info(name: str) -> ModeInfo:
    """The :class:`ModeInfo` of ``name``, or a one-line :class:`UserError` listing valid modes."""
    try:
        return MODES[name]
    except KeyError:
        raise UserError(f"unknown mode {name!r}; valid modes: {', '.join(MODE_NAMES)}") from None
