"""``pyramid-gguf calibrate``: measure this machine's batch costs for a ladder, and what they mean.

Re-measures every tier's cost curve (``auto`` reads the cached one), probes batch identity with
``--strict-identity``, and prints, for each chain, the keep rate its proposals need before
speculation pays here. ``--device-profile`` also fits this machine's device profile to the
tiers' curves and saves it where ``plan`` looks first (the GPU's when every layer is offloaded,
else the CPU's).
"""

from __future__ import annotations

import json
import platform
from datetime import date
from typing import Any

import click

from ..api import Pyramid
from ..core.errors import UserError
from ..core.spec import SpecConfig
from ..decoding.pricing.chains import break_even, ladder_chains
from ..decoding.runtime.calibrate import Calibration
from ..planning.compose import Shape
from ..planning.memory import model_memory
from ..planning.sources import save_measured
from .ladders import load_pyramid, resolve_ladder
from .options import LadderArgs, command, ladder_options

SHOWN = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def _device_profile(pyramid: Pyramid, cals: dict[str, Calibration]) -> str:
    """Fit and save this machine's profile from the tiers' curves; the line saying so."""
    from ..native import build_id, devices, supports_gpu_offload

    tiers = pyramid.tiers()
    on_gpu = supports_gpu_offload() and all(t.n_gpu_layers < 0 for t in tiers)
    kind = "gpu" if on_gpu else "cpu"
    names = [name for gpu, name, _ in devices() if gpu == on_gpu]
    device = names[0] if names else platform.machine()
    samples = [(Shape.of(model_memory(t.path)), cals[t.name].curve) for t in tiers]
    if len({s.weight_bytes for s, _ in samples}) < 2:
        raise UserError("--device-profile needs a ladder of two or more model sizes")
    threads = tiers[0].n_threads
    source = (
        f"measured by pyramid-gguf calibrate --device-profile on {device} ({threads} threads), "
        f"{build_id()}, {date.today()}, from {', '.join(t.path.name for t in tiers)}"
    )
    name = f"yours-{kind}"
    _, path, errors = save_measured(kind, name, source, samples)
    worst = max(errors)
    return f"wrote your {kind.upper()} profile to {path} (fit within {worst:.1%}); plan uses it"


@command()
@ladder_options
@click.option(
    "--device-profile",
    is_flag=True,
    help="Also fit this machine's device profile (GPU with every layer offloaded, else CPU) to "
    "the curves and save it for plan.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the curves as JSON.")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Also print every measured size: the median of its repeats and their spread.",
)
def calibrate(device_profile: bool, as_json: bool, verbose: bool, **params: Any) -> None:
    """Measure batch costs of each tier on this machine (cached for `auto`).

    Prints milliseconds per evaluation of n tokens and, per chain, the share of proposals the
    target must keep before speculation beats plain decoding here.
    """
    args = LadderArgs.from_params(params)
    resolved = resolve_ladder(args)
    with load_pyramid(args, resolved, SpecConfig(mode="target"), calibrate=False) as pyramid:
        cals = pyramid.calibrate(refresh=True, say=lambda m: click.echo(m, err=True))
        costs = pyramid.costs()
        chains = ladder_chains(pyramid.ladder.shape, SpecConfig())
        weights = {t.name: t for t in pyramid.tiers()}
        saved = _device_profile(pyramid, cals) if device_profile else None
    evens = {c.name: break_even(c, costs) for c in chains if not c.plain}
    if as_json:
        doc = {
            "ladder": resolved.name,
            "tiers": {name: cal.to_dict() for name, cal in cals.items()},
            "weights": {name: t.weight_buffers for name, t in weights.items()},
            "break_even_keep_rate": evens,
        }
        click.echo(json.dumps(doc, indent=2))
        if saved:
            click.echo(saved, err=True)
        return
    head = f"{'tier':<10}" + "".join(f"{n:>8}" for n in SHOWN)
    click.echo(head + "   (ms per evaluation of n tokens; relative to one below)")
    for name, cal in cals.items():
        c = cal.curve
        click.echo(f"{name:<10}" + "".join(f"{c(n) * 1000:>8.1f}" for n in SHOWN))
        click.echo(f"{'':<10}" + "".join(f"{c(n) / c.one:>8.2f}" for n in SHOWN))
        click.echo(f"{'':<10}weights: {weights[name].weights}")
        if verbose:
            for t in cal.timed:
                click.echo(
                    f"{'':<10}n={t.n:<3} {t.median * 1000:8.2f} ms measured "
                    f"({t.low * 1000:.2f}-{t.high * 1000:.2f}), priced {c(t.n) * 1000:.2f} ms"
                )
        if cal.loaded:
            click.echo(f"{'':<10}measured on a busy machine: not cached, measured again next time")
        if cal.identity_batch is not None:
            click.echo(f"{'':<10}batches up to {cal.identity_batch} are bit-identical here")
    for chain, a in evens.items():
        need = f"pays when {a:.0%} of proposals are kept" if a else "cannot pay on this machine"
        click.echo(f"{chain + ':':<11}{need}")
    if saved:
        click.echo(saved)
