"""The small-GPU planner: device profiles fitted to whole-model curves, cost curves composed for
split placements, and placements ranked by replaying traces, so that the qualifier is kept only
when its acceptance gain pays for the target layers it displaces."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from planning_support import CPU, GPU, LADDER, LOAD
from traces_fixtures import synthetic_set

from pyramid_gguf.cli.main import main
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.planning.compose import DeviceProfile, Link, Shape, composed_curve, split
from pyramid_gguf.planning.memory import GiB
from pyramid_gguf.planning.rank import (
    ALL,
    NO_QUALIFIER,
    QUALIFIER_DRAFTS,
    TARGET_ONLY,
    placements,
    rank,
)


def test_a_profile_fitted_to_whole_models_prices_them() -> None:
    shapes = [Shape.of(m) for m in LADDER.values()] + [Shape(2 * GiB, 20)]
    samples = [(s, GPU.curve(s)) for s in shapes]
    fitted = DeviceProfile.fit("gpu", "test", samples)
    assert max(fitted.errors(samples)) < 1e-6
    for n in (1, 4, 16):
        assert fitted.per_byte[n - 1] == pytest.approx(GPU.per_byte[n - 1], rel=1e-6)
        assert fitted.per_layer[n - 1] == pytest.approx(GPU.per_layer[n - 1], rel=1e-6)


def test_a_split_costs_its_cpu_part_its_gpu_part_and_a_transfer() -> None:
    target = LADDER["target"]
    everything = composed_curve(target, target.n_layer + 1, CPU, GPU)
    nothing = composed_curve(target, 0, CPU, GPU)
    assert everything(1) == pytest.approx(GPU.curve(Shape.of(target))(1))
    assert nothing(1) == pytest.approx(CPU.curve(Shape.of(target))(1))
    half = composed_curve(target, 17, CPU, GPU)  # the head and the last 16 blocks on the GPU
    cpu_part, gpu_part = split(target, 17)
    assert (cpu_part.n_layer, gpu_part.n_layer) == (16, 16)
    link = Link()
    for n in (1, 8):
        want = CPU.cost(n, cpu_part) + GPU.cost(n, gpu_part) + link.cost(n, target.n_embd)
        assert half(n) == pytest.approx(want)
    # CPU layers dominate: half the layers on the CPU cost far more than all on the GPU
    assert everything(1) < 0.2 * half(1) < half(1) < nothing(1)
    assert composed_curve(target, 17, CPU, None)(1) == pytest.approx(nothing(1))  # no GPU build


def test_placements_trade_the_qualifier_for_target_layers() -> None:
    by_name = {p.name: p for p in placements(LADDER, 6 * GiB, LOAD)}
    assert set(by_name) >= {ALL, NO_QUALIFIER, QUALIFIER_DRAFTS, TARGET_ONLY}
    layers = {name: p.n_gpu_layers("target") for name, p in by_name.items()}
    assert layers[ALL] < layers[NO_QUALIFIER] <= layers[TARGET_ONLY]
    for p in by_name.values():
        assert p.plan.gpu_bytes <= p.plan.usable_bytes
    assert by_name[ALL].n_gpu_layers("qualifier") == LADDER["qualifier"].n_layer + 1


def test_the_plan_keeps_the_qualifier_only_when_it_pays() -> None:
    """4 GiB cannot hold the 8B: its step is dear (CPU layers), drafts on the GPU are cheap. A
    qualifier that agrees with the target far better than the draft is worth the target layers
    it displaces; one that agrees about as well is not, and its VRAM goes to the target."""
    options = placements(LADDER, 4 * GiB, LOAD)
    strong = rank(options, LADDER, synthetic_set(2, draft=0.5, qualifier=0.97), CPU, GPU)
    weak = rank(options, LADDER, synthetic_set(2, draft=0.75, qualifier=0.78), CPU, GPU)
    assert "qualifier" in strong[0].placement.tiers
    assert strong[0].speedup > 1.2  # over the best plain decoding of any placement
    assert "qualifier" not in weak[0].placement.tiers
    for ranked in (strong, weak):
        only = next(p for p in ranked if p.placement.name == TARGET_ONLY)
        assert only.plain_tps == max(p.plain_tps for p in ranked)  # the most target layers


def test_a_small_cpu_without_a_gpu_plans_plain_speed() -> None:
    """Without a GPU every tier is priced on the CPU; on two compute-bound cores (a batch of n
    tokens costs almost n) model drafts cannot pay, whatever the placement."""
    two_cores = replace(CPU, per_byte=tuple(2.5e-11 * (1 + 0.6 * i) for i in range(16)))
    traces = synthetic_set(1, draft=0.75, qualifier=0.78)
    ranked = rank(placements(LADDER, 6 * GiB, LOAD), LADDER, traces, two_cores, None)
    assert all(p.tps == pytest.approx(p.plain_tps, rel=0.05) for p in ranked)


def test_costs_compose_per_batch_size() -> None:
    curve = composed_curve(LADDER["draft"], 17, CPU, GPU)
    assert isinstance(curve, CostCurve) and len(curve.seconds) == 16
    assert all(b >= a for a, b in zip(curve.seconds, curve.seconds[1:], strict=False))
    assert replace(GPU, name="x").cost(1, Shape(0, 0)) == GPU.fixed[0]


def test_plan_command_ranks_placements(
    tiny_draft: Path, tiny_qualifier: Path, tiny_target: Path, tmp_path: Path
) -> None:
    """``plan`` prints the ranking with its sources, then the winner's memory table; ``--json``
    lists the placements fastest first. Traces and profiles given explicitly."""
    traces = tmp_path / "traces.json"
    synthetic_set(1, draft=0.5, qualifier=0.95).save(traces)
    cpu, gpu = tmp_path / "cpu.json", tmp_path / "gpu.json"
    CPU.save(cpu)
    GPU.save(gpu)
    args = [
        "plan", "--draft", str(tiny_draft), "--qualifier", str(tiny_qualifier),
        "--target", str(tiny_target), "--vram", "1GiB", "--ctx-size", "256",
        "--traces", str(traces), "--cpu-profile", str(cpu), "--gpu-profile", str(gpu),
    ]  # fmt: skip
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    for text in (
        ALL,
        NO_QUALIFIER,
        TARGET_ONLY,
        "best:",
        "acceptance: auto replayed",
        "n_gpu_layers",
    ):
        assert text in res.output
    doc = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    speeds = [p["auto_tps"] for p in doc["placements"]]
    assert (
        speeds == sorted(speeds, reverse=True) and doc["best"] == doc["placements"][0]["placement"]
    )
    bad = CliRunner().invoke(main, [*args[:-2], "--gpu-profile", str(traces)])
    assert (
        bad.exit_code == 1 and bad.output.startswith("Error: ") and "device profile" in bad.output
    )
