"""Where a ladder's tiers run when some live on other machines: :class:`RpcConfig`.

llama.cpp's ``--rpc HOST:PORT[,HOST:PORT...]`` names RPC servers whose devices join the local
ones. Here they hold whole tiers: by default the target (the expensive tier a speculative
round asks once per block), while the draft and the qualifier stay local and cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from .endpoints import parse_endpoints
from .errors import UserError
from .load import LoadConfig

TIER_NAMES = ("draft", "qualifier", "target")
T = TypeVar("T")


@dataclass(frozen=True)
class RpcConfig:
    """Which tiers run on which RPC servers.

    ``endpoints``: the servers, each ``HOST:PORT``; a tier on them spreads its layers over
    their devices (llama.cpp splits by free memory). ``tiers``: the tiers placed there.
    ``remote_output``: the output layer too (the logits of every verified row cross the link:
    ``n_vocab`` floats a row) or, by default, kept here (the hidden state crosses instead:
    ``n_embd`` floats a row, a hundredth for Qwen2.5, and this machine computes the head).
    """

    endpoints: tuple[str, ...]
    tiers: tuple[str, ...] = ("target",)
    remote_output: bool = False

    def __post_init__(self) -> None:
        parsed = parse_endpoints(self.endpoints)
        object.__setattr__(self, "endpoints", tuple(str(e) for e in parsed))
        bad = [t for t in self.tiers if t not in TIER_NAMES]
        if bad or not self.tiers:
            raise UserError(
                f"--rpc-tiers takes {', '.join(TIER_NAMES)} (comma-separated), got "
                f"{','.join(self.tiers) or 'nothing'}"
            )

    @classmethod
    def from_flags(
        cls, rpc: str | None, tiers: str | None = None, remote_output: bool = False
    ) -> RpcConfig | None:
        """From ``--rpc``, ``--rpc-tiers`` and ``--rpc-output``; None without ``--rpc``."""
        if not rpc:
            if tiers:
                raise UserError("--rpc-tiers needs --rpc")
            return None
        names = tuple(t.strip() for t in (tiers or "target").split(",") if t.strip())
        return cls((rpc,), names, remote_output)

    def place_tiers(self, tiers: Mapping[str, T]) -> dict[str, T]:
        """``tiers`` (a ladder's tier names to anything), checked to hold every tier of
        :attr:`tiers`."""
        missing = [t for t in self.tiers if t not in tiers]
        if missing:
            raise UserError(f"--rpc-tiers names {', '.join(missing)}, which this ladder lacks")
        return dict(tiers)

    def place(
        self,
        tiers: Mapping[str, Any],
        base: LoadConfig,
        tier_loads: Mapping[str, LoadConfig] | None = None,
    ) -> dict[str, LoadConfig]:
        """Each tier's :class:`LoadConfig` (``tier_loads`` else ``base``), those of
        :attr:`tiers` on the servers with every layer there; ``tiers`` maps the ladder's tier
        names (its model files). A named tier the ladder lacks is a :class:`UserError`."""
        out = {t: (tier_loads or {}).get(t, base) for t in self.place_tiers(tiers)}
        for t in self.tiers:
            out[t] = replace(
                out[t], rpc=self.endpoints, rpc_output=self.remote_output, n_gpu_layers=-1
            )
        return out
