"""One admitted generation's steps, on the worker thread of the slot that decodes it: a slot
taken, the mode's scheduler built on it, and each token turned into a :class:`Response` (its
text UTF-8-safe and cut at a stop string, the target's log-probabilities when asked for); it
ends at the next token once the job is cancelled."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ..core.sampling import SamplingConfig
from ..core.spec import SpecConfig
from ..core.textstream import TextStream
from ..decoding.pricing.costs import CostCurve
from ..decoding.pricing.estimates import KeepMemory
from ..decoding.runtime.engine import decode, make_guide, make_scheduler
from ..decoding.runtime.ngram import NGramPool
from ..decoding.runtime.sampling import Sampler, log_softmax, top_ids
from ..decoding.runtime.slots import Job, SlotPool
from ..decoding.runtime.stats import GenerationStats
from ..native import Vocab
from .calibration import needs_identity_probe
from .steps import END, Response, TokenLogprob

_DROPPED = np.zeros(0, dtype=np.float32)


def generation_steps(
    slots: SlotPool,
    job: Job,
    tokens: list[int],
    sampling: SamplingConfig,
    spec: SpecConfig,
    *,
    costs: Callable[[], dict[str, CostCurve]],
    pool: NGramPool | None = None,
    memory: KeepMemory | None = None,
    logprobs: int | None = None,
    special: bool = False,
) -> Iterator[Response]:
    """The steps of ``job`` (prompt ``tokens``) on one of ``slots``; the last carries the
    finish reason (``cancelled`` when the job was cancelled before a slot was free).

    ``costs``: each tier's cost curve, calibrating when needed (called before a slot is taken:
    calibration needs every slot free). ``pool``: the shared n-gram pool, which this
    generation's tokens join. ``memory``: the keep rates of the ladder's model chains so far,
    which ``auto`` starts from. ``logprobs``: that many alternatives per token (None: none).
    ``special``: render control tokens in the text (for a tool-call parser)."""
    stats = GenerationStats(mode=spec.mode)
    text = TextStream(sampling.stop)
    base = slots.ladder
    vocab = base.target.vocab
    strict = needs_identity_probe(base)  # the identity probe sets the target's micro-batch
    curves = costs() if spec.info.auto or strict else None
    generated: list[int] = []
    with slots.take(job) as slot:
        if slot is None:  # cancelled while every slot was held
            yield Response("", [], "cancelled", stats)
            return
        try:
            ladder = slot.ladder
            sampler = Sampler(sampling, vocab=vocab)  # DRY's breakers are found in it
            guide = make_guide(ladder, sampling, len(tokens))
            scheduler, prefill = make_scheduler(  # a fixed mode's tiers are checked here, once
                ladder, spec, sampler, stats, costs=curves if spec.info.auto else None,
                pool=pool, guide=guide, load=slot, memory=memory,
            )  # fmt: skip
            rows: list[np.ndarray] | None = [] if logprobs is not None else None
            steps = decode(ladder, tokens, scheduler, prefill, sampler, stats, rows, guide)
            try:
                for token in steps:
                    lp: tuple[TokenLogprob, ...] = ()
                    if rows is not None and logprobs is not None:
                        lp = (token_logprob(vocab, token, rows[len(generated)], logprobs),)
                        rows[len(generated)] = _DROPPED  # rows are large: keep none
                    generated.append(token)
                    delta = text.feed(vocab.token_bytes(token, special=special))
                    if text.stopped:
                        stats.finish_reason = "stop"
                        if delta:
                            yield Response(delta, [token], None, stats, lp)
                        break
                    yield Response(delta, [token], None, stats, lp)
                    if job.cancelled:
                        stats.finish_reason = "cancelled"
                        break
            finally:
                steps.close()
        finally:
            if pool is not None:
                pool.add([*tokens, *generated])
    yield Response(text.flush(), [], stats.finish_reason or "length", stats)


def token_logprob(vocab: Vocab, token: int, row: np.ndarray, top: int) -> TokenLogprob:
    """``token``'s log-probability under the target's ``row`` ``[V]``, and ``top`` others
    (under a grammar: the row masked to the allowed tokens, and only those)."""
    lp = log_softmax(row)
    ids = [int(i) for i in top_ids(lp, top) if np.isfinite(lp[i])]
    alts = tuple((i, vocab.token_bytes(i), float(lp[i])) for i in ids)
    return TokenLogprob(token, vocab.token_bytes(token), float(lp[token]), alts)


def job_work(
    steps: Callable[[Job], Iterator[Response]],
    deliver: Callable[[Response | BaseException | None], None],
) -> Callable[[Job], bool]:
    """What a slot's thread runs for a job: each of ``steps(job)`` handed to ``deliver``, then
    the exception that ended it if any (the reader raises it), then ``None`` (the end). Returns
    whether the generation ended by being cancelled (a reader that stops listening after the
    end cancels nothing)."""

    def work(job: Job) -> bool:
        reason: str | None = None
        try:
            for step in steps(job):
                reason = step.finish_reason or reason
                deliver(step)
        except BaseException as e:
            deliver(e)
        finally:
            deliver(END)
        return reason == "cancelled"

    return work
