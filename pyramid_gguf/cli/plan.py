"""``pyramid-gguf plan``: how many layers of each tier fit a GPU memory budget.

Reads GGUF headers only (no model is loaded). Sizes shown in MiB (2^20 bytes).
"""

from __future__ import annotations

import json

import click

from ..config import LoadConfig
from ..ladder import LadderPaths
from ..models.memory import fmt_mib, parse_size
from ..models.planner import Plan, plan_ladder, resolve_budget
from .options import (
    batch_size_option,
    cache_type_k_option,
    cache_type_v_option,
    command,
    ctx_size_option,
)

__all__ = ["format_plan", "plan"]


def format_plan(p: Plan) -> str:
    """The human-readable table of a plan."""
    head = (
        f"{'tier':<10} {'layers':>8} {'GPU w':>9} {'CPU w':>9} {'KV GPU':>8} {'KV CPU':>8} "
        f"{'buf GPU':>8} {'buf CPU':>8} {'GPU tot':>9} {'host':>9}"
    )
    lines = [
        f"VRAM budget {fmt_mib(p.budget_bytes)} MiB, margin {fmt_mib(p.margin_bytes)} MiB, "
        f"usable {fmt_mib(p.usable_bytes)} MiB; ctx {p.load.n_ctx}, ubatch {p.load.n_batch}, "
        f"KV {p.load.type_k}/{p.load.type_v}  (MiB)",
        head,
        "-" * len(head),
    ]
    for t in p.tiers:
        layers = f"{t.n_gpu_layers}/{t.n_layer + 1}"
        lines.append(
            f"{t.tier:<10} {layers:>8} {fmt_mib(t.gpu_weight_bytes):>9} "
            f"{fmt_mib(t.cpu_weight_bytes):>9} {fmt_mib(t.gpu_kv_bytes):>8} "
            f"{fmt_mib(t.cpu_kv_bytes):>8} {fmt_mib(t.gpu_buffer_bytes):>8} "
            f"{fmt_mib(t.cpu_buffer_bytes):>8} {fmt_mib(t.gpu_bytes):>9} {fmt_mib(t.host_bytes):>9}"
        )
    lines.append("-" * len(head))
    lines.append(
        f"GPU total {fmt_mib(p.gpu_bytes)} of {fmt_mib(p.usable_bytes)} MiB usable "
        f"({fmt_mib(p.budget_bytes)} budget); host RAM needed {fmt_mib(p.host_bytes)} MiB"
    )
    flags = " ".join(f"{t.tier}={t.n_gpu_layers}" for t in p.tiers)
    lines.append(
        f"n_gpu_layers: {flags}  (layers = llama.cpp's n_gpu_layers / n_layer+1; the output "
        "layer is offloaded first, token_embd stays on the CPU)"
    )
    no_offload = [t.tier for t in p.tiers if not t.op_offload]
    if no_offload:
        lines.append(
            f"op offload off for {', '.join(no_offload)}: its prompt batches stay on the CPU "
            "(the GPU buffer they need does not fit)"
        )
    return "\n".join(lines)


@command()
@click.option("--draft", metavar="GGUF", default=None, help="Draft (smallest) model.")
@click.option("--qualifier", metavar="GGUF", default=None, help="Qualifier (mid-size) model.")
@click.option("--target", "-m", "target", metavar="GGUF", required=True, help="Target model.")
@click.option(
    "--vram",
    metavar="SIZE|auto",
    default="auto",
    show_default=True,
    help="GPU memory budget, e.g. 8GiB, 6GB, 512MiB (auto: free memory per nvidia-smi).",
)
@ctx_size_option
@batch_size_option
@cache_type_k_option
@cache_type_v_option
@click.option(
    "--kv-quant",
    type=click.Choice(["off", "auto"]),
    default="off",
    show_default=True,
    help="auto: try f16, q8_0, q4_0 KV caches to fit more layers.",
)
@click.option(
    "--margin",
    metavar="SIZE",
    default=None,
    help="VRAM kept free [default: max(256MiB, 5% of the budget)].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(
    draft: str | None,
    qualifier: str | None,
    target: str,
    vram: str,
    n_ctx: int,
    n_batch: int,
    type_k: str,
    type_v: str,
    kv_quant: str,
    margin: str | None,
    as_json: bool,
) -> None:
    """Plan GPU offload for a ladder: n_gpu_layers per tier within a VRAM budget.

    The draft is placed first, then the qualifier, then the target; a tier gets layers only
    once the tiers before it are fully on the GPU.
    """
    load = LoadConfig(n_ctx=n_ctx, n_batch=n_batch, type_k=type_k, type_v=type_v)  # type: ignore[arg-type]
    result = plan_ladder(
        resolve_budget(vram),
        LadderPaths.of(target, qualifier, draft),
        load,
        kv_quant="auto" if kv_quant == "auto" else "off",
        margin_bytes=None if margin is None else parse_size(margin),
    )
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(format_plan(result))
