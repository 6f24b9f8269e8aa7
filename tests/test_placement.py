"""Placements of the weights left on the CPU (issue 48): mapped, pinned (``--no-mmap``) and
repacked (``--no-host``) loads, each card's PCIe link, llama.cpp's op offload priced as the bytes
it copies over that link, the placements ranked beside the ``-ngl`` splits, the winner loaded
with its flags, and the prompt speed (pp512, time to a first token) predicted per placement."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import llama_cpp
import pytest
from click.testing import CliRunner
from planning_support import CPU, GPU, LADDER, LOAD
from traces_fixtures import synthetic_set

from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.load import LoadConfig, parse_pcie
from pyramid_gguf.decoding.runtime.calibrate import cache_key
from pyramid_gguf.native.buffers import LOAD_MODE_AUTO, LOAD_MODE_NONE, plan_placement
from pyramid_gguf.planning.compose import (
    OP_OFFLOAD_MIN_BATCH,
    DeviceProfile,
    Link,
    composed_curve,
    split,
)
from pyramid_gguf.planning.devices import catalogue
from pyramid_gguf.planning.links import (
    PAGEABLE_BYTES_PER_S,
    Pcie,
    card_pcie,
    plain_kernels,
)
from pyramid_gguf.planning.memory import GiB
from pyramid_gguf.planning.plan import load_plan, weights_allowed
from pyramid_gguf.planning.rank import (
    PROMPT_N,
    Placement,
    Prediction,
    Ranking,
    placements,
    prompt_seconds,
    rank,
    with_weights,
)

TARGET = LADDER["target"]
#: A split of the 8B: its head and last 8 blocks on the GPU, 24 blocks on the CPU.
SPLIT = 9


# --- loading ------------------------------------------------------------------------------------


def test_load_config_carries_the_weights_placement_and_a_checked_link() -> None:
    cfg = LoadConfig()
    assert cfg.use_mmap and not cfg.no_host and cfg.pcie is None
    assert LoadConfig(pcie="4:x16").pcie == "4.0:16"
    assert parse_pcie("5.0:8") == (5.0, 8)
    for bad in ("4", "4:12", "7:16", "x16:4", "gen4:16"):
        with pytest.raises(UserError, match="GEN:LANES"):
            LoadConfig(pcie=bad)


def test_the_native_adapter_loads_pinned_or_repacked_weights(tmp_path: Path) -> None:
    """``--no-mmap`` sets llama.cpp's load mode to plain reads (``-lm none``), ``--no-host`` its
    ``no_host``; the default leaves llama.cpp's own choice (a mapping)."""
    path = tmp_path / "m.gguf"
    for cfg, mode, no_host in (
        (LoadConfig(), LOAD_MODE_AUTO, False),
        (LoadConfig(use_mmap=False), LOAD_MODE_NONE, False),
        (LoadConfig(no_host=True, extra_buffers=True), LOAD_MODE_AUTO, True),
    ):
        params = llama_cpp.llama_model_default_params()
        params.no_host = not no_host  # the adapter must set it either way
        plan_placement(path, cfg).apply(params)
        assert (params.load_mode, params.no_host) == (mode, no_host)
    assert LOAD_MODE_NONE == llama_cpp.LLAMA_LOAD_MODE_NONE


def test_the_calibration_cache_keys_by_mapped_pinned_or_repacked(tmp_path: Path) -> None:
    """A curve measured with mapped weights never prices pinned or repacked ones (op offload
    copies at another rate; repacked kernels cost differently); the declared link does not
    move a measurement, so it is not keyed."""
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")

    def key(cfg: LoadConfig) -> str:
        model = SimpleNamespace(
            path=path, cfg=cfg, placement=SimpleNamespace(kind="extra"), weight_buffers={}
        )
        return json.dumps(cache_key(model), sort_keys=True)  # type: ignore[arg-type]

    base = key(LoadConfig(n_threads=2, n_threads_batch=2))
    pinned = key(LoadConfig(n_threads=2, n_threads_batch=2, use_mmap=False))
    repacked = key(LoadConfig(n_threads=2, n_threads_batch=2, no_host=True))
    assert len({base, pinned, repacked}) == 3
    assert key(LoadConfig(n_threads=2, n_threads_batch=2, pcie="5:8")) == base


def test_bad_flags_get_one_line_errors() -> None:
    res = CliRunner().invoke(main, ["plan", "--pcie", "4:12", "--vram", "8GiB"])
    assert res.exit_code != 0
    assert "GEN:LANES" in res.output and "Traceback" not in res.output


# --- the link and op offload --------------------------------------------------------------------


def test_each_card_states_its_pcie_link() -> None:
    """The 4060 and 4060 Ti are x8 cards; the 5060 Ti is PCIe 5.0 x8."""
    want = {
        "rtx-4060-8gb": "4.0:8",
        "rtx-4060-ti-8gb": "4.0:8",
        "rtx-4060-ti-16gb": "4.0:8",
        "rtx-5060-ti-16gb": "5.0:8",
        "rtx-3060-12gb": "4.0:16",
        "rtx-2060-6gb": "3.0:16",
    }
    for slug, link in want.items():
        assert DeviceProfile.load(catalogue("gpu")[slug].path).pcie == link, slug
    for entry in catalogue("gpu").values():
        profile = DeviceProfile.load(entry.path)
        assert profile.pcie is not None, entry.slug
        data = json.loads(entry.path.read_text(encoding="utf-8"))
        assert data["sources"], entry.slug


def test_link_rates_follow_generation_lanes_and_pinning() -> None:
    x16, x8, gen5x8 = Pcie(4.0, 16), Pcie(4.0, 8), Pcie(5.0, 8)
    assert x8.pinned_bytes_per_s == pytest.approx(x16.pinned_bytes_per_s / 2)
    assert gen5x8.pinned_bytes_per_s == pytest.approx(x16.pinned_bytes_per_s, rel=0.01)
    assert 22e9 < x16.pinned_bytes_per_s < 28e9  # ~25 GB/s on 4.0 x16 (issue 48)
    pinned = x16.copy_rate("pinned")
    assert pinned is not None and x16.copy_rate("mapped") == PAGEABLE_BYTES_PER_S < pinned
    assert Pcie(3.0, 4).copy_rate("mapped") == Pcie(3.0, 4).pinned_bytes_per_s  # the link binds
    assert x16.copy_rate("repacked") is None
    assert card_pcie("5:8", "4.0:16", "card").spec == "5.0:8"  # --pcie wins
    assert card_pcie(None, "4.0:8", "card").spec == "4.0:8"
    assert "assumed" in card_pcie(None, None, "card").source


def test_op_offload_prices_the_copy_from_its_threshold() -> None:
    """From 32 tokens the CPU layers' weights cross the link and the GPU computes on them:
    exactly their bytes over the copy rate, the GPU's cost of the part and two hidden-state
    crossings per CPU block; below it, the CPU's cost. Pinned beats mapped; no copy priced,
    the CPU's cost goes on."""
    cpu_part, _ = split(TARGET, SPLIT)
    pcie = Pcie(4.0, 16)
    curves = {
        w: composed_curve(TARGET, SPLIT, CPU, GPU, pcie.link(w), 64) for w in ("mapped", "pinned")
    }
    plain = composed_curve(TARGET, SPLIT, CPU, GPU, Link(), 64)
    n = OP_OFFLOAD_MIN_BATCH
    link = pcie.link("pinned")
    gpu_part = split(TARGET, SPLIT)[1]
    want = (
        cpu_part.weight_bytes / pcie.pinned_bytes_per_s
        + GPU.cost(n, cpu_part)
        + 2 * cpu_part.n_layer * link.cost(n, TARGET.n_embd)
        + GPU.cost(n, gpu_part)
        + link.cost(n, TARGET.n_embd)
    )
    assert curves["pinned"](n) == pytest.approx(want)
    for w in ("mapped", "pinned"):
        assert curves[w](n - 1) == pytest.approx(plain(n - 1), rel=0.01)  # below: the CPU
        assert curves[w](64) < plain(64)  # the copy beats the CPU's 64 tokens here
    assert curves["pinned"](n) < curves["mapped"](n)
    # a flat stretch: 64 tokens cost about what 32 do once the weights cross
    assert curves["pinned"](64) < 1.2 * curves["pinned"](n)


def test_plain_kernels_scale_the_cpu_profile_only() -> None:
    """Unrepacked weights (mapped or pinned beside a GPU) cost more in small batches and, as
    measured here, less in long ones; the fixed and per-block costs do not move."""
    plain = plain_kernels(replace(CPU, tail=1e-12))
    assert all(p > c for p, c in zip(plain.per_byte, CPU.per_byte, strict=True))
    assert plain.tail is not None and plain.tail < 1e-12
    assert plain.fixed == CPU.fixed and plain.per_layer == CPU.per_layer


# --- ranking ------------------------------------------------------------------------------------


def test_placements_are_ranked_mapped_pinned_and_repacked() -> None:
    """Every split placement three times, a placement holding no CPU weights once; the ranking
    carries pp512 and TTFT per placement, and a long-block trace prefers pinned weights."""
    options = [p for p in placements(LADDER, 4 * GiB, LOAD) if p.name == "target only"]
    assert options and options[0].holds_cpu_weights()
    tripled = with_weights(options)
    assert [p.weights for p in tripled] == ["mapped", "pinned", "repacked"]
    assert [p.label for p in tripled][1:] == ["target only, pinned", "target only, repacked"]
    everything = [p for p in placements(LADDER, 24 * GiB, LOAD) if not p.holds_cpu_weights()]
    assert everything and len(with_weights(everything)) == len(everything)
    ranked = rank(
        tripled, LADDER, synthetic_set(1, draft=0.5, qualifier=0.95), CPU, GPU, pcie=Pcie(4.0, 16)
    )
    by = {p.placement.weights: p for p in ranked}
    assert by["pinned"].pp512_tps > by["mapped"].pp512_tps > by["repacked"].pp512_tps > 0
    assert all(p.ttft_s > PROMPT_N / p.pp512_tps for p in ranked)
    doc = by["pinned"].to_dict()
    assert doc["weights"] == "pinned" and doc["load_flags"] == {"use_mmap": False, "no_host": False}
    assert doc["pp512_tps"] > 0 and doc["ttft_512_s"] > 0


def test_no_mmap_or_no_host_fix_the_weights_placement() -> None:
    assert weights_allowed(LoadConfig()) == ("mapped", "pinned", "repacked")
    assert weights_allowed(LoadConfig(use_mmap=False)) == ("pinned",)
    assert weights_allowed(LoadConfig(no_host=True)) == ("repacked",)


def test_the_winner_is_loaded_with_its_flags() -> None:
    options = with_weights(
        [p for p in placements(LADDER, 4 * GiB, LOAD) if p.name == "target only"]
    )
    for p in options:
        r = Ranking((_pred(p),), synthetic_set(1), CPU, GPU, pcie=Pcie(4.0, 16))
        paths = LadderPaths(Path("t.gguf"), None, None)
        _, loads = load_plan(paths, r, LOAD)
        assert loads["target"].use_mmap == (p.weights != "pinned")
        assert loads["target"].no_host == (p.weights == "repacked")


def _pred(p: Placement) -> Prediction:
    """A prediction that only names its placement (what :func:`load_plan` reads)."""
    return Prediction(p, {}, 1.0, 1.0, {})


# --- the prompt ---------------------------------------------------------------------------------


def test_prompt_seconds_are_the_batch_cost_in_chunks() -> None:
    """A 512-token prompt is ``ceil(512 / n_batch)`` evaluations of the chunk; without a GPU,
    the CPU profile's cost of them, its tail past its sizes included."""
    p = next(p for p in placements(LADDER, 0, LOAD) if p.name == "target only")
    shape_cost = composed_curve(TARGET, 0, CPU, None, None, 512)(512)
    assert prompt_seconds(p, LADDER, CPU, None)["target"] == pytest.approx(shape_cost)
    small = replace(p, plan=replace(p.plan, load=replace(p.plan.load, n_batch=128)))
    chunk = composed_curve(TARGET, 0, CPU, None, None, 128)(128)
    assert prompt_seconds(small, LADDER, CPU, None)["target"] == pytest.approx(4 * chunk)


def test_a_profile_tail_prices_long_batches() -> None:
    tailed = replace(CPU, tail=1e-12)
    assert tailed.byte_cost(16) == CPU.per_byte[-1]
    assert tailed.byte_cost(116) == pytest.approx(CPU.per_byte[-1] + 100e-12)
    slope = (CPU.per_byte[-1] - CPU.per_byte[11]) / 4
    assert CPU.byte_cost(20) == pytest.approx(CPU.per_byte[-1] + 4 * slope)
