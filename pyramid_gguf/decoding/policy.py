"""The arithmetic of ``auto``: expected tokens per second of each chain at each block size.

A round that proposes ``k`` tokens whose keep probabilities are ``a_1, a_2, ...`` commits
``E(k) = 1 + a_1 + a_1 a_2 + ... + a_1...a_k`` tokens in expectation (the verifier always adds
one) and costs the drafting, any qualifier checks and one target evaluation of ``k + 1``
tokens, priced by the tiers' measured :class:`~.costs.CostCurve`. Every option is scored by
``E / cost``; the best one wins, and plain decoding wins ties (and anything within
:data:`MIN_GAIN`).

Estimates are means, and a mean that promises a little (a few percent) is wrong about as often
as it is right: text that does not copy pays for every such bet and wins none. So every round
has a :class:`Budget`: what it loses if nothing is kept (its whole cost, for the one token plain
decoding would have made) must be covered by what earlier rounds of the same generation saved
over plain decoding (by the same cost model), and by the credit of shadow blocks (blocks not
proposed, settled against the tokens decoded instead: :data:`SHADOW_CREDIT`); a round promising
:data:`CONFIDENT_GAIN` may also risk one plain token's time of its own. Text that copies pays
for marginal and long blocks; text that does not loses at most one token's time beyond what it
earned. Pure Python (docs/ALGORITHMS.md, "The cost model and auto").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .costs import CostCurve

#: A speculative option must beat plain decoding by this factor to be chosen (estimates are
#: noisy; a near-tie is not worth the risk of being slower).
MIN_GAIN = 1.03
#: A speculative option promising at least this factor over plain decoding may risk one plain
#: token's time beyond the savings (:class:`Budget`): a generation's first bets. Replaying the
#: shipped prompts through the cost model (greedy, 160 tokens): 1.25 keeps the README's first
#: prompt at plain speed (1.2 lost a bet there) and the edit set at 1.53x (1.3: 1.40x).
CONFIDENT_GAIN = 1.25
#: A shadow round (a block auto did not propose, checked against the tokens decoded plainly)
#: credits the budget with this fraction of what it would have saved, and with all it would
#: have lost. Replayed on this 2-core curve and the issue's AVX-512 one: 0.5 keeps the README's
#: first prompt at plain speed on both (1.0 lost a bet) and the edit set on the AVX-512 curve
#: at 1.21x, as without a budget (0.25: 1.07x).
SHADOW_CREDIT = 0.5
#: A tier that lags behind the committed text catches up when next used; that cost is spread
#: over this many rounds when pricing a chain (it is paid once, not every round).
CATCH_UP_ROUNDS = 8
#: Longest draft a model proposes per qualifier check in a pyramid.
MAX_L_D = 8


@dataclass(frozen=True)
class Option:
    """One way to run the next round.

    ``chain``: ``target`` (plain decoding), ``ngram``, a model tier name (that model drafts
    for the target) or ``pyramid`` (draft -> qualifier -> target). ``k``: tokens proposed to
    the target. ``l_d``: a pyramid's draft tokens per qualifier check. ``tokens``: expected
    committed tokens; ``seconds``: expected cost.
    """

    chain: str
    k: int
    tokens: float
    seconds: float
    l_d: int = 0

    @property
    def rate(self) -> float:
        """Expected committed tokens per second."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def expected_tokens(first: float, after: float, k: int) -> float:
    """``E(k)`` for keep probability ``first`` of the first proposal and ``after`` of each
    later one (given the one before was kept)."""
    if k <= 0:
        return 1.0
    run = float(k) if after >= 1.0 else (1.0 - after**k) / (1.0 - after)
    return 1.0 + first * run


@dataclass
class Budget:
    """What one round may lose against plain decoding ``base``.

    ``savings``: seconds this generation's speculative rounds saved so far, plus the credit of
    its shadow blocks (negative: lost), by the cost model. A round that keeps nothing costs its
    ``seconds`` for one token, losing ``seconds - base.seconds``: allowed up to ``savings``, and
    up to ``savings`` plus one plain token's time when it promises :data:`CONFIDENT_GAIN`. So a
    generation never loses more than one token's time beyond what it earned.

    It notes what it was asked about: ``best``, each chain's option with the most expected
    tokens per second, allowed or not (what the chain would run without a budget: the ``-v``
    outlook, and an n-gram shadow block); ``refused``, chains that had a block worth running
    (:data:`MIN_GAIN`) it did not allow.
    """

    base: Option
    savings: float = math.inf
    best: dict[str, Option] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)

    def allows(self, option: Option) -> bool:
        seen = self.best.get(option.chain)
        if seen is None or option.rate > seen.rate:  # the first of equals, as best_block
            self.best[option.chain] = option
        loss = option.seconds - self.base.seconds
        stake = self.base.seconds if option.rate >= CONFIDENT_GAIN * self.base.rate else 0.0
        ok = loss <= self.savings + stake
        if not ok and option.rate >= MIN_GAIN * self.base.rate:
            self.refused.add(option.chain)
        return ok


def best_block(
    chain: str,
    tokens: Callable[[int], float],
    seconds: Callable[[int], float],
    max_k: int,
    l_d: int = 0,
    budget: Budget | None = None,
) -> Option | None:
    """The block size ``k`` in ``1..max_k`` with the most expected tokens per second, among
    those ``budget`` allows (all without one)."""
    best: Option | None = None
    for k in range(1, max_k + 1):
        option = Option(chain, k, tokens(k), seconds(k), l_d)
        allowed = budget is None or budget.allows(option)
        if allowed and (best is None or option.rate > best.rate):
            best = option
    return best


def plain(target: CostCurve, overhead: float) -> Option:
    """Plain decoding: one token per one-token evaluation."""
    return Option("target", 0, 1.0, target(1) + overhead)


def ngram(
    target: CostCurve,
    first: float,
    after: float,
    available: int,
    max_k: int,
    overhead: float,
    budget: Budget | None = None,
) -> Option | None:
    """Proposing up to ``available`` n-gram tokens (drafting costs nothing)."""
    return best_block(
        "ngram",
        lambda k: expected_tokens(first, after, k),
        lambda k: target(k + 1) + overhead,
        min(available, max_k),
        budget=budget,
    )


def draft(
    name: str,
    target: CostCurve,
    model: CostCurve,
    keep: float,
    max_k: int,
    lag: int,
    overhead: float,
    budget: Budget | None = None,
) -> Option | None:
    """Model ``name`` drafting ``k`` tokens one by one for the target (``sd``)."""
    catch_up = model(lag) / CATCH_UP_ROUNDS
    return best_block(
        name,
        lambda k: expected_tokens(keep, keep, k),
        lambda k: k * model(1) + catch_up + target(k + 1) + overhead,
        max_k,
        budget=budget,
    )


def pyramid(
    target: CostCurve,
    qualifier: CostCurve,
    bottom: CostCurve,
    keep_dq: float,
    keep_qt: float,
    max_k: int,
    lags: tuple[int, int],
    overhead: float,
    budget: Budget | None = None,
) -> Option | None:
    """Draft -> qualifier -> target: the qualifier fills a buffer of ``k`` tokens from checks
    of ``l_d`` drafted tokens, then the target verifies the buffer (``psd-exact``)."""
    catch_up = (bottom(lags[0]) + qualifier(lags[1])) / CATCH_UP_ROUNDS
    best: Option | None = None

    def tokens(k: int) -> float:
        return expected_tokens(keep_qt, keep_qt, k)

    for l_d in range(1, MAX_L_D + 1):
        per_check = l_d * bottom(1) + qualifier(l_d + 1) + overhead
        per_token = per_check / expected_tokens(keep_dq, keep_dq, l_d)

        def seconds(k: int, per_token: float = per_token) -> float:
            return k * per_token + catch_up + target(k + 1) + overhead

        option = best_block("pyramid", tokens, seconds, max_k, l_d, budget)
        if option is not None and (best is None or option.rate > best.rate):
            best = option
    return best


def choose(base: Option, options: Iterable[Option | None]) -> Option:
    """The best option; ``base`` (plain decoding) unless another beats it by :data:`MIN_GAIN`."""
    best = base
    for option in options:
        if option is not None and option.rate > best.rate and option.rate >= MIN_GAIN * base.rate:
            best = option
    return best
