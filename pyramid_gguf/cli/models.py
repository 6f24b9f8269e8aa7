"""``models list``, ``pull`` and ``derive``: model ladder presets and derived tiers."""

from __future__ import annotations

import json

import click

from ..core.errors import UserError
from ..core.load import check_threads, default_threads
from .group import PyramidGroup
from .options import PyramidCommand, command


@click.group(cls=PyramidGroup)
def models() -> None:
    """Model ladder presets (models.toml)."""


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


@models.command("list", cls=PyramidCommand)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_models(as_json: bool) -> None:
    """Presets, their tiers, and which files are present locally."""
    from ..core.home import cache_home
    from ..models.presets import describe, preset_names
    from ..models.registry import get_preset

    rows = [describe(get_preset(name)) for name in preset_names()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"cache: {cache_home()}  (PYRAMID_GGUF_HOME; Hugging Face files under HF_HOME)")
    for row in rows:
        knobs = " ".join(f"{k}={v}" for k, v in row["knobs"].items())
        default = " [default]" if row["default"] else ""
        click.echo(f"\n{row['name']}{default}: {row['description']}")
        click.echo(f"  mode {row['mode']}  {knobs}")
        for tier, info in row["tiers"].items():
            mark = "present" if info["present"] else "missing"
            size = _size(info["size"])
            click.echo(f"  {tier:<9} {mark:<7} {size:>9}  {info['file']}  ({info['origin']})")


@command()
@click.argument("preset")
def pull(preset: str) -> None:
    """Download / assemble / derive every model of PRESET and verify the sha256 sums."""
    from ..models.presets import pull_preset

    ladder = pull_preset(preset)
    for tier, path in ladder.paths.model_files().items():
        click.echo(f"{tier}: {path}")


@command()
@click.argument("src", type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Output GGUF (written to a temporary file, then renamed).",
)
@click.option("--keep-layers", metavar="LIST", help="Layers to keep, e.g. 0-9,12,14-27.")
@click.option(
    "--skip-every",
    type=int,
    metavar="N",
    help="Drop every N-th layer (first and last layers are always kept).",
)
@click.option("--quantize", "qtype", metavar="TYPE", help="Requantize to TYPE (e.g. Q4_0).")
@click.option("--threads", "-t", type=int, default=None, help="Threads for --quantize.")
def derive(
    src: str,
    out: str,
    keep_layers: str | None,
    skip_every: int | None,
    qtype: str | None,
    threads: int | None,
) -> None:
    """Derive a smaller tier from the GGUF SRC by layer skipping or requantizing."""
    from ..models import derive as d

    if sum(x is not None for x in (keep_layers, skip_every, qtype)) != 1:
        raise UserError("give exactly one of --keep-layers, --skip-every or --quantize")
    if threads is not None:
        check_threads(threads)
    if qtype is not None:
        path = d.requantize(src, out, qtype, threads=threads or default_threads())
    else:
        path = d.keep_layers(src, out, layer_spec=keep_layers, every=skip_every)
    click.echo(str(path))
