"""Cost curves the pricing tests share: measured CPU targets, a GPU-like one, and drafts
(seconds per evaluation of 1, 2, ... tokens)."""

from __future__ import annotations

from pyramid_gguf.decoding.pricing.costs import CostCurve

#: Measured on a 2-core AVX-512 machine (issue 12): the 1.5B Q4_K_M target, ms per decode of
#: k tokens; repacked weights are multiplied in rows of 4, so 5 tokens cost far more than 4.
AVX512 = CostCurve(tuple(ms / 1000 for ms in (34, 51, 68, 80, 129, 140, 160, 188)))
#: The same target on a 2-core Xeon with the no-AMX build (README, ``calibrate``), 1..16 tokens:
#: 2 tokens cost 1.62 single ones, so no block that risks at most one token's time can promise
#: CONFIDENT_GAIN; first bets come from shadow credit.
NOAMX_MS = (56.9, 92.4, 116.2, 116.2, 145.2, 176.5, 190.3, 204.1, 213.4, 222.8, 232.1, 241.4)
NOAMX = CostCurve(tuple(ms / 1000 for ms in (*NOAMX_MS, 241.4, 241.4, 241.4, 241.4)))
#: A GPU-like target: a batch costs about one token.
GPU = CostCurve.shaped(0.010, 0.0002)
#: A 2-core CPU draft: 0.64 of the target per token (the 0.5B against the 1.5B).
CPU_DRAFT = CostCurve(tuple(0.64 * s for s in AVX512.seconds))
GPU_DRAFT = CostCurve.shaped(0.002, 0.0001)
