"""Consumer device profiles: the physical model behaves as physics says, its fit recovers known
parameters, and every shipped profile loads, is monotone in the batch size and prices the
published figures of its card (scripts/fit_profiles.py wrote them from published.json)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pyramid_gguf.planning.compose import MAX_N, DeviceProfile, Shape
from pyramid_gguf.planning.hardware import (
    GPU_START,
    MMVQ_MAX_BATCH,
    CpuModel,
    Figure,
    GpuModel,
    ModelFacts,
    Spec,
    Work,
    cpu_compute,
    fit_cpu,
    fit_figures,
    fit_gpu,
    load_published,
    load_specs,
    shipped,
    soft_max,
)

#: Llama 3.2 1B / 3.2 3B / 3.1 8B Q4_K_M as plan reads them (blocks + output head).
LLAMA_1B = Shape(799_500_000, 16)
LLAMA_3B = Shape(2_012_000_000, 28)
LLAMA_8B = Shape(4_617_000_000, 32)

GPU = GpuModel(
    eta={"ampere": 0.85, "ada": 0.9},
    per_layer=30e-6,
    fixed=150e-6,
    vec_rate=20e9,
    tile_rate=3e9,
    tensor_eff=0.4,
    softness=2.0,
)
CARD = Spec("card", "a card", "gpu", "consumer", "ampere", 360e9, sms=28, boost_ghz=1.777)

SPECS = load_specs()
MODELS, FIGURES = load_published()
GPUS = shipped("gpus")
CPUS = shipped("cpus")


def seconds(model: GpuModel, spec: Spec, shape: Shape, n: int = 1) -> float:
    return model.seconds(spec, Work(shape.weight_bytes, shape.n_layer, n))


# --- the physical model -------------------------------------------------------------------------


def test_soft_max_is_the_larger_cost_with_a_knee() -> None:
    assert soft_max(3.0, 0.0, 2.0) == 3.0
    assert soft_max(3.0, 4.0, 2.0) == pytest.approx(5.0)
    assert soft_max(3.0, 4.0, 50.0) == pytest.approx(4.0, rel=1e-2)


def test_more_bandwidth_is_faster_and_memory_bound_at_one_token() -> None:
    slow, fast = CARD, replace(CARD, bandwidth=2 * CARD.bandwidth)
    assert seconds(GPU, fast, LLAMA_8B) < seconds(GPU, slow, LLAMA_8B)
    overhead = LLAMA_8B.n_layer * GPU.per_layer + GPU.fixed
    memory = LLAMA_8B.weight_bytes / (GPU.eta["ampere"] * CARD.bandwidth)
    # one token streams the weights: within a few percent of bytes / effective bandwidth
    assert seconds(GPU, CARD, LLAMA_8B) - overhead == pytest.approx(memory, rel=0.05)


def test_batch_cost_ratio_rises_toward_compute_bound() -> None:
    one = seconds(GPU, CARD, LLAMA_8B)
    costs = [seconds(GPU, CARD, LLAMA_8B, n) for n in range(1, MMVQ_MAX_BATCH + 1)]
    steps = np.diff(costs)
    compute_slope = LLAMA_8B.weight_bytes / (GPU.vec_rate * CARD.sm_ghz)
    assert np.all(steps > 0) and np.all(np.diff(steps) > -1e-9)  # convex: the knee
    assert steps[-1] <= compute_slope * 1.0001  # approaches the compute-bound slope
    assert 1.0 < costs[1] / one < costs[3] / one < costs[7] / one
    # a card with more compute per byte of bandwidth pays less for the same batch
    rich = replace(CARD, sms=2 * CARD.sms)
    assert seconds(GPU, rich, LLAMA_8B, 8) / seconds(GPU, rich, LLAMA_8B) < costs[7] / one


def test_per_layer_term_makes_small_models_relatively_dearer() -> None:
    byte_ratio = LLAMA_1B.weight_bytes / LLAMA_8B.weight_bytes
    step_ratio = seconds(GPU, CARD, LLAMA_1B) / seconds(GPU, CARD, LLAMA_8B)
    assert step_ratio > byte_ratio
    heavier = replace(GPU, per_layer=3 * GPU.per_layer)
    assert seconds(heavier, CARD, LLAMA_1B) / seconds(heavier, CARD, LLAMA_8B) > step_ratio


def test_profile_prices_what_the_model_prices() -> None:
    """Exactly up to 8 tokens; beyond, the envelope (llama.cpp's MMQ kernel for 9+ tokens can
    be cheaper than MMVQ at 8, and a cheaper longer batch would tell auto it verifies for free)."""
    profile = GPU.profile(CARD, "test")
    model = [seconds(GPU, CARD, LLAMA_8B, n) for n in range(1, MAX_N + 1)]
    for n in range(1, MAX_N + 1):
        expected = max(model[:n]) if n > MMVQ_MAX_BATCH else model[n - 1]
        assert profile.cost(n, LLAMA_8B) == pytest.approx(expected, rel=1e-3)


def test_cpu_is_memory_bound_for_a_token_and_compute_bound_for_batches() -> None:
    cpu = CpuModel(eta=0.65, fixed=5e-4, core_rate=13e9, batch_slope=0.5)
    few = Spec("ddr5-4", "4 cores", "cpu", "consumer", "cpu", 89.6e9, cores=4)
    many = replace(few, cores=16)
    assert cpu.per_byte(many, 1) == pytest.approx(1 / (0.65 * 89.6e9), rel=0.01)
    assert cpu.per_byte(few, 16) / cpu.per_byte(few, 1) > cpu.per_byte(many, 16) / cpu.per_byte(
        many, 1
    )


# --- fitting ------------------------------------------------------------------------------------


def synthetic(model: GpuModel) -> list[Figure]:
    """Figures a known model would publish: several cards and model sizes, batches 1-16, 512."""
    cards = ["rtx-3060-12gb", "rtx-3090-24gb", "rtx-4060-8gb", "rtx-4090-24gb", "rtx-2080-8gb"]
    sizes = ["llama3.2-1b-q4_k_m", "llama3.2-3b-q4_k_m", "llama3.1-8b-q4_k_m"]
    out = []
    for card in cards:
        for key in sizes:
            for n in (1, 2, 4, 8, 12, 16, 512):
                f = Figure(f"{card}-{key}-{n}", card, key, n, 1.0, 64.0, "fit", backend="CUDA")
                t = model.seconds(SPECS[card], f.work(MODELS))
                out.append(replace(f, tokens_per_s=n / t))
    return out


def test_gpu_fit_recovers_known_parameters() -> None:
    truth = replace(GPU, eta={"ampere": 0.82, "ada": 0.91, "turing": 0.7})
    fitted = fit_gpu(synthetic(truth), SPECS, MODELS, GPU_START)
    for arch in ("ampere", "ada", "turing"):
        assert fitted.eta[arch] == pytest.approx(truth.eta[arch], rel=0.02)
    for name in ("per_layer", "fixed", "vec_rate", "tile_rate", "tensor_eff", "softness"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.05), name


def test_cpu_fit_recovers_known_parameters() -> None:
    rate, slope = 12e9, 0.4
    measured = DeviceProfile(
        "cpu", "synthetic", tuple((1 + slope * i) / (2 * rate) for i in range(16)), (0.0,) * 16,
        (1e-3,) * 16,
    )  # fmt: skip
    assert cpu_compute(measured, cores=2) == pytest.approx((rate, slope), rel=1e-6)
    truth = CpuModel(eta=0.6, fixed=7e-4, core_rate=rate, batch_slope=slope)
    figures = []
    for key in ("llama3.2-1b-q4_k_m", "qwen3-4b-q4_k_m", "llama3.1-8b-q4_k_m"):
        f = Figure(key, "ryzen-7-7840hs", key, 1, 1.0, 64.0, "fit", backend="CPU")
        t = truth.seconds(SPECS["ryzen-7-7840hs"], f.work(MODELS))
        figures.append(replace(f, tokens_per_s=1.0 / t))
    fitted = fit_cpu(figures, SPECS, MODELS, rate, slope)
    assert fitted.eta == pytest.approx(0.6, rel=1e-3)
    assert fitted.fixed == pytest.approx(7e-4, rel=1e-2)


# --- shipped profiles ---------------------------------------------------------------------------


def test_the_required_cards_and_classes_ship() -> None:
    required = {
        "rtx-2060-6gb", "rtx-3050-8gb", "rtx-3060-12gb", "rtx-3060-ti-8gb", "rtx-3070-8gb",
        "rtx-3080-10gb", "rtx-4060-8gb", "rtx-4060-ti-8gb", "rtx-4060-ti-16gb", "rtx-4070-12gb",
        "rtx-4090-24gb", "rtx-4050-laptop-6gb", "rtx-4060-laptop-8gb",
    }  # fmt: skip
    assert required <= set(GPUS)
    assert {f"ddr{d}-{c}core" for d in (4, 5) for c in (4, 8, 16)} <= set(CPUS)


@pytest.mark.parametrize("path", [*GPUS.values(), *CPUS.values()], ids=lambda p: p.stem)
def test_shipped_profile_loads_and_is_monotone(path: Path) -> None:
    profile = DeviceProfile.load(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert profile.name == path.stem and len(profile.fixed) == MAX_N
    assert data["kind"] in ("gpu", "cpu") and data["class"] in ("consumer", "laptop")
    assert data["bandwidth"] > 0 and data["sources"] and "predicted" in profile.source
    assert set(data["fit_error"]) == {"fit", "held_out", "context"}
    assert data["basis"] in ("published", "spec-derived")
    if data["kind"] == "gpu":
        assert data["vram_bytes"] >= 6 * 2**30
    for shape in (LLAMA_1B, LLAMA_3B, LLAMA_8B):
        costs = [profile.cost(n, shape) for n in range(1, MAX_N + 1)]
        assert all(b >= a for a, b in itertools.pairwise(costs))
    one = profile.cost(1, LLAMA_8B)
    assert 1 / one == pytest.approx(data["predicted"]["llama-3.1-8b-q4_k_m"]["tok_s"], rel=1e-2)


def profile_tok_s(figure: Figure) -> tuple[float, DeviceProfile] | None:
    """Tok/s the shipped profile of the figure's device predicts for it (its KV cache reads
    priced as weight bytes)."""
    path = GPUS.get(str(figure.card)) or CPUS.get(str(figure.card))
    if path is None or figure.model is None or figure.n != 1:
        return None
    m: ModelFacts = MODELS[figure.model]
    profile = DeviceProfile.load(path)
    shape = Shape(int(m.weight_bytes + m.kv_bytes_per_token * figure.depth), m.n_layer)
    return 1.0 / profile.cost(1, shape), profile


EIGHT_B_CLASS = {"llama2-7b-q4_0", "llama3-8b-q4_0", "llama3.1-8b-q4_k_m", "qwen3-8b-q4_k_m"}


def test_shipped_profiles_price_published_8b_steps() -> None:
    """Every published 7-8B token step of a shipped card (fitted or held out) is priced within
    20% by that card's profile."""
    checked = 0
    for f in FIGURES:
        if f.use == "context" or f.model not in EIGHT_B_CLASS:
            continue
        priced_ = profile_tok_s(f)
        if priced_ is None:
            continue
        assert priced_[0] / f.tokens_per_s == pytest.approx(1.0, abs=0.2), f.id
        checked += 1
    assert checked >= 8


def test_held_out_error_below_15_percent_on_three_cards() -> None:
    """Computed from the shipped profiles and published.json, not from stored numbers."""
    good = set()
    for f in FIGURES:
        if f.use != "held_out" or f.model not in EIGHT_B_CLASS:
            continue
        priced_ = profile_tok_s(f)
        if priced_ is not None and abs(priced_[0] / f.tokens_per_s - 1) < 0.15:
            good.add(f.card)
    assert len(good) >= 3, good


def test_stored_fit_errors_match_the_profiles() -> None:
    for path in [*GPUS.values(), *CPUS.values()]:
        data = json.loads(path.read_text(encoding="utf-8"))
        by_id = {f.id: f for f in FIGURES}
        for row in data["fit_error"]["held_out"]:
            f = by_id[row["figure"]]
            priced_ = profile_tok_s(f)
            if priced_ is not None and f.card == path.stem:
                assert priced_[0] == pytest.approx(row["predicted_tok_s"], rel=0.02), f.id


def test_fit_reproduces_the_shipped_profiles() -> None:
    """The shipped GPU profiles are what the code fits from the shipped data."""
    model = fit_gpu(fit_figures(FIGURES, SPECS, "gpu"), SPECS, MODELS)
    for slug in ("rtx-3060-12gb", "rtx-4060-8gb", "rtx-2060-6gb"):
        shipped_profile = DeviceProfile.load(GPUS[slug])
        fresh = model.profile(SPECS[slug], "test")
        assert np.allclose(fresh.per_byte, shipped_profile.per_byte, rtol=1e-3)
        assert math.isclose(fresh.per_layer[0], shipped_profile.per_layer[0], rel_tol=1e-3)
