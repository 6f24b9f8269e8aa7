"""``tune`` on tiny models: a configuration, never one slower than target; load_tuned round trip."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from bench_fixtures import PROMPTS, load_ladder
from click.testing import CliRunner

from pyramid_gguf.bench.results import RowResult
from pyramid_gguf.bench.tune import TuneResult, candidates, tune, winner
from pyramid_gguf.cli.main import main
from pyramid_gguf.core.ladder import NGRAM, LadderPaths, LadderShape
from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.models.resolve import resolve_ladder
from pyramid_gguf.models.tuned import ladder_key, load_tuned, save_tuned, tuned_path

pytestmark = pytest.mark.usefixtures("home")


@pytest.mark.parametrize("drop", [0.0, 0.5])
def test_tune_never_slower_than_target(ladder_paths: LadderPaths, drop: float) -> None:
    with load_ladder(ladder_paths) as p:
        r = tune(
            p,
            SpecConfig(mode="target"),
            ladder_paths,
            PROMPTS,
            SamplingConfig(temperature=0, max_tokens=10),
            max_quality_drop=drop,
            max_configs=5,
            budget_seconds=60,
        )
    assert isinstance(r.spec, SpecConfig)
    assert r.recommend_target == (r.spec.mode == "target")
    assert r.speedup >= 1.0 and r.tps >= r.target_tps
    if drop == 0:
        assert r.spec.lossless
        assert all(m["mode"] in ("auto", "sd", "psd-exact") for m in r.measured)
    assert r.quality_drop <= drop
    assert 0 < len([m for m in r.measured if m["phase"] == "screen"]) <= 5
    assert r.path == tuned_path(ladder_paths) and r.path.is_file()
    assert load_tuned(ladder_paths) == r.spec


def test_load_tuned_round_trip(ladder_paths: LadderPaths, home: Path) -> None:
    assert load_tuned(ladder_paths) is None
    spec = SpecConfig(mode="sd", l_d=6, p_min=0.2)
    result = TuneResult(spec, False, 1.3, 13.0, 10.0, 0.0, 0.0, ladder_key(ladder_paths))
    path = save_tuned(ladder_paths, result.to_dict())
    assert path.parent == home / "tuned"
    assert load_tuned(ladder_paths) == spec
    assert load_tuned(replace(ladder_paths, draft=NGRAM)) is None  # another ladder
    data = json.loads(path.read_text())
    assert data["ladder"]["target"]["size"] == ladder_paths.target.stat().st_size
    resolved = resolve_ladder(paths=ladder_paths)  # what the CLI and the API load
    assert resolved.tuned and resolved.spec == spec
    path.write_text("{broken")
    assert load_tuned(ladder_paths) is None
    assert resolve_ladder(paths=ladder_paths).spec == SpecConfig()


def test_candidates() -> None:
    base = SpecConfig()
    assert [c.spec.mode for c in candidates(base, LadderShape())] == ["auto"]
    lossless = candidates(base, LadderShape(("draft", "qualifier", "target")))
    assert lossless[0].spec.mode == "auto"
    assert {c.spec.mode for c in lossless} == {"auto", "sd", "psd-exact"}
    two = candidates(base, LadderShape(("draft", "target")), max_quality_drop=0.1)
    assert {c.spec.mode for c in two} == {"auto", "sd", "fsd"}
    ngram = candidates(base, LadderShape(("target",), drafter="ngram"))
    assert all(c.spec.p_min == 0 for c in ngram)
    assert {c.spec.mode for c in ngram} == {"auto", "sd"}


def row(mode: str, speedup: float, agreement: float = 1.0) -> RowResult:
    """A hand-made benchmark row: only what ``winner`` reads matters."""
    lossless = SpecConfig(mode=mode).lossless
    return RowResult(
        mode, mode, {}, {"mode": mode}, lossless, 1, 1, {"median": speedup}, [], speedup, [],
        {}, [], {}, agreement, agreement, 0.0,
    )  # fmt: skip


def test_winner_is_never_slower_than_target_nor_out_of_bounds() -> None:
    """The rule ``tune`` recommends by: the fastest eligible row faster than ``target``."""
    assert winner([row("sd", 0.97), row("psd-exact", 1.0)], 0.0) is None  # target wins
    lossy = row("psd-f", 1.6, agreement=0.7)  # 0.3 of the tokens differ from target's
    sd = row("sd", 1.2)
    assert winner([lossy, sd], 0.0) is sd
    assert winner([lossy, sd], 0.5) is lossy
    assert winner([sd, row("auto", 1.25)], 0.0).mode == "auto"


def test_cli_tune(ladder_paths: LadderPaths) -> None:
    out = CliRunner().invoke(
        main,
        [
            "tune",
            "-m",
            str(ladder_paths.target),
            "--draft",
            str(ladder_paths.draft),
            "-n",
            "8",
            "--max-configs",
            "2",
            "--prompts",
            "code",
            "-c",
            "256",
            "-t",
            "1",
            "--json",
            "--raw",
        ],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["speedup"] >= 1.0 and Path(doc["path"]).is_file()
    bad = CliRunner().invoke(
        main, ["tune", "-m", str(ladder_paths.target), "--max-quality-drop", "2"]
    )
    assert bad.exit_code == 1 and "max-quality-drop" in bad.output
