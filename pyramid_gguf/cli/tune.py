"""``pyramid-gguf tune``: the fastest spec for this machine and ladder; ``run`` then uses it."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click

from ..core.errors import UserError
from ..core.home import require_writable
from .bench import bench_sampling_options, limit_per_set, prompt_options, prompts_from
from .ladders import load_pyramid, resolve_ladder
from .options import LadderArgs, command, ladder_options, sampling_config_from

__all__ = ["tune"]


@command()
@ladder_options
@bench_sampling_options
@prompt_options
@click.option(
    "--max-quality-drop",
    type=float,
    default=0.0,
    show_default=True,
    help="Largest allowed drop in token agreement with target (0: lossless modes only).",
)
@click.option(
    "--budget-seconds",
    type=float,
    default=300.0,
    show_default=True,
    help="Rough time budget of the search.",
)
@click.option(
    "--max-configs",
    type=int,
    default=12,
    show_default=True,
    help="Most candidate configurations to screen.",
)
@click.option(
    "--confirm-repeats",
    type=int,
    default=2,
    show_default=True,
    help="Repeats of the final comparison against target.",
)
@click.option("--dry-run", is_flag=True, help="Do not write the tuned config.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune(**params: Any) -> None:
    """Find the fastest spec for this machine and ladder; `run` then uses it by default.

    Measures target in the same run and never recommends a configuration slower than it.
    Result: $PYRAMID_GGUF_HOME/tuned/<ladder-key>.json.
    """
    from ..bench.tune import tune as run_tune
    from ..models.tuned import tuned_dir

    if params["max_quality_drop"] < 0 or params["max_quality_drop"] > 1:
        raise UserError("--max-quality-drop must be in [0, 1]")
    if params["max_configs"] < 0:
        raise UserError("--max-configs must be >= 0")
    if params["budget_seconds"] <= 0:
        raise UserError("--budget-seconds must be positive")
    sampling = sampling_config_from({**params, "stop": ()})
    prompts = prompts_from(params)
    if params["limit"] is None and not params["prompt_file"]:
        prompts = limit_per_set(prompts, 1)
    args = LadderArgs.from_params(params)
    if not params["dry_run"]:  # before minutes of measuring, not after
        require_writable(tuned_dir(), "the tuned config")
    resolved = resolve_ladder(args)
    base = resolved.spec.with_(mode="target")
    with load_pyramid(args, resolved, base, calibrate=True) as pyramid:
        result = run_tune(
            pyramid,
            base,
            resolved.paths,
            prompts,
            sampling,
            max_quality_drop=params["max_quality_drop"],
            budget_seconds=params["budget_seconds"],
            max_configs=params["max_configs"],
            confirm_repeats=params["confirm_repeats"],
            chat=params["chat"],
            write=not params["dry_run"],
            log=lambda m: click.echo(m, err=True),
        )
    if params["as_json"]:
        path = str(result.path) if result.path else None
        click.echo(json.dumps({**result.to_dict(), "path": path}, indent=2))
        return
    s = result.spec
    if result.recommend_target:
        click.echo(
            f"no configuration beat target ({result.target_tps:.1f} tok/s) on this machine; "
            "recommending plain target decoding"
        )
    else:
        knobs = {k: v for k, v in asdict(s).items() if k != "mode"}
        click.echo(f"best: {s.mode} {knobs}")
        click.echo(
            f"  {result.tps:.1f} tok/s vs target {result.target_tps:.1f} tok/s "
            f"({result.speedup:.2f}x), quality drop {result.quality_drop:.3f}"
        )
    if result.path:
        click.echo(f"saved to {result.path} (used by `pyramid-gguf run` for this ladder)")
