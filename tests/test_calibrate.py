"""Cost curves and the identity probe on tiny models: measured once, cached per machine and
load settings, re-measured on demand; ``pyramid-gguf calibrate`` prints them."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TINY_LOAD

from pyramid_gguf.cli.main import main
from pyramid_gguf.decoding.runtime.calibrate import (
    ATTEMPTS,
    MAX_N,
    Measured,
    cache_key,
    cache_path,
    calibrate,
    measure_curve,
    probe_identity,
    summarize,
)
from pyramid_gguf.decoding.runtime.tiers import ModelTier
from pyramid_gguf.native import NativeModel

pytestmark = pytest.mark.usefixtures("home")


def test_measured_curve_is_complete_and_its_own(tiny_target: Path) -> None:
    """Every size up to MAX_N is priced, and no point sits above what was measured there by
    more than the noise of its repeats (no running maximum)."""
    with NativeModel(tiny_target, TINY_LOAD) as m:
        measured = measure_curve(m, repeats=2)
        curve = measured.curve
        assert len(curve.seconds) == MAX_N and all(s > 0 for s in curve.seconds)
        assert m.n_past == 0  # the cache is left empty
    for t in measured.timed:
        assert curve(t.n) <= t.median + t.high - t.low + 1e-6


def test_a_curve_that_falls_is_recorded_falling() -> None:
    """A split tier's curve flattens or falls past llama.cpp's op-offload threshold: the fall,
    beyond the repeats' noise, stays in the curve; a dip within noise is smoothed away."""
    rounds = {
        1: [0.40, 0.41, 0.40],
        8: [1.40, 1.41, 1.39],
        16: [1.48, 1.47, 1.49],
        32: [1.00, 1.02, 1.01],  # op offload: cheaper than 16 tokens, well beyond noise
        64: [1.05, 1.04, 1.06],
    }
    curve = summarize(rounds).curve
    assert curve(32) == pytest.approx(1.01) and curve(32) < curve(16)
    assert curve(64) == pytest.approx(1.05)
    noisy = summarize({1: [1.0, 1.1, 0.9], 2: [0.98, 1.08, 0.95], 4: [1.5, 1.5, 1.5]}).curve
    assert noisy(2) == pytest.approx(1.0)  # 0.98 < 1.0 by less than its repeats' spread
    assert noisy(3) == pytest.approx(1.25)  # interpolated between measured sizes


def test_busy_machine_is_measured_again_and_not_cached(
    tiny_target: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A calibration whose repeats spread beyond LOADED_SPREAD at most sizes is measured
    again; still noisy, it prices this run and is not cached, so the next run measures anew."""
    from pyramid_gguf.decoding.runtime import calibrate as module

    calls: list[int] = []

    def noisy(model: object, **_: object) -> Measured:
        calls.append(1)
        return summarize({n: [n * 0.01, n * 0.02, n * 0.015] for n in (1, 2, 4)})

    monkeypatch.setattr(module, "measure_curve", noisy)
    with NativeModel(tiny_target, TINY_LOAD) as m:
        said: list[str] = []
        cal = calibrate(ModelTier("target", m), say=said.append)
        assert cal.loaded and len(calls) == ATTEMPTS
        assert any("busy" in line for line in said)
        assert not cache_path(cache_key(m)).exists()
        calibrate(ModelTier("target", m))
        assert len(calls) == 2 * ATTEMPTS  # not cached: measured again


class _SlowSpell:
    """A model whose evaluation of ``n`` tokens takes ``n`` ms on a fake clock, ten times as
    long over six evaluations in a row (a neighbour's burst on a shared machine), or over the
    evaluations numbered in ``slow``."""

    n_vocab = 1000

    def __init__(self, slow_from: int = 0, slow: Collection[int] = ()) -> None:
        self.clock = 0.0
        self.evals = 0
        self.slow = slow or range(slow_from, slow_from + 6)
        self.sizes: list[int] = []

    def reset(self) -> None:
        pass

    def rollback(self, n_past: int) -> None:
        pass

    def eval(self, tokens: list[int], rows: object = ()) -> None:
        self.evals += 1
        self.sizes.append(len(tokens))
        self.clock += len(tokens) * 1e-3 * (10 if self.evals in self.slow else 1)


@pytest.mark.parametrize("slow_from", [3, 9, 20])
def test_a_slow_spell_does_not_bend_the_curve(
    slow_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever six consecutive timings a burst slows, it slows one round of a size at most,
    and the median round is fast: the curve is the model's own, n ms for n tokens."""
    from pyramid_gguf.decoding.runtime import calibrate as module

    model = _SlowSpell(slow_from)
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: model.clock))
    measured = measure_curve(cast(Any, model))
    assert measured.curve.seconds == pytest.approx([n * 1e-3 for n in range(1, MAX_N + 1)])
    assert not measured.loaded  # one burst is not a busy machine


def test_two_spells_on_one_size_are_outvoted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two bursts that slow a size in two of its three rounds (here the one-token step, the
    price of plain decoding) would make its median ten times its cost, and verifying two
    tokens look cheaper than decoding one: the size is timed again until the timings around
    its median agree, and the curve is the model's own."""
    from pyramid_gguf.decoding.runtime import calibrate as module

    per_round = len(module.SIZES)
    first = 3  # evaluations 1 and 2 are the prefix and the warm-up; round r's n=1 comes first
    model = _SlowSpell(slow={first, first + per_round})
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: model.clock))
    measured = measure_curve(cast(Any, model))
    assert measured.curve(1) == pytest.approx(1e-3) and measured.curve(1) < measured.curve(2)
    assert measured.curve.seconds == pytest.approx([n * 1e-3 for n in range(1, MAX_N + 1)])
    # only the spoiled size was timed again
    extra = model.evals - 2 - module.REPEATS * per_round
    assert module.EXTRA_REPEATS <= extra <= module.RETRIES * module.EXTRA_REPEATS
    assert model.sizes[-extra:] == [1] * extra


def test_identity_probe_finds_what_the_kernels_keep(tiny_target: Path) -> None:
    """Whatever this CPU does, a batch of up to the probed size gives exactly the rows of
    one-token decoding, and the next size (if any) does not."""
    with NativeModel(tiny_target, TINY_LOAD) as m:
        safe = probe_identity(m, max_n=6)
        assert 1 <= safe <= 6
        prefix, tokens = list(range(20, 44)), list(range(60, 67))
        m.eval(prefix)
        singles = np.stack([m.eval([t], [0])[0] for t in tokens])
        m.rollback(len(prefix))
        np.testing.assert_array_equal(m.eval(tokens[:safe], range(safe)), singles[:safe])


def test_calibration_is_cached_per_file_and_load_settings(tiny_target: Path, home: Path) -> None:
    with NativeModel(tiny_target, TINY_LOAD) as m:
        tier = ModelTier("target", m)
        said: list[str] = []
        first = calibrate(tier, say=said.append)
        assert first.measured and len(said) == 1 and first.identity_batch is None
        again = calibrate(tier, say=said.append)
        assert not again.measured and again.curve == first.curve and len(said) == 1
        path = cache_path(cache_key(m))
        key = json.loads(path.read_text())["key"]
        assert path.parent == home / "costs" and key["load"]["n_threads"] == 1
        probed = calibrate(tier, probe=True)  # asks for the probe: measured once more
        assert probed.measured and probed.identity_batch is not None
        assert calibrate(tier, refresh=True).measured
    for other in (
        replace(TINY_LOAD, n_threads=2, n_threads_batch=2),
        replace(TINY_LOAD, op_offload=False),
    ):
        with NativeModel(tiny_target, other) as m:
            assert cache_path(cache_key(m)) != path  # other settings: another calibration
    with NativeModel(tiny_target, replace(TINY_LOAD, n_ctx=1024)) as m:
        assert cache_path(cache_key(m)) == path  # the context's size is not a cost


def test_calibrate_command(tiny_target: Path, tiny_draft: Path) -> None:
    args = ["calibrate", "-m", str(tiny_target), "--draft", str(tiny_draft), "-t", "1", "-c", "256"]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc["tiers"]) == {"draft", "target"}
    assert len(doc["tiers"]["target"]["curve"]["seconds"]) == MAX_N
    assert set(doc["break_even_keep_rate"]) == {"ngram", "draft"}
    text = CliRunner().invoke(main, [*args, "--strict-identity"])
    assert text.exit_code == 0, text.output
    assert "ms per evaluation" in text.stdout and "bit-identical" in text.stdout
    assert "ngram:" in text.stdout
    verbose = CliRunner().invoke(main, [*args, "-v"])
    assert verbose.exit_code == 0, verbose.output
    assert f"n={MAX_N}" in verbose.stdout and "measured (" in verbose.stdout
