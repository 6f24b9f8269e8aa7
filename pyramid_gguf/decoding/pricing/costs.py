"""Batch cost curves: what one evaluation of ``n`` tokens costs a tier on this machine.

The number that decides whether speculation pays: verifying ``k`` proposals costs one
evaluation of ``k + 1`` tokens. On a GPU that is about one token (memory bound); on a small CPU
it can be nearly ``k + 1`` tokens, with steps where llama.cpp changes kernels. Pure Python;
measuring and caching live in :mod:`.calibrate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Most padding rows a batch takes (:meth:`CostCurve.padding`), and never more than it carries.
PAD_MOST = 8
#: Least share of a batch's cost that padding must save: below it, a curve's noise.
PAD_GAIN = 0.05


@dataclass(frozen=True)
class CostCurve:
    """Seconds of one evaluation of ``n`` tokens, ``seconds[n - 1]`` for ``n = 1..len``.

    Beyond the measured sizes the curve grows linearly with the slope of its last quarter
    (prompt-sized batches: cost per token settles). ``chunk > 0`` prices an evaluation split
    into micro-batches of at most ``chunk`` tokens (``--strict-identity``).
    """

    seconds: tuple[float, ...]
    chunk: int = 0
    #: Seconds to drop the last ``j`` tokens of the last evaluation, ``rollback[j - 1]``
    #: (beyond the measured ``j``, the last): what a rejected round pays besides its batch on a
    #: cache that cannot simply forget a suffix (a hybrid or recurrent model restoring a saved
    #: state and evaluating the kept tokens again; llama.cpp's per-sequence snapshots make it
    #: nearly free). Empty: free, as a KV cache drops a suffix (runtime/rollback_cost.py).
    rollback: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.seconds or any(not s > 0 for s in self.seconds):
            raise ValueError(f"a cost curve needs positive timings, got {self.seconds}")
        if any(not s >= 0 for s in self.rollback):
            raise ValueError(f"rollback costs must be >= 0, got {self.rollback}")

    def __call__(self, n: int) -> float:
        """Seconds for one evaluation of ``n`` tokens (0 for ``n <= 0``)."""
        if n <= 0:
            return 0.0
        if self.chunk > 0 and n > self.chunk:
            full, rest = divmod(n, self.chunk)
            return full * self._raw(self.chunk) + self._raw(rest)
        return self._raw(n)

    def _raw(self, n: int) -> float:
        if n <= 0:
            return 0.0
        m = len(self.seconds)
        if n <= m:
            return self.seconds[n - 1]
        lo = max(1, m - max(1, m // 4))
        slope = (self.seconds[m - 1] - self.seconds[lo - 1]) / max(m - lo, 1)
        return self.seconds[m - 1] + max(slope, 0.0) * (n - m)

    def drop(self, j: int) -> float:
        """Seconds to roll back the last ``j`` evaluated tokens (0 for ``j <= 0``)."""
        if j <= 0 or not self.rollback:
            return 0.0
        return self.rollback[min(j, len(self.rollback)) - 1]

    def with_rollback(self, rollback: Sequence[float]) -> CostCurve:
        """The same curve with these rollback costs (``rollback[j - 1]``: drop ``j``)."""
        return CostCurve(self.seconds, self.chunk, tuple(float(s) for s in rollback))

    @property
    def one(self) -> float:
        """Seconds of one single-token evaluation."""
        return self.seconds[0]

    def relative(self, sizes: Sequence[int] | None = None) -> list[float]:
        """Cost of ``n`` tokens over the cost of one, for ``sizes`` (default: measured ones)."""
        sizes = sizes if sizes is not None else range(1, len(self.seconds) + 1)
        return [self(n) / self.one for n in sizes]

    def after(self, size: int) -> CostCurve:
        """What ``n`` more tokens add to an evaluation that already carries ``size`` (other
        sequences' tokens): ``c(size + n) - c(size)``, the marginal cost in a combined batch,
        over the measured sizes (never below a thousandth of one token's cost)."""
        if size <= 0:
            return self
        floor = self.one * 1e-3
        base = self(size)
        n = len(self.seconds)
        marginal = tuple(max(self(size + k) - base, floor) for k in range(1, n + 1))
        return CostCurve(marginal, 0, self.rollback)

    def padding(self, n: int, *, gain: float = PAD_GAIN) -> int:
        """Rows worth adding to an evaluation of ``n`` tokens for a cheaper kernel: the ``k``
        (``1 <= k <= min(n, PAD_MOST)``, ``n + k`` within the measured sizes) whose ``n + k``
        the curve prices lowest, when that saves at least ``gain`` of ``c(n)``; else 0.

        CPU kernels of repacked weights multiply activations in blocks of rows (4 on AVX2 and
        AVX-512) and take the rest one row at a time, so 3 tokens can cost more than 4 (seen:
        163 ms against 142 for the 1.5B Q4_K_M on a 2-core AVX-512 Xeon). Not for a chunked
        curve (``--strict-identity`` evaluates a batch as it would run alone)."""
        if n <= 0 or self.chunk > 0:
            return 0
        base = self(n)
        best, cost = 0, base
        for k in range(1, min(n, PAD_MOST, len(self.seconds) - n) + 1):
            if self.seconds[n + k - 1] < cost:
                best, cost = k, self.seconds[n + k - 1]
        return best if cost <= base * (1.0 - gain) else 0

    def padded(self) -> CostCurve:
        """The curve a batcher that pads (:meth:`padding`) pays: ``c(n + padding(n))``."""
        if self.chunk > 0:
            return self
        seconds = tuple(self(n + self.padding(n)) for n in range(1, len(self.seconds) + 1))
        return CostCurve(seconds, 0, self.rollback)

    def with_chunk(self, chunk: int) -> CostCurve:
        """The same curve, evaluated in micro-batches of at most ``chunk`` tokens."""
        return CostCurve(self.seconds, chunk, self.rollback)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "seconds": [round(s, 6) for s in self.seconds],
            "chunk": self.chunk,
        }
        if self.rollback:
            out["rollback"] = [round(s, 6) for s in self.rollback]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CostCurve:
        raw = data.get("seconds")
        if not isinstance(raw, list):
            raise ValueError("a cost curve needs a list of seconds")
        chunk = data.get("chunk", 0)
        back = data.get("rollback", [])
        return cls(
            tuple(float(s) for s in raw),
            int(chunk) if isinstance(chunk, int) else 0,
            tuple(float(s) for s in back) if isinstance(back, list) else (),
        )

    @classmethod
    def shaped(cls, one: float, per_token: float, *, n: int = 64) -> CostCurve:
        """A synthetic curve ``one + per_token * (n - 1)`` seconds (GPU-like for a small
        ``per_token``, CPU-like for ``per_token`` near ``one``): for tests and planning."""
        return cls(tuple(one + per_token * (k - 1) for k in range(1, n + 1)))
