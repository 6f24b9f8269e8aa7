"""``GET /metrics``: the server's counters in Prometheus's text format, like llama-server's.

llama-server names its metrics ``llamacpp:...`` (``tools/server/server.cpp``, ``/metrics``);
ours are ``pyramid_gguf:...`` with the same meanings where they exist there (prompt and
predicted tokens and seconds, decode calls, busy slots per decode, requests processing and
deferred) and a few of our own (batched tokens per tier, tokens per second now, 503s). Those
llama-server has are also written under its own names (:data:`LLAMA_CPP`), with its
``prompt_tokens_cached_total`` and average throughputs, so its dashboards read ours.
Embeddings (``serve --embedding-model``) count as llama-server counts them: their tokens as
prompt tokens, their ``llama_decode`` calls as decodes, nothing predicted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api import PoolSnapshot
from ..decoding.runtime.batcher import BatchCounters
from ..embeddings import EmbeddingCounts
from .jobs import Totals

PREFIX = "pyramid_gguf:"
#: llama-server's prefix, and the names it shares with ours.
LLAMA_PREFIX = "llamacpp:"
LLAMA_CPP = frozenset(
    {
        "prompt_tokens_total",
        "prompt_seconds_total",
        "tokens_predicted_total",
        "tokens_predicted_seconds_total",
        "n_decode_total",
        "n_busy_slots_per_decode",
        "requests_processing",
        "requests_deferred",
        "n_tokens_max",
        "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total",
        "spec_decode_num_drafts_total",
    }
)
#: Prometheus's text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Metric:
    """One metric: its name (without :data:`PREFIX`), kind, help text and samples (label
    text, value)."""

    name: str
    kind: str
    help: str
    samples: tuple[tuple[str, float], ...]

    def render(self, prefix: str = PREFIX) -> str:
        full = prefix + self.name
        lines = [f"# HELP {full} {self.help}", f"# TYPE {full} {self.kind}"]
        lines += [f"{full}{labels} {_number(value)}" for labels, value in self.samples]
        return "\n".join(lines)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _one(name: str, kind: str, help: str, value: float) -> Metric:
    return Metric(name, kind, help, (("", value),))


def collect(
    now: PoolSnapshot, totals: Totals, embedded: EmbeddingCounts | None = None
) -> list[Metric]:
    """Every metric, from the pool's snapshot ``now``, the server's ``totals`` and what its
    embedding model did (``embedded``)."""
    t, c, e = totals, now.batches, embedded or EmbeddingCounts()
    per_tier = tuple((f'{{tier="{name}"}}', float(n)) for name, n in c.tokens.items())
    return [
        _one(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens evaluated (embedded inputs included).",
            t.prompt_evaluated + e.tokens,
        ),
        _one(
            "prompt_seconds_total",
            "counter",
            "Prompt processing time (embedding included).",
            t.prompt_seconds + e.seconds,
        ),
        _one(
            "prompt_tokens_shared_total",
            "counter",
            "Prompt tokens a slot took from another slot's cache instead of evaluating them.",
            now.shared_tokens,
        ),
        _one("tokens_predicted_total", "counter", "Generated tokens.", t.generated_tokens),
        _one(
            "tokens_predicted_seconds_total",
            "counter",
            "Generation time, summed over requests.",
            t.generation_seconds,
        ),
        _one(
            "n_decode_total",
            "counter",
            "Batches evaluated (every tier, and the embedding model's).",
            c.batches + e.decodes,
        ),
        _one("embedding_tokens_total", "counter", "Tokens of embedded inputs.", e.tokens),
        _one(
            "n_tokens_max",
            "counter",
            "Largest observed sequence length (prompt + generation).",
            t.n_tokens_max,
        ),
        _one(
            "spec_decode_num_draft_tokens_total",
            "counter",
            "Speculative: draft tokens the target verified.",
            t.draft_tokens,
        ),
        _one(
            "spec_decode_num_accepted_tokens_total",
            "counter",
            "Speculative: draft tokens accepted by the target.",
            t.draft_accepted,
        ),
        _one(
            "spec_decode_num_drafts_total",
            "counter",
            "Speculative: the target's verification steps.",
            t.drafts,
        ),
        _one(
            "n_busy_slots_per_decode",
            "gauge",
            "Average requests per batch.",
            c.slots_in_batches / c.batches if c.batches else 0.0,
        ),
        Metric("batch_tokens_total", "counter", "Tokens evaluated in batches, by tier.", per_tier),
        _one(
            "batch_padding_rows_total",
            "counter",
            "Rows added to batches for a cheaper kernel, evaluated and dropped.",
            c.padded,
        ),
        _one("decode_seconds_total", "counter", "Time inside llama_decode.", c.seconds),
        *step_split(c),
        _one(
            "tokens_per_second",
            "gauge",
            "Tokens generated per second by all requests, over the last 10 s.",
            t.tokens_per_second(),
        ),
        _one("kv_cache_tokens", "gauge", "Tokens in every tier's KV cache.", now.cached_tokens),
        _one("slots", "gauge", "Parallel slots.", now.slots),
        _one("requests_processing", "gauge", "Requests holding a slot.", now.busy),
        _one("requests_deferred", "gauge", "Admitted requests waiting for a slot.", now.queued),
        _one(
            "queue_size",
            "gauge",
            "Requests admitted at once (more get 503).",
            now.queue_size if now.queue_size is not None else 0,
        ),
        _one("requests_completed_total", "counter", "Requests answered.", now.completed),
        _one("requests_cancelled_total", "counter", "Requests cancelled.", now.cancelled),
        _one("requests_rejected_total", "counter", "Requests refused with 503.", now.rejected),
    ]


def step_split(c: BatchCounters) -> list[Metric]:
    """Where the steps' wall time went while slots ran (the batcher's counters): inside
    ``llama_decode``, the rest of each batch, the slots' own work between batches and the
    hand-off to the batch; the same for batches of several slots, and per-slot sums."""
    parts = (
        ("llama_decode", c.decode_seconds),
        ("batch_other", c.seconds - c.decode_seconds),
        ("slot_work", c.work_seconds),
        ("handoff", c.handoff_seconds),
    )
    shared = (
        ("llama_decode", c.shared_decode_seconds),
        ("batch_other", c.shared_seconds - c.shared_decode_seconds),
        ("between", c.shared_gap_seconds),
    )
    return [
        Metric(
            "step_seconds_total",
            "counter",
            "Wall time of the steps while slots ran, by part.",
            tuple((f'{{part="{k}"}}', v) for k, v in parts),
        ),
        Metric(
            "shared_step_seconds_total",
            "counter",
            "Wall time of batches of several slots and the gaps before them, by part.",
            tuple((f'{{part="{k}"}}', v) for k, v in shared),
        ),
        _one("shared_steps_total", "counter", "Batches of several slots.", c.shared_batches),
        _one(
            "shared_step_outside_ratio",
            "gauge",
            "Share of the several-slot steps' time outside llama_decode.",
            c.outside(),
        ),
        _one(
            "gather_seconds_total",
            "counter",
            "Time ready batches waited for arriving requests.",
            c.gather_seconds,
        ),
        _one(
            "slot_wake_seconds_total",
            "counter",
            "Per slot, summed: from a batch's end until its thread ran again.",
            c.wake_seconds,
        ),
        _one(
            "slot_work_seconds_total",
            "counter",
            "Per slot, summed: from its rows back until it asked again (sampling, delivery).",
            c.slot_seconds,
        ),
    ]


def llama_cpp_only(totals: Totals) -> list[Metric]:
    """llama-server's metrics that have no ``pyramid_gguf:`` twin: cached prompt tokens (not
    evaluated) and the average prompt and generation throughputs (tokens/s)."""
    t = totals
    return [
        _one(
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's cache.",
            t.prompt_tokens - t.prompt_evaluated,
        ),
        _one(
            "prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s.",
            t.prompt_evaluated / t.prompt_seconds if t.prompt_seconds else 0.0,
        ),
        _one(
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            t.generated_tokens / t.generation_seconds if t.generation_seconds else 0.0,
        ),
    ]


def render(now: PoolSnapshot, totals: Totals, embedded: EmbeddingCounts | None = None) -> str:
    """The ``/metrics`` body: ours, then llama-server's names (:data:`LLAMA_PREFIX`)."""
    ours = collect(now, totals, embedded)
    theirs = [m for m in ours if m.name in LLAMA_CPP] + llama_cpp_only(totals)
    lines = [m.render() for m in ours] + [m.render(LLAMA_PREFIX) for m in theirs]
    return "\n".join(lines) + "\n"
