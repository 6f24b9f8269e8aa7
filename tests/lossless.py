"""What "lossless" lets a greedy run differ in, checked from the target's own logits.

A lossless mode's greedy tokens equal ``target``'s, except that a verification batch runs other
matrix kernels than one-token decoding, so at a floating-point near-tie of the target's top
logits it may pick another of them (docs/ALGORITHMS.md). :func:`assert_same_or_near_tie`
asserts exactly that, on any CPU: identical tokens, or a first difference where both tokens'
logits are within ``bound`` of the target's top logit there. The logits are evaluated as
``target`` decoding evaluates them on a fresh cache (the prompt in one batch, then one token at
a time); a run that reused a cached prompt prefix rounded slightly differently, which is why
the criterion names a bound and not an exact order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

from pyramid_gguf.api import Pyramid
from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.runtime.engine import decode, make_scheduler
from pyramid_gguf.decoding.runtime.sampling import Sampler, warp
from pyramid_gguf.decoding.runtime.stats import GenerationStats
from pyramid_gguf.decoding.runtime.tiers import ModelTier
from pyramid_gguf.native import supports_gpu_offload

#: Stated bounds on how far under the target's top logit either token of a permitted
#: divergence may be. Tiny f32 models: batched and one-token logits differ by ~1e-4 here.
#: Real Q4/Q5 models: first differences were near-ties of at most 0.25 logits on the
#: Qwen2.5-Coder 1.5B (docs/ALGORITHMS.md, "What lossless means"); llama.cpp's kernels differ by up
#: to ~0.7. A GPU build offloads the tiny models too: there batch shape picks the kernel
#: (matrix-vector, MMQ or cuBLAS, with f16 intermediates) and logits differ by up to 0.032 (H100,
#: docs/BENCHMARKS.md "On a GPU"); the tiny models' bound is then 0.05.
ON_GPU = supports_gpu_offload()
TINY_TIE = 5e-2 if ON_GPU else 1e-3
REAL_TIE = 1.0


def kernel_atol(cpu: float) -> float:
    """Tolerance between two evaluations of the tiny models that run different kernels:
    ``cpu`` on a CPU build, at least :data:`TINY_TIE` on a GPU build."""
    return max(cpu, TINY_TIE) if ON_GPU else cpu


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
    at an end-of-generation token: then the best end-of-generation token stands in for it.
    """
    i = first_difference(got, want)
    if i is None:
        return
    z = target_logits_at(p, prompt, want[:i]).astype(np.float64)
    top = float(z.max())
    for seq in (got, want):
        if i < len(seq):
            token = int(seq[i])
        else:  # this run ended here: its token was the most likely end-of-generation token
            ends = [t for t in np.argsort(-z)[:8] if p.is_eog(int(t))]
            assert ends, f"position {i}: generation ended, but no EOG is among the top 8"
            token = int(ends[0])
        gap = top - float(z[token])
        assert gap < bound, (
            f"position {i}: token {token} is {gap:.4f} under the target's top logit, "
            f"not a near-tie (< {bound})"
        )


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
    rounds, prefill = make_scheduler(p.ladder, spec, sampler, stats, costs=dict(costs or {}))
    return list(decode(p.ladder, prompt, rounds, prefill, sampler, stats)), stats


def shaped_costs(p: Pyramid, *, per_token: float, draft: float) -> dict[str, CostCurve]:
    """Cost curves for every tier of ``p``: the target 1 s per evaluation plus ``per_token``
    per extra token (0.02: a GPU; 1.0: a small CPU), the other tiers ``draft`` times that."""
    curves = {}
    for tier in p.ladder.models:
        scale = 1.0 if tier is p.ladder.target else draft
        curves[tier.name] = CostCurve.shaped(scale, scale * per_token)
    return curves


# --- the joint distribution of the first two sampled tokens, and its chi-square test ---------

HOT = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=4, ignore_eos=True)
GREEDY = SamplingConfig(temperature=0, max_tokens=40, ignore_eos=True)
PROMPT = "the model of the tree"
SEEDS = 2500


def joint(tier: ModelTier, prompt: list[int]) -> np.ndarray:
    """``p(t1, t2)`` of ``tier`` after ``prompt`` under :data:`HOT`, flattened ``[V * V]``."""
    p1 = warp(tier.score(prompt, [])[0], HOT)
    out = np.zeros((len(p1), len(p1)))
    for t1 in np.flatnonzero(p1 > 1e-7):  # the rest cannot show up in a few thousand samples
        out[t1] = p1[t1] * warp(tier.score([*prompt, int(t1)], [])[0], HOT)
    tier.model.reset()
    return (out / out.sum()).ravel()


def pairs(run: object, n_vocab: int) -> np.ndarray:
    firsts = np.array([run(seed)[:2] for seed in range(SEEDS)])  # type: ignore[operator]
    return firsts[:, 0] * n_vocab + firsts[:, 1]


def chain_joint(
    tier: ModelTier, prompt: list[int], sampling: SamplingConfig, vocab: Any = None
) -> np.ndarray:
    """``p(t1, t2)`` of ``tier`` under ``sampling``'s whole chain, each position warped after
    its own prefix (the penalties read it), flattened ``[V * V]``; ``vocab``: the vocabulary
    DRY's sequence breakers are found in."""
    s = Sampler(sampling, vocab=vocab)

    def dist(prefix: list[int]) -> np.ndarray:
        return s.warp(s.prepare(prefix, tier.score(prefix, [])[0]))

    p1 = dist(prompt)
    out = np.zeros((len(p1), len(p1)))
    for t1 in np.flatnonzero(p1 > 1e-7):
        out[t1] = p1[t1] * dist([*prompt, int(t1)])
    tier.model.reset()
    return (out / out.sum()).ravel()


def chi_square_pvalue(samples: np.ndarray, expected_probs: np.ndarray) -> float:
    """Pearson chi-square goodness of fit, bins with expected count < 5 pooled."""
    n = len(samples)
    observed = np.bincount(samples, minlength=len(expected_probs)).astype(float)
    expected = expected_probs * n
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(sps.chisquare(obs[keep], exp[keep]).pvalue)
