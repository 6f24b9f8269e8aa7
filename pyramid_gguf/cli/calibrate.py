"""``pyramid-gguf calibrate``: measure this machine's batch costs for a ladder, and what they mean.

Re-measures every tier's cost curve (``auto`` reads the cached one), probes batch identity with
``--strict-identity``, and prints, for each chain, the keep rate its proposals need before
speculation pays here.
"""

from __future__ import annotations

import json
from typing import Any

import click

from ..core.spec import SpecConfig
from ..decoding.pricing.chains import break_even, ladder_chains
from .ladders import load_pyramid, resolve_ladder
from .options import LadderArgs, command, ladder_options

SHOWN = (1, 2, 3, 4, 5, 6, 8, 12, 16)


@command()
@ladder_options
@click.option("--json", "as_json", is_flag=True, help="Print the curves as JSON.")
def calibrate(as_json: bool, **params: Any) -> None:
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
        weights = {t.name: t.model for t in pyramid.ladder.models}
    evens = {c.name: break_even(c, costs) for c in chains if not c.plain}
    if as_json:
        doc = {
            "ladder": resolved.name,
            "tiers": {name: cal.to_dict() for name, cal in cals.items()},
            "weights": {name: m.weight_buffers for name, m in weights.items()},
            "break_even_keep_rate": evens,
        }
        click.echo(json.dumps(doc, indent=2))
        return
    head = f"{'tier':<10}" + "".join(f"{n:>8}" for n in SHOWN)
    click.echo(head + "   (ms per evaluation of n tokens; relative to one below)")
    for name, cal in cals.items():
        c = cal.curve
        click.echo(f"{name:<10}" + "".join(f"{c(n) * 1000:>8.1f}" for n in SHOWN))
        click.echo(f"{'':<10}" + "".join(f"{c(n) / c.one:>8.2f}" for n in SHOWN))
        click.echo(f"{'':<10}weights: {weights[name].describe_weights()}")
        if cal.identity_batch is not None:
            click.echo(f"{'':<10}batches up to {cal.identity_batch} are bit-identical here")
    for chain, a in evens.items():
        need = f"pays when {a:.0%} of proposals are kept" if a else "cannot pay on this machine"
        click.echo(f"{chain + ':':<11}{need}")
