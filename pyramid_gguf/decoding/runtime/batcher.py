"""Many sequences, one batch per tier: the step that every slot's model calls wait on.

Each slot runs its :class:`~.engine.Generation` on its own thread as if it were alone; every
evaluation it asks of a model (a prompt, a draft step, a qualifier check, a verification)
becomes a request to the :class:`Batcher` and blocks. When every running slot is waiting, the
batcher takes the requests of the smallest tier that has any (drafts before qualifier checks
before the target, so that one target batch carries every slot's verification block),
evaluates them together with one :meth:`~pyramid_gguf.native.NativeModel.eval_parts` (one
``llama_decode`` per ``n_batch`` tokens, logits only at the rows each asked for) and wakes
their slots. The threads are the slots' coroutines and the batcher is the clock: nothing
native runs unless every running slot is waiting on it, so the batches are the same whatever
order the threads run in.

A request longer than :data:`PROMPT_CHUNK` tokens (a prompt, a tier catching up) is evaluated
that many tokens per batch while other slots are running, so their streams never stall
behind it (llama-server's continuous batching). With ``strict_identity`` nothing is shared:
each request is evaluated alone, split exactly as it would be if its slot ran alone, so every
answer equals the one it gets alone.

Requests that arrive together start together: while the pool has admitted requests about to
join (``arriving``), a batch that is ready waits up to :data:`GATHER_SECONDS` for them, so four
prompts sent at once are evaluated in one batch instead of the first alone and the rest after it.

Once the tiers' cost curves are known (:meth:`Batcher.use_costs`, after calibration), a batch
that a few more rows would make cheaper gets them (:meth:`~.CostCurve.padding`: on CPUs that
multiply repacked weights four rows at a time, three slots decoding cost more than four):
padding rows in a sequence's cache only for the one call (:meth:`NativeModel.eval_parts`), so
no answer depends on them beyond the kernel its rows ran. Never with ``strict_identity``.

Each slot's last round (tokens it brought to the target's batch, tokens it committed) is
recorded here, so that ``auto`` can price a slot's speculation against the batch it rides in
(:meth:`Batcher.load`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ...native import EvalTimer, NativeModel, Part
from ..pricing.costs import CostCurve

#: Most tokens of one long request evaluated per batch while other slots are running.
PROMPT_CHUNK = 128
#: Longest a ready batch waits for admitted requests that are about to join it.
GATHER_SECONDS = 0.05


@dataclass(frozen=True)
class Load:
    """The rest of the batch as one slot sees it: ``size`` tokens the other running slots
    bring to the target's evaluation per round and ``tokens`` they commit (their last round's
    figures; a slot that has not reported counts as plain decoding: one and one)."""

    size: int = 0
    tokens: float = 0.0
    slots: int = 0


@dataclass
class _Request:
    """One evaluation a slot waits for; a long one is served over several batches."""

    tier: int
    model: NativeModel
    part: Part
    chunk: int
    timer: EvalTimer
    want: list[int]
    done: int = 0
    rows: np.ndarray | None = None
    error: BaseException | None = None
    finished: bool = False
    #: perf_counter when the slot asked, and when the batch that finished it ended.
    asked: float = 0.0
    ended: float = 0.0

    @property
    def left(self) -> int:
        return len(self.part.tokens) - self.done


@dataclass
class BatchCounters:
    """What the batcher did since it was made (for ``/metrics``), and where the time of the
    steps went, in seconds of wall time.

    While any slot runs, the time is either in a batch (``seconds``: whole evaluations, of which
    ``decode_seconds`` inside ``llama_decode``) or between batches (``gap_seconds``), and a gap
    is the slots' own work until the last request the batch waits for is asked
    (``work_seconds``: sampling, acceptance, delivery to the readers, their wake-ups; done in
    series under the GIL while the batch waits) and then the hand-off to the thread that runs
    the batch (``handoff_seconds``: a ``Condition`` wake-up, and the wait for arriving requests,
    ``gather_seconds`` of it). Per slot, summed over slots: ``wake_seconds`` from a batch's end
    until its slot's thread runs again, ``slot_seconds`` from then until the slot asks for its
    next evaluation. ``shared_*``: the same for batches of more than one slot, and the gaps
    before them."""

    batches: int = 0
    slots_in_batches: int = 0
    tokens: dict[str, int] = field(default_factory=dict)
    #: Padding rows the batches carried (evaluated, then dropped: a cheaper kernel).
    padded: int = 0
    seconds: float = 0.0
    decode_seconds: float = 0.0
    gap_seconds: float = 0.0
    work_seconds: float = 0.0
    handoff_seconds: float = 0.0
    gather_seconds: float = 0.0
    wake_seconds: float = 0.0
    slot_seconds: float = 0.0
    shared_batches: int = 0
    shared_seconds: float = 0.0
    shared_decode_seconds: float = 0.0
    shared_gap_seconds: float = 0.0

    def outside(self) -> float:
        """The share of the shared steps' time spent outside ``llama_decode`` (0 to 1)."""
        step = self.shared_seconds + self.shared_gap_seconds
        return 1.0 - self.shared_decode_seconds / step if step > 0 else 0.0


class Batcher:
    """Gathers the model calls of the running slots of one ladder (``models``: the loaded
    models, smallest first, named ``names``) into one batch per tier."""

    def __init__(
        self,
        models: Sequence[NativeModel],
        names: Sequence[str],
        arriving: Callable[[], int] = lambda: 0,
    ) -> None:
        self.models = list(models)
        self.names = list(names)
        self.strict = any(m.cfg.strict_identity for m in self.models)
        #: Held while anything native runs: a batch, a rollback, a slot's cache cleared.
        self.lock = threading.Condition()
        self._running: set[int] = set()
        self._waiting: list[_Request] = []
        self._busy = False
        #: Each running slot's last round: (target tokens, committed tokens).
        self._rounds: dict[int, tuple[int, int]] = {}
        self._counters = BatchCounters(tokens=dict.fromkeys(self.names, 0))
        #: Requests about to join (the pool's count), and since when a ready batch waits.
        self._arriving = arriving
        self._ready_since: float | None = None
        #: When the last batch ended (None while no slot runs), when the batch went ready
        #: (its last request asked), and when each slot's thread last got its rows back.
        self._last_end: float | None = None
        self._ready_at = 0.0
        self._returned: dict[int, float] = {}
        #: Each tier's measured cost curve (None until :meth:`use_costs`): what padding buys.
        self._curves: list[CostCurve | None] = [None] * len(self.models)

    def use_costs(self, curves: Mapping[str, CostCurve]) -> None:
        """Pad each tier's batches as its measured curve ``curves[name]`` says pays."""
        with self.lock:
            self._curves = [curves.get(name) for name in self.names]

    def counters(self) -> BatchCounters:
        """A copy of the counters now (read without the lock, which a batch holds)."""
        c = self._counters
        return replace(c, tokens=dict(c.tokens))

    # --- membership ----------------------------------------------------------------------------

    def join(self, seq: int) -> None:
        """Slot ``seq`` starts running: batches now wait for it too."""
        with self.lock:
            if not self._running:
                self._last_end = time.perf_counter()
            self._running.add(seq)
            self._rounds[seq] = (1, 1)
            self.lock.notify_all()  # a batch gathering arrivals may go now

    def leave(self, seq: int) -> None:
        """Slot ``seq`` stops running (finished, cancelled or failed)."""
        with self.lock:
            self._running.discard(seq)
            self._rounds.pop(seq, None)
            self._returned.pop(seq, None)
            self._ready_at = time.perf_counter()  # the others may be ready from now
            if not self._running:
                self._last_end = None
            self.lock.notify_all()  # the others may all be waiting now

    # --- pricing against the batch -----------------------------------------------------------

    def report(self, seq: int, size: int, committed: int) -> None:
        """Slot ``seq``'s round brought ``size`` tokens to the target and committed
        ``committed``."""
        with self.lock:
            if seq in self._running:
                self._rounds[seq] = (size, committed)

    def load(self, seq: int) -> Load:
        """The other running slots' share of the next target batch, as slot ``seq`` sees it."""
        with self.lock:
            others = [r for s, r in self._rounds.items() if s != seq]
        return Load(sum(r[0] for r in others), float(sum(r[1] for r in others)), len(others))

    # --- evaluation ----------------------------------------------------------------------------

    def evaluate(self, model: NativeModel, part: Part, chunk: int, timer: EvalTimer) -> np.ndarray:
        """Evaluate ``part`` on ``model`` in the next batch of its tier (blocking until it has
        been); rows ``[len(logits_at), V]`` as :meth:`NativeModel.eval` returns them.
        ``timer``: the slot's, charged its share of each batch."""
        want = part.wanted()  # a bad index fails here, in its own slot
        tier = self.models.index(model)
        req = _Request(tier, model, part, chunk, timer, want)
        with self.lock:
            req.asked = self._ready_at = time.perf_counter()
            back = self._returned.pop(part.seq, None)
            if back is not None:
                self._counters.slot_seconds += req.asked - back
            self._waiting.append(req)
            while not req.finished:
                if self._busy or len(self._waiting) < len(self._running):
                    self.lock.wait()
                    continue
                gather = self._gather_left()
                if gather > 0:
                    self.lock.wait(gather)
                else:
                    self._dispatch()
            now = time.perf_counter()
            self._counters.wake_seconds += now - req.ended
            if part.seq in self._running:
                self._returned[part.seq] = now
        if req.error is not None:
            raise req.error
        assert req.rows is not None
        return req.rows

    def _gather_left(self) -> float:
        """Seconds a ready batch should still wait for requests about to join it (lock held)."""
        if self._arriving() <= 0:
            return 0.0
        now = time.perf_counter()
        if self._ready_since is None:
            self._ready_since = now
        return max(self._ready_since + GATHER_SECONDS - now, 0.0)

    def _dispatch(self) -> None:
        """Evaluate the smallest waiting tier's requests (lock held), then wake everyone."""
        start = time.perf_counter()
        if self._ready_since is not None:
            self._counters.gather_seconds += start - self._ready_since
        self._ready_since = None
        self._busy = True
        group: list[_Request] = []
        try:
            tier = min(r.tier for r in self._waiting)
            group = [r for r in self._waiting if r.tier == tier]
            if self._last_end is not None:  # the gap since the last batch, split
                ready = max(self._ready_at, self._last_end)
                c = self._counters
                c.gap_seconds += start - self._last_end
                c.work_seconds += ready - self._last_end
                c.handoff_seconds += start - ready
                if len(group) > 1:
                    c.shared_gap_seconds += start - self._last_end
            if self.strict:
                for r in group:
                    self._run([r], alone=True)
            else:
                self._run(group, alone=len(self._running) <= 1)
            self._waiting = [r for r in self._waiting if not r.finished]
        finally:
            end = time.perf_counter()
            for r in group:
                r.ended = end
            if self._running:
                self._last_end = end
            self._busy = False
            self.lock.notify_all()

    def _run(self, group: list[_Request], *, alone: bool) -> None:
        """One batch of ``group`` on their model; a long request gives :data:`PROMPT_CHUNK`
        tokens of itself unless it runs ``alone``."""
        model = group[0].model
        pieces: list[Part] = []
        for r in group:
            take = r.left if alone or r.left <= PROMPT_CHUNK else PROMPT_CHUNK
            lo, hi = r.done, r.done + take
            at = [i - lo for i in r.want if lo <= i < hi]
            pieces.append(Part(r.part.seq, r.part.tokens[lo:hi], at))
        chunk = max((r.chunk for r in group), default=0)
        curve = self._curves[group[0].tier]
        n = sum(len(p.tokens) for p in pieces)
        pad = 0
        if curve is not None and not self.strict and chunk == 0 and model.can_pad:
            pad = curve.padding(n)
        t0 = time.perf_counter()
        decoding, padded = model.timer.decode_seconds, model.timer.padded
        try:
            rows = model.eval_parts(pieces, chunk=chunk, pad=pad)
        except BaseException as e:  # every slot in this batch hears it, and goes on without it
            for r in group:
                r.error, r.finished = e, True
            return
        seconds = time.perf_counter() - t0
        decoded = model.timer.decode_seconds - decoding
        total = n or 1
        c = self._counters
        c.padded += model.timer.padded - padded
        c.batches += 1
        c.slots_in_batches += len(group)
        c.tokens[self.names[group[0].tier]] += total
        c.seconds += seconds
        c.decode_seconds += decoded
        if len(group) > 1:
            c.shared_batches += 1
            c.shared_seconds += seconds
            c.shared_decode_seconds += decoded
        for r, piece, got in zip(group, pieces, rows, strict=True):
            _charge(r.timer, len(piece.tokens), seconds * len(piece.tokens) / total)
            if r.done == 0 and len(piece.tokens) == r.left:  # the whole request: its own rows
                r.rows, r.done, r.finished = r.part.ordered(got, r.want), r.left, True
                continue
            if r.rows is None:
                r.rows = np.empty((len(r.want), model.n_vocab), dtype=np.float32)
            asked = piece.logits_at
            first = r.want.index(asked[0] + r.done) if asked else 0
            r.rows[first : first + len(asked)] = got
            r.done += len(piece.tokens)
            if r.left == 0:
                r.rows = r.part.ordered(r.rows, r.want)
                r.finished = True


def _charge(timer: EvalTimer, tokens: int, seconds: float) -> None:
    """Count a slot's share of one batch on its own timer."""
    timer.n_evals += 1
    timer.n_tokens += tokens
    timer.seconds += seconds
