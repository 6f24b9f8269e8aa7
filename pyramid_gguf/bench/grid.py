"""The benchmark grid: which modes to run and which knob values to sweep, as config rows.

A swept knob is only swept for the modes that read it (the mode table says which).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import UserError
from ..core.modes import mode_info
from ..core.spec import KNOBS, SpecConfig

#: Knobs ``--sweep`` accepts: every speculative knob but the mode itself.
SWEEP_KNOBS: tuple[str, ...] = tuple(k for k in KNOBS if k != "mode")


@dataclass(frozen=True)
class BenchConfig:
    """One row of the benchmark: a spec and the swept knob values that made it."""

    label: str
    spec: SpecConfig
    knobs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, base: SpecConfig, mode: str, **knobs: Any) -> BenchConfig:
        """``base`` in ``mode`` with ``knobs`` set, labelled ``"mode k=v ..."``."""
        label = mode + "".join(f" {k}={v}" for k, v in knobs.items())
        return cls(label, base.with_(mode=mode, **knobs), dict(knobs))


def parse_modes(text: str | Sequence[str] | None, allowed: Sequence[str]) -> list[str]:
    """``--modes sd,psd-exact`` -> the modes to run, ``target`` always first (the reference).
    ``allowed``: the modes the ladder runs (:attr:`~pyramid_gguf.core.ladder.LadderShape.modes`)."""
    if text is None or text == "" or text == "all":
        wanted = list(allowed)
    else:
        items = text.split(",") if isinstance(text, str) else list(text)
        wanted = [m.strip() for m in items if m.strip()]
    for m in wanted:
        mode_info(m)  # an unknown mode names the valid ones
        if m not in allowed:
            raise UserError(
                f"mode {m} needs a tier this ladder lacks; this ladder allows: {', '.join(allowed)}"
            )
    return ["target", *[m for m in dict.fromkeys(wanted) if m != "target"]]


def parse_sweep(items: Iterable[str]) -> list[tuple[str, list[Any]]]:
    """``["l_d=2,4,8", "tau_t=0.2,0.4"]`` -> ``[("l_d", [2, 4, 8]), ("tau_t", [0.2, 0.4])]``."""
    out: list[tuple[str, list[Any]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not values.strip():
            raise UserError(f"malformed --sweep {item!r}; expected KNOB=V1,V2 (e.g. l_d=2,4,8)")
        if key not in SWEEP_KNOBS:
            raise UserError(f"cannot sweep {key!r}; valid knobs: {', '.join(SWEEP_KNOBS)}")
        if any(k == key for k, _ in out):
            raise UserError(f"--sweep {key} given twice")
        parsed = [KNOBS[key].from_text(v, f"--sweep {key}") for v in values.split(",")]
        out.append((key, list(dict.fromkeys(parsed))))
    return out


def build_grid(
    modes: Sequence[str], base: SpecConfig, sweeps: Sequence[tuple[str, list[Any]]] = ()
) -> list[BenchConfig]:
    """One row per mode and point of the cartesian grid of the knobs that mode uses.

    ``target`` is one row; a mode gets ``prod(len(values))`` rows over the swept knobs it uses
    (``tau_t`` is not swept for ``sd``). Invalid values raise :class:`UserError`.
    """
    rows: list[BenchConfig] = []
    for mode in modes:
        used = [(k, vs) for k, vs in sweeps if k in mode_info(mode).knobs]
        for point in itertools.product(*(vs for _, vs in used)):
            knobs = {k: v for (k, _), v in zip(used, point, strict=True)}
            rows.append(BenchConfig.of(base, mode, **knobs))
    return rows
