"""Chains: who proposes to whom in a round, under which rules, and what a round of them costs.

A :class:`Chain` lists its tiers from the bottom proposer (a drafter with no model, such as the
n-gram drafter, or a draft model) through any checking model up to the target, with one
:class:`StageRule` per stage. Plain decoding is :data:`PLAIN`, the chain with no stage. The
chains of a ladder come from the mode table, once:

- a fixed mode is one constant chain (:func:`mode_chain`: ``sd`` is ``draft -> target``,
  ``psd-*`` are ``draft -> qualifier -> target``, with the mode's rules);
- ``auto`` chooses among :func:`ladder_chains` every round (plain decoding, each drafter with
  no model, each model drafting for the target, the pyramid);
- ``calibrate``, ``tune``, the planner and the prediction scripts price that same list with
  :meth:`Chain.price`.

What a round of each chain costs and commits is one function per shape of chain, priced on the
tiers' :class:`~.costs.CostCurve` and scored by :func:`~.policy.best_block` (expected committed
tokens per second at each block size): :func:`price_plain`, :func:`price_lookup` (a drafter
with no model: its block is known before the round, drafting it costs nothing),
:func:`price_draft` (a model drafting for the target) and :func:`price_pyramid`;
:meth:`Chain.price` picks the one of its shape. Which drafters have no model is the ladder's
:attr:`~pyramid_gguf.core.ladder.LadderShape.lookups` (the drafter kinds' registry,
:mod:`pyramid_gguf.decoding.runtime.drafters`).

Pure Python: a chain names tiers; :class:`~pyramid_gguf.decoding.runtime.rounds.RoundRunner`
runs it on loaded models.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ...core.ladder import LadderShape
from ...core.modes import RuleFamily
from ...core.spec import SpecConfig
from . import policy
from .costs import CostCurve

RuleKind = Literal["exact", "fuzzy", "greedy-match"]

#: A stage's keep probabilities: of its first proposal, and of each one after a kept one.
Keep = tuple[float, float]
#: A tier that lags behind the committed text catches up when next used; that cost is spread
#: over this many rounds when pricing a chain (it is paid once, not every round).
CATCH_UP_ROUNDS = 8
#: Longest draft a model proposes per qualifier check in a pyramid.
MAX_L_D = 8


@dataclass(frozen=True)
class StageRule:
    """Which acceptance rule a stage applies, with its fuzzy knobs (docs/ALGORITHMS.md)."""

    kind: RuleKind = "exact"
    tau: float = -1.0
    divergence: str = "js"
    variant: str = "reducible"

    @property
    def lossless(self) -> bool:
        return self.kind != "fuzzy"


def stage_rule(family: RuleFamily | None, tau: float, spec: SpecConfig) -> StageRule:
    """The rule of a stage of family ``family``: fuzzy at threshold ``tau`` with the spec's
    divergence and variant, else the spec's exact rule (speculative sampling or token
    matching)."""
    if family == "fuzzy":
        return StageRule("fuzzy", tau, spec.divergence, spec.fuzzy_variant)
    return StageRule(spec.exact_rule)


@dataclass(frozen=True)
class Stage:
    """One proposer -> verifier step of a chain (``name`` like ``draft->qualifier``)."""

    lower: str
    upper: str
    rule: StageRule

    @property
    def name(self) -> str:
        return f"{self.lower}->{self.upper}"


@dataclass(frozen=True)
class Chain:
    """A round's shape: ``tiers`` from the bottom proposer up to ``target``, one rule per stage.

    ``name`` is what statistics and ``auto`` call it: ``target`` (plain decoding), the name of
    a drafter with no model (``ngram``), the name of the model drafting for the target
    (``draft``, ``qualifier``), or ``pyramid`` (``ngram-pyramid`` when the n-gram drafter feeds
    the qualifier). ``lookup``: the bottom is a drafter with no model (no tier to evaluate).
    """

    name: str
    tiers: tuple[str, ...]
    rules: tuple[StageRule, ...] = ()
    lookup: bool = False

    def __post_init__(self) -> None:
        if not self.tiers or self.tiers[-1] != "target" or len(self.rules) != len(self.tiers) - 1:
            raise ValueError(f"a chain ends at the target, one rule per stage: {self}")

    @property
    def stages(self) -> tuple[Stage, ...]:
        """Bottom-up: the last stage ends at the target."""
        return tuple(
            Stage(lo, up, rule)
            for lo, up, rule in zip(self.tiers[:-1], self.tiers[1:], self.rules, strict=True)
        )

    @property
    def plain(self) -> bool:
        """Plain decoding: the target alone."""
        return not self.rules

    @property
    def top(self) -> Stage:
        """The stage that ends at the target."""
        return self.stages[-1]

    @property
    def bottom(self) -> str:
        """The tier that proposes first (``ngram``, ``draft``, ... or ``target`` when plain)."""
        return self.tiers[0]

    @property
    def models(self) -> tuple[str, ...]:
        """The model tiers a round evaluates, smallest first (the target last)."""
        return self.tiers[1:] if self.lookup else self.tiers

    @property
    def lossless(self) -> bool:
        """Output distributed exactly as the target's: every stage exact."""
        return all(r.lossless for r in self.rules)

    def price(
        self,
        costs: Mapping[str, CostCurve],
        keeps: Sequence[Keep],
        max_k: int,
        *,
        overhead: float,
        lags: Mapping[str, int] | None = None,
        available: int | None = None,
        budget: policy.Budget | None = None,
        forced: int = 0,
        batch: policy.Batch = policy.SOLO,
    ) -> policy.Pick:
        """This chain's best next round, by the price function of its shape (:func:`price_plain`,
        :func:`price_lookup`, :func:`price_draft`, :func:`price_pyramid`).

        ``costs``: each tier's :class:`CostCurve` by name. ``keeps``: per stage (bottom-up)
        the keep probabilities of its proposals. ``lags``: committed tokens each model below
        the target has not seen (it catches up when next used). ``available``: tokens a
        drafter with no model offers (its block). ``forced``: tokens a grammar forces before
        the block (certain acceptances, verified in the same batch). ``batch``: the rest of the
        batch the round rides in (``costs["target"]`` then prices this sequence's tokens at the
        margin of the combined evaluation). Plain decoding's pick is its one option.
        """
        target = costs["target"]
        lags = lags or {}
        if self.plain:
            base = price_plain(target, overhead, forced, batch)
            return policy.Pick(base, base)
        if self.lookup and len(self.rules) == 1:
            first, after = keeps[0]
            n = max_k if available is None else available
            return price_lookup(
                self.name, target, first, after, n, max_k, overhead, budget, forced, batch
            )
        if not self.lookup and len(self.rules) == 1:
            model = self.bottom
            keep = keeps[0][0]
            lag = lags.get(model, 0)
            return price_draft(
                model, target, costs[model], keep, max_k, lag, overhead, budget, forced, batch
            )
        if not self.lookup and len(self.rules) == 2:
            lower, middle = self.tiers[0], self.tiers[1]
            pair = (lags.get(lower, 0), lags.get(middle, 0))
            return price_pyramid(
                target,
                costs[middle],
                costs[lower],
                keeps[0][0],
                keeps[1][0],
                max_k,
                pair,
                overhead,
                budget,
                forced,
                batch,
            )
        raise ValueError(f"chain {self.name} ({' -> '.join(self.tiers)}) is not priced")


#: Plain decoding: the target alone, one token per evaluation.
PLAIN = Chain("target", ("target",))


def mode_chain(spec: SpecConfig, shape: LadderShape) -> Chain:
    """The constant chain of fixed mode ``spec.mode`` over a ladder of ``shape``, or a
    one-line :class:`UserError` when the ladder lacks a tier the mode needs."""
    info = spec.info
    if info.auto:
        raise ValueError("auto has no constant chain: it chooses among ladder_chains()")
    shape.check(spec.mode)
    if info.n_tiers == 1:
        return PLAIN
    bottom = shape.drafter or "draft"
    lookup = shape.drafter is not None
    top = stage_rule(info.top, spec.tau_t, spec)
    if info.n_tiers == 2:
        return Chain(bottom, (bottom, "target"), (top,), lookup)
    name = f"{shape.drafter}-pyramid" if lookup else "pyramid"
    stage1 = stage_rule(info.stage1, spec.tau_q, spec)
    return Chain(name, (bottom, "qualifier", "target"), (stage1, top), lookup)


def ladder_chains(shape: LadderShape, spec: SpecConfig) -> tuple[Chain, ...]:
    """Every chain ``auto`` may run on a ladder of ``shape``, plain decoding first.

    Each drafter with no model (:attr:`~pyramid_gguf.core.ladder.LadderShape.lookups`: the
    n-gram drafter, ...) proposes to the target under the exact rule; each model tier below the
    target drafts for it; draft -> qualifier -> target when both are models. The model chains'
    rules are exact, or fuzzy with ``tau_q`` / ``tau_t`` when ``spec.allow_lossy``.
    """
    exact = StageRule(spec.exact_rule)
    lossy: RuleFamily = "fuzzy" if spec.allow_lossy else "exact"
    top = stage_rule(lossy, spec.tau_t, spec)
    out = [PLAIN, *(Chain(n, (n, "target"), (exact,), lookup=True) for n in shape.lookups)]
    out += [Chain(m, (m, "target"), (top,)) for m in shape.models if m != "target"]
    if "draft" in shape.models and "qualifier" in shape.models:
        stage1 = stage_rule(lossy, spec.tau_q, spec)
        out.append(Chain("pyramid", ("draft", "qualifier", "target"), (stage1, top)))
    return tuple(out)


# --- what a round of each chain costs and commits ---------------------------------------------


def price_plain(
    target: CostCurve, overhead: float, forced: int = 0, batch: policy.Batch = policy.SOLO
) -> policy.Option:
    """Plain decoding: one token per one-token evaluation. With ``forced`` tokens of a grammar
    (certain to be kept), they and the target's next token in one evaluation."""
    return policy.Option("target", 0, 1.0 + forced, target(1 + forced) + overhead, batch=batch)


def price_lookup(
    name: str,
    target: CostCurve,
    first: float,
    after: float,
    available: int,
    max_k: int,
    overhead: float,
    budget: policy.Budget | None = None,
    forced: int = 0,
    batch: policy.Batch = policy.SOLO,
) -> policy.Pick:
    """Drafter ``name``, with no model, proposing up to ``available`` tokens it read off the
    text (drafting costs nothing; the n-gram drafter's continuation) after ``forced`` tokens of
    a grammar (kept for certain, verified in the same batch)."""
    ks = range(1, min(available, max_k) + 1)
    tokens = [forced + policy.expected_tokens(first, after, k) for k in ks]
    seconds = [
        target(k + forced + 1) + overhead + expected_drop(target, first, after, k) for k in ks
    ]
    return policy.best_block(name, tokens, seconds, budget=budget, batch=batch)


def expected_drop(curve: CostCurve, first: float, after: float, k: int, unseen: int = 0) -> float:
    """Expected seconds a tier of cost ``curve`` spends rolling back after a block of ``k``
    proposals, the first kept with probability ``first`` and each after a kept one with
    ``after``: keeping ``j < k`` drops the ``k - j - unseen`` evaluated tokens past them
    (``unseen``: proposals the tier never evaluated, a drafter's last). 0 where the cache
    drops a suffix for free (:meth:`~.costs.CostCurve.drop`: hybrid and recurrent targets pay)."""
    if not curve.rollback:
        return 0.0
    total, reach = 0.0, 1.0
    for j in range(k):
        keep = first if j == 0 else after
        total += reach * (1.0 - keep) * curve.drop(k - j - unseen)
        reach *= keep
    return total


def price_draft(
    name: str,
    target: CostCurve,
    model: CostCurve,
    keep: float,
    max_k: int,
    lag: int,
    overhead: float,
    budget: policy.Budget | None = None,
    forced: int = 0,
    batch: policy.Batch = policy.SOLO,
) -> policy.Pick:
    """Model ``name`` drafting ``k`` tokens one by one for the target (``sd``), after
    ``forced`` tokens of a grammar (the model reads them with its first draft step); each
    block's seconds are :func:`draft_seconds`."""
    ks = range(1, max_k + 1)
    tokens = [forced + policy.expected_tokens(keep, keep, k) for k in ks]
    seconds = [draft_seconds(target, model, keep, k, lag, overhead, forced) for k in ks]
    return policy.best_block(name, tokens, seconds, budget=budget, batch=batch)


def draft_seconds(
    target: CostCurve,
    model: CostCurve,
    keep: float,
    k: int,
    lag: int = 0,
    overhead: float = 0.0,
    forced: int = 0,
    stopped: bool = False,
) -> float:
    """What a round of a model drafting ``k`` tokens for the target costs (:func:`price_draft`
    prices every ``k``; ``auto``'s ledger books the ``k`` a round really proposed).

    The model never evaluates the last token it drafts: when the target keeps the whole block,
    the next round's first step reads it beside the target's bonus token (two tokens, not
    one), with probability ``keep ** k``. ``stopped``: the draft stopped before its cap because
    its next token was not worth proposing (``auto``'s lone draft, :func:`~.policy.lookahead`):
    the evaluation that found that token was paid too (``k = 0``: the draft's one evaluation,
    and the target's of one token). Its catching up on ``lag`` committed tokens is spread over
    :data:`CATCH_UP_ROUNDS` rounds."""
    catch_up = model(lag) / CATCH_UP_ROUNDS + (model(forced + 1) - model(1) if forced else 0.0)
    one, second = model(1), model(2) - model(1)
    reread = keep**k * second if k > 0 else 0.0
    return (
        (k + (1 if stopped or k == 0 else 0)) * one
        + reread
        + catch_up
        + target(k + forced + 1)
        + overhead
        + expected_drop(target, keep, keep, k)
        + expected_drop(model, keep, keep, k, unseen=1)
    )


@dataclass(frozen=True)
class Fill:
    """How a pyramid's qualifier fills a buffer of ``r`` tokens (``r = 0..max_k``):
    ``checks[r][m]``, the expected number of its checks of ``m`` drafted tokens
    (``m = 1..l_d``; index 0 unused), and ``own[r]``, the probability that the buffer's last
    token is the qualifier's own (a correction or bonus token, which it sampled but never
    evaluated; else its last check was cut to the room left, ending on a drafted token)."""

    checks: tuple[tuple[float, ...], ...]
    own: tuple[float, ...]


@functools.lru_cache(maxsize=2048)
def buffer_fill(keep: float, l_d: int, max_k: int) -> Fill:
    """:class:`Fill` for drafts kept with probability ``keep``, up to ``l_d`` per check.

    Each check drafts ``m = min(l_d, room)`` tokens (the draft never drafts past the buffer's
    room) and adds the kept ones plus the qualifier's own token; the last check of a buffer is
    often a short one. Exact under independent keeps (a dynamic programme over the room
    left), which is what a replay of such traces counts.
    """
    checks: list[tuple[float, ...]] = [(0.0,) * (l_d + 1)]
    own = [0.0]
    for r in range(1, max_k + 1):
        m = min(l_d, r)
        row = [0.0] * (l_d + 1)
        row[m] = 1.0
        last = 0.0
        reach = 1.0  # probability the first j drafted tokens are kept
        for j in range(m + 1):
            p = reach * (1.0 - keep) if j < m else reach
            rest = r - j - 1  # room left after this check's j kept tokens and its own one
            if rest >= 0:
                last += p * (own[rest] if rest > 0 else 1.0)
                for i in range(1, l_d + 1):
                    row[i] += p * checks[rest][i]
            reach *= keep
        checks.append(tuple(row))
        own.append(last)
    return Fill(tuple(checks), tuple(own))


def price_pyramid(
    target: CostCurve,
    qualifier: CostCurve,
    bottom: CostCurve,
    keep_dq: float,
    keep_qt: float,
    max_k: int,
    lags: tuple[int, int],
    overhead: float,
    budget: policy.Budget | None = None,
    forced: int = 0,
    batch: policy.Batch = policy.SOLO,
) -> policy.Pick:
    """Draft -> qualifier -> target: the qualifier fills a buffer of ``k`` tokens from checks
    of up to ``l_d`` drafted tokens (:func:`buffer_fill`), then the target verifies the buffer
    (``psd-exact``), after ``forced`` tokens of a grammar.

    A check of ``m`` drafted tokens costs the draft's ``m`` steps (its first one also reads the
    token the last check added, two tokens when that check kept all it drafted) and the
    qualifier's evaluation of ``m + 1`` tokens. When the target keeps the whole buffer
    (probability ``keep_qt ** k``) and the buffer ends on the qualifier's own token, the next
    round's first check reads that token too (``m + 2`` tokens)."""
    catch_up = (bottom(lags[0] + forced) + qualifier(lags[1] + forced)) / CATCH_UP_ROUNDS
    ks = range(1, max_k + 1)
    tokens = [forced + policy.expected_tokens(keep_qt, keep_qt, k) for k in ks]
    verify = [
        target(k + forced + 1) + catch_up + overhead + expected_drop(target, keep_qt, keep_qt, k)
        for k in ks
    ]
    one, second = bottom(1), bottom(2) - bottom(1)
    keep = round(keep_dq, 2)
    pick = policy.Pick()
    for l_d in range(1, MAX_L_D + 1):
        check = [0.0] + [
            m * one + keep**m * second + qualifier(m + 1) + overhead for m in range(1, l_d + 1)
        ]
        fill = buffer_fill(keep, l_d, max_k)
        seconds = []
        for k, v in zip(ks, verify, strict=True):
            m = min(l_d, k)
            reread = keep_qt**k * fill.own[k] * (qualifier(m + 2) - qualifier(m + 1))
            seconds.append(
                sum(n * c for n, c in zip(fill.checks[k], check, strict=True)) + reread + v
            )
        pick = pick | policy.best_block("pyramid", tokens, seconds, l_d, budget, batch)
    return pick


def break_even(chain: Chain, costs: Mapping[str, CostCurve], max_k: int = 64) -> float | None:
    """The smallest keep probability (to 0.01, every proposal of every stage alike) at which
    ``chain``'s best round beats plain decoding by :data:`~.policy.MIN_GAIN` on these cost
    curves, or None when it never does."""
    plain = price_plain(costs["target"], 0.0)
    for i in range(1, 101):
        keeps = ((i / 100, i / 100),) * len(chain.rules)
        best = chain.price(costs, keeps, max_k, overhead=0.0, available=max_k).best
        if best is not None and best.rate >= policy.MIN_GAIN * plain.rate:
            return i / 100
    return None
