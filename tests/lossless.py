"""What "lossless" lets a greedy run differ in, checked from the target's own logits.

A lossless mode's greedy tokens equal ``target``'s, except that a verification batch runs other
matrix kernels than one-token decoding, so at a floating-point near-tie of the target's top two
logits it may pick the other one (docs/ALGORITHMS.md). :func:`assert_same_or_near_tie` asserts
exactly that, on any CPU: identical tokens, or a first difference where both tokens are the
target's top two and their logits are within ``bound`` of each other, the logits coming from
the same evaluation path ``target`` decoding used (the prompt in one batch, then one token at a
time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pyramid_gguf.config import SamplingConfig, SpecConfig
from pyramid_gguf.decoding.costs import CostCurve
from pyramid_gguf.decoding.engine import decode, make_rounds
from pyramid_gguf.decoding.sampling import Sampler
from pyramid_gguf.decoding.stats import GenerationStats
from pyramid_gguf.serving.api import Pyramid

#: Stated bounds on the top-2 logit gap at a permitted divergence. Tiny f32 models: batched
#: and one-token logits differ by ~1e-4 here. Real Q4/Q5 models: by up to ~0.7 where
#: llama.cpp changes kernels (measured on the Qwen2.5-Coder 1.5B; README).
TINY_TIE = 1e-3
REAL_TIE = 1.0


def target_logits_at(p: Pyramid, prompt: Sequence[int], prefix: Sequence[int]) -> np.ndarray:
    """The target's raw logits after ``prompt + prefix``, evaluated as ``target`` decoding
    evaluates them: the prompt in one batch, then each token alone. ``[V]``."""
    tier = p.ladder.target
    tier.model.reset()
    row = tier.prefill(prompt, logits=True)
    for token in prefix:
        row = tier.step(token)
    tier.model.reset()
    return row


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_same_or_near_tie(
    p: Pyramid, prompt: Sequence[int], got: Sequence[int], want: Sequence[int], bound: float
) -> None:
    """``got`` (a lossless mode) equals ``want`` (``target``), or first differs at a near-tie.

    Both are greedy token lists for ``prompt`` on ``p``'s target. A list that ends first ended
    at an end-of-generation token, which then is its token at the difference.
    """
    i = first_difference(got, want)
    if i is None:
        return
    z = target_logits_at(p, prompt, want[:i])
    top2 = [int(t) for t in np.argsort(-z.astype(np.float64), kind="stable")[:2]]
    gap = float(z[top2[0]] - z[top2[1]])
    tokens = {int(seq[i]) if i < len(seq) else None for seq in (got, want)}
    ended = None in tokens
    tokens.discard(None)
    assert tokens <= set(top2), f"position {i}: {tokens} are not the target's top two {top2}"
    if ended:  # the other of the top two must end generation
        other = next(t for t in top2 if t not in tokens)
        assert p.is_eog(other), f"position {i}: generation ended on non-EOG {other}"
    assert gap < bound, f"position {i}: top-2 gap {gap:.4f} is not a near-tie (< {bound})"


def generate(
    p: Pyramid,
    prompt: Sequence[int],
    spec: SpecConfig,
    sampling: SamplingConfig,
    costs: Mapping[str, CostCurve] | None = None,
) -> tuple[list[int], GenerationStats]:
    """A generation through the engine itself, ``auto`` priced by the given ``costs`` (a
    GPU-shaped curve, say) instead of this machine's measured ones."""
    stats = GenerationStats(mode=spec.mode)
    sampler = Sampler(sampling)
    rounds, prefill = make_rounds(p.ladder, spec, sampler, stats, costs=dict(costs or {}))
    return list(decode(p.ladder, prompt, rounds, prefill, sampler, stats)), stats


def shaped_costs(p: Pyramid, *, per_token: float, draft: float) -> dict[str, CostCurve]:
    """Cost curves for every tier of ``p``: the target 1 s per evaluation plus ``per_token``
    per extra token (0.02: a GPU; 1.0: a small CPU), the other tiers ``draft`` times that."""
    curves = {}
    for tier in p.ladder.models:
        scale = 1.0 if tier is p.ladder.target else draft
        curves[tier.name] = CostCurve.shaped(scale, scale * per_token)
    return curves
