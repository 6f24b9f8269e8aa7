"""Each tier's batch cost curve for a loaded ladder: measured once per machine and cached
(:func:`~pyramid_gguf.decoding.runtime.calibrate.calibrate`), and the curves ``auto`` prices
rounds with (a strict target's micro-batches included)."""

from __future__ import annotations

from collections.abc import Callable

from ..decoding.pricing.costs import CostCurve
from ..decoding.runtime.calibrate import Calibration, calibrate
from ..decoding.runtime.tiers import Ladder


def calibrate_ladder(
    ladder: Ladder, *, refresh: bool = False, say: Callable[[str], None] | None = None
) -> dict[str, Calibration]:
    """Each tier's calibration by tier name (``refresh``: measure again). A target loaded with
    ``strict_identity`` also gets the identity probe, which sets its micro-batch (``chunk``)
    to the largest batch that is bit-identical here. Evaluates on the models' contexts: call
    it only while no slot runs."""
    out = {}
    for tier in ladder.models:
        strict = tier is ladder.target and tier.model.cfg.strict_identity
        out[tier.name] = cal = calibrate(tier, probe=strict, refresh=refresh, say=say)
        if strict:
            tier.chunk = cal.identity_batch or 1
    return out


def priced_costs(ladder: Ladder, calibration: dict[str, Calibration]) -> dict[str, CostCurve]:
    """The cost curve of each tier as ``auto`` prices it: seconds per evaluation of n tokens,
    split into the tier's micro-batches, or padded where the slots' batcher pads them (a tier
    that can drop padding rows, not split)."""
    out = {}
    for t in ladder.models:
        curve = calibration[t.name].curve
        padded = t.chunk == 0 and t.loaded.can_pad
        out[t.name] = curve.padded() if padded else curve.with_chunk(t.chunk)
    return out


def needs_identity_probe(ladder: Ladder) -> bool:
    """Whether the target runs ``strict_identity`` (its micro-batch comes from calibration)."""
    return ladder.target.model.cfg.strict_identity
