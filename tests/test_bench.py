"""``pyramid-gguf bench`` on tiny models: fields, speedup reference, acceptance sums, grids, PNG."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from bench_fixtures import PROMPTS, load_ladder
from click.testing import CliRunner

from pyramid_gguf.bench.grid import BenchConfig, build_grid, parse_modes, parse_sweep
from pyramid_gguf.bench.plot import plot_bench
from pyramid_gguf.bench.prompts import load_prompt_file, load_prompt_sets
from pyramid_gguf.bench.report import report, to_csv
from pyramid_gguf.bench.results import aggregate, agreement
from pyramid_gguf.bench.runner import run_bench
from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.core.spec import SpecConfig

GREEDY = SamplingConfig(temperature=0, max_tokens=12)
ALL = ["target", "sd", "fsd", "psd-exact", "psd-a", "psd-f"]


@pytest.fixture(scope="module")
def measured(ladder_paths: LadderPaths):  # type: ignore[no-untyped-def]
    configs = build_grid(ALL, SpecConfig())
    with load_ladder(ladder_paths) as p:
        run = run_bench(p, configs, PROMPTS, GREEDY, repeats=2, warmup=False, chat=False)
    return run, aggregate(run)


def test_json_has_every_field(measured) -> None:  # type: ignore[no-untyped-def]
    run, rows = measured
    doc = json.loads(json.dumps(report(run, rows, {"ladder": "tiny"})))
    assert doc["meta"]["repeats"] == 2 and doc["meta"]["peak_rss_mib"] > 0
    assert [r["mode"] for r in doc["rows"]] == ALL
    for r in doc["rows"]:
        for key in (
            "label",
            "tps",
            "tps_repeats",
            "speedup",
            "speedup_repeats",
            "stages",
            "time_share",
            "agreement_prefix",
            "agreement_positional",
            "peak_rss_mib",
            "tps_by_set",
            "n_samples",
            "generated_tokens",
            "spec",
            "lossless",
        ):
            assert key in r, key
        assert {"median", "min", "max"} <= set(r["tps"])
        assert r["n_samples"] == len(PROMPTS) * 2
        assert "scheduler" in r["time_share"]
        assert sum(r["time_share"].values()) == pytest.approx(1.0, abs=0.02)
        assert set(r["tps_by_set"]) == {"code", "edit"}
        if r["mode"] != "target":
            assert r["stages"] and r["stages"][-1]["name"].endswith("->target")


def test_target_speedup_is_one_and_lossless_agree(measured) -> None:  # type: ignore[no-untyped-def]
    _, rows = measured
    assert rows[0].speedup == 1.0 and rows[0].speedup_repeats == [1.0, 1.0]
    for r in rows:
        assert r.speedup > 0
        if r.lossless:  # greedy lossless modes reproduce the target's tokens
            assert r.agreement_prefix == pytest.approx(1.0)
            assert r.agreement_positional == pytest.approx(1.0)


def test_acceptance_agrees_with_engine_stats(measured) -> None:  # type: ignore[no-untyped-def]
    run, rows = measured
    for i, row in enumerate(rows):
        stats = [s.stats for s in run.samples if s.row == i]
        assert sum(s.generated_tokens for s in stats) == row.generated_tokens
        for stage in row.stages:
            engine = [st for s in stats for st in s.stages if st.name == stage.name]
            drafted = sum(st.draft_n for st in engine)
            accepted = sum(st.draft_n_accepted for st in engine)
            checks = sum(st.verifications for st in engine)
            assert (stage.draft_n, stage.draft_n_accepted, stage.verifications) == (
                drafted,
                accepted,
                checks,
            )
            assert stage.acceptance_rate == pytest.approx(accepted / drafted)
            assert stage.mean_accepted == pytest.approx(accepted / checks)
            assert sum(n * c for n, c in enumerate(stage.histogram)) == accepted


def test_csv_and_png(measured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, rows = measured
    table = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert [t["mode"] for t in table] == ALL and float(table[0]["speedup"]) == 1.0
    png = plot_bench(rows, tmp_path / "bench.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_sweep_grid_sizes() -> None:
    sweeps = parse_sweep(["l_d=2,4,8", "tau_t=0.2,0.4"])
    assert sweeps == [("l_d", [2, 4, 8]), ("tau_t", [0.2, 0.4])]
    base = SpecConfig()
    # target 1; sd uses l_d only: 3; fsd and psd-a use both: 6 each
    grid = build_grid(["target", "sd", "fsd", "psd-a"], base, sweeps)
    assert len(grid) == 1 + 3 + 6 + 6
    assert len({g.label for g in grid}) == len(grid)
    assert {g.spec.l_d for g in grid if g.spec.mode == "fsd"} == {2, 4, 8}
    psd_f = parse_sweep(["tau_q=0.1,0.2", "l_q=4,8"])
    assert len(build_grid(["target", "psd-f"], base, psd_f)) == 5
    assert len(build_grid(["target"], base, sweeps)) == 1


def test_bad_flags_are_user_errors() -> None:
    for bad in (["l_d"], ["l_d="], ["foo=1"], ["l_d=x"], ["l_d=1", "l_d=2"]):
        with pytest.raises(UserError):
            parse_sweep(bad)
    with pytest.raises(UserError):
        build_grid(["target", "sd"], SpecConfig(), parse_sweep(["l_d=0"]))
    with pytest.raises(UserError, match="unknown mode"):
        parse_modes("sd,nope", ALL)
    with pytest.raises(UserError, match="allows"):
        parse_modes("psd-exact", ["target", "sd", "fsd"])
    assert parse_modes("sd", ALL) == ["target", "sd"]
    assert parse_modes(None, ["target", "sd"]) == ["target", "sd"]
    with pytest.raises(UserError):
        load_prompt_sets(["nope"])


def test_prompt_sets_and_files(tmp_path: Path) -> None:
    prompts = load_prompt_sets(None)
    sets = {p.set for p in prompts}
    assert sets == {"code", "edit", "chat", "qa", "summarize", "rag"}
    for name in sets:
        assert 3 <= sum(p.set == name for p in prompts) <= 5
    assert len({p.key for p in prompts}) == len(prompts)
    f = tmp_path / "mine.json"
    f.write_text(json.dumps(["one", {"id": "x", "text": "two"}]))
    assert [p.key for p in load_prompt_file(f)] == ["mine/0", "mine/x"]
    t = tmp_path / "mine.txt"
    t.write_text("first\nline\n\nsecond\n")
    assert [p.text for p in load_prompt_file(t)] == ["first\nline", "second"]
    with pytest.raises(UserError):
        load_prompt_file(tmp_path / "missing.json")


def test_agreement() -> None:
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == (1.0, 1.0)
    assert agreement([1, 2, 3, 4], [1, 9, 3, 4]) == (0.25, 0.75)
    assert agreement([1, 2], [1, 2, 3, 4]) == (1.0, 0.5)


def test_first_row_must_be_target(ladder_paths: LadderPaths) -> None:
    with load_ladder(ladder_paths) as p, pytest.raises(UserError):
        run_bench(p, [BenchConfig("sd", SpecConfig(mode="sd"))], PROMPTS, GREEDY)


def test_cli_sweep_json_csv_plot(ladder_paths: LadderPaths, tmp_path: Path) -> None:
    out = CliRunner().invoke(
        main,
        [
            "bench",
            "-m",
            str(ladder_paths.target),
            "--draft",
            str(ladder_paths.draft),
            "--modes",
            "sd,fsd",
            "--sweep",
            "l_d=2,3",
            "--sweep",
            "tau_t=0.3,0.6",
            "-n",
            "8",
            "--repeats",
            "1",
            "--prompts",
            "code",
            "--limit",
            "1",
            "-c",
            "256",
            "-t",
            "1",
            "--json",
            "--csv",
            str(tmp_path / "b.csv"),
            "--plot",
            str(tmp_path / "b.png"),
            "--quiet",
            "--raw",
        ],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert len(doc["rows"]) == 1 + 2 + 4
    assert doc["rows"][0]["speedup"] == 1.0
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "b.csv").read_text().splitlines()) == 1 + 7


def test_cli_bad_flags_one_line(ladder_paths: LadderPaths) -> None:
    base = ["bench", "-m", str(ladder_paths.target), "--draft", str(ladder_paths.draft)]
    for extra in (
        ["--modes", "bogus"],
        ["--sweep", "l_d"],
        ["--sweep", "nope=1"],
        ["--prompts", "nope"],
        ["--modes", "psd-exact"],
        ["--repeats", "0"],
    ):
        out = CliRunner().invoke(main, base + extra)
        assert out.exit_code == 1, (extra, out.output)
        assert isinstance(out.exception, SystemExit)  # an Error: line, not a crash
        assert "Traceback" not in out.output
        assert len(out.output.strip().splitlines()) == 1, out.output
