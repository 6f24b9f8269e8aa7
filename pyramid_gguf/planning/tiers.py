"""A named ladder's memory facts before (or after) its files are here.

Per tier of a ``models.toml`` preset, the first that applies:

1. its file, when it is on disk (the header, read locally);
2. with ``hub``, an ``hf`` tier's header read from the hub by range requests (a few MB);
3. the shape shipped with the tier in ``models.toml`` (offline);
4. a tier derived by ``keep_layers``: its source tier's facts, those blocks kept;
5. an ``hf`` tier's header from the hub, unless ``HF_HUB_OFFLINE`` is set.

Anything else is a one-line :class:`UserError` saying what to do (pull the ladder, or go
online). Every answer says where each tier's facts came from.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import UserError
from ..models.derive import parse_layer_list
from ..models.fetch import local_path
from ..models.registry import Preset, Tier
from .memory import ModelMemory, keep_blocks, model_memory, shape_memory


@dataclass(frozen=True)
class LadderMemory:
    """Each tier's :class:`ModelMemory` and, per tier, where it came from (one line each)."""

    models: dict[str, ModelMemory]
    notes: tuple[str, ...]


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _from_hub(tier: Tier) -> tuple[ModelMemory, str]:
    from ..models.remote import hub_header

    got = hub_header(tier)
    note = f"the header of {tier.repo}/{tier.file} read from the hub ({got.bytes_read >> 10} KiB)"
    return model_memory(got.header), note


def _tier_memory(preset: Preset, tier: Tier, hub: bool) -> tuple[ModelMemory, str]:
    label = f"{preset.name}/{tier.name}"
    path = local_path(tier)
    if path is not None:
        return model_memory(path), f"the header of {path}"
    if hub and tier.source == "hf":
        return _from_hub(tier)
    if tier.shape is not None:
        return shape_memory(tier.shape, f"{label} (shipped shape)"), (
            f"the shape shipped in models.toml: {tier.shape.source}"
        )
    if tier.source == "derived" and tier.keep_layers and tier.derived_from:
        base, note = _tier_memory(preset, preset.tiers[tier.derived_from], hub)
        blocks = parse_layer_list(tier.keep_layers, base.n_layer)
        kept = keep_blocks(base, blocks, f"{label} (derived shape)")
        return kept, f"blocks {tier.keep_layers} of the {tier.derived_from}'s: {note}"
    if tier.source == "hf" and not _offline():
        return _from_hub(tier)
    why = "HF_HUB_OFFLINE is set" if tier.source == "hf" else "it is not on the hub"
    raise UserError(
        f"preset {preset.name!r}: the {tier.name} ({tier.file}) is not here, models.toml ships "
        f"no shape for it and {why}; run `pyramid-gguf pull {preset.name}` or plan online"
    )


def preset_memory(preset: Preset, *, hub: bool = False) -> LadderMemory:
    """The memory facts of every tier of ``preset`` (see the module docstring)."""
    models, notes = {}, []
    for name, tier in preset.tiers.items():
        models[name], note = _tier_memory(preset, tier, hub)
        notes.append(f"{name}: {note}")
    return LadderMemory(models, tuple(notes))
