"""Hybrid (Gated DeltaNet + attention) targets: rollback through llama.cpp's per-sequence
recurrent-state snapshots (``n_rs_seq``) and through saved states, both exact; its cost
measured by ``calibrate`` and priced into every rejected round."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth_hybrid import HybridSpec, write_hybrid

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.decoding.pricing.chains import (
    Chain,
    StageRule,
    break_even,
    expected_drop,
    price_plain,
)
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.runtime.calibrate import calibrate
from pyramid_gguf.decoding.runtime.rollback_cost import (
    MAX_DROP,
    RollbackConfig,
    measure_rollback,
    needs_rollback_pricing,
)
from pyramid_gguf.decoding.runtime.tiers import ModelTier
from pyramid_gguf.native.model import NativeModel
from pyramid_gguf.planning.memory import model_memory, padded_ctx
from pyramid_gguf.planning.vram import tier_plan


@pytest.fixture(scope="session")
def tiny_hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hybrid(tmp_path_factory.mktemp("hybrid") / "hybrid.gguf", seed=20)


def _load(n_rs_seq: int) -> LoadConfig:
    return LoadConfig(n_ctx=512, n_batch=64, n_threads=1, n_threads_batch=1, n_rs_seq=n_rs_seq)


def test_hybrid_loads_as_hybrid_with_state_snapshots(tiny_hybrid: Path) -> None:
    with NativeModel(tiny_hybrid, _load(8)) as m, NativeModel(tiny_hybrid, _load(0)) as plain:
        assert m.snapshot_reason == "hybrid"
        assert m.n_rs_seq == 8
        assert plain.n_rs_seq == 0


@pytest.mark.parametrize("n_rs_seq", [0, 4])
def test_hybrid_rollback_matches_a_fresh_evaluation(tiny_hybrid: Path, n_rs_seq: int) -> None:
    """Rounds as speculation makes them: a block evaluated in one batch, part of it dropped;
    the logits after each rollback equal a fresh evaluation of the kept prefix."""
    g = np.random.default_rng(1)
    with NativeModel(tiny_hybrid, _load(n_rs_seq)) as m, NativeModel(tiny_hybrid, _load(0)) as f:
        seq = [int(t) for t in g.integers(3, m.n_vocab, size=200)]
        m.eval(seq[:20])
        for _ in range(20):
            block = int(g.integers(2, 7))
            start = m.n_past
            m.eval(seq[start : start + block])
            cut = start + int(g.integers(1, block))  # drop 1..block-1 tokens
            m.rollback(cut)
            assert m.tokens == seq[:cut]
            got = m.eval(seq[cut : cut + 1], [-1])[0]
            f.reset()
            want = f.eval(seq[: cut + 1], [-1])[0]
            np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-3)
        native, state = m.rollback_counts()
        if n_rs_seq:
            assert native > 0 and state <= native  # blocks longer than n_rs_seq + 1 fall back
        else:
            assert native == 0 and state == 20


def test_rollback_spanning_evaluations_takes_the_state_path(tiny_hybrid: Path) -> None:
    """Tokens from several evaluations (a draft's one-token steps) cannot be dropped through
    llama.cpp's snapshots, which hold only the last evaluation's states."""
    with NativeModel(tiny_hybrid, _load(8)) as m, NativeModel(tiny_hybrid, _load(0)) as f:
        seq = list(range(3, 40))
        m.eval(seq[:10])
        for t in seq[10:14]:
            m.eval([t])
        m.rollback(11)
        assert m.rollback_counts() == (0, 1)
        got = m.eval(seq[11:12], [-1])[0]
        want = f.eval(seq[:12], [-1])[0]
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-3)


# --- rollback priced: measured by calibrate, paid by every rejected round ----------------------


def test_rollback_costs_are_measured_per_drop_length(tiny_hybrid: Path) -> None:
    cfg = RollbackConfig(max_j=6, repeats=1)
    with NativeModel(tiny_hybrid, _load(0)) as m:
        assert needs_rollback_pricing(m)
        costs = measure_rollback(m, cfg)
        assert len(costs) == 6 and all(s > 0 for s in costs)
        assert m.n_past == 0  # measuring empties the sequence
        assert m.rollback_counts()[1] > 0  # the saved-state path is what was timed
    with NativeModel(tiny_hybrid, _load(8)) as m:
        measure_rollback(m, cfg)
        assert m.rollback_counts()[0] > 0  # llama.cpp's snapshots: the native path


def test_calibrate_attaches_rollback_to_a_hybrid_curve(
    tiny_hybrid: Path, tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(tmp_path / "home"))
    with NativeModel(tiny_hybrid, _load(0)) as h, NativeModel(tiny_target, _load(0)) as d:
        hybrid = calibrate(ModelTier("target", h)).curve
        dense = calibrate(ModelTier("target", d)).curve
        assert len(hybrid.rollback) == MAX_DROP and hybrid.drop(3) > 0
        assert dense.rollback == () and dense.drop(3) == 0.0
        again = calibrate(ModelTier("target", h)).curve  # from the cache, rollback included
        assert again.rollback == hybrid.rollback


def test_cost_curve_keeps_its_rollback() -> None:
    c = CostCurve.shaped(1.0, 0.5, n=8).with_rollback([0.2, 0.3])
    assert c.drop(0) == 0.0 and c.drop(1) == 0.2 and c.drop(5) == 0.3
    assert CostCurve.from_dict(c.to_dict()) == c
    assert c.after(2).rollback == c.rollback and c.with_chunk(2).rollback == c.rollback


def test_expensive_rollback_stops_speculation_that_would_pay_without_it() -> None:
    """A CPU-like target where a model draft pays at a middling keep rate: priced with a
    rollback costing a few tokens, the same chain loses to plain decoding (``auto`` then
    decodes plainly), and a rollback that costs nothing (llama.cpp's snapshots) changes
    nothing."""
    target = CostCurve.shaped(1.0, 0.15)
    draft = CostCurve.shaped(0.05, 0.01)
    chain = Chain("draft", ("draft", "target"), (StageRule(),))
    free = break_even(chain, {"target": target, "draft": draft})
    native = break_even(chain, {"target": target.with_rollback([0.0] * 16), "draft": draft})
    dear = break_even(chain, {"target": target.with_rollback([3.0] * 16), "draft": draft})
    assert free is not None and native == free
    assert dear is None or dear > free + 0.2
    plain = price_plain(target, 0.0)
    keeps = ((0.5, 0.5),)
    costs = {"target": target.with_rollback([3.0] * 16), "draft": draft}
    best = chain.price(costs, keeps, 16, overhead=0.0).best
    assert best is None or best.rate < plain.rate
    assert expected_drop(target.with_rollback([1.0]), 0.0, 0.0, 4) == 1.0  # always rejected
    assert expected_drop(target.with_rollback([1.0]), 1.0, 1.0, 4) == 0.0  # never


def test_plan_counts_recurrent_states_and_their_snapshots(tiny_hybrid: Path) -> None:
    """Gated DeltaNet blocks keep no KV cache but a state per sequence, times 1 + n_rs_seq;
    the NextN block's cache lives in the MTP context."""
    mm = model_memory(tiny_hybrid)
    spec = HybridSpec()
    conv = (spec.ssm_conv - 1) * spec.ssm_head_dim * (2 * spec.ssm_k_heads + spec.ssm_v_heads)
    one = 4 * (conv + spec.ssm_head_dim**2 * spec.ssm_v_heads)
    assert mm.state_bytes == (one, 0, 0)  # DeltaNet, attention, NextN
    assert mm.n_embd_k == (0, spec.n_head_kv * spec.head_dim, 0)
    assert mm.recurrent_bytes(2, 3) == (one * 2 * 4, 0, 0)
    load = LoadConfig(n_ctx=512, n_threads=1, n_threads_batch=1, parallel=2, n_rs_seq=3)
    split = tier_plan("target", mm, 0, load)
    cells = padded_ctx(512 * 2)
    assert split.cpu_kv_bytes == cells * sum(mm.kv_bytes_per_token()) + one * 2 * 4
