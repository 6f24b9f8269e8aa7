"""``auto``: each round, run the chain and block size with the most expected tokens per second.

:class:`AutoScheduler` prices every chain the ladder offers (:meth:`~.chains.Chain.price`: the
tiers' cost curves and the online keep-rate estimates of :mod:`.estimates`), chooses with
:func:`~.policy.choose` within the round's :class:`~.policy.Budget`, runs the choice through the
same :class:`~.rounds.RoundRunner` and proposers as the fixed modes, and learns from the
outcome:

- ``target``: plain decoding (also whenever nothing else pays);
- ``ngram`` (and any other drafter with no model, :mod:`.drafters`): the block it offers (the
  n-gram drafter's continuation), priced by its own estimator (the match length);
- ``draft`` / ``qualifier``: that model drafts for the target (``sd``), stopping early when
  its confidence no longer pays for the verification;
- ``pyramid``: draft -> qualifier -> target (``psd-exact``).

Each round's :class:`~.policy.Budget` limits what it may lose to what the speculative rounds so
far saved over plain decoding (the generation's :class:`~.policy.Ledger`, priced by the same
cost curves), plus one token's time for a confident bet. When plain decoding runs although a
drafter with no model (the n-gram drafter) had a block worth proposing, that block becomes a
:class:`Shadow`: once the target's own tokens show how much of it would have been kept, it
teaches that drafter's estimates and credits the budget (:data:`~.policy.SHADOW_CREDIT`), at no
cost. Text that copies thus earns its first bets while decoding plainly; text that only echoes
a phrase does not.

The chains are :func:`~.chains.ladder_chains` of the ladder; each drafter with no model is
built from its kind in the registry (:mod:`.drafters`). They are lossless (exact rules)
unless ``allow_lossy``, which makes the model chains use the fuzzy rules (``fsd``, ``psd-f``
with ``tau_t`` / ``tau_q``). Tiers other than the target are never prefilled: a model catches up on
the committed text only if and when it is chosen.

In a batch of parallel slots (``load``), each round is priced against the batch it rides in:
the target's cost curve becomes the marginal cost of this slot's tokens on top of the other
slots' (their last rounds), and every option's rate is the whole batch's
(:class:`~.policy.Batch`). Where the batch already uses what a block would, nothing pays and
every slot decodes plainly; a slot alone prices exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ...core.spec import SpecConfig
from ..pricing import policy
from ..pricing.chains import Chain, Keep, draft_seconds, ladder_chains, price_plain
from ..pricing.costs import CostCurve
from ..pricing.estimates import ChainAcceptance, KeepMemory
from ..pricing.policy import Option, Pick
from . import drafters
from .batcher import Load
from .drafters import DraftSetup, Lookup, Offer
from .guide import Guide
from .ngram import NGramPool
from .proposers import Admit, DraftProposer, Observe, Proposer
from .rounds import RoundRunner
from .sampling import Sampler
from .stats import AutoStats, GenerationStats
from .tiers import Ladder, common_prefix, native_depth

#: The cost curves and the rest of the batch one round is priced with.
Priced = tuple[Mapping[str, CostCurve], policy.Batch]

#: A model chain's bound and refusals are keyed by its name, keep rates, forced tokens and batch.
BoundKey = tuple[str, tuple[Keep, ...], int, policy.Batch]

#: A proven refusal (:meth:`AutoScheduler._prove_refusal`): the block limit, savings and lags
#: it holds for, and whether an option worth choosing was refused then (the ``unfunded`` count).
Refusal = tuple[int, float, dict[str, int], bool]

#: A refusal is proven for this many rounds of :data:`~.policy.EXPLORE_SHARE` allowance ahead
#: of the round that proves it, so that a chain nothing can fund is priced once every so
#: many rounds instead of every round (:meth:`AutoScheduler._refused`).
REFUSAL_ROUNDS = 16

#: Python time per round outside llama.cpp, in seconds (warping, acceptance, bookkeeping).
#: A constant, not a measurement, so that decisions (and with them a seeded run's samples)
#: depend only on the cached cost curves and the tokens, never on timing noise.
ROUND_OVERHEAD = 4e-4


class SlotLoad(Protocol):
    """What a parallel slot knows of the batch it rides in (:class:`~.slots.Slot`)."""

    def load(self) -> Load:
        """The other running slots' share of the next target batch."""
        ...

    def report(self, size: int, committed: int) -> None:
        """This slot's round brought ``size`` tokens to the target and committed ``committed``."""
        ...


@dataclass(frozen=True)
class Shadow:
    """A block drafter ``lookup`` offered but did not propose (plain decoding ran instead), to
    be settled against the tokens committed from position ``at`` on. ``option``: its price
    and promise then."""

    at: int
    lookup: str
    offer: Offer
    option: Option

    @property
    def block(self) -> list[int]:
        return self.offer.continuation[: self.option.k]


class AutoScheduler:
    """The ``auto`` scheduler of one generation (see the module docstring)."""

    def __init__(
        self,
        ladder: Ladder,
        spec: SpecConfig,
        sampler: Sampler,
        stats: GenerationStats,
        costs: Mapping[str, CostCurve],
        pool: NGramPool | None = None,
        guide: Guide | None = None,
        load: SlotLoad | None = None,
        memory: KeepMemory | None = None,
    ) -> None:
        self.spec = spec
        self.costs = costs
        #: The batch of parallel slots this generation rides in (None: alone).
        self.load = load
        self.runner = RoundRunner(ladder, sampler, stats, guide)
        self.chains = {c.name: c for c in ladder_chains(ladder.shape, spec)}
        #: Each lossy chain's fuzzy stages, as ``-v`` names them.
        self.lossy = {
            c.name: ", ".join(
                f"{s.name} {s.rule.divergence} <= {s.rule.tau:g}"
                for s in c.stages
                if not s.rule.lossless
            )
            for c in self.chains.values()
        }
        #: The drafters with no model (the n-gram drafter, on every match of
        #: :data:`~.ngram.KEY` tokens or more), by the name of their chain.
        setup = DraftSetup(spec.max_block, spec, pool, auto=True)
        self.lookups: dict[str, Lookup] = {
            c.name: drafters.lookup(c.bottom, setup) for c in self.chains.values() if c.lookup
        }
        #: Chains drafted by models, in the ladder's order (each model drafting, the pyramid).
        self.model_chains = [c for c in self.chains.values() if not c.plain and not c.lookup]
        #: The model chains' keep rates: from the ladder's earlier generations of these knobs
        #: and this kind of sampling (``memory``), else from the priors.
        self.chain_keep = (
            memory.start((spec, sampler.greedy)) if memory is not None else ChainAcceptance()
        )
        self.overhead = ROUND_OVERHEAD
        #: Most tokens a round proposes: on a hybrid target, no more than its recurrent-state
        #: snapshots let it drop natively (a deeper drop restores a saved state that may be
        #: many rounds old, which calibration, timing a state one round old, does not price).
        self.max_k = min(spec.max_block, native_depth(ladder.target) or spec.max_block)
        self.ledger = policy.Ledger()
        self.auto = stats.auto = AutoStats()
        #: Where the answer starts in the committed tokens (set by the first round): n-gram
        #: matches before it quote the prompt (every drafter with no model is told).
        self.answer_start: int | None = None
        self.shadows: list[Shadow] = []
        #: Rounds run so far in this generation.
        self.rounds = 0
        #: Each model chain's bound (:meth:`_bound`) and the block limit it was priced at.
        self._bounds: dict[BoundKey, tuple[int, Option | None]] = {}
        #: Refusals proven ahead (:meth:`_refused`): the block limit, the most savings and the
        #: least lags under which a model chain has no option worth choosing.
        self._refusals: dict[tuple[BoundKey, Option], Refusal] = {}
        #: The round before which a refusal that failed to be proven is not tried again.
        self._unproven: dict[tuple[BoundKey, Option], int] = {}

    # --- choosing --------------------------------------------------------------------------

    def picks(
        self,
        committed: Sequence[int],
        max_k: int,
        offers: Mapping[str, Offer],
        budget: policy.Budget,
        forced: int = 0,
        priced: Priced | None = None,
    ) -> dict[str, Pick]:
        """Every chain's options within ``budget``, by chain name, each after ``forced`` tokens
        of a grammar (``committed`` includes them), in the batch of ``priced`` (default:
        alone). ``offers``: the blocks the drafters with no model offer, by chain name. A model
        chain whose bound (:meth:`_bound`) cannot beat plain decoding is not priced (it could
        not be chosen): its pick holds the bound only."""
        costs, batch = priced or (self.costs, policy.SOLO)
        out: dict[str, Pick] = {}
        for name, offer in offers.items():  # any length: its estimates say what it is worth
            out[name] = self.chains[name].price(
                costs,
                (self.lookups[name].keep(offer),),
                max_k,
                overhead=self.overhead,
                available=len(offer.continuation),
                budget=budget,
                forced=forced,
                batch=batch,
            )
        # models have no shadows to learn from: an allowance for their rounds (EXPLORE_SHARE)
        allowance = policy.EXPLORE_SHARE * self.rounds * budget.base.seconds
        explore = policy.Budget(budget.base, budget.savings + allowance)
        for chain in self.model_chains:
            keeps = self._keeps(chain)
            bound = self._bound(chain, keeps, max_k, forced, (costs, batch))
            if bound is None or not budget.worth(bound):
                out[chain.name] = Pick(best=bound)
                continue
            key = (chain.name, keeps, forced, batch)
            lags = {t.name: t.lag(committed) for t in self.runner.tiers(chain)[:-1]}
            refused = self._refused(chain, key, max_k, explore, lags, costs)
            if refused is None:
                refused = self._prove_refusal(chain, key, max_k, explore, lags, costs)
            if refused is not None:  # nothing it could choose, now or for a while
                out[chain.name] = Pick(best=bound, refused=refused)
                continue
            out[chain.name] = self._price(chain, costs, key, max_k, explore, lags)
        return out

    def _price(
        self,
        chain: Chain,
        costs: Mapping[str, CostCurve],
        key: BoundKey,
        max_k: int,
        budget: policy.Budget,
        lags: Mapping[str, int],
    ) -> Pick:
        """``chain`` priced at ``key``'s keep rates, forced tokens and batch, under ``budget``."""
        _, keeps, forced, batch = key
        return chain.price(
            costs,
            keeps,
            max_k,
            overhead=self.overhead,
            lags=lags,
            budget=budget,
            forced=forced,
            batch=batch,
        )

    @staticmethod
    def _chosen(pick: Pick, budget: policy.Budget) -> bool:
        """Whether ``pick`` has an allowed option :func:`~.policy.choose` could take over
        plain decoding (``budget.base``)."""
        return pick.allowed is not None and budget.worth(pick.allowed)

    def _refused(
        self,
        chain: Chain,
        key: BoundKey,
        max_k: int,
        budget: policy.Budget,
        lags: Mapping[str, int],
        costs: Mapping[str, CostCurve],
    ) -> bool | None:
        """Whether a refusal proven earlier (:meth:`_prove_refusal`) covers this round (None
        if not; else whether an option worth choosing was refused when it was proven): the
        same keep rates, forced tokens, batch and plain price, no longer blocks (a lone
        draft's options at each block size do not depend on the limit; other chains' need the
        same limit), no more savings than it was proven for and no tier's catching up cheaper
        (its cost curve at the lag, and past the forced tokens: what the chains price)."""
        proof = self._refusals.get((key, budget.base))
        if proof is None:
            return None
        limit, savings, behind, refused = proof
        blocks = max_k <= limit if len(chain.stages) == 1 else max_k == limit
        if not blocks or budget.savings > savings:
            return None
        forced = key[2]
        for tier, then in behind.items():
            now, curve = lags.get(tier, 0), costs[tier]
            if any(curve(now + f) < curve(then + f) for f in {0, forced}):
                return None  # catching up is cheaper than when it was proven
        return refused

    def _prove_refusal(
        self,
        chain: Chain,
        key: BoundKey,
        max_k: int,
        budget: policy.Budget,
        lags: Mapping[str, int],
        costs: Mapping[str, CostCurve],
    ) -> bool | None:
        """Price ``chain`` under :data:`REFUSAL_ROUNDS` rounds more of allowance than this
        round's ``budget``. If even that allows nothing worth choosing, nothing will while the
        savings stay below it and its tiers' catching up costs no less (a larger budget only
        allows more; a catch-up only adds seconds), at these keep rates, batch and plain
        price: :meth:`_refused` then skips pricing it. Exact: a skipped round (this one
        included) chooses what pricing it would have. Returns what :meth:`_refused` would
        (None: not proven). A proof that fails is tried again :data:`REFUSAL_ROUNDS` rounds
        later at the soonest (meanwhile each round prices the chain as it is)."""
        at = (key, budget.base)
        if not math.isfinite(budget.savings) or self._unproven.get(at, -1) > self.rounds:
            return None
        savings = budget.savings + REFUSAL_ROUNDS * policy.EXPLORE_SHARE * budget.base.seconds
        wider = policy.Budget(budget.base, savings)
        pick = self._price(chain, costs, key, max_k, wider, lags)
        if self._chosen(pick, wider):
            self._unproven[at] = self.rounds + REFUSAL_ROUNDS
            return None
        self._refusals[at] = (max_k, savings, dict(lags), pick.refused)
        return pick.refused

    def _keeps(self, chain: Chain) -> tuple[Keep, ...]:
        """The keep rate of each stage of a model chain at its upper confidence bound
        (:data:`~.estimates.EXPLORE`), so that an untried chain gets tried."""
        rates = (self.chain_keep.optimistic(s.name, self.rounds) for s in chain.stages)
        return tuple((r, r) for r in rates)

    def _bound(
        self, chain: Chain, keeps: tuple[Keep, ...], max_k: int, forced: int, priced: Priced
    ) -> Option | None:
        """The best option of a model chain at these keep rates, caught up and without a
        budget: the most it can promise until its keep rates change (which takes a round of
        it) or the batch does, cached."""
        costs, batch = priced
        key = (chain.name, keeps, forced, batch)
        cached = self._bounds.get(key)
        if cached is not None:
            limit, best = cached
            # a lone draft's options at each block size do not depend on the limit: the best
            # of a longer limit is the best of this one when its block fits (the first of equals)
            reuse = len(chain.stages) == 1 and best is not None and best.k <= max_k <= limit
            if limit == max_k or reuse:
                return best
        pick = chain.price(costs, keeps, max_k, overhead=self.overhead, forced=forced, batch=batch)
        self._bounds[key] = (max_k, pick.best)
        return pick.best

    def _priced(self) -> Priced:
        """The cost curves and the rest of the batch this round is priced with: alone, or
        this slot's tokens at the margin of the other slots' target batch."""
        rest = self.load.load() if self.load is not None else None
        if rest is None or rest.slots == 0:
            return self.costs, policy.SOLO
        c_t = self.costs["target"]
        costs = {**self.costs, "target": c_t.after(rest.size)}
        seconds = c_t(rest.size) + rest.slots * self.overhead
        return costs, policy.Batch(rest.tokens, seconds, rest.slots)

    # --- running ---------------------------------------------------------------------------

    def run(self, committed: list[int], room: int) -> list[int]:
        if self.answer_start is None:
            self.answer_start = len(committed)
            for lookup in self.lookups.values():
                lookup.start(self.answer_start)
        # A grammar's forced tokens come first, free: every option is priced after them.
        forced = self.runner.forced_tokens(committed, room - 1)
        ctx = [*committed, *forced] if forced else committed
        left = room - 1 - len(forced)
        max_k = min(self.max_k, left) if left > 0 else 0
        offers = self._offers(ctx, max_k) if max_k > 0 else {}
        priced = self._priced()
        costs, batch = priced
        plain = price_plain(costs["target"], self.overhead, batch=batch)
        base = price_plain(costs["target"], self.overhead, len(forced), batch) if forced else plain
        self._settle(committed, plain)
        # An answer copying its prompt bets as llama.cpp does, bounded by its estimates alone.
        copying = any(o.copying for o in offers.values())
        budget = policy.Budget(base) if copying else self.ledger.budget(base)
        picks = self.picks(ctx, max_k, offers, budget, len(forced), priced) if max_k > 0 else {}
        choice = policy.choose(base, [p.allowed for p in picks.values()])
        if choice is base and any(p.refused for p in picks.values()):
            self.auto.unfunded += 1
        for name, offer in offers.items():
            shadow = picks.get(name, Pick()).best
            if choice is base and shadow is not None and not forced:
                self._shadow(committed, name, offer, shadow, base)
        for name, pick in picks.items():
            if pick.best is not None:
                self.auto.outlook[name] = pick.best.rate / base.rate
        keep = self._draft_keep(choice)
        new, proposed = self._execute(choice, committed, offers, forced, costs, keep)
        if self.load is not None:
            self.load.report(len(forced) + proposed + 1, len(new))
        self.rounds += 1
        self.auto.record(choice.chain, proposed, len(new), self.lossy[choice.chain])
        if choice is not plain:  # what this round saved (or lost) against plain decoding
            booked = self._as_run(choice, proposed, len(forced), costs, keep)
            self.ledger.round(booked, len(new), plain)
        self.auto.savings = self.ledger.savings
        self.auto.shadow_credit = self.ledger.shadow_credit
        return new

    def _draft_keep(self, choice: Option) -> float | None:
        """The keep rate a lone draft's round is priced at (None for any other chain): its
        stage's upper confidence bound as :meth:`picks` priced it (:meth:`_keeps`), read before
        the round teaches it. Where the draft stops (:meth:`_admit`) and how the round is booked
        (:meth:`_as_run`) both use it, so that both agree with the price it was chosen at."""
        chain = self.chains[choice.chain]
        if chain.plain or chain.lookup or len(chain.stages) > 1:
            return None
        return self._keeps(chain)[0][0]

    def _as_run(
        self,
        choice: Option,
        proposed: int,
        forced: int,
        costs: Mapping[str, CostCurve],
        keep: float | None,
    ) -> Option:
        """``choice`` as its round ran, for the ledger: a lone draft (``keep``: the keep rate it
        was priced at, :meth:`_draft_keep`; None for other chains) stops where :meth:`_admit`
        says, so the round is booked at the block it proposed (:func:`~.chains.draft_seconds`,
        the draft's evaluation that found the token it refused included), not at the block it
        was chosen for. Booked at the chosen block, a round whose draft stopped at once was
        charged a whole long block (on a split 32B's curve 1.2 s for a 0.27 s round): the
        savings ran dry and plain decoding ran where the draft paid. Both blocks are priced as
        ``choice`` was (``costs``: the curves of the round's batch; ``keep``, not the mean the
        round then taught), so the booking differs from its price by the blocks alone."""
        if keep is None or proposed == choice.k:
            return choice
        chain = self.chains[choice.chain]
        target, model = costs["target"], costs[chain.bottom]
        ran = draft_seconds(target, model, keep, proposed, forced=forced, stopped=True)
        chosen = draft_seconds(target, model, keep, choice.k, forced=forced)
        return replace(choice, k=proposed, seconds=choice.seconds - chosen + ran)

    def _offers(self, context: Sequence[int], max_k: int) -> dict[str, Offer]:
        """The block each drafter with no model offers after ``context``, by chain name."""
        out = {}
        for name, lookup in self.lookups.items():
            offer = lookup.offer(context, max_k)
            if offer is not None:
                out[name] = offer
        return out

    def _shadow(
        self, committed: Sequence[int], name: str, offer: Offer, option: Option, base: Option
    ) -> None:
        """Keep the block of ``name`` this plain round did not propose (``option``: its best
        block without a budget), when it was worth it."""
        if option.rate >= base.batch.factor(policy.MIN_GAIN) * base.rate:
            self.shadows.append(Shadow(len(committed), name, offer, option))

    def _settle(self, committed: Sequence[int], base: Option) -> None:
        """Settle the shadows the committed tokens now decide: the target kept (or sampled)
        their first ``kept`` tokens, exactly what verifying them would have kept under greedy
        decoding, and as likely under sampling."""
        pending = []
        for s in self.shadows:
            block = s.block
            seen = committed[s.at : s.at + len(block)]
            kept = common_prefix(block, seen)
            if kept == len(seen) < len(block):
                pending.append(s)  # not decided yet
                continue
            self.lookups[s.lookup].learn(s.offer, len(block), kept)
            self.ledger.shadow((kept + 1) * base.seconds - s.option.seconds)
            self.auto.shadows += 1
        self.shadows = pending

    def _execute(
        self,
        choice: Option,
        committed: list[int],
        offers: Mapping[str, Offer],
        forced: list[int],
        costs: Mapping[str, CostCurve],
        keep: float | None,
    ) -> tuple[list[int], int]:
        """Run ``choice`` after the grammar's ``forced`` tokens (``costs``: the cost curves it
        was priced with; ``offers``: the blocks it was priced with; ``keep``: a lone draft's
        keep rate it was priced at, :meth:`_draft_keep`); the committed tokens and how many
        were drafted."""
        chain = self.chains[choice.chain]
        if chain.plain and not forced:
            return self.runner.plain(committed), 0
        if chain.plain:  # the forced tokens and the target's next one in one batch, none drafted
            name, first = next(iter(self.lookups.items()))  # the n-gram's chain verifies them
            r = self.runner.speculate(self.chains[name], first.proposer, committed, forced, 0)
            return r.tokens, 0
        proposer = self._proposer(chain, choice, costs, keep)
        lookup = self.lookups.get(chain.name)
        k = choice.k if lookup is not None else self.spec.max_block
        r = self.runner.speculate(chain, proposer, committed, forced, k)
        if lookup is not None:
            lookup.learn(offers[chain.name], r.proposed, r.kept)
            return r.tokens, r.proposed
        if r.proposed == 0 and keep is not None:
            # A lone draft withheld its first token (:meth:`_admit`): the round committed what
            # plain decoding would, a draft step dearer. Taught as a refused token: nothing
            # else would teach the chain's keep rate, whose upper bound only grows with the
            # rounds, and a head too unsure to propose was chosen every few rounds forever.
            self.chain_keep.record(chain.top.name, 1, 0)
        else:
            self.chain_keep.record(chain.top.name, r.proposed, r.kept)
        if isinstance(proposer, DraftProposer) and proposer.top_probs:
            self.chain_keep.record_confidence(proposer.top_probs, r.kept)
        return r.tokens, r.proposed

    def _proposer(
        self, chain: Chain, choice: Option, costs: Mapping[str, CostCurve], keep: float | None
    ) -> Proposer:
        """The proposer of ``choice``: a drafter with no model (which proposes the block
        ``choice`` was priced by), or ``chain``'s models: a lone draft (``keep`` not None)
        stops where its next token no longer pays (:meth:`_admit`); a pyramid's checks teach
        its first stage's keep rate."""
        pyramid = len(chain.stages) > 1
        lookup = self.lookups.get(chain.name)
        return self.runner.build_proposer(
            chain,
            k=choice.k,
            l_d=choice.l_d,
            admit=None if keep is None else self._admit(choice, costs, keep),
            lookup=None if lookup is None else lookup.proposer,
            observe=self._observe(chain.stages[0].name) if pyramid else None,
        )

    def _observe(self, stage: str) -> Observe:
        """Record each of a pyramid's qualifier checks into the keep rate of ``stage``."""

        def observe(proposed: int, kept: int) -> None:
            self.chain_keep.record(stage, proposed, kept)

        return observe

    def _admit(self, choice: Option, costs: Mapping[str, CostCurve], keep: float) -> Admit:
        """Propose one more drafted token while the expected tokens it adds (the chance that
        it and every one before it are kept) pay for its share of the verification at the
        rate the round was chosen for, looking ahead: a token also pays when drafting on to a
        longer block whose verification costs little more does (:func:`~.policy.lookahead`: a
        curve that falls past op offload makes the next token dear and the 32nd cheap). Each
        token also pays the draft's step that follows it. Priced as the round was: ``costs``,
        the curves of its batch (the target's at the margin of the other slots'), and
        ``keep``, the keep rate it was priced at (:meth:`_draft_keep`; the mean instead let a
        doubt stick: a refused first token teaches nothing)."""
        rate = choice.rate
        chain = self.chains[choice.chain]
        step = costs[chain.bottom](1)
        limits = policy.lookahead(costs["target"], keep, self.spec.max_block, step)

        def admit(tops: list[float]) -> bool:
            n = len(tops)
            reach = 1.0
            for p in tops:
                reach *= self.chain_keep.token(p)
            return n > len(limits) or reach >= rate * limits[n - 1]

        return admit

    def sync(self, committed: Sequence[int]) -> None:
        """Nothing to do: each tier rolls back to the committed text when next used."""
