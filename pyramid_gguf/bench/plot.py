"""``bench --plot FILE.png``: speedup per row with error bars; for sweeps, speedup and
acceptance against the swept knob (one line per mode); and when quality was measured
(HumanEval pass@1, or the target-scored argmax share), quality against speed, one line per
mode through its swept values, ``target`` as the reference. Matplotlib's Agg backend, no
display."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError

if TYPE_CHECKING:
    from .results import RowResult


def _errors(rows: Sequence[RowResult]) -> list[list[float]]:
    lo = [max(r.speedup - min(r.speedup_repeats), 0.0) for r in rows]
    hi = [max(max(r.speedup_repeats) - r.speedup, 0.0) for r in rows]
    return [lo, hi]


def plot_bench(rows: Sequence[RowResult], path: str | Path, title: str = "") -> Path:
    """Write the chart of ``rows`` to ``path`` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    swept = list(dict.fromkeys(k for r in rows for k in r.knobs))
    panels = _quality_panels(rows)
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.4), squeeze=False)
        for ax, (quality, speed, ylabel, xlabel) in zip(axes[0], panels, strict=True):
            _quality_panel(ax, rows, quality, speed, ylabel, xlabel)
    elif swept:
        knob = swept[0]
        fig, (ax_s, ax_a) = plt.subplots(1, 2, figsize=(11, 4.2))
        ax_s.axhline(1.0, color="grey", lw=0.8, ls="--", label="target")
        for mode in dict.fromkeys(r.mode for r in rows if knob in r.knobs):
            group = [r for r in rows if r.mode == mode and knob in r.knobs]

            def rest_of(r: RowResult) -> tuple[tuple[str, Any], ...]:
                return tuple((k, v) for k, v in r.knobs.items() if k != knob)

            for rest in dict.fromkeys(rest_of(r) for r in group):
                line = sorted(
                    (r for r in group if rest_of(r) == rest),
                    key=lambda r: r.knobs[knob],
                )
                name = mode + "".join(f" {k}={v}" for k, v in rest)
                xs = [r.knobs[knob] for r in line]
                ax_s.errorbar(
                    xs,
                    [r.speedup for r in line],
                    yerr=_errors(line),
                    marker="o",
                    capsize=3,
                    label=name,
                )
                top = [r.stages[-1].acceptance_rate if r.stages else 0.0 for r in line]
                ax_a.plot(xs, top, marker="o", label=name)
        ax_s.set_xlabel(knob)
        ax_s.set_ylabel("speedup vs target")
        ax_a.set_xlabel(knob)
        ax_a.set_ylabel("acceptance rate (stage into target)")
        ax_a.set_ylim(0, 1.05)
        ax_s.legend(fontsize=7)
        ax_a.legend(fontsize=7)
    else:
        fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(rows) + 2), 4.0))
        xs = list(range(len(rows)))
        colors = [
            "#888888" if r.mode == "target" else ("#2a7ab0" if r.lossless else "#d9822b")
            for r in rows
        ]
        ax.bar(xs, [r.speedup for r in rows], yerr=_errors(rows), capsize=4, color=colors)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(xs, [r.label for r in rows], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("speedup vs target (median, min-max)")
    fig.suptitle(title or "pyramid-gguf bench", fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=110)
    except OSError as e:
        raise UserError(f"cannot write plot {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


Metric = Callable[["RowResult"], "float | None"]


def _quality_panels(rows: Sequence[RowResult]) -> list[tuple[Metric, Metric, str, str]]:
    """(quality, speed, y label, x label) of each quality chart the rows allow."""
    out: list[tuple[Metric, Metric, str, str]] = []
    if any(r.humaneval_pass_at_1 is not None for r in rows):
        out.append(
            (
                lambda r: r.humaneval_pass_at_1,
                lambda r: r.humaneval_speedup,
                "HumanEval pass@1",
                "speedup vs target (HumanEval answers)",
            )
        )
    if any(r.argmax_share is not None for r in rows):
        out.append(
            (
                lambda r: r.argmax_share,
                lambda r: r.speedup,
                "emitted tokens that are the target's argmax",
                "speedup vs target (prompt sets)",
            )
        )
    return out


def _quality_panel(
    ax: Any, rows: Sequence[RowResult], quality: Metric, speed: Metric, ylabel: str, xlabel: str
) -> None:
    """One line per mode (and per value of any second swept knob) through its rows, ordered by
    the first swept knob, each point labelled with its value; ``target`` a star, a dotted line
    one point (0.01) under ``target``'s quality."""
    reference = rows[0]
    swept = list(dict.fromkeys(k for r in rows for k in r.knobs))
    knob = swept[0] if swept else None

    def rest_of(r: RowResult) -> tuple[tuple[str, Any], ...]:
        return tuple((k, v) for k, v in r.knobs.items() if k != knob)

    def value(r: RowResult) -> Any:
        return r.knobs.get(knob) if knob is not None else None

    for mode in dict.fromkeys(r.mode for r in rows[1:]):
        group = [r for r in rows[1:] if r.mode == mode]
        for rest in dict.fromkeys(rest_of(r) for r in group):
            line = sorted((r for r in group if rest_of(r) == rest), key=lambda r: value(r) or 0)
            points = [(speed(r), quality(r), r) for r in line]
            kept = [(x, y, r) for x, y, r in points if x is not None and y is not None]
            if not kept:
                continue
            name = mode + "".join(f" {k}={v}" for k, v in rest)
            xs, ys = [x for x, _, _ in kept], [y for _, y, _ in kept]
            (drawn,) = ax.plot(xs, ys, marker="o", label=name)
            for x, y, r in kept:
                if value(r) is not None:
                    ax.annotate(
                        str(value(r)),
                        (x, y),
                        textcoords="offset points",
                        xytext=(4, 3),
                        fontsize=7,
                        color=drawn.get_color(),
                    )
    base, x0 = quality(reference), speed(reference)
    if base is not None and x0 is not None:
        ax.plot([x0], [base], marker="*", markersize=12, color="black", ls="", label="target")
        ax.axhline(base - 0.01, color="grey", lw=0.8, ls=":", label="target - 1 point")
    ax.axvline(1.0, color="grey", lw=0.6, ls="--")
    ax.set_xlabel(xlabel + (f"; labels: {knob}" if knob else ""))
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
