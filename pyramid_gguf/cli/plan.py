"""``pyramid-gguf plan``: how to spend a GPU memory budget on a ladder, before or after download.

Reads GGUF headers only (no model is loaded); a preset whose files are not here is planned from
the tier shapes shipped in ``models.toml`` or its headers on the hub. ``--gpu`` / ``--cpu`` name
the device profiles (``list`` shows the shipped ones). By default it ranks every placement of
the ladder (all tiers; no qualifier; the qualifier as the only draft; the draft on the CPU; the
target alone) by the speed ``auto`` is predicted to reach with it
(:mod:`pyramid_gguf.planning`), beside llama.cpp's own draft-model speculation in the same
placement, and shows the winner's memory table; ``--fit`` only fits every tier, the draft first.
System RAM is a budget too (``--ram``, else this machine's): a placement whose host memory does
not fit is listed apart, not ranked. Sizes in MiB.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..core.endpoints import parse_endpoints
from ..core.errors import UserError
from ..core.ladder import TIERS, LadderPaths
from ..core.load import LoadConfig
from ..core.remote import RpcConfig
from ..models.presets import DEFAULT_PRESET
from ..models.registry import get_preset
from ..planning.devices import DEFAULT, catalogue, format_list
from ..planning.memory import GiB, MiB, fmt_mib, model_memory, parse_size
from ..planning.plan import PlanInputs, plan_ladder, plan_preset
from ..planning.ram import SSD_BYTES_PER_S, RamBudget, overflow_bytes, resolve_ram
from ..planning.rank import Ranking
from ..planning.remote import RemoteDevice, describe_remote, remote_fit
from ..planning.tiers import preset_memory
from ..planning.vram import KvQuant, Plan, fit_ladder, make_plan, resolve_budget
from .options import (
    batch_size_option,
    cache_type_k_option,
    cache_type_v_option,
    command,
    ctx_size_option,
    moe_options,
    placement_options,
    ram_option,
)

__all__ = ["format_plan", "format_ranking", "plan"]

F = TypeVar("F", bound=Callable[..., Any])


def format_plan(p: Plan, ram: RamBudget | None = None) -> str:
    """The human-readable table of a plan (``ram``: with a line on whether its host memory
    fits that budget)."""
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
    if ram is not None:
        over = overflow_bytes(p.host_bytes, ram)
        lines.append(
            f"RAM: {ram.describe()}: "
            + (f"does NOT fit, {fmt_mib(over)} MiB over" if over else "fits")
        )
    flags = " ".join(f"{t.tier}={t.n_gpu_layers}" for t in p.tiers)
    lines.append(
        f"n_gpu_layers: {flags}  (layers = llama.cpp's n_gpu_layers / n_layer+1; the output "
        "layer is offloaded first, token_embd stays on the CPU)"
    )
    moe = " ".join(f"{t.tier}={t.n_cpu_moe}" for t in p.tiers if t.n_cpu_moe)
    if moe:
        lines.append(
            f"n_cpu_moe: {moe}  (llama.cpp's --n-cpu-moe: the routed experts of the first N "
            "blocks in system RAM, counted in CPU weights)"
        )
    no_offload = [t.tier for t in p.tiers if not t.op_offload]
    if no_offload:
        lines.append(
            f"op offload off for {', '.join(no_offload)}: its prompt batches stay on the CPU "
            "(the GPU buffer they need does not fit)"
        )
    return "\n".join(lines)


def format_ranking(r: Ranking) -> str:
    """The ranking table: per placement, each tier's GPU layers and VRAM, plain decoding's and
    ``auto``'s predicted speed, and the chain ``auto`` ran most."""
    w = max(20, *(len(p.placement.label) for p in r.predictions))
    head = (
        f"{'placement':<{w}} {'draft':>13} {'qualifier':>13} {'target':>13} {'RAM GiB':>7} "
        f"{'pp512':>7} {'TTFT s':>6} "
        f"{'plain tok/s':>11} {'llama.cpp -md':>13} {'auto tok/s':>10} {'vs best plain':>13}"
        "  auto ran"
    )
    lines = [
        "predicted (greedy), per placement; tiers: GPU layers, VRAM MiB; llama.cpp -md: "
        "llama-server's draft-model speculation here (tok/s, d or q: the draft or the qualifier "
        "as its draft / its best --spec-draft-n-max); eN: the experts of the first N blocks in "
        "system RAM (--n-cpu-moe N); pinned / repacked: the CPU layers' weights loaded with "
        "--no-mmap / --no-host (else mapped); pp512: the target's prompt tok/s, TTFT: seconds "
        "to a first token after a 512-token prompt",
        head,
        "-" * len(head),
    ]
    for p in r.predictions:
        cells = []
        for tier in ("draft", "qualifier", "target"):
            if tier in p.placement.tiers:
                t = p.placement.plan.tier(tier)
                moe = f" e{t.n_cpu_moe}" if t.n_cpu_moe else ""
                cells.append(f"{t.n_gpu_layers}/{t.n_layer + 1}{moe} {t.gpu_bytes / MiB:.0f}")
            else:
                cells.append("-")
        peer = "-"
        if p.peer is not None:
            peer = f"{p.peer.tps:.1f} {p.peer.draft[0]}/{p.peer.draft_max}"
        ram = p.placement.plan.host_bytes / GiB
        pp = f"{p.pp512_tps:>7.1f} {p.ttft_s:>6.2f}" if p.prompt_s else f"{'-':>7} {'-':>6}"
        lines.append(
            f"{p.placement.label:<{w}} {cells[0]:>13} {cells[1]:>13} {cells[2]:>13} {ram:>7.1f} "
            f"{pp} {p.plain_tps:>11.1f} {peer:>13} {p.tps:>10.1f} {p.speedup:>12.2f}x  "
            f"{p.main_chain}"
        )
    for u in r.unfit:
        if u.placement.weights != "mapped":
            lines.append(
                f"{u.placement.label:<{w}} does not fit the RAM: needs "
                f"{u.host_bytes / GiB:.1f} GiB, {u.over_bytes / GiB:.1f} over; its CPU weights "
                f"are not pages of the file, so it would not load (plain, {u.plain_tps:.1f} "
                "tok/s if it fit)"
            )
            continue
        lines.append(
            f"{u.placement.label:<{w}} does not fit the RAM: needs {u.host_bytes / GiB:.1f} GiB, "
            f"{u.over_bytes / GiB:.1f} over; re-reading that from an SSD "
            f"({SSD_BYTES_PER_S / 1e9:.0f} GB/s) every token: {u.ssd_tps:.2f} tok/s at best "
            f"(plain, {u.plain_tps:.1f} if it fit)"
        )
    lines += ["-" * len(head), *r.sources()]
    best, plain = r.best, max(p.plain_tps for p in r.predictions)
    flags = {"pinned": " (load with --no-mmap)", "repacked": " (load with --no-host)"}
    lines.append(
        f"best: {best.placement.label}{flags.get(best.placement.weights, '')}, auto predicted "
        f"{best.tps:.1f} tok/s, {best.speedup:.2f}x the best plain decoding ({plain:.1f} tok/s)"
        + (f"; pp512 {best.pp512_tps:.0f} tok/s, TTFT {best.ttft_s:.2f} s" if best.prompt_s else "")
    )
    return "\n".join(lines)


def _listing(kind: str, as_json: bool) -> str:
    if as_json:
        rows = [
            {
                "slug": e.slug,
                "name": e.full_name,
                "class": e.cls,
                "vram_bytes": e.vram_bytes,
                "bandwidth_gbs": round(e.bandwidth / 1e9, 1),
                "basis": e.basis,
                "fit_error": e.fit_error,
            }
            for e in catalogue(kind).values()
        ]
        return json.dumps(rows, indent=2)
    return format_list(kind)


def _profile_option(kind: str, hint: str) -> Callable[[F], F]:
    return click.option(
        f"--{kind}",
        f"--{kind}-profile",
        f"{kind}_name",
        metavar="NAME|FILE|list",
        default=None,
        help=f"{kind.upper()} to price on: a shipped profile ('list' shows them) or a profile "
        f"file [default: yours (calibrate --device-profile), {hint}].",
    )


@command()
@click.option("--draft", metavar="GGUF", default=None, help="Draft (smallest) model.")
@click.option("--qualifier", metavar="GGUF", default=None, help="Qualifier (mid-size) model.")
@click.option("--target", "-m", "target", metavar="GGUF", default=None, help="Target model.")
@click.option(
    "--preset",
    metavar="NAME",
    default=None,
    help="A ladder from models.toml, planned without its files (shipped shapes, else the hub) "
    "[default without models: the default ladder].",
)
@click.option(
    "--hub",
    is_flag=True,
    help="With --preset: read each missing file's header from the hub (a few MB) before the "
    "shipped shape.",
)
@click.option(
    "--vram",
    metavar="SIZE|auto",
    default="auto",
    show_default=True,
    help="GPU memory budget, e.g. 8GiB, 6GB, 512MiB (auto: free memory per nvidia-smi).",
)
@ram_option
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
@click.option(
    "--fit",
    is_flag=True,
    help="Only fit every tier into the budget (the draft first), without ranking placements.",
)
@click.option(
    "--traces",
    "traces_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Acceptance traces (pyramid-gguf traces) [default: this ladder's, else the shipped ones].",
)
@click.option("--prompts", "sets", default=None, help="Only these prompt sets of the traces.")
@_profile_option("gpu", f"else the card llama.cpp reports, else {DEFAULT['gpu']}")
@_profile_option("cpu", f"else {DEFAULT['cpu']}")
@click.option(
    "--rpc",
    metavar="HOST:PORT[,...]",
    default=None,
    help="Place tiers on these llama.cpp RPC servers instead (their memory as they report it).",
)
@click.option("--rpc-tiers", metavar="TIERS", default=None, help="Tiers there [default: target].")
@click.option("--rpc-output/--no-rpc-output", "rpc_output", default=False)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@moe_options[0]
@moe_options[1]
@placement_options[0]
@placement_options[1]
@placement_options[2]
@click.option(
    "--routes",
    "routes_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A mixture-of-experts target's router choices recorded on real text (.npy, int "
    "[n_tokens, n_layer, K]): the experts a block reads are measured on them "
    "[default: random routing].",
)
def plan(
    draft: str | None,
    qualifier: str | None,
    target: str | None,
    preset: str | None,
    hub: bool,
    vram: str,
    ram: str,
    n_ctx: int,
    n_batch: int,
    type_k: str,
    type_v: str,
    kv_quant: str,
    margin: str | None,
    fit: bool,
    traces_path: Path | None,
    sets: str | None,
    gpu_name: str | None,
    cpu_name: str | None,
    rpc: str | None,
    rpc_tiers: str | None,
    rpc_output: bool,
    as_json: bool,
    n_cpu_moe: int,
    cpu_moe: bool,
    no_mmap: bool,
    no_host: bool,
    pcie: str | None,
    routes_path: Path | None,
) -> None:
    """Plan GPU offload for a ladder within a VRAM budget, before or after download.

    Ranks every placement (all tiers, no qualifier, the qualifier as the only draft, the draft
    on the CPU, the target alone) by the speed auto is predicted to reach, from acceptance
    traces and cost curves composed from device profiles, and shows the winner's layers per
    tier. Beside it, llama.cpp's own draft-model speculation in the same placement
    (llama-server -md, greedy matching, its best --spec-draft-n-max; no per-round overhead
    charged). --gpu list / --cpu list show the shipped profiles. With --fit: every tier, the
    draft first, then the qualifier, then the target.

    System RAM is a budget too: a placement keeps its CPU layers' weights, their KV cache and
    compute buffers in host memory. llama.cpp maps the GGUF file, so those weights live in the
    page cache and count against RAM (repacked CPU weights are copies in ordinary memory: the
    same bytes). Only placements that fit the RAM (--ram, else this machine's, less a reserve
    of max(2 GiB, 10%) for the OS) are ranked; one that does not is listed apart with the
    speed it would reach re-reading its overflow from an SSD every token (3 GB/s assumed), and
    when none fits, one line says how much RAM, or how much --vram, is missing.
    """
    for kind, name in (("gpu", gpu_name), ("cpu", cpu_name)):
        if name is not None and name.strip().lower() == "list":
            click.echo(_listing(kind, as_json))
            return
    if preset is not None and (target or qualifier or draft):
        raise UserError("give either --preset or model paths (--target/--qualifier/--draft)")
    if target is None and (qualifier or draft):
        raise UserError("--target is required when --draft or --qualifier is given")
    load = LoadConfig(
        n_ctx=n_ctx,
        n_batch=n_batch,
        type_k=type_k,  # type: ignore[arg-type]
        type_v=type_v,  # type: ignore[arg-type]
        n_cpu_moe=n_cpu_moe,
        cpu_moe=cpu_moe,
        use_mmap=not no_mmap,
        no_host=no_host,
        pcie=pcie,
    )
    budget = resolve_budget(vram) if not rpc else 0
    quant: KvQuant = "auto" if kv_quant == "auto" else "off"
    margin_bytes = None if margin is None else parse_size(margin)
    paths = LadderPaths.of(target, qualifier, draft) if target else None
    ladder = preset or DEFAULT_PRESET
    remote = RpcConfig.from_flags(rpc, rpc_tiers, rpc_output)
    if remote is not None:
        _plan_remote(remote, paths, ladder, load, hub=hub, as_json=as_json)
        return
    if fit:
        if paths is not None:
            result = fit_ladder(budget, paths, load, kv_quant=quant, margin_bytes=margin_bytes)
        else:
            models = preset_memory(get_preset(ladder), hub=hub).models
            order = [(t, models[t]) for t in TIERS if t in models]
            result = make_plan(order, budget, load, kv_quant=quant, margin_bytes=margin_bytes)
        budget_ram = resolve_ram(ram)
        if as_json:
            doc = result.to_dict()
            doc["ram"] = budget_ram.to_dict() if budget_ram is not None else None
            click.echo(json.dumps(doc, indent=2))
        else:
            click.echo(format_plan(result, budget_ram))
        return
    inputs = PlanInputs(
        traces=traces_path,
        sets=tuple(s.strip() for s in (sets or "").split(",") if s.strip()),
        cpu=cpu_name,
        gpu=gpu_name,
        gpu_offload=True,
        kv_quant=quant,
        margin=margin_bytes,
        ram=ram,
        routes=routes_path,
    )
    if paths is not None:
        ranking = plan_ladder(paths, budget, load, inputs=inputs)
    else:
        ranking = plan_preset(ladder, budget, load, inputs=inputs, hub=hub)
    if as_json:
        click.echo(json.dumps(ranking.to_dict(), indent=2))
    else:
        click.echo(format_ranking(ranking))
        click.echo("")
        click.echo(format_plan(ranking.best.placement.plan, ranking.ram))


def _plan_remote(
    rpc: RpcConfig,
    paths: LadderPaths | None,
    preset: str,
    load: LoadConfig,
    *,
    hub: bool,
    as_json: bool,
) -> None:
    """``plan --rpc``: each tier's side against the servers' reported memory."""
    from ..native import rpc as native_rpc

    if paths is not None:
        models = {t: model_memory(p) for t, p in paths.model_files().items()}
    else:
        models = dict(preset_memory(get_preset(preset), hub=hub).models)
    devices = [
        RemoteDevice(str(d.endpoint), d.name, d.free, d.total)
        for d in native_rpc.devices(parse_endpoints(rpc.endpoints))
    ]
    fit = remote_fit(rpc.place_tiers(models), rpc, devices, load)
    if as_json:
        doc = {
            "devices": [vars(d) for d in devices],
            "remote_bytes": fit.remote_bytes,
            "local_bytes": fit.local_bytes,
            "free_bytes": fit.free_bytes,
            "fits": fit.fits,
            "tiers": list(fit.parts),
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(describe_remote(fit, devices, rpc))
