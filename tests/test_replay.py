"""Replaying acceptance traces through the real rounds: scripted tiers follow a trace, every
chain commits exactly the target's answer, and on a tiny ladder a replay of ``sd`` predicts the
real engine's acceptance exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_fixtures import PROMPTS
from conftest import TINY_LOAD
from traces_fixtures import synthetic_set, synthetic_trace

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.bench.traces import record_traces
from pyramid_gguf.decoding.offline.replay import replay_trace
from pyramid_gguf.decoding.offline.traces import TraceSet
from pyramid_gguf.decoding.pricing.costs import CostCurve

#: A GPU-like target (a batch costs about one token) and cheap lower tiers.
GPU = {
    "target": CostCurve.shaped(0.020, 0.0005),
    "qualifier": CostCurve.shaped(0.004, 0.0002),
    "draft": CostCurve.shaped(0.001, 0.0001),
}
#: A small CPU: batches cost nearly as many single tokens.
CPU = {name: CostCurve.shaped(c.one, 0.9 * c.one) for name, c in GPU.items()}


@pytest.mark.parametrize("mode", ["target", "sd", "psd-exact", "auto"])
def test_every_mode_commits_the_answer(mode: str) -> None:
    trace = synthetic_trace(0)
    r = replay_trace(trace, GPU, SpecConfig(mode=mode, l_d=3, l_q=6))
    assert r.tokens == list(trace.answer)
    assert r.seconds > 0 and r.evaluations >= 1


def test_a_good_draft_pays_on_a_gpu_and_not_on_a_cpu() -> None:
    good = synthetic_trace(1, draft=0.9)
    bad = synthetic_trace(1, draft=0.05)
    sd = SpecConfig(mode="sd", l_d=4)
    plain = replay_trace(good, GPU, SpecConfig(mode="target"))
    assert plain.speedup == pytest.approx(1.0)
    fast = replay_trace(good, GPU, sd)
    assert fast.speedup > 2.0 and fast.evaluations < len(good.answer) / 2
    assert replay_trace(bad, GPU, sd).speedup < 1.0  # drafting and verifying for nothing
    assert replay_trace(good, CPU, sd).speedup < 1.0  # batches cost what single tokens do
    stage = next(s for s in fast.stats.stages if s.name == "draft->target")
    # blocks of 4 whose tokens are each kept with 0.9: 0.9 + 0.81 + 0.73 + 0.66 of 4 kept
    assert stage.acceptance_rate == pytest.approx((0.9 + 0.81 + 0.729 + 0.6561) / 4, abs=0.08)


def test_auto_follows_the_trace_to_the_chain_that_pays() -> None:
    """A qualifier that agrees with the target far more than the draft: auto runs the pyramid
    on GPU-shaped curves; with a poor qualifier it drafts with the draft alone."""
    strong = synthetic_set(2, draft=0.5, qualifier=0.97, draft_qualifier=0.8)
    weak = synthetic_set(2, draft=0.8, qualifier=0.5)
    auto = SpecConfig(mode="auto")

    def committed(traces: TraceSet) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in traces.traces:
            for c in replay_trace(t, GPU, auto).auto.choices.values():
                out[c.chain] = out.get(c.chain, 0) + c.committed
        return out

    by_chain = committed(strong)
    assert max(by_chain, key=lambda c: by_chain[c]) == "pyramid"
    by_chain = committed(weak)
    assert max(by_chain, key=lambda c: by_chain[c]) == "draft"


@pytest.fixture(scope="module")
def tiny_traces(tiny_target: Path, tiny_qualifier: Path, tiny_draft: Path) -> TraceSet:
    with Pyramid.from_paths(
        tiny_target, draft=tiny_draft, qualifier=tiny_qualifier, load=TINY_LOAD
    ) as p:
        p.calibrate()
        return record_traces(p, PROMPTS[:2], max_tokens=24, chat=False)


def test_recorded_traces_hold_what_each_tier_would_propose(tiny_traces: TraceSet) -> None:
    assert {t.key for t in tiny_traces.traces} == {p.key for p in PROMPTS[:2]}
    for t in tiny_traces.traces:
        assert set(t.tiers) == {"draft", "qualifier"} and 0 < len(t.answer) <= 24
        for tier in t.tiers.values():
            assert len(tier.argmax) == len(t.answer)
            assert all(0 < p <= 1 for p in tier.top)
            assert all(0 <= o <= 1 + 1e-9 for o in tier.overlap)
    # the qualifier is the draft's teacher (less noise on the target's weights): it agrees more
    assert tiny_traces.agreement("qualifier") >= tiny_traces.agreement("draft") > 0.3
    stored = tiny_traces.to_dict()  # probabilities to 4 decimals
    assert TraceSet.from_dict(stored).to_dict() == stored


def test_a_replayed_sd_run_predicts_the_engines_acceptance(
    tiny_traces: TraceSet, tiny_target: Path, tiny_draft: Path
) -> None:
    """Greedy ``sd`` on the real tiny models and its replay over the recorded trace propose
    and keep exactly the same tokens (the replay decides from the trace alone)."""
    spec = SpecConfig(mode="sd", l_d=3)
    with Pyramid.from_paths(tiny_target, draft=tiny_draft, load=TINY_LOAD) as p:
        for trace in tiny_traces.traces:
            sampling = SamplingConfig(temperature=0, max_tokens=len(trace.answer))
            real = p.generate(list(trace.prompt), sampling, spec)
            assert real.token_ids == list(trace.answer)
            costs = {"target": CostCurve((1.0,)), "draft": CostCurve((0.1,))}
            replayed = replay_trace(trace.__class__(**{**trace.__dict__, "tiers": {
                "draft": trace.tiers["draft"]}}), costs, spec)  # fmt: skip
            got = {s.name: (s.draft_n, s.draft_n_accepted) for s in replayed.stats.stages}
            want = {s.name: (s.draft_n, s.draft_n_accepted) for s in real.stats.stages}
            assert got == want
