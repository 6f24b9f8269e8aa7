"""``pyramid-gguf tune``: the fastest spec for this machine and ladder, within a quality bound.

Two phases on the benchmark machinery (:mod:`pyramid_gguf.bench`), ``target`` measured in the
same runs:

1. screening: candidates (a small grid over mode, ``l_d``, ``l_q``, ``tau`` and ``p_min``, in
   priority order) run once each in batches interleaved with a ``target`` row, until the
   candidates, ``max_configs`` or ~60% of ``budget_seconds`` run out;
2. confirmation: the best (up to 3) eligible candidates run again with ``target``,
   ``confirm_repeats`` times, interleaved; the winner is the fastest median among those whose
   speedup over ``target`` in this run is above 1. When none is, ``target`` is recommended.

Quality drop of a row: 0 for lossless modes (sd, psd-exact: same distribution as the target by
construction), else ``1 - positional token agreement`` with the target's output on the same
prompts. ``max_quality_drop=0`` therefore allows lossless modes only.

The result is written by :func:`~pyramid_gguf.models.tuned.save_tuned`; the ladder resolution
(:mod:`pyramid_gguf.models.resolve`) reads it back as a :class:`SpecConfig` (what ``run`` uses when
no mode flag is given).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..api import Pyramid
from ..core.ladder import LadderPaths, LadderShape
from ..core.sampling import SamplingConfig
from ..core.spec import SpecConfig
from ..models.tuned import ladder_key, save_tuned
from .grid import BenchConfig
from .prompts import BenchPrompt
from .results import RowResult, aggregate
from .runner import run_bench

# --- candidates ------------------------------------------------------------------------------


def candidates(
    base: SpecConfig, shape: LadderShape, *, max_quality_drop: float = 0.0
) -> list[BenchConfig]:
    """The search grid, most promising first (``target`` itself is not a candidate): ``auto``
    (which needs no draft: the n-gram drafter), then the fixed modes the ladder's ``shape``
    can run (the mode table), lossy ones only when ``max_quality_drop`` allows them."""
    out: list[BenchConfig] = [BenchConfig.of(base, "auto")]
    if not shape.has_draft:
        return out
    sd = [(4, 0.0), (2, 0.0), (8, 0.0), (6, 0.0), (3, 0.0)]
    if "draft" in shape.models:  # a model draft's confidence can stop it early
        sd[3:3] = [(8, 0.3), (6, 0.2)]
    psd = [(4, 8), (3, 8), (2, 6), (4, 12), (6, 12)] if shape.has_qualifier else []
    # interleave so a small --max-configs still covers both families
    for i in range(max(len(sd), len(psd))):
        if i < len(psd):
            out.append(BenchConfig.of(base, "psd-exact", l_d=psd[i][0], l_q=psd[i][1], p_min=0.0))
        if i < len(sd):
            out.append(BenchConfig.of(base, "sd", l_d=sd[i][0], p_min=sd[i][1]))
    if max_quality_drop > 0:
        for tau in (0.3, 0.5, 0.7):
            out.append(BenchConfig.of(base, "fsd", l_d=6, tau_t=tau, p_min=0.0))
            if shape.has_qualifier:
                out.append(BenchConfig.of(base, "psd-a", l_d=4, l_q=8, tau_t=tau, p_min=0.0))
                out.append(
                    BenchConfig.of(base, "psd-f", l_d=4, l_q=8, tau_q=tau, tau_t=tau, p_min=0.0)
                )
    return [c for c in out if shape.runs(c.spec.mode)]


def quality_drop(row: RowResult) -> float:
    """0 for lossless modes; else 1 - positional agreement with the target's tokens."""
    return 0.0 if row.lossless else max(0.0, 1.0 - row.agreement_positional)


def eligible(row: RowResult, max_quality_drop: float) -> bool:
    """Within the quality bound (lossless rows always are)."""
    return quality_drop(row) <= max_quality_drop + 1e-9


def winner(rows: Sequence[RowResult], max_quality_drop: float) -> RowResult | None:
    """The fastest row that is eligible and faster than ``target`` measured in the same run
    (``speedup > 1``), or None: then ``target`` is recommended. ``tune`` never recommends a
    configuration slower than ``target`` in its own measurements."""
    fast = [r for r in rows if eligible(r, max_quality_drop) and r.speedup > 1.0]
    return max(fast, key=lambda r: r.speedup, default=None)


# --- the search ------------------------------------------------------------------------------


@dataclass
class TuneResult:
    """What :func:`tune` found (``spec.mode == "target"`` when nothing beat the target)."""

    spec: SpecConfig
    recommend_target: bool
    speedup: float
    tps: float
    target_tps: float
    quality_drop: float
    max_quality_drop: float
    ladder_key: str
    measured: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    path: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ladder_key": self.ladder_key,
            "spec": asdict(self.spec),
            "recommend_target": self.recommend_target,
            "speedup": round(self.speedup, 4),
            "tps": round(self.tps, 2),
            "target_tps": round(self.target_tps, 2),
            "quality_drop": round(self.quality_drop, 4),
            "max_quality_drop": self.max_quality_drop,
            "seconds": round(self.seconds, 1),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": platform.node(),
            "measured": self.measured,
        }


def _summary(row: RowResult, phase: str, max_drop: float) -> dict[str, Any]:
    drop = quality_drop(row)
    return {
        "phase": phase,
        "label": row.label,
        "mode": row.mode,
        "spec": row.spec,
        "tps": round(row.tps["median"], 2),
        "speedup": round(row.speedup, 4),
        "quality_drop": round(drop, 4),
        "eligible": eligible(row, max_drop),
    }


def tune(
    pyramid: Pyramid,
    base: SpecConfig,
    paths: LadderPaths,
    prompts: Sequence[BenchPrompt],
    sampling: SamplingConfig,
    *,
    max_quality_drop: float = 0.0,
    budget_seconds: float = 300.0,
    max_configs: int = 12,
    batch: int = 4,
    confirm_repeats: int = 2,
    chat: bool | None = None,
    write: bool = True,
    log: Callable[[str], None] | None = None,
) -> TuneResult:
    """Search the spec grid on ``pyramid`` (a loaded ladder at ``paths``) around ``base`` (the
    ladder's recommended knobs) and save the winner."""
    say = log or (lambda _msg: None)
    t0 = time.perf_counter()
    grid = candidates(base, pyramid.ladder.shape, max_quality_drop=max_quality_drop)
    grid = grid[: max(0, max_configs)]
    target_row = BenchConfig.of(base, "target")
    measured: list[dict[str, Any]] = []
    screened: list[tuple[float, BenchConfig]] = []
    last_batch = 0.0
    for start in range(0, len(grid), batch):
        elapsed = time.perf_counter() - t0
        if start and elapsed + last_batch > 0.6 * budget_seconds:
            say(f"budget: screened {start} of {len(grid)} candidates")
            break
        chunk = grid[start : start + batch]
        tb = time.perf_counter()
        run = run_bench(pyramid, [target_row, *chunk], prompts, sampling, repeats=1, chat=chat)
        last_batch = time.perf_counter() - tb
        for cfg, row in zip(chunk, aggregate(run)[1:], strict=True):
            s = _summary(row, "screen", max_quality_drop)
            measured.append(s)
            say(f"screen {row.label}: {s['speedup']:.2f}x, quality drop {s['quality_drop']:.3f}")
            if s["eligible"]:
                screened.append((row.speedup, cfg))
    finalists = [c for _, c in sorted(screened, key=lambda x: -x[0])[:3]]
    best: RowResult | None = None
    target_result: RowResult | None = None
    if finalists:
        run = run_bench(
            pyramid,
            [target_row, *finalists],
            prompts,
            sampling,
            repeats=max(1, confirm_repeats),
            chat=chat,
        )
        rows = aggregate(run)
        target_result = rows[0]
        for row in rows[1:]:
            s = _summary(row, "confirm", max_quality_drop)
            measured.append(s)
            say(f"confirm {row.label}: {s['speedup']:.2f}x")
        best = winner(rows[1:], max_quality_drop)
    else:
        run = run_bench(pyramid, [target_row], prompts, sampling, repeats=1, chat=chat)
        target_result = aggregate(run)[0]
    target_tps = target_result.tps["median"]
    if best is None:
        spec, speedup, tps, drop = target_row.spec, 1.0, target_tps, 0.0
    else:
        spec = SpecConfig(**best.spec)
        speedup, tps, drop = best.speedup, best.tps["median"], quality_drop(best)
    result = TuneResult(
        spec=spec,
        recommend_target=best is None,
        speedup=speedup,
        tps=tps,
        target_tps=target_tps,
        quality_drop=drop,
        max_quality_drop=max_quality_drop,
        ladder_key=ladder_key(paths),
        measured=measured,
        seconds=time.perf_counter() - t0,
    )
    if write:
        result.path = save_tuned(paths, result.to_dict())
    return result
