"""Aggregating a benchmark run: one :class:`RowResult` per config row.

Generation tok/s per repeat (all prompts of a repeat pooled: tokens / seconds), its median and
spread, the speedup against the ``target`` row of the same run (ratio of medians; per-repeat
ratios give the spread), per-stage acceptance summed from the engine's stats, each tier's and
the Python scheduler's share of wall time, agreement with the target's tokens, and HumanEval
pass@1 and generation speed when asked. Quality under the target (:mod:`.quality`), when
scored: mean negative log-probability of the emitted tokens and their argmax share, over the
prompt sets' first pass and over the HumanEval answers separately.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..api import GenerationStats, StageStats
from .quality import TokenQuality
from .runner import BenchRun, Sample


def sum_stages(stats: Iterable[GenerationStats]) -> list[StageStats]:
    """Per-stage sums of ``draft_n``, ``draft_n_accepted``, verifications and histograms."""
    out: dict[str, StageStats] = {}
    for s in stats:
        for st in s.stages:
            out.setdefault(st.name, StageStats(st.name)).merge(st)
    return list(out.values())


def agreement(reference: Sequence[int], tokens: Sequence[int]) -> tuple[float, float]:
    """(prefix, positional) agreement of ``tokens`` with ``reference``.

    prefix: length of the common prefix over the reference length (1.0 = identical up to the
    end); positional: positions holding the same token over the longer length.
    """
    n = max(len(reference), len(tokens))
    if n == 0:
        return 1.0, 1.0
    prefix = 0
    for a, b in zip(reference, tokens, strict=False):
        if a != b:
            break
        prefix += 1
    same = sum(a == b for a, b in zip(reference, tokens, strict=False))
    return prefix / max(len(reference), 1), same / n


def _spread(values: Sequence[float]) -> dict[str, float]:
    vals = sorted(values)
    out = {"median": statistics.median(vals), "min": vals[0], "max": vals[-1]}
    if len(vals) >= 4:
        q = statistics.quantiles(vals, n=4)
        out |= {"q1": q[0], "q3": q[2]}
    return out


@dataclass
class RowResult:
    """One row's aggregated results."""

    label: str
    mode: str
    knobs: dict[str, Any]
    spec: dict[str, Any]
    lossless: bool
    n_samples: int
    generated_tokens: int
    tps: dict[str, float]
    tps_repeats: list[float]
    speedup: float
    speedup_repeats: list[float]
    tps_by_set: dict[str, float]
    stages: list[StageStats]
    time_share: dict[str, float]
    agreement_prefix: float
    agreement_positional: float
    peak_rss_mib: float
    humaneval_pass_at_1: float | None = None
    humaneval_n: int = 0
    #: Task ids of the HumanEval problems passed, in problem order.
    humaneval_passed: list[str] | None = None
    #: Generation tok/s over every HumanEval answer (tokens / seconds), and its ratio to
    #: ``target``'s in the same run.
    humaneval_tps: float | None = None
    humaneval_speedup: float | None = None
    #: Target-scored quality (:mod:`.quality`) of the prompt sets' first pass: nats per
    #: emitted token, and the share of emitted tokens that were the target's argmax.
    nll: float | None = None
    argmax_share: float | None = None
    #: The same over the HumanEval answers.
    humaneval_nll: float | None = None
    humaneval_argmax_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stages"] = [s.to_dict() for s in self.stages]
        r4 = lambda x: round(x, 4)  # noqa: E731
        d["tps"] = {k: round(v, 2) for k, v in self.tps.items()}
        d["tps_repeats"] = [round(v, 2) for v in self.tps_repeats]
        d["tps_by_set"] = {k: round(v, 2) for k, v in self.tps_by_set.items()}
        d["speedup"] = r4(self.speedup)
        d["speedup_repeats"] = [r4(v) for v in self.speedup_repeats]
        d["time_share"] = {k: r4(v) for k, v in self.time_share.items()}
        d["agreement_prefix"] = r4(self.agreement_prefix)
        d["agreement_positional"] = r4(self.agreement_positional)
        d["peak_rss_mib"] = round(self.peak_rss_mib, 1)
        for key in (
            "humaneval_tps",
            "humaneval_speedup",
            "nll",
            "argmax_share",
            "humaneval_nll",
            "humaneval_argmax_share",
        ):
            if d[key] is not None:
                d[key] = r4(d[key])
        return d


def _tps(samples: Iterable[Sample]) -> float:
    tokens = seconds = 0.0
    for s in samples:
        tokens += s.stats.generated_tokens
        seconds += s.stats.generation_seconds
    return tokens / seconds if seconds > 0 else 0.0


def _quality(samples: Iterable[Sample]) -> TokenQuality | None:
    """The scored samples' quality pooled over their tokens, or None when none was scored."""
    scored = [s.quality for s in samples if s.quality is not None]
    return TokenQuality.pooled(scored) if scored else None


def aggregate(run: BenchRun) -> list[RowResult]:
    """One :class:`RowResult` per config of ``run`` (row 0 is the target reference)."""
    by_row: dict[int, list[Sample]] = {}
    for s in run.samples:
        by_row.setdefault(s.row, []).append(s)
    he_by_row: dict[int, list[Sample]] = {}
    for s in run.humaneval_samples:
        he_by_row.setdefault(s.row, []).append(s)
    he_target_tps = _tps(he_by_row.get(0, []))
    reference = {s.prompt: s.token_ids for s in by_row.get(0, []) if s.repeat == 0}
    target_tps = [_tps(s for s in by_row.get(0, []) if s.repeat == r) for r in range(run.repeats)]
    target_median = statistics.median(target_tps)
    rows = []
    for i, c in enumerate(run.configs):
        samples = by_row.get(i, [])
        tps_r = [_tps(s for s in samples if s.repeat == r) for r in range(run.repeats)]
        tps = _spread(tps_r)
        if i == 0:
            speedup, speedup_r = 1.0, [1.0] * run.repeats
        else:
            speedup = tps["median"] / target_median if target_median > 0 else 0.0
            speedup_r = [a / b if b > 0 else 0.0 for a, b in zip(tps_r, target_tps, strict=True)]
        sets = dict.fromkeys(p.set for p in run.prompts)
        by_set = {
            name: _tps(s for s in samples if s.prompt.split("/", 1)[0] == name) for name in sets
        }
        wall = sum(s.stats.prompt_seconds + s.stats.generation_seconds for s in samples)
        share: dict[str, float] = {}
        for s in samples:
            for t in s.stats.tiers:
                if t.seconds > 0 or t.n_tokens > 0:
                    share[t.name] = share.get(t.name, 0.0) + t.seconds
        share["scheduler"] = sum(s.stats.scheduler_seconds for s in samples)
        share = {k: v / wall if wall > 0 else 0.0 for k, v in share.items()}
        agree = [agreement(reference.get(s.prompt, []), s.token_ids) for s in samples]
        he = run.humaneval.get(i)
        he_samples = he_by_row.get(i, [])
        he_tps = _tps(he_samples) if he_samples else None
        quality = _quality(s for s in samples if s.repeat == 0)
        he_quality = _quality(he_samples)
        rows.append(
            RowResult(
                label=c.label,
                mode=c.spec.mode,
                knobs=dict(c.knobs),
                spec=asdict(c.spec),
                lossless=c.spec.lossless,
                n_samples=len(samples),
                generated_tokens=sum(s.stats.generated_tokens for s in samples),
                tps=tps,
                tps_repeats=tps_r,
                speedup=speedup,
                speedup_repeats=speedup_r,
                tps_by_set=by_set,
                stages=sum_stages(s.stats for s in samples),
                time_share=share,
                agreement_prefix=statistics.fmean(a for a, _ in agree) if agree else 0.0,
                agreement_positional=statistics.fmean(b for _, b in agree) if agree else 0.0,
                peak_rss_mib=run.peak_rss.get(i, 0.0),
                humaneval_pass_at_1=(sum(r.passed for r in he) / len(he)) if he else None,
                humaneval_n=len(he) if he else 0,
                humaneval_passed=[r.task_id for r in he if r.passed] if he else None,
                humaneval_tps=he_tps,
                humaneval_speedup=(
                    he_tps / he_target_tps if he_tps is not None and he_target_tps > 0 else None
                ),
                nll=quality.mean_nll if quality else None,
                argmax_share=quality.argmax_share if quality else None,
                humaneval_nll=he_quality.mean_nll if he_quality else None,
                humaneval_argmax_share=he_quality.argmax_share if he_quality else None,
            )
        )
    return rows
