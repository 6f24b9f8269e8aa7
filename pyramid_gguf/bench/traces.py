"""Recording acceptance traces on real models (``pyramid-gguf traces``).

For each prompt: the target's greedy answer (``target`` mode, as ``bench`` runs it, the chat
template applied), then every tier evaluates the prompt and the answer teacher-forced, in
batches, reading exactly the answer's rows. From those rows each lower tier's
:class:`~pyramid_gguf.decoding.offline.traces.TierTrace` is computed: argmax, temperature-1 top
probability, and the overlap of its warped distribution with the target's at the recording
temperature. About the cost of one ``target`` generation per prompt plus one batch per tier.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Sequence

import numpy as np

from ..api import Pyramid
from ..core.sampling import SamplingConfig
from ..core.spec import SpecConfig
from ..decoding.offline.traces import TierTrace, Trace, TraceSet
from ..decoding.runtime.sampling import softmax, warp
from ..decoding.runtime.tiers import ModelTier
from ..native import build_id
from .prompts import BenchPrompt
from .quality import forced_chunks
from .runner import encode_prompt


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def forced_rows(tier: ModelTier, prompt: Sequence[int], answer: Sequence[int]) -> np.ndarray:
    """``tier``'s raw logits predicting each answer token after the prompt and the answer
    before it, evaluated teacher-forced in batches (:func:`.quality.forced_chunks`):
    ``[len(answer), V]`` float32."""
    parts = [rows for rows, _ in forced_chunks(tier, prompt, answer)]
    return np.concatenate(parts) if parts else np.zeros((0, tier.n_vocab), dtype=np.float32)


def tier_trace(rows: np.ndarray, target_p: np.ndarray, sampling: SamplingConfig) -> TierTrace:
    """A lower tier's trace from its forced ``rows`` ``[n, V]`` and the target's warped
    distributions ``target_p`` ``[n, V]`` at the same positions."""
    top = softmax(rows).max(axis=-1)
    overlap = np.minimum(warp(rows, sampling), target_p).sum(axis=-1)
    return TierTrace(
        tuple(int(t) for t in rows.argmax(axis=-1)),
        tuple(float(x) for x in top),
        tuple(float(x) for x in overlap),
    )


def record_traces(
    pyramid: Pyramid,
    prompts: Sequence[BenchPrompt],
    *,
    max_tokens: int = 256,
    sampling: SamplingConfig | None = None,
    chat: bool | None = None,
    ladder: str = "",
    say: Callable[[str], None] | None = None,
) -> TraceSet:
    """Traces of every lower tier of ``pyramid``'s ladder along the target's greedy answers to
    ``prompts``; overlaps at ``sampling`` (default: ``run``'s sampling)."""
    sampling = sampling or SamplingConfig()
    chat = pyramid.chat_template is not None if chat is None else chat
    greedy = SamplingConfig(temperature=0, max_tokens=max_tokens)
    target = pyramid.tier("target")
    lower = [pyramid.tier(t.name) for t in pyramid.tiers() if t.name != "target"]
    traces = []
    for q in prompts:
        prompt = encode_prompt(pyramid, q, chat)
        answer = pyramid.generate(prompt, greedy, SpecConfig(mode="target")).token_ids
        if not answer:
            continue
        target_p = warp(forced_rows(target, prompt, answer), sampling)
        tiers = {
            m.name: tier_trace(forced_rows(m, prompt, answer), target_p, sampling) for m in lower
        }
        traces.append(Trace(q.key, q.set, tuple(prompt), tuple(answer), tiers))
        if say is not None:
            kept = ", ".join(f"{n} {t.agreement(answer):.2f}" for n, t in tiers.items())
            say(f"{q.key}: {len(answer)} tokens; argmax agreement with the target: {kept}")
    files = {t.name: t.path.name for t in pyramid.tiers()}
    threads = pyramid.tiers()[-1].n_threads
    machine = f"{cpu_name()}, {threads} threads, {build_id().split(';')[0]}"
    costs = {name: curve.seconds for name, curve in pyramid.costs().items()}
    return TraceSet(
        ladder or pyramid.name, files, sampling.temperature, tuple(traces), machine, costs
    )
