"""``pyramid-gguf traces``: record a ladder's acceptance traces for the planner and replays.

Answers every prompt of the chosen sets with the target (greedy), then has each lower tier read
the answer teacher-forced, and saves what each would have proposed along it
(:mod:`pyramid_gguf.decoding.offline.traces`). ``plan`` ranks placements by replaying such traces;
by default it reads the traces shipped for the default ladder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..bench.traces import record_traces
from ..core.files import check_output
from ..core.home import cache_home
from ..core.sampling import SamplingConfig
from ..core.spec import SpecConfig
from .bench import prompt_options, prompts_from
from .ladders import load_pyramid, resolve_ladder
from .options import LadderArgs, command, ladder_options


@command()
@ladder_options
@prompt_options
@click.option("--max-tokens", "-n", type=int, default=256, show_default=True, help="Answer length.")
@click.option(
    "--temperature",
    "--temp",
    "temperature",
    type=float,
    default=SamplingConfig().temperature,
    show_default=True,
    help="Sampling temperature of the recorded overlaps (top-k/top-p/min-p: run's defaults).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    default=None,
    help="Trace file [default: $PYRAMID_GGUF_HOME/traces/<ladder>.json].",
)
def traces(max_tokens: int, temperature: float, output: Path | None, **params: Any) -> None:
    """Record acceptance traces of a ladder (what each lower tier would propose along the
    target's own answers), for `plan` and replays."""
    prompts = prompts_from(params)
    sampling = SamplingConfig(temperature=temperature)
    args = LadderArgs.from_params(params)
    resolved = resolve_ladder(args)
    say = lambda m: click.echo(m, err=True)  # noqa: E731
    path = check_output(output or cache_home() / "traces" / f"{resolved.name}.json", "trace file")
    with load_pyramid(args, resolved, SpecConfig(mode="target"), calibrate=True) as pyramid:
        result = record_traces(
            pyramid,
            prompts,
            max_tokens=max_tokens,
            sampling=sampling,
            chat=params.get("chat"),
            ladder=resolved.name,
            say=say,
        )
    result.save(path)
    click.echo(str(path))
