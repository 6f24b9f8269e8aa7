"""Parallel slots: each loaded model's sequences, one per request being generated.

A :class:`SlotPool` holds ``parallel`` slots of one loaded :class:`~.tiers.Ladder` (every
model's context holds that many sequences, ``LoadConfig.parallel``). A :class:`Slot` is a
sequence id in every tier: its own ladder of :class:`SlotModel` views, whose evaluations go
through the pool's :class:`~.batcher.Batcher`, so the rounds, proposers and verifications that
decode one sequence decode it unchanged in a batch of many. A request takes the free slot
whose cache shares the longest prefix with its prompt (llama-server's prompt reuse), runs
(:meth:`SlotPool.running`) and gives the slot back; what the slot's cache holds stays there
for the next prompt that starts the same way. The one-request path is the same machine with one
slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ...native import EvalTimer, NativeModel, Part
from .batcher import Batcher, Load
from .tiers import Ladder, ModelTier, common_prefix


class SlotModel(NativeModel):
    """Sequence ``seq`` of a loaded model, evaluated through ``batcher``.

    It shares the loaded model's weights, context and facts (it owns no native object:
    :meth:`close` does nothing) and keeps its own timer, so each slot's statistics count its
    own share of the batches it rode in.
    """

    def __init__(self, base: NativeModel, seq: int, batcher: Batcher) -> None:
        # Not NativeModel.__init__: nothing is loaded, everything is the base's.
        self._base = base
        self.seq = seq
        self.batcher = batcher
        self.cfg = base.cfg
        self.path = base.path
        self._model = base._model
        self.placement = base.placement
        self.weight_buffers = base.weight_buffers
        self.vocab = base.vocab
        self.n_vocab = base.n_vocab
        self.n_ctx = base.n_ctx
        self.n_batch = base.n_batch
        self.n_seq = 1
        self.timer = EvalTimer()

    @property
    def base(self) -> NativeModel:
        return self._base

    @property
    def tokens(self) -> list[int]:
        return self._base.held(self.seq)

    @property
    def n_past(self) -> int:
        return len(self._base.held(self.seq))

    def held(self, seq: int) -> list[int]:
        return self._base.held(self.seq)

    def eval(
        self, tokens: Sequence[int], logits_at: Sequence[int] = (), *, chunk: int = 0, seq: int = 0
    ) -> np.ndarray:
        """Append ``tokens`` to this slot's sequence in the next batch of this tier."""
        part = Part(self.seq, tokens, logits_at)
        return self.batcher.evaluate(self._base, part, chunk, self.timer)

    def eval_parts(self, parts: Sequence[Part], *, chunk: int = 0) -> list[np.ndarray]:
        raise TypeError("a slot evaluates its own sequence: use eval()")

    @property
    def snapshot_reason(self) -> str | None:
        return self._base.snapshot_reason

    def rollback(self, n_past: int, seq: int = 0) -> None:
        with self.batcher.lock:
            self._base.rollback(n_past, self.seq)

    def clear(self, seq: int = 0) -> None:
        with self.batcher.lock:
            self._base.clear(self.seq)

    def reset(self) -> None:
        self.clear()

    def close(self) -> None:
        """Nothing: the loaded model owns the context."""


@dataclass
class Slot:
    """One sequence id in every tier, and the ladder of views that decodes it."""

    seq: int
    ladder: Ladder
    batcher: Batcher | None = None
    busy: bool = False
    #: Requests this slot has served.
    served: int = 0
    #: When it was last taken (the pool's count of requests then).
    last_used: int = 0

    def reuse(self, prompt: Sequence[int]) -> tuple[int, int]:
        """Prompt tokens the target's cache of this slot already holds, and cached tokens
        ``prompt`` would throw away."""
        held = self.ladder.target.model.tokens
        kept = common_prefix(held, prompt)
        return kept, len(held) - kept

    def load(self) -> Load:
        """The rest of the batch, as this slot sees it."""
        return self.batcher.load(self.seq) if self.batcher is not None else Load()

    def report(self, size: int, committed: int) -> None:
        """This slot's round brought ``size`` tokens to the target, committed ``committed``."""
        if self.batcher is not None:
            self.batcher.report(self.seq, size, committed)


class SlotPool:
    """The slots of ``ladder`` (``parallel`` of them, its contexts' sequence count)."""

    def __init__(self, ladder: Ladder) -> None:
        self.ladder = ladder
        models = ladder.models
        self.n_slots = min(m.model.n_seq for m in models)
        self.batcher = Batcher([m.model for m in models], [m.name for m in models])
        self.slots = [
            Slot(seq, _slot_ladder(ladder, seq, self.batcher), self.batcher)
            for seq in range(self.n_slots)
        ]
        self._cond = threading.Condition()
        self._exclusive = False
        self._taken = 0

    @property
    def busy(self) -> int:
        """Slots running a request now."""
        return sum(s.busy for s in self.slots)

    def acquire(
        self, prompt: Sequence[int], stopped: Callable[[], bool] | None = None
    ) -> Slot | None:
        """A free slot for ``prompt`` (waiting for one; None when ``stopped()`` turns true
        while waiting): :func:`choose`'s."""
        with self._cond:
            while self._exclusive or all(s.busy for s in self.slots):
                if stopped is not None and stopped():
                    return None
                self._cond.wait(timeout=0.1 if stopped is not None else None)
            slot = choose([s for s in self.slots if not s.busy], prompt)
            self._taken += 1
            slot.busy, slot.last_used = True, self._taken
            slot.served += 1
        for mine, base in zip(slot.ladder.models, self.ladder.models, strict=True):
            mine.chunk = base.chunk  # --strict-identity's micro-batch, set by calibration
        return slot

    def release(self, slot: Slot) -> None:
        with self._cond:
            slot.busy = False
            self._cond.notify_all()

    @contextmanager
    def running(self, slot: Slot) -> Iterator[None]:
        """While the block runs, batches wait for ``slot``'s model calls too."""
        self.batcher.join(slot.seq)
        try:
            yield
        finally:
            self.batcher.leave(slot.seq)

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


def choose(free: Sequence[Slot], prompt: Sequence[int]) -> Slot:
    """The free slot whose cache serves ``prompt`` best: the longest cache that ``prompt``
    continues (an empty one continues anything, so a conversation's next turn finds its own
    slot and a new conversation takes an empty slot rather than another's), unless cutting
    another cache reuses more than it throws away; with no cache to continue, the one that
    reuses the most for the least thrown away. The least recently used among equals
    (llama-server picks by prompt similarity, then least recently used)."""
    reuse = {s.seq: s.reuse(prompt) for s in free}

    def net(s: Slot) -> tuple[int, int]:
        kept, lost = reuse[s.seq]
        return kept - lost, -s.last_used

    cut = max(free, key=net)
    going_on = [s for s in free if reuse[s.seq][1] == 0]
    if not going_on:
        return cut
    best = max(going_on, key=lambda s: (reuse[s.seq][0], -s.last_used))
    kept, lost = reuse[cut.seq]
    return cut if kept > lost and kept > reuse[best.seq][0] else best


def _slot_ladder(ladder: Ladder, seq: int, batcher: Batcher) -> Ladder:
    """``ladder`` seen from sequence ``seq``: each model a :class:`SlotModel`."""

    def view(tier: ModelTier) -> ModelTier:
        return ModelTier(tier.name, SlotModel(tier.model, seq, batcher))

    draft = ladder.draft
    return Ladder(
        view(ladder.target),
        view(ladder.qualifier) if ladder.qualifier is not None else None,
        view(draft) if isinstance(draft, ModelTier) else draft,
    )
