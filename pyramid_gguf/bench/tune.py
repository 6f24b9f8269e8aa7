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

The result is written to ``$PYRAMID_GGUF_HOME/tuned/<ladder-key>.json``; :func:`load_tuned`
reads it back as a :class:`SpecConfig` (what ``run`` uses when no mode flag is given).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..api import Pyramid
from ..config import SamplingConfig, SpecConfig, cache_home
from ..errors import UserError
from ..ladder import TIERS, LadderPaths, LadderShape
from ..modes import modes_for
from .grid import BenchConfig
from .prompts import BenchPrompt
from .results import RowResult, aggregate
from .runner import run_bench

TUNED_VERSION = 1


# --- where tuned configs live ----------------------------------------------------------------


def _fingerprint(paths: LadderPaths) -> list[list[Any]]:
    items: list[list[Any]] = []
    for tier in TIERS:
        value = paths.get(tier)
        if not isinstance(value, Path):
            items.append([tier, None if value is None else str(value), 0])
            continue
        p = value.expanduser()
        try:
            p = p.resolve()
            size = p.stat().st_size
        except OSError:
            size = -1
        items.append([tier, str(p), size])
    return items


def ladder_key(paths: LadderPaths) -> str:
    """Hash of the ladder's resolved model paths and sizes (``ngram`` / absent tiers included)."""
    blob = json.dumps(_fingerprint(paths), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def tuned_dir() -> Path:
    return cache_home() / "tuned"


def tuned_path(paths: LadderPaths) -> Path:
    """``$PYRAMID_GGUF_HOME/tuned/<ladder-key>.json``."""
    return tuned_dir() / f"{ladder_key(paths)}.json"


def load_tuned(paths: LadderPaths) -> SpecConfig | None:
    """The tuned :class:`SpecConfig` of this ladder, or None (never tuned, stale or unreadable).

    A model file replaced by another of a different size changes the key, so its old result
    is not used.
    """
    try:
        data = json.loads(tuned_path(paths).read_text(encoding="utf-8"))
        if data.get("version") != TUNED_VERSION:
            return None
        known = {f.name for f in fields(SpecConfig)}
        return SpecConfig(**{k: v for k, v in data["spec"].items() if k in known})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError):
        return None


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
    if not shape.ngram:  # a model draft's confidence can stop it early
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
    runnable = set(modes_for(shape.n_tiers))
    return [c for c in out if c.spec.mode in runnable]


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

    def to_dict(self, ladder: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "version": TUNED_VERSION,
            "ladder_key": self.ladder_key,
            "ladder": ladder or {},
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
        result.path = save_tuned(result, paths)
    return result


def save_tuned(result: TuneResult, paths: LadderPaths) -> Path:
    """Write ``result`` to :func:`tuned_path` atomically and return the path."""
    path = tuned_path(paths)
    path.parent.mkdir(parents=True, exist_ok=True)
    ladder = {tier: {"path": p, "size": size} for tier, p, size in _fingerprint(paths)}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result.to_dict(ladder), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
