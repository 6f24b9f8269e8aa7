"""The arithmetic of ``auto``'s choice: options scored by expected tokens per second, the
budget a round may lose, and the choice among them.

A round that proposes ``k`` tokens whose keep probabilities are ``a_1, a_2, ...`` commits
``E(k) = 1 + a_1 + a_1 a_2 + ... + a_1...a_k`` tokens in expectation (:func:`expected_tokens`;
the verifier always adds one) and costs the drafting, any qualifier checks and one target
evaluation of ``k + 1`` tokens, priced by the tiers' measured :class:`~.costs.CostCurve` (each
chain's price function is in :mod:`.chains`). Every :class:`Option` is scored by ``E / cost``
(:func:`best_block` over block sizes); the best one wins (:func:`choose`), and plain decoding
wins ties (and anything within :data:`MIN_GAIN`).

Estimates are means, and a mean that promises a little (a few percent) is wrong about as often
as it is right: text that does not copy pays for every such bet and wins none. So every round
has a :class:`Budget`: what it loses if nothing is kept (its whole cost, for the one token plain
decoding would have made) must be covered by what earlier rounds of the same generation saved
over plain decoding (by the same cost model), and by the credit of shadow blocks (blocks not
proposed, settled against the tokens decoded instead: :data:`SHADOW_CREDIT`); a round promising
:data:`CONFIDENT_GAIN` may also risk one plain token's time of its own. The generation's
:class:`Ledger` keeps that account; a :class:`Budget` only answers whether an option fits it.
Every search returns a :class:`Pick`: the chain's best option, the best one the budget allows,
and whether an option worth running was refused. Text that copies pays for marginal and long
blocks; text that does not loses at most one token's time beyond what it earned. Pure Python
(docs/ALGORITHMS.md, "The cost model and auto").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

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
#: Model chains may also spend this share of the plain decoding time the generation has run so
#: far on rounds its savings do not cover: a model draft has no free shadow to learn from, so
#: without an allowance one unlucky first bet would stop it for the whole generation (replayed
#: on GPU-shaped curves, a draft keeping 0.3 that pays 1.2x was never run again after its first
#: three rounds lost 0.02 s). Bounded: a generation loses at most this share plus one token.
EXPLORE_SHARE = 0.02


@dataclass(frozen=True)
class Batch:
    """The rest of the batch a sequence's round rides in (parallel slots): the other
    sequences commit ``tokens`` per step and their step costs ``seconds`` without this one.

    With other sequences in the batch, a round's ``seconds`` is what it adds to the step (its
    drafting, and its tokens at the marginal cost of the target's combined evaluation:
    :meth:`~.costs.CostCurve.after`), and an option's rate is the whole batch's, so a round
    speculates only where that raises the batch's tokens per second (Dinkelbach's ratio test:
    a bet whose extra tokens per extra second fall below the batch's own rate slows everyone).
    ``slots``: how many other sequences; a gain a single sequence must show (:data:`MIN_GAIN`,
    :data:`CONFIDENT_GAIN`) is asked of its share of the batch (:meth:`factor`).
    """

    tokens: float = 0.0
    seconds: float = 0.0
    slots: int = 0

    def factor(self, gain: float) -> float:
        """The batch's rate gain that is ``gain`` for one of its ``slots + 1`` sequences."""
        return 1.0 + (gain - 1.0) / (self.slots + 1)


#: A sequence alone.
SOLO = Batch()


@dataclass(frozen=True)
class Option:
    """One way to run the next round.

    ``chain``: ``target`` (plain decoding), ``ngram``, a model tier name (that model drafts
    for the target) or ``pyramid`` (draft -> qualifier -> target). ``k``: tokens proposed to
    the target. ``l_d``: a pyramid's draft tokens per qualifier check. ``tokens``: expected
    committed tokens; ``seconds``: expected cost; ``batch``: the rest of the batch it rides in.
    """

    chain: str
    k: int
    tokens: float
    seconds: float
    l_d: int = 0
    batch: Batch = SOLO

    @property
    def rate(self) -> float:
        """Expected committed tokens per second (of the whole batch when in one)."""
        spent = self.seconds + self.batch.seconds
        return (self.tokens + self.batch.tokens) / spent if spent > 0 else 0.0


def expected_tokens(first: float, after: float, k: int) -> float:
    """``E(k)`` for keep probability ``first`` of the first proposal and ``after`` of each
    later one (given the one before was kept)."""
    if k <= 0:
        return 1.0
    run = float(k) if after >= 1.0 else (1.0 - after**k) / (1.0 - after)
    return 1.0 + first * run


@dataclass(frozen=True)
class Budget:
    """What one round may lose against plain decoding ``base``: a pure question.

    ``savings``: seconds this generation's speculative rounds saved so far, plus the credit of
    its shadow blocks (negative: lost), by the cost model (:class:`Ledger`). A round that keeps
    nothing costs its ``seconds`` for one token, losing ``seconds - base.seconds``: allowed up
    to ``savings``, and up to ``savings`` plus one plain token's time when it promises
    :data:`CONFIDENT_GAIN`. So a generation never loses more than one token's time beyond
    what it earned. In a batch of parallel slots, ``seconds`` are what a round adds to the
    batch's step, the gains are asked of this sequence's share (:meth:`Batch.factor`), and
    the stake is one step of the batch.
    """

    base: Option
    savings: float = math.inf

    def allows(self, option: Option) -> bool:
        base = self.base
        loss = option.seconds - base.seconds
        confident = option.rate >= base.batch.factor(CONFIDENT_GAIN) * base.rate
        return loss <= self.savings + (base.seconds + base.batch.seconds if confident else 0.0)

    def worth(self, option: Option) -> bool:
        """Whether ``option`` beats plain decoding by :data:`MIN_GAIN` (budget aside)."""
        return option.rate >= self.base.batch.factor(MIN_GAIN) * self.base.rate


@dataclass
class Ledger:
    """One generation's account against plain decoding, by the cost model: what its
    speculative rounds saved (``savings``) and what its shadow blocks earned
    (``shadow_credit``). The budget of every round is drawn on it (:meth:`budget`)."""

    savings: float = 0.0
    shadow_credit: float = 0.0

    def budget(self, base: Option) -> Budget:
        return Budget(base, self.savings + self.shadow_credit)

    def round(self, option: Option, committed: int, base: Option) -> None:
        """A speculative round ran ``option`` and committed ``committed`` tokens."""
        self.savings += committed * base.seconds - option.seconds

    def shadow(self, gain: float) -> None:
        """A shadow block would have saved ``gain`` seconds (negative: lost); credited at
        :data:`SHADOW_CREDIT` when it gains, in full when it loses."""
        self.shadow_credit += gain * SHADOW_CREDIT if gain > 0 else gain


@dataclass(frozen=True)
class Pick:
    """A chain's options for the next round.

    ``best``: the option with the most expected tokens per second, budget aside (what the chain
    would run if the generation had earned enough: the ``-v`` outlook, an n-gram shadow block).
    ``allowed``: the best option the budget allows. ``refused``: an option worth running
    (:data:`MIN_GAIN`) was not allowed.
    """

    best: Option | None = None
    allowed: Option | None = None
    refused: bool = False

    def __or__(self, other: Pick) -> Pick:
        """The better of two picks of one chain, part by part (the first of equals)."""
        return Pick(
            _better(self.best, other.best),
            _better(self.allowed, other.allowed),
            self.refused or other.refused,
        )


def _better(a: Option | None, b: Option | None) -> Option | None:
    return b if a is None or (b is not None and b.rate > a.rate) else a


def best_block(
    chain: str,
    tokens: Sequence[float],
    seconds: Sequence[float],
    l_d: int = 0,
    budget: Budget | None = None,
    batch: Batch = SOLO,
) -> Pick:
    """The block size ``k`` with the most expected tokens per second, overall and among those
    ``budget`` allows (all, without one). ``tokens[k - 1]`` / ``seconds[k - 1]``: expected
    committed tokens and cost of proposing ``k`` (``k = 1..len(tokens)``); rates are the
    ``batch``'s with this sequence in it. The first of equal rates wins. Called for every
    chain every round, so it makes only the options it returns."""
    best_k = allowed_k = 0
    best_rate = allowed_rate = 0.0
    refused = False
    # Budget.allows unrolled (the hot loop of every round): a loss up to ``savings``, up to
    # ``staked`` at ``confident`` rates
    base, savings, staked, confident, worth = 0.0, math.inf, math.inf, math.inf, math.inf
    if budget is not None:
        plain, savings = budget.base, budget.savings
        base, staked = plain.seconds, savings + plain.seconds + plain.batch.seconds
        confident = plain.batch.factor(CONFIDENT_GAIN) * plain.rate
        worth = plain.batch.factor(MIN_GAIN) * plain.rate
    shared_t, shared_s = batch.tokens, batch.seconds
    for k, (t, s) in enumerate(zip(tokens, seconds, strict=True), start=1):
        rate = (t + shared_t) / (s + shared_s) if s + shared_s > 0 else 0.0
        if best_k == 0 or rate > best_rate:
            best_k, best_rate = k, rate
        if s - base <= (staked if rate >= confident else savings):
            if allowed_k == 0 or rate > allowed_rate:
                allowed_k, allowed_rate = k, rate
        elif rate >= worth:
            refused = True

    def option(k: int) -> Option | None:
        if not k:
            return None
        return Option(chain, k, tokens[k - 1], seconds[k - 1], l_d, batch)

    best = option(best_k)
    return Pick(best, best if allowed_k == best_k else option(allowed_k), refused)


@functools.lru_cache(maxsize=256)
def lookahead(
    cost: Callable[[int], float], keep: float, max_k: int, step: float = 0.0
) -> tuple[float, ...]:
    """Seconds per expected token a lone draft's ``n``-th token must beat, ``[max_k]``
    (entry ``n - 1``): the least, over block lengths ``m >= n``, of what verifying ``m``
    drafted tokens costs beyond ``n - 1`` (``cost(m + 1) - cost(n)``, ``cost`` the target's
    seconds for a batch) and drafting the ``m - n + 1`` tokens from the ``n``-th on (``step``
    seconds each: the draft evaluates each token it proposes to see the next one), over the
    tokens the ``n``-th and the ``m - n`` after it add, each kept at ``keep`` given the one
    before (the ``n``-th counted whole: the caller weighs it by the chance it is reached and
    kept). With ``m = n`` alone this is the marginal rule. Cached: the curve, the keep rate
    (to 0.01) and the step change rarely."""
    c = [cost(i) for i in range(1, max_k + 2)]  # c[i - 1]: a batch of i
    out = []
    for n in range(1, max_k + 1):
        best, run, term = math.inf, 0.0, 1.0
        for m in range(n, max_k + 1):
            run += term
            term *= keep
            best = min(best, (c[m] - c[n - 1] + (m - n + 1) * step) / run)
        out.append(best)
    return tuple(out)


def choose(base: Option, options: Iterable[Option | None]) -> Option:
    """The best option; ``base`` (plain decoding) unless another beats it by :data:`MIN_GAIN`."""
    best = base
    for option in options:
        if (
            option is not None
            and option.rate > best.rate
            and option.rate >= base.batch.factor(MIN_GAIN) * base.rate
        ):
            best = option
    return best
