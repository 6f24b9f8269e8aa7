"""Benchmark output: the table, the ``--json`` document and CSV lines."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .results import RowResult
from .runner import BenchRun, peak_rss_mib


def report(
    run: BenchRun, rows: Sequence[RowResult], meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``--json`` document."""
    return {
        "meta": {
            **(meta or {}),
            "repeats": run.repeats,
            "prompts": [p.key for p in run.prompts],
            "sampling": asdict(run.sampling),
            "seconds": round(run.seconds, 2),
            "peak_rss_mib": round(max(run.peak_rss.values(), default=peak_rss_mib()), 1),
        },
        "rows": [r.to_dict() for r in rows],
    }


def _stage_text(r: RowResult) -> str:
    return (
        "  ".join(
            f"{s.name} {100 * s.acceptance_rate:.0f}%/{s.mean_accepted:.2f}" for s in r.stages
        )
        or "-"
    )


def _share_text(r: RowResult) -> str:
    return " ".join(
        f"{k[0] if k != 'scheduler' else 'py'}{100 * v:.0f}" for k, v in r.time_share.items()
    )


def format_table(rows: Sequence[RowResult]) -> str:
    """The human-readable table: one line per row.

    With HumanEval: ``pass@1`` and ``HE x`` (generation speed over the HumanEval answers,
    relative to ``target``'s). With quality scored: ``top1`` (share of emitted tokens that were
    the target's argmax) and ``nll`` (their mean negative log-probability under the target,
    nats per token), over the prompt sets.
    """
    he = any(r.humaneval_pass_at_1 is not None for r in rows)
    scored = any(r.argmax_share is not None for r in rows)
    width = max([len("config"), *(len(r.label) for r in rows)])
    head = (
        f"{'config':<{width}} {'tok/s':>8} {'min-max':>13} {'speedup':>7} {'agree':>6} "
        + (f"{'pass@1':>6} {'HE x':>5} " if he else "")
        + (f"{'top1':>6} {'nll':>6} " if scored else "")
        + f"{'RSS MiB':>8}  {'time % (d/q/t/py)':<20} acceptance (rate/mean accepted)"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        spread = f"{r.tps['min']:.1f}-{r.tps['max']:.1f}"
        line = (
            f"{r.label:<{width}} {r.tps['median']:>8.1f} {spread:>13} {r.speedup:>6.2f}x "
            f"{r.agreement_positional:>6.2f} "
        )
        if he:
            line += f"{_num(r.humaneval_pass_at_1, 6, '.3f')} {_num(r.humaneval_speedup, 4, '.2f')}"
            line += "x " if r.humaneval_speedup is not None else "  "
        if scored:
            line += f"{_num(r.argmax_share, 6, '.3f')} {_num(r.nll, 6, '.3f')} "
        line += f"{r.peak_rss_mib:>8.0f}  {_share_text(r):<20} {_stage_text(r)}"
        lines.append(line)
    lines.append(
        "tok/s: generation median over repeats (min-max); speedup: median / target median; "
        "agree: positional token agreement with target"
    )
    if he:
        lines.append("HE x: generation speed over the HumanEval answers / target's")
    if scored:
        lines.append(
            "top1: share of emitted tokens that are the target's argmax; nll: their mean "
            "negative log-probability under the target (nats/token); first pass, teacher-forced"
        )
    return "\n".join(lines)


def _num(value: float | None, width: int, fmt: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{fmt}}"


CSV_FIELDS = (
    "label",
    "mode",
    "knobs",
    "lossless",
    "n_samples",
    "generated_tokens",
    "tps_median",
    "tps_min",
    "tps_max",
    "speedup",
    "speedup_min",
    "speedup_max",
    "agreement_prefix",
    "agreement_positional",
    "humaneval_pass_at_1",
    "humaneval_speedup",
    "argmax_share",
    "nll",
    "humaneval_argmax_share",
    "humaneval_nll",
    "peak_rss_mib",
    "time_share",
    "stages",
    "tps_by_set",
)


def to_csv(rows: Sequence[RowResult]) -> str:
    """One CSV line per row; stage acceptance and time shares as ``name=value`` lists."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_FIELDS)
    for r in rows:
        w.writerow(
            [
                r.label,
                r.mode,
                json.dumps(r.knobs),
                r.lossless,
                r.n_samples,
                r.generated_tokens,
                round(r.tps["median"], 2),
                round(r.tps["min"], 2),
                round(r.tps["max"], 2),
                round(r.speedup, 4),
                round(min(r.speedup_repeats), 4),
                round(max(r.speedup_repeats), 4),
                round(r.agreement_prefix, 4),
                round(r.agreement_positional, 4),
                *(
                    "" if v is None else round(v, 4)
                    for v in (
                        r.humaneval_pass_at_1,
                        r.humaneval_speedup,
                        r.argmax_share,
                        r.nll,
                        r.humaneval_argmax_share,
                        r.humaneval_nll,
                    )
                ),
                round(r.peak_rss_mib, 1),
                ";".join(f"{k}={v:.4f}" for k, v in r.time_share.items()),
                ";".join(
                    f"{s.name}={s.acceptance_rate:.4f}/{s.mean_accepted:.3f}" for s in r.stages
                ),
                ";".join(f"{k}={v:.2f}" for k, v in r.tps_by_set.items()),
            ]
        )
    return buf.getvalue()
