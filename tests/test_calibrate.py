"""Cost curves and the identity probe on tiny models: measured once, cached per machine and
load settings, re-measured on demand; ``pyramid-gguf calibrate`` prints them."""

from __future__ import annotations

import json
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
    MAX_N,
    cache_key,
    cache_path,
    calibrate,
    measure_curve,
    probe_identity,
)
from pyramid_gguf.decoding.runtime.tiers import ModelTier
from pyramid_gguf.native import NativeModel


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_measured_curve_is_complete_and_monotone(tiny_target: Path) -> None:
    with NativeModel(tiny_target, TINY_LOAD) as m:
        curve = measure_curve(m, repeats=1)
        assert len(curve.seconds) == MAX_N
        assert all(b >= a > 0 for a, b in zip(curve.seconds, curve.seconds[1:], strict=False))
        assert m.n_past == 0  # the cache is left empty


class _SlowSpell:
    """A model whose evaluation of ``n`` tokens takes ``n`` ms on a fake clock, ten times as
    long over six evaluations in a row (a neighbour's burst on a shared machine)."""

    n_vocab = 1000

    def __init__(self, slow_from: int) -> None:
        self.clock = 0.0
        self.evals = 0
        self.slow = range(slow_from, slow_from + 6)

    def reset(self) -> None:
        pass

    def rollback(self, n_past: int) -> None:
        pass

    def eval(self, tokens: list[int], rows: object = ()) -> None:
        self.evals += 1
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
    curve = measure_curve(cast(Any, model))
    assert curve.seconds == pytest.approx([n * 1e-3 for n in range(1, MAX_N + 1)])


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
        assert path.parent == home / "costs" and json.loads(path.read_text())["key"]["threads"]
        probed = calibrate(tier, probe=True)  # asks for the probe: measured once more
        assert probed.measured and probed.identity_batch is not None
        assert calibrate(tier, refresh=True).measured
    other = replace(TINY_LOAD, n_threads=2, n_threads_batch=2)
    with NativeModel(tiny_target, other) as m:
        assert cache_path(cache_key(m)) != path  # other threads: another calibration


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
