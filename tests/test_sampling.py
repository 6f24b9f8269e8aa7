"""The sampling warp: temperature, top-k, top-p, min-p, greedy ties."""

from __future__ import annotations

import numpy as np
import pytest

from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.decoding.runtime.sampling import sample, softmax, warp


def cfg(**kw: object) -> SamplingConfig:
    base: dict[str, object] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    base.update(kw)
    return SamplingConfig(**base)  # type: ignore[arg-type]


def test_greedy_is_one_hot_with_lowest_id_on_ties() -> None:
    z = np.array([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    out = warp(z, cfg(temperature=0))
    assert out.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_plain_warp_is_softmax_at_temperature() -> None:
    z = np.random.default_rng(0).normal(size=(3, 50))
    assert np.allclose(warp(z, cfg(temperature=0.5)), softmax(z / 0.5))


def test_top_k_keeps_k_largest() -> None:
    z = np.array([0.0, 4.0, 1.0, 3.0, 2.0])
    out = warp(z, cfg(top_k=2))
    assert set(np.flatnonzero(out)) == {1, 3}
    assert out.sum() == pytest.approx(1.0)


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    p = np.array([0.5, 0.3, 0.15, 0.05])
    out = warp(np.log(p), cfg(top_p=0.8))
    assert np.allclose(out, [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    out = warp(np.log(p), cfg(top_p=0.81))
    assert np.count_nonzero(out) == 3


def test_min_p_drops_tokens_under_fraction_of_top() -> None:
    p = np.array([0.6, 0.3, 0.08, 0.02])
    out = warp(np.log(p), cfg(min_p=0.1))
    assert np.count_nonzero(out) == 3
    assert out.sum() == pytest.approx(1.0)


def test_warp_rows_are_independent() -> None:
    z = np.random.default_rng(1).normal(size=(4, 30))
    c = cfg(top_k=5, top_p=0.9, min_p=0.05, temperature=0.7)
    rows = warp(z, c)
    for i in range(4):
        assert np.allclose(rows[i], warp(z[i], c))


def test_sample_never_picks_zero_probability() -> None:
    g = np.random.default_rng(0)
    p = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    picks = {sample(p, g) for _ in range(500)}
    assert picks == {1, 3}


@pytest.mark.parametrize(
    "kw", [{"temperature": -1}, {"top_p": 0}, {"min_p": 2}, {"max_tokens": 0}, {"stop": ("",)}]
)
def test_bad_sampling_values_are_user_errors(kw: dict[str, object]) -> None:
    with pytest.raises(UserError):
        SamplingConfig(**kw)  # type: ignore[arg-type]
