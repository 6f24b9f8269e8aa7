"""Acceptance traces: what each lower tier would have proposed along the target's own answer.

Recorded once on real models (``pyramid-gguf traces``), a :class:`Trace` holds a prompt, the
target's greedy answer to it, and for each lower tier (``draft``, ``qualifier``) its
teacher-forced view of every answer position: its argmax (what it drafts under greedy
decoding), its top probability (temperature 1, what ``auto``'s admit rule reads) and the
overlap ``sum(min(p_target, p_tier))`` of the two warped distributions at the trace's sampling
temperature (the expected acceptance of exact speculative sampling there). What the n-gram
drafter would propose follows from the tokens themselves and is recomputed, not stored.

Under greedy verification a trace decides exactly which tokens any chain keeps for any block
schedule, so a chain's speed on any machine is the trace priced by that machine's cost curves
(:mod:`.replay`). Pure Python; recording lives in :mod:`pyramid_gguf.bench.traces`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import UserError
from ...core.files import load_json, write_text

TRACE_VERSION = 1


@dataclass(frozen=True)
class TierTrace:
    """One lower tier along a target answer of ``n`` tokens: per position ``i`` (the token
    after ``prompt + answer[:i]``) its ``argmax[i]``, its temperature-1 ``top[i]`` probability
    and its ``overlap[i]`` with the target at the trace's temperature. Each ``[n]``."""

    argmax: tuple[int, ...]
    top: tuple[float, ...]
    overlap: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.argmax) == len(self.top) == len(self.overlap):
            raise ValueError("a tier trace needs one argmax, top and overlap per position")

    def agreement(self, answer: Sequence[int]) -> float:
        """Share of positions where this tier's argmax is the target's token."""
        n = min(len(answer), len(self.argmax))
        return sum(a == b for a, b in zip(self.argmax, answer, strict=False)) / max(n, 1)


@dataclass(frozen=True)
class Trace:
    """One prompt of a set: its tokens, the target's greedy ``answer`` and each lower tier's
    :class:`TierTrace` along it."""

    key: str
    set: str
    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    tiers: Mapping[str, TierTrace] = field(default_factory=dict)

    @property
    def text(self) -> tuple[int, ...]:
        return (*self.prompt, *self.answer)


@dataclass(frozen=True)
class TraceSet:
    """Traces of one ladder: ``ladder`` names it, ``files`` its tier files (name -> file name),
    ``temperature`` the sampling temperature of the overlaps, ``cost_seconds`` the target's
    cost curve on the machine that recorded it (seconds per evaluation of 1.. tokens, per tier),
    ``machine`` a description of that machine."""

    ladder: str
    files: Mapping[str, str]
    temperature: float
    traces: tuple[Trace, ...]
    machine: str = ""
    cost_seconds: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def sets(self) -> list[str]:
        """The prompt sets present, in order of first appearance."""
        return list(dict.fromkeys(t.set for t in self.traces))

    def select(self, sets: Sequence[str] | None) -> TraceSet:
        """Only the traces of ``sets`` (all when None); a one-line error for an unknown set."""
        if not sets:
            return self
        unknown = [s for s in sets if s not in self.sets()]
        if unknown:
            raise UserError(
                f"no traces of set(s) {', '.join(unknown)}; recorded: {', '.join(self.sets())}"
            )
        picked = tuple(t for t in self.traces if t.set in sets)
        return TraceSet(
            self.ladder, self.files, self.temperature, picked, self.machine, self.cost_seconds
        )

    def agreement(self, tier: str) -> float:
        """Mean share of answer positions where ``tier``'s argmax is the target's token."""
        rows = [(t.tiers[tier].agreement(t.answer), len(t.answer)) for t in self.traces]
        total = sum(n for _, n in rows)
        return sum(a * n for a, n in rows) / max(total, 1)

    def overlap(self, tier: str) -> float:
        """Mean overlap of ``tier`` with the target over every answer position."""
        values = [v for t in self.traces for v in t.tiers[tier].overlap]
        return sum(values) / max(len(values), 1)

    # --- files ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": TRACE_VERSION,
            "ladder": self.ladder,
            "files": dict(self.files),
            "temperature": self.temperature,
            "machine": self.machine,
            "cost_seconds": {k: [round(s, 6) for s in v] for k, v in self.cost_seconds.items()},
            "traces": [
                {
                    "key": t.key,
                    "set": t.set,
                    "prompt": list(t.prompt),
                    "answer": list(t.answer),
                    "tiers": {
                        name: {
                            "argmax": list(tt.argmax),
                            "top": [round(x, 4) for x in tt.top],
                            "overlap": [round(x, 4) for x in tt.overlap],
                        }
                        for name, tt in t.tiers.items()
                    },
                }
                for t in self.traces
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TraceSet:
        if data.get("version") != TRACE_VERSION:
            raise ValueError(f"trace version {data.get('version')!r}, expected {TRACE_VERSION}")
        traces = tuple(
            Trace(
                str(t["key"]),
                str(t["set"]),
                tuple(int(x) for x in t["prompt"]),
                tuple(int(x) for x in t["answer"]),
                {
                    name: TierTrace(
                        tuple(int(x) for x in tt["argmax"]),
                        tuple(float(x) for x in tt["top"]),
                        tuple(float(x) for x in tt["overlap"]),
                    )
                    for name, tt in t["tiers"].items()
                },
            )
            for t in data["traces"]
        )
        return cls(
            str(data["ladder"]),
            {str(k): str(v) for k, v in data["files"].items()},
            float(data["temperature"]),
            traces,
            str(data.get("machine", "")),
            {str(k): tuple(float(s) for s in v) for k, v in data.get("cost_seconds", {}).items()},
        )

    def save(self, path: Path) -> None:
        """Write the trace file (a one-line :class:`UserError` when it cannot be written)."""
        write_text(path, json.dumps(self.to_dict(), separators=(",", ":")) + "\n", "trace file")

    @classmethod
    def load(cls, path: Path) -> TraceSet:
        """Read a trace file (a one-line :class:`UserError` when it is missing or not one)."""
        return load_json(path, "pyramid-gguf trace file", cls.from_dict)
