"""Running a benchmark: every config row over every prompt, repeats interleaved.

:func:`run_bench` runs repeat -> prompt -> row, so machine noise hits every row alike, then
each HumanEval problem under every row, and keeps each generation's tokens and
:class:`~pyramid_gguf.decoding.runtime.stats.GenerationStats` as a :class:`Sample`; with
``quality``, the target then scores every answer teacher-forced (:mod:`.quality`), after all timing
is done. :mod:`.results` reduces them.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api import GenerationStats, Pyramid
from ..core.errors import UserError
from ..core.sampling import SamplingConfig
from .grid import BenchConfig
from .prompts import BenchPrompt
from .quality import TokenQuality, score_answers


@dataclass
class Sample:
    """One generation of one row on one prompt."""

    row: int
    prompt: str
    repeat: int
    token_ids: list[int]
    stats: GenerationStats
    #: The answer scored under the target (``run_bench(quality=True)``), else None.
    quality: TokenQuality | None = None


@dataclass
class BenchRun:
    """Everything :func:`run_bench` measured."""

    configs: list[BenchConfig]
    prompts: list[BenchPrompt]
    sampling: SamplingConfig
    repeats: int
    samples: list[Sample]
    peak_rss: dict[int, float]
    humaneval: dict[int, list[Any]] = field(default_factory=dict)
    #: One per HumanEval problem and row (prompt ``humaneval/<task_id>``, repeat 0).
    humaneval_samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (models of every tier included)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


Progress = Callable[[int], None]


def encode_prompt(pyramid: Pyramid, prompt: BenchPrompt, chat: bool) -> list[int]:
    """Token ids of a prompt: through the target's chat template when ``chat``, else raw."""
    if chat:
        return list(pyramid.chat_tokens([{"role": "user", "content": prompt.text}]))
    return list(pyramid.tokenize(prompt.text))


def run_bench(
    pyramid: Pyramid,
    configs: Sequence[BenchConfig],
    prompts: Sequence[BenchPrompt],
    sampling: SamplingConfig,
    *,
    repeats: int = 3,
    warmup: bool = True,
    chat: bool | None = None,
    humaneval_problems: Sequence[dict[str, Any]] = (),
    humaneval_timeout: float = 10.0,
    quality: bool = False,
    progress: Progress | None = None,
) -> BenchRun:
    """Run every config over every prompt ``repeats`` times, interleaved.

    ``chat=None`` uses the target's chat template when it has one. HumanEval problems run raw
    (no chat template), every row on each problem in turn. ``quality``: afterwards, score the
    first pass's answers and every HumanEval answer under the target (:mod:`.quality`).
    ``progress(n)`` is called after each generation.
    """
    if repeats < 1:
        raise UserError(f"--repeats must be at least 1, got {repeats}")
    if not prompts:
        raise UserError("no prompts to run")
    if not configs or configs[0].spec.mode != "target":
        raise UserError("the first benchmark row must be the target reference")
    if chat is None:
        chat = pyramid.chat_template is not None
    encoded = {p.key: encode_prompt(pyramid, p, chat) for p in prompts}
    t0 = time.perf_counter()
    constrained = {p.key: sampling.with_(grammar=p.grammar) for p in prompts}
    if warmup:
        first = prompts[0]
        short = constrained[first.key].with_(max_tokens=min(8, sampling.max_tokens))
        for c in configs:
            pyramid.generate(encoded[first.key], short, c.spec)
    samples: list[Sample] = []
    peak: dict[int, float] = {}
    for r in range(repeats):
        for p in prompts:
            for i, c in enumerate(configs):
                done = pyramid.generate(encoded[p.key], constrained[p.key], c.spec)
                samples.append(Sample(i, p.key, r, list(done.token_ids), done.stats))
                peak[i] = peak_rss_mib()
                if progress:
                    progress(1)
    he: dict[int, list[Any]] = {}
    he_samples: list[Sample] = []
    if humaneval_problems:
        from .humaneval import STOP, check, truncate

        he_sampling = sampling.with_(stop=tuple(dict.fromkeys((*sampling.stop, *STOP))))
        for problem in humaneval_problems:
            key = f"humaneval/{problem['task_id']}"
            encoded[key] = pyramid.tokenize(problem["prompt"])
            for i, c in enumerate(configs):
                done = pyramid.generate(encoded[key], he_sampling, c.spec)
                he_samples.append(Sample(i, key, 0, list(done.token_ids), done.stats))
                he.setdefault(i, []).append(
                    check(problem, truncate(done.text), timeout=humaneval_timeout)
                )
                if progress:
                    progress(1)
    if quality:
        target = pyramid.tier("target")
        by_prompt: dict[str, list[Sample]] = {}
        for s in [*(s for s in samples if s.repeat == 0), *he_samples]:
            by_prompt.setdefault(s.prompt, []).append(s)
        for key, group in by_prompt.items():  # the prompt evaluated once for all its answers
            scores = score_answers(target, encoded[key], [s.token_ids for s in group])
            for s, q in zip(group, scores, strict=True):
                s.quality = q
    return BenchRun(
        list(configs),
        list(prompts),
        sampling,
        repeats,
        samples,
        peak,
        he,
        he_samples,
        time.perf_counter() - t0,
    )


def total_steps(n_configs: int, n_prompts: int, repeats: int, n_humaneval: int = 0) -> int:
    """Generations :func:`run_bench` will report to ``progress``."""
    return n_configs * (n_prompts * repeats + n_humaneval)
