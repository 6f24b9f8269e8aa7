"""``bench --plot FILE.png``: speedup per row with error bars, or, for sweeps, speedup and
acceptance against the swept knob (one line per mode). Matplotlib's Agg backend, no display."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError

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
    if swept:
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
    fig.suptitle(title or "pyramid-gguf bench")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=110)
    except OSError as e:
        raise UserError(f"cannot write plot {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path
