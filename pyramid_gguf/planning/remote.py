"""Tiers on RPC servers (``plan --rpc``): what each side must hold, against what it reports.

llama.cpp spreads a model's layers over the devices it is given in proportion to their free
memory; a tier on RPC servers puts its repeating layers, their KV cache and compute buffer
there, and keeps the token embeddings (always) and, by default, the output layer here
(:class:`~pyramid_gguf.core.remote.RpcConfig`). Speeds over a link are not predicted: its round
trips are measured by ``calibrate --rpc`` and priced by ``auto`` every round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..core.load import LoadConfig
from ..core.remote import RpcConfig
from .memory import GiB, ModelMemory, fmt_mib


def _size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{fmt_mib(n)} MiB"


@dataclass(frozen=True)
class RemoteDevice:
    """What an RPC server reports of one device: its endpoint, name and memory in bytes."""

    endpoint: str
    name: str
    free: int
    total: int


@dataclass(frozen=True)
class RemoteFit:
    """Bytes the RPC servers must hold for the remote tiers, bytes left here, and whether the
    servers' free memory holds them."""

    remote_bytes: int
    local_bytes: int
    free_bytes: int
    parts: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return self.remote_bytes <= self.free_bytes


def remote_fit(
    models: Mapping[str, ModelMemory],
    rpc: RpcConfig,
    devices: Sequence[RemoteDevice],
    load: LoadConfig,
) -> RemoteFit:
    """Where ``models`` (tier -> memory facts) go under ``rpc``."""
    remote = local = 0
    parts: list[str] = []
    for tier, mm in models.items():
        kv = mm.kv_bytes(load.n_ctx, load.type_k, load.type_v)
        compute = mm.compute_bytes(load.n_ctx, min(load.n_batch, 512), logits=rpc.remote_output)
        if tier in rpc.tiers:
            there = sum(mm.layer_bytes) + kv + compute
            here = mm.embd_bytes + mm.other_bytes
            if rpc.remote_output:
                there += mm.head_bytes
            else:
                here += mm.head_bytes
            remote += there
            local += here
            where = "its output layer here" if not rpc.remote_output else "its output layer too"
            parts.append(
                f"{tier} on the RPC servers: {_size(there)} (layers and KV cache at "
                f"{load.n_ctx} tokens; {where}), {_size(here)} here"
            )
        else:
            own = mm.weight_bytes + kv + compute
            local += own
            parts.append(f"{tier} here: {_size(own)}")
    return RemoteFit(remote, local, sum(d.free for d in devices), tuple(parts))


def describe_remote(fit: RemoteFit, devices: Sequence[RemoteDevice], rpc: RpcConfig) -> str:
    """The plan as lines: each server's devices, each tier's side, the verdict."""
    lines = ["RPC servers (llama.cpp's RPC backend; no authentication: a trusted network only):"]
    lines += [
        f"  {d.name} at {d.endpoint}: {_size(d.free)} free of {_size(d.total)}" for d in devices
    ]
    lines += [f"  {p}" for p in fit.parts]
    if fit.fits:
        lines.append(
            f"fits: {_size(fit.remote_bytes)} of {_size(fit.free_bytes)} free on the "
            f"servers, {_size(fit.local_bytes)} here"
        )
    else:
        short = fit.remote_bytes - fit.free_bytes
        lines.append(
            f"does not fit: the servers need {_size(short)} more free memory (another "
            "--rpc server, a smaller quantization or a shorter --ctx-size)"
        )
    tiers = ",".join(rpc.tiers)
    lines.append(
        "speed: not predicted over a link; `pyramid-gguf calibrate --rpc "
        f"{','.join(rpc.endpoints)} --rpc-tiers {tiers}` measures its round trips and auto "
        "prices them every round"
    )
    return "\n".join(lines)
