"""The decoding loop: prompt processing, the first token, then rounds until a stop.

Every mode of docs/ALGORITHMS.md is a :class:`~.rounds.Scheduler` (:func:`make_scheduler`): a
fixed mode's :class:`~.rounds.FixedScheduler` runs its one chain every round (plain decoding,
or a proposer and the target verifying its block in one batch), ``auto``'s
:class:`~.auto.AutoScheduler` picks a chain and a block size each round from the cost model.
A :class:`Generation` holds one sequence's state and advances it one step at a time, driven
from outside, each step one round; :func:`decode` is the same as a generator of token ids.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...core.errors import ContextOverflow, UserError
from ...core.sampling import SamplingConfig
from ...core.spec import SpecConfig
from ...native import grammar_tokenizer
from ..pricing.costs import CostCurve
from ..pricing.estimates import KeepMemory
from .guide import Guide
from .ngram import NGramPool
from .rounds import Scheduler, fixed_scheduler
from .sampling import Sampler
from .stats import GenerationStats, TierStats
from .tiers import Ladder, ModelTier

if TYPE_CHECKING:
    from .auto import SlotLoad


def make_scheduler(
    ladder: Ladder,
    spec: SpecConfig,
    sampler: Sampler,
    stats: GenerationStats,
    *,
    costs: dict[str, CostCurve] | None = None,
    pool: NGramPool | None = None,
    guide: Guide | None = None,
    load: SlotLoad | None = None,
    memory: KeepMemory | None = None,
) -> tuple[Scheduler, list[ModelTier]]:
    """The scheduler of ``spec.mode``'s rounds and the tiers to prefill with the prompt.

    ``auto`` needs ``costs`` (each tier's :class:`CostCurve`, by tier name) and prices its
    rounds against the batch of parallel slots ``load`` says it rides in; ``pool`` lets the
    n-gram drafter search earlier requests; ``guide`` constrains every round (a grammar);
    ``memory``: what the ladder's earlier generations taught ``auto`` of its model chains.
    """
    if spec.info.auto:
        from .auto import AutoScheduler

        if costs is None:
            raise ValueError("mode auto needs the tiers' cost curves")
        auto = AutoScheduler(ladder, spec, sampler, stats, costs, pool, guide, load, memory)
        return auto, [ladder.target]
    return fixed_scheduler(ladder, spec, sampler, stats, pool, guide)


def make_guide(ladder: Ladder, sampling: SamplingConfig, start: int) -> Guide | None:
    """The grammar of a generation whose answer starts at ``start`` (None when
    ``sampling`` asks for none): llguidance's tokenizer of the target's vocabulary, which
    every tier shares."""
    if sampling.grammar is None and not sampling.triggers:
        return None
    target = ladder.target
    vocab = target.vocab
    return Guide(
        grammar_tokenizer(target.model),
        target.n_vocab,
        lambda t: vocab.token_bytes(t, special=True),
        start,
        grammar=sampling.grammar,
        triggers=sampling.triggers,
    )


class Generation:
    """One sequence being generated: its committed tokens, sampler, scheduler and statistics.

    Driven from outside, one :meth:`step` at a time: the first evaluates the prompt (every tier
    in ``prefill`` does so now; the others catch up when first used) and samples the first
    token from the target's last row, as llama.cpp does; each later one runs one round, which
    commits one or more of the target's tokens. A step returns the tokens it emits, ending the
    generation (:attr:`done`, ``stats.finish_reason``) after ``max_tokens`` tokens, at an
    end-of-generation token (not emitted, unless ``ignore_eos``), or when the context is full.
    Prompt processing is timed apart from generation. A consumer that keeps fewer tokens of a
    step (a stop string, a cancellation) says so with :meth:`truncate`; :meth:`close` settles
    the per-tier statistics.

    ``rows``: when given, receives the target's raw logits row ``[V]`` of every emitted token, in
    order (the distribution it was chosen from), for log-probabilities.

    Everything per sequence lives here, so several of them can share one loaded ladder
    (docs/ARCHITECTURE.md, "Many sequences").
    """

    def __init__(
        self,
        ladder: Ladder,
        prompt: Sequence[int],
        scheduler: Scheduler,
        prefill: Sequence[ModelTier],
        sampler: Sampler,
        stats: GenerationStats,
        rows: list[np.ndarray] | None = None,
        guide: Guide | None = None,
    ) -> None:
        self.n_ctx = min(m.n_ctx for m in ladder.models)
        if not prompt:
            raise UserError("the prompt is empty")
        if len(prompt) >= self.n_ctx:
            raise ContextOverflow(
                f"prompt of {len(prompt)} tokens does not fit the context of {self.n_ctx} tokens "
                "(raise --ctx-size or shorten the prompt)"
            )
        self.ladder = ladder
        self.prompt = list(prompt)
        self.scheduler = scheduler
        self.prefill = list(prefill)
        self.sampler = sampler
        self.stats = stats
        self.rows = rows
        #: The answer's grammar (None: unconstrained), stepped with the committed tokens.
        self.guide = guide
        #: The prompt and every token committed after it (an end-of-generation token included).
        self.committed = list(prompt)
        self.done = False
        self._started = False
        self._last: list[int] = []
        self._t_gen = 0.0
        self._before = {m.name: m.timer.snapshot() for m in ladder.models}
        self._after_prompt = dict(self._before)
        stats.prompt_tokens = len(prompt)

    def step(self) -> list[int]:
        """Commit the next tokens and return those emitted (possibly none, when it ends)."""
        if self.done:
            return []
        if not self._started:
            new = self._start()
        else:
            room = self._room()
            self.scheduler.sync(self.committed)  # roll back what the last round evaluated
            new = self.scheduler.run(self.committed, room)[:room]
            if self.rows is not None:
                self.rows += self.scheduler.runner.take_rows()[: len(new)]
        out = self._emit(new)
        self.stats.generation_seconds = time.perf_counter() - self._t_gen
        if not self.done and self._room() <= 0:
            self._finish("length")
        return out

    def truncate(self, kept: int) -> None:
        """Only the first ``kept`` tokens of the last step were used: the generation ends, and
        the rest are not counted as generated."""
        self.stats.generated_tokens -= max(len(self._last) - kept, 0)
        self.done = True

    def close(self) -> None:
        """Settle the statistics: generation time, and each tier's work since the start."""
        self.done = True
        if self.guide is not None:
            self.stats.grammar_seconds = self.guide.seconds
        if self._started:
            self.stats.generation_seconds = time.perf_counter() - self._t_gen
        self.stats.tiers = [
            _tier_stats(m, self._before[m.name], self._after_prompt[m.name])
            for m in self.ladder.models
            if m.timer.snapshot() != self._before[m.name]
        ]

    def _start(self) -> list[int]:
        """The prompt in one batch per prefilled tier, then the first token."""
        self._started = True
        target = self.ladder.target
        t0 = time.perf_counter()
        row = target.prefill(self.prompt, logits=True)
        for model in self.prefill:
            if model is not target:
                model.prefill(self.prompt)
        self.stats.prompt_seconds = time.perf_counter() - t0
        self._after_prompt = {m.name: m.timer.snapshot() for m in self.ladder.models}
        prefilled = self._after_prompt["target"][1] - self._before["target"][1]
        self.stats.prompt_evaluated = prefilled
        self._t_gen = time.perf_counter()
        if self.guide is not None:
            row = self.guide.mask(self.prompt, row)
        if self.rows is not None:  # the target's row of every committed token, in order
            self.scheduler.runner.keep_rows = True
            self.rows.append(row)
        return [self.sampler.pick(self.sampler.prepare(self.prompt, row))]

    def _emit(self, new: Sequence[int]) -> list[int]:
        """Commit ``new`` up to ``max_tokens``, ending at an end-of-generation token, or where a
        lazy grammar's trigger appears (the round's tokens after it were chosen without it)."""
        cfg: SamplingConfig = self.sampler.cfg
        out: list[int] = []
        for token in new[: cfg.max_tokens - self.stats.generated_tokens]:
            self.committed.append(token)
            if self.ladder.target.is_eog(token) and not cfg.ignore_eos:
                self._finish("stop")
                break
            out.append(token)
            if self.guide is not None and self.guide.observe(self.committed):
                break  # a lazy grammar starts here: the round's later tokens ignored it
        self.stats.generated_tokens += len(out)
        if self.rows is not None:
            del self.rows[self.stats.generated_tokens :]
        self._last = out
        return out

    def _room(self) -> int:
        """Tokens this generation may still commit."""
        left = self.sampler.cfg.max_tokens - self.stats.generated_tokens
        return min(left, self.n_ctx - len(self.committed))

    def _finish(self, reason: str) -> None:
        self.stats.finish_reason = reason
        self.done = True


def decode(
    ladder: Ladder,
    prompt: Sequence[int],
    scheduler: Scheduler,
    prefill: Sequence[ModelTier],
    sampler: Sampler,
    stats: GenerationStats,
    rows: list[np.ndarray] | None = None,
    guide: Guide | None = None,
) -> Generator[int, None, None]:
    """Yield a :class:`Generation`'s tokens one at a time, filling ``stats`` as it goes (the
    caller stops pulling to end it early)."""
    gen = Generation(ladder, prompt, scheduler, prefill, sampler, stats, rows, guide)
    try:
        while not gen.done:
            new = gen.step()
            for i, token in enumerate(new):
                try:
                    yield token
                except GeneratorExit:
                    gen.truncate(i + 1)
                    raise
    finally:
        gen.close()


def _tier_stats(
    tier: ModelTier, before: tuple[int, int, float], prefill: tuple[int, int, float]
) -> TierStats:
    """Work since ``before``; prompt processing is counted in tokens but not in evals."""
    n_evals, n_tokens, seconds = tier.timer.snapshot()
    return TierStats(
        tier.name,
        n_evals=n_evals - prefill[0],
        n_tokens=n_tokens - before[1],
        seconds=seconds - before[2],
    )
