"""The most any n-gram drafter could gain on a recorded answer: an upper bound, by a cost curve.

An n-gram drafter (ours, llama.cpp's ``ngram-simple``, ``ngram-map-k``, ``ngram-mod``) looks
the last committed token(s) up in the text so far and proposes what followed an earlier
occurrence. Whatever its lookup, a proposal it can make at answer position ``i`` is some
``text[j : j + b]`` with ``text[j - 1]`` equal to the last committed token: anchored on at least
that token. :func:`copy_runs` measures, per position, the longest such run that the answer
really continues with (an oracle's pick of ``j``; a run may overlap the text it is copying, as
an answer repeating a short cycle does). Unanchored (``anchored=False``), any earlier ``j``
counts: the bound of every drafter that copies from the context, whatever it looks up (one
that re-aligns with its source after an edit, as speculative edits do, included).

:func:`copy_bound` then chooses, with perfect foresight, where to propose and how much (up to
``max_block``) to spend the fewest seconds on the answer under ``curve``: no drafter of the
kind can do better greedily on that machine, so a goal above the bound cannot be met by better
drafting, only by a flatter curve or answers that copy more. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..pricing.costs import CostCurve

#: Longest block the bound considers: llama.cpp's n-gram drafters propose at most 48 tokens.
MAX_BLOCK = 48


def copy_runs(prompt: Sequence[int], answer: Sequence[int], *, anchored: bool = True) -> np.ndarray:
    """``runs[i]`` (shape ``[len(answer)]``): the longest ``b`` such that ``answer[i : i + b]``
    equals ``text[j : j + b]`` for some ``j < len(prompt) + i`` with ``text[j - 1]`` equal to
    the token before ``answer[i]`` (any such ``j`` unless ``anchored``), where
    ``text = prompt + answer``."""
    text = np.asarray([*prompt, *answer], dtype=np.int64)
    start, n = len(prompt), len(answer)
    runs = np.zeros(n, dtype=np.int64)
    if start == 0 or n == 0:
        return runs
    # lcp[j] = common prefix length of text[j:] and text[p:], updated from p + 1 down to p.
    lcp = np.zeros(len(text) + 1, dtype=np.int64)
    for p in range(len(text) - 1, start - 1, -1):
        lcp[:-1] = np.where(text == text[p], lcp[1:] + 1, 0)
        lcp[-1] = 0
        if not anchored:
            runs[p - start] = int(lcp[:p].max())
            continue
        anchors = np.flatnonzero(text[: p - 1] == text[p - 1]) + 1  # j - 1 anchors, 1 <= j < p
        if anchors.size:
            runs[p - start] = int(lcp[anchors].max())
    return np.minimum(runs, np.arange(n, 0, -1))


def copy_bound(
    prompt: Sequence[int],
    answer: Sequence[int],
    curve: CostCurve,
    max_block: int = MAX_BLOCK,
    *,
    anchored: bool = True,
) -> float:
    """Speedup over plain decoding (``len(answer)`` single-token evaluations) of the best
    schedule of fully kept copy blocks: at each position either one plain token or a block of
    ``b <= min(runs[i], max_block)`` copied tokens verified in one evaluation of ``b + 1``
    tokens (the last committed token is the target's own, so a block ends before the answer
    does). A block is priced at the cheapest evaluation of at least its size (a curve with
    steps may make a longer, partly refused block cheaper). Dynamic programming, backwards."""
    n = len(answer)
    if n == 0:
        return 1.0
    runs = copy_runs(prompt, answer, anchored=anchored)
    price = [curve(k) for k in range(1, max_block + 2)]
    for k in range(max_block - 1, -1, -1):  # cheapest evaluation of at least k + 1 tokens
        price[k] = min(price[k], price[k + 1])
    best = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        cost = price[0] + best[i + 1]
        for b in range(1, min(int(runs[i]), max_block, n - 1 - i) + 1):
            cost = min(cost, price[b] + best[i + b + 1])
        best[i] = cost
    return n * curve(1) / best[0]
