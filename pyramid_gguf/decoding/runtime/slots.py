"""Parallel slots: the one admission of requests, the threads that decode them, the sequences.

A :class:`SlotPool` holds ``parallel`` slots of one loaded :class:`~.tiers.Ladder` (every
model's context holds that many sequences, ``LoadConfig.parallel``). A :class:`Slot` is a
sequence id in every tier: its own ladder of :class:`~pyramid_gguf.native.SequenceView` tiers,
whose evaluations go through the pool's :class:`~.batcher.Batcher`, so the rounds, proposers
and verifications that decode one sequence decode it unchanged in a batch of many.

The pool is also where every request enters, whoever asks (the Python API, the server):
:meth:`SlotPool.submit` admits a :class:`Job` (at most ``queue_size`` at once, the running ones
included, else :class:`QueueFull`) and one of ``parallel`` worker threads runs it: its ``work``
takes a slot (:meth:`SlotPool.take`: the free slot whose cache shares the longest prefix with its
prompt, llama-server's prompt reuse; where another slot's cache, busy or free, holds a longer prefix
of it, the slot takes those cells unevaluated,
:meth:`~pyramid_gguf.native.model.NativeModel.share_prefix`), decodes, and hands each result to its
reader on that thread: the one boundary between the reader and the slot (the reader only queues it,
so no reader's pace holds up a batch). :meth:`Job.cancel` is the one cancel signal (a reader gone, a
client gone, the server stopping): the work stops at its next token and the slot is free at once;
what its cache holds stays for the next prompt that starts the same way.
The one-request path is the same machine with one slot.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from ...native import SequenceView
from .batcher import GATHER_SECONDS, BatchCounters, Batcher, Load
from .tiers import Ladder, ModelTier, common_prefix


class QueueFull(RuntimeError):
    """Every place of the pool's queue is taken (the server answers 503)."""


class PoolClosed(RuntimeError):
    """The pool is shutting down and takes no new request."""


class Expected:
    """A request announced to a :class:`SlotPool` before it is submitted
    (:meth:`SlotPool.expect`); :meth:`release` (idempotent) withdraws it."""

    __slots__ = ("_pool",)

    def __init__(self, pool: SlotPool) -> None:
        self._pool = pool

    def release(self) -> None:
        self._pool._unexpect(self)


#: The announcement (:meth:`SlotPool.announced`) of the request the current context serves.
_ANNOUNCED: ContextVar[Expected | None] = ContextVar("pyramid_announced", default=None)


class Job:
    """One admitted request. ``work(job)`` runs on a worker thread of the pool: it takes a slot
    with :meth:`SlotPool.take`, decodes, hands what it produces to its reader, and returns
    whether it ended by being cancelled (counted apart from the completed ones)."""

    def __init__(self, prompt: Sequence[int], work: Callable[[Job], bool]) -> None:
        self.prompt = list(prompt)
        self.work = work
        self._cancelled = threading.Event()
        self._finished = threading.Event()
        #: Whether the job has taken a slot and joined the batches.
        self.joined = False

    def cancel(self) -> None:
        """Stop the work at its next token (or before it starts); the slot is then free."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def finished(self) -> bool:
        """The work has returned and the job left the pool."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the work has returned (True) or ``timeout`` seconds passed (False)."""
        return self._finished.wait(timeout)


@dataclass
class Slot:
    """One sequence id in every tier, and the ladder of views that decodes it."""

    seq: int
    ladder: Ladder
    batcher: Batcher
    busy: bool = False
    #: Taken by a request that has not joined the batches yet (it is adopting a prefix).
    joining: bool = False
    #: Requests this slot has served.
    served: int = 0
    #: When it was last taken (the pool's count of requests then).
    last_used: int = 0

    def held(self) -> list[int]:
        """The tokens the target's cache of this slot holds."""
        return self.ladder.target.model.tokens

    def reuse(self, prompt: Sequence[int]) -> tuple[int, int]:
        """Prompt tokens the target's cache of this slot already holds, and cached tokens
        ``prompt`` would throw away."""
        held = self.held()
        kept = common_prefix(held, prompt)
        return kept, len(held) - kept

    def load(self) -> Load:
        """The rest of the batch, as this slot sees it."""
        return self.batcher.load(self.seq)

    def report(self, size: int, committed: int) -> None:
        """This slot's round brought ``size`` tokens to the target, committed ``committed``."""
        self.batcher.report(self.seq, size, committed)


@dataclass(frozen=True)
class PoolSnapshot:
    """What the pool is doing, read at one moment (``/health`` and ``/metrics``)."""

    slots: int
    busy: int
    #: Admitted requests waiting for a worker.
    queued: int
    queue_size: int | None
    completed: int
    cancelled: int
    rejected: int
    #: Tokens held in every tier's KV cache, all slots together.
    cached_tokens: int
    #: Admitted requests not yet finished and counted (queued, waiting for a slot or running):
    #: 0 only once every one is in ``completed`` or ``cancelled``.
    admitted: int = 0
    batches: BatchCounters = field(default_factory=BatchCounters)
    #: Per slot, in slot order: whether it is decoding, and the tokens its target cache holds.
    slot_busy: tuple[bool, ...] = ()
    slot_cached: tuple[int, ...] = ()
    #: Prompt tokens a slot's target cache took from another slot's instead of evaluating them.
    shared_tokens: int = 0


class SlotPool:
    """The slots of ``ladder`` (``parallel`` of them, its contexts' sequence count), the
    queue that admits requests to them (``queue_size``; None: unbounded) and one worker thread
    per slot."""

    def __init__(self, ladder: Ladder, queue_size: int | None = None) -> None:
        self.ladder = ladder
        models = ladder.models
        self.n_slots = min(m.loaded.n_seq for m in models)
        self.queue_size = queue_size
        self.batcher = Batcher(
            [m.loaded for m in models], [m.name for m in models], arriving=self._arriving
        )
        self.slots = [
            Slot(seq, self._slot_ladder(seq), self.batcher) for seq in range(self.n_slots)
        ]
        self._cond = threading.Condition()
        self._exclusive = False
        self._taken = 0
        self._queue: deque[Job] = deque()
        #: Admitted jobs (queued or running) and, of those, the ones not yet in a batch.
        self._admitted = 0
        self._not_joined = 0
        #: Requests announced but not yet submitted (:meth:`expect`): when each was announced.
        self._expected: dict[Expected, float] = {}
        self._expected_lock = threading.Lock()
        self._running: set[Job] = set()
        self._workers: list[threading.Thread] = []
        self._closing = False
        self._completed = self._cancelled = self._rejected = 0
        #: Per model (smallest first): whether its slots' sequences may share a prefix.
        self._shares = [m.loaded.can_share for m in models]
        self._shared = 0

    def _slot_ladder(self, seq: int) -> Ladder:
        """The ladder seen from sequence ``seq``: each tier a view of the loaded model."""

        def view(tier: ModelTier) -> ModelTier:
            seq_view = SequenceView(tier.loaded, seq, self.batcher.evaluate, self.batcher.lock)
            return ModelTier(tier.name, tier.loaded, seq_view)

        ladder, draft = self.ladder, self.ladder.draft
        return Ladder(
            view(ladder.target),
            view(ladder.qualifier) if ladder.qualifier is not None else None,
            view(draft) if isinstance(draft, ModelTier) else draft,
        )

    # --- admission -----------------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], work: Callable[[Job], bool]) -> Job:
        """Admit a request for ``prompt`` whose ``work`` runs on a worker thread
        (:class:`QueueFull` when ``queue_size`` requests are admitted already,
        :class:`PoolClosed` once the pool is closing)."""
        with self._cond:
            if self._closing:
                raise PoolClosed("the models are being closed")
            if self.queue_size is not None and self._admitted >= self.queue_size:
                self._rejected += 1
                raise QueueFull(f"the server is busy ({self.queue_size} requests queued)")
            job = Job(prompt, work)
            self._admitted += 1
            self._not_joined += 1
            if (announced := _ANNOUNCED.get()) is not None:
                announced.release()  # admitted now, no longer only announced
            self._queue.append(job)
            if len(self._workers) < min(self._admitted, self.n_slots):
                worker = threading.Thread(
                    target=self._serve, name=f"pyramid-slot-{len(self._workers)}", daemon=True
                )
                self._workers.append(worker)
                worker.start()
            self._cond.notify_all()
        return job

    def expect(self) -> Expected:
        """Announce a request that is being read and is about to be submitted (a server's
        request whose body is being parsed and whose prompt is being tokenized): for at most
        :data:`~.batcher.GATHER_SECONDS` from now, until the handle is released or the request
        is submitted, a batch about to run waits for it as for an admitted request
        (:meth:`_arriving`), so that requests sent together start in one batch although the
        first is admitted before the others are read."""
        handle = Expected(self)
        with self._expected_lock:
            self._expected[handle] = time.perf_counter()
        return handle

    @contextmanager
    def announced(self) -> Iterator[Expected]:
        """:meth:`expect` for the request the current task (its context) serves, released when
        the block ends; the first :meth:`submit` in that context takes its place, at once (no
        moment when it is neither announced nor admitted)."""
        handle = self.expect()
        token = _ANNOUNCED.set(handle)
        try:
            yield handle
        finally:
            handle.release()
            _ANNOUNCED.reset(token)

    def _unexpect(self, handle: Expected) -> None:
        with self._expected_lock:
            self._expected.pop(handle, None)

    def _announced(self) -> int:
        """Requests announced in the last :data:`~.batcher.GATHER_SECONDS` and not yet
        released: one that takes longer (a slow upload) no longer holds the batches."""
        since = time.perf_counter() - GATHER_SECONDS
        with self._expected_lock:
            return sum(1 for t in self._expected.values() if t > since)

    def _serve(self) -> None:
        """A worker thread: run admitted jobs in order until the pool closes."""
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                job = self._queue.popleft()
                self._running.add(job)
            cancelled = True
            try:
                cancelled = job.work(job)
            finally:
                with self._cond:
                    self._running.discard(job)
                    self._admitted -= 1
                    if not job.joined:
                        self._not_joined -= 1
                    if cancelled:
                        self._cancelled += 1
                    else:
                        self._completed += 1
                    self._cond.notify_all()
                job._finished.set()

    def _arriving(self) -> int:
        """Admitted or announced (:meth:`expect`) requests about to join the batches (a slot
        is free for them, or they hold one and are taking its cached prefix): the batcher
        gathers them into the batch it is about to run (read without the pool's lock)."""
        joining = sum(s.joining for s in self.slots)
        free = self.n_slots - sum(s.busy for s in self.slots)
        coming = self._not_joined + (self._announced() if self._expected else 0)
        return max(min(coming, free + joining), 0)

    # --- slots ---------------------------------------------------------------------------------

    @contextmanager
    def take(self, job: Job) -> Iterator[Slot | None]:
        """The free slot that serves ``job``'s prompt best (:func:`choose`), in the batches
        while the block runs; None when the job is cancelled while it waits (only calibration
        holds every slot: a worker always finds one free otherwise)."""
        slot = self._acquire(job)
        if slot is None:
            yield None
            return
        self.batcher.join(slot.seq)
        with self._cond:
            job.joined, slot.joining = True, False
            self._not_joined -= 1
        try:
            yield slot
        finally:
            self.batcher.leave(slot.seq)
            with self._cond:
                slot.busy = False
                self._cond.notify_all()

    def _acquire(self, job: Job) -> Slot | None:
        with self._cond:
            while self._exclusive or all(s.busy for s in self.slots):
                if job.cancelled:
                    return None
                self._cond.wait(timeout=0.1)
            free = [s for s in self.slots if not s.busy]
            slot = choose(free, job.prompt, sharing=self._shares[-1])
            self._taken += 1
            slot.busy, slot.joining, slot.last_used = True, True, self._taken
            slot.served += 1
        for mine, base in zip(slot.ladder.models, self.ladder.models, strict=True):
            mine.chunk = base.chunk  # --strict-identity's micro-batch, set by calibration
        if any(self._shares) and job.prompt:
            try:
                # waits for a running batch (the lock): the batch after it waits for this slot
                self._adopt(slot, job.prompt)
            except BaseException:
                with self._cond:
                    slot.busy = slot.joining = False
                    self._cond.notify_all()
                raise
        return slot

    def _adopt(self, slot: Slot, prompt: Sequence[int]) -> None:
        """Give ``slot``, per model, the longest prefix of ``prompt`` another slot's cache holds
        (busy or free), where that is longer than its own: those cells, not evaluated again."""
        with self.batcher.lock:  # no batch, rollback or clear runs meanwhile
            for i, tier in enumerate(slot.ladder.models):
                if not self._shares[i]:
                    continue
                own = best = common_prefix(tier.model.tokens, prompt)
                donor: Slot | None = None
                for other in self.slots:
                    if other is not slot:
                        kept = common_prefix(other.ladder.models[i].model.tokens, prompt)
                        if kept > best:
                            donor, best = other, kept
                if donor is None:
                    continue
                tier.loaded.share_prefix(donor.seq, slot.seq, best)
                if tier.name == "target":
                    self._shared += best - own

    @property
    def busy(self) -> int:
        """Slots running a request now."""
        return sum(s.busy for s in self.slots)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Wait for every slot to be free and hold them all (to calibrate the models)."""
        with self._cond:
            while self._exclusive or any(s.busy for s in self.slots):
                self._cond.wait()
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    # --- what it is doing, and the end ---------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """The pool's figures now (read without stopping the engine)."""
        with self._cond:
            flags = tuple(s.busy for s in self.slots)
            counts = (len(self._queue), self._completed, self._cancelled, self._rejected)
            admitted = self._admitted
        cached = sum(len(m.model.tokens) for s in self.slots for m in s.ladder.models)
        held = tuple(len(s.held()) for s in self.slots)
        queued, completed, cancelled, rejected = counts
        return PoolSnapshot(
            slots=self.n_slots,
            busy=sum(flags),
            queued=queued,
            queue_size=self.queue_size,
            completed=completed,
            cancelled=cancelled,
            rejected=rejected,
            cached_tokens=cached,
            admitted=admitted,
            batches=self.batcher.counters(),
            slot_busy=flags,
            slot_cached=held,
            shared_tokens=self._shared,
        )

    def close(self) -> None:
        """Stop taking requests, cancel every admitted one and wait for the workers (before
        the models are freed)."""
        with self._cond:
            self._closing = True
            jobs = [*self._running, *self._queue]
            self._cond.notify_all()
        for job in jobs:
            job.cancel()
        for worker in list(self._workers):
            worker.join()


def choose(free: Sequence[Slot], prompt: Sequence[int], *, sharing: bool = False) -> Slot:
    """The free slot whose cache serves ``prompt`` best: the longest cache that ``prompt``
    continues (an empty one continues anything, so a conversation's next turn finds its own
    slot and a new conversation takes an empty slot rather than another's), unless cutting
    another cache reuses more than it throws away; with no cache to continue, the one that
    reuses the most for the least thrown away. The least recently used among equals
    (llama-server picks by prompt similarity, then least recently used).

    ``sharing``: the slots' caches share prefixes
    (:meth:`~pyramid_gguf.native.model.NativeModel.share_prefix`), so a prefix that another slot
    holds costs nothing wherever the prompt goes; with no cache to continue, the prompt then goes
    where its own prefix is longest (its conversation's slot, whose tail it rewrites), then where
    the least is thrown away."""
    reuse = {s.seq: s.reuse(prompt) for s in free}

    def net(s: Slot) -> tuple[int, int]:
        kept, lost = reuse[s.seq]
        return kept - lost, -s.last_used

    def longest(s: Slot) -> tuple[int, int, int]:
        kept, lost = reuse[s.seq]
        return kept, -lost, -s.last_used

    cut = max(free, key=longest if sharing else net)
    going_on = [s for s in free if reuse[s.seq][1] == 0]
    if not going_on:
        return cut
    best = max(going_on, key=lambda s: (reuse[s.seq][0], -s.last_used))
    kept, lost = reuse[cut.seq]
    return cut if kept > lost and kept > reuse[best.seq][0] else best
