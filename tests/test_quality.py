"""Quality of lossy decoding: the target-scored signal of ``bench``, its table, CSV and chart,
``auto -v`` naming the lossy chains it ran, and the fuzzy thresholds' defaults."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from bench_fixtures import PROMPTS, load_ladder
from lossless import generate, shaped_costs

from pyramid_gguf import Pyramid
from pyramid_gguf.bench import quality
from pyramid_gguf.bench.grid import BenchConfig
from pyramid_gguf.bench.plot import plot_bench
from pyramid_gguf.bench.quality import TokenQuality, score_answer, score_rows
from pyramid_gguf.bench.report import format_table, report, to_csv
from pyramid_gguf.bench.results import aggregate
from pyramid_gguf.bench.runner import run_bench
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.decoding.runtime.stats import AutoStats

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
GREEDY = SamplingConfig(temperature=0, max_tokens=24)


def test_score_rows_by_hand() -> None:
    z = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 3.0], [1.0, 1.0, 1.0]])
    q = score_rows(z, [0, 2, 1])
    # row 1 ties ids 1 and 2: greedy picks the lowest id, so 2 is not the argmax
    assert (q.tokens, q.argmax) == (3, 1)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    assert q.nll == pytest.approx(-(logp[0, 0] + logp[1, 2] + logp[2, 1]))
    assert q.mean_nll == pytest.approx(q.nll / 3) and q.argmax_share == pytest.approx(1 / 3)
    assert score_rows(np.array([[0.0, -1e4]]), [1]).nll == pytest.approx(1e4)
    empty = score_rows(np.zeros((0, 3)), [])
    assert (empty.tokens, empty.mean_nll, empty.argmax_share) == (0, 0.0, 1.0)
    pooled = TokenQuality()
    pooled.add(q)
    pooled.add(TokenQuality(1, 0.5, 1))
    assert (pooled.tokens, pooled.argmax, pooled.nll) == (4, 2, pytest.approx(q.nll + 0.5))


def test_teacher_forced_scores_do_not_depend_on_the_batch(
    ladder_paths: LadderPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring in batches of 5 rows or of 32 gives the same figures, and the target's own
    greedy answer is its argmax at (nearly) every position."""
    with load_ladder(ladder_paths) as p:
        prompt = p.tokenize("def the return value")
        answer = p.generate(prompt, GREEDY, SpecConfig(mode="target")).token_ids
        assert len(answer) > 5
        whole = score_answer(p.ladder.target, prompt, answer)
        monkeypatch.setattr(quality, "ROWS_PER_BATCH", 5)
        parts = score_answer(p.ladder.target, prompt, answer)
        assert p.ladder.target.model.n_past == 0  # the cache is left empty
    assert whole.tokens == parts.tokens == len(answer)
    assert parts.nll == pytest.approx(whole.nll, rel=1e-3, abs=1e-3)
    assert whole.argmax >= len(answer) - 1


def test_answers_to_one_prompt_score_as_alone_with_the_prompt_evaluated_once(
    ladder_paths: LadderPaths,
) -> None:
    """``score_answers`` gives each answer exactly the figures ``score_answer`` gives it alone
    (the answers' rows rolled back between them), evaluating the prompt once, not per answer."""
    with load_ladder(ladder_paths) as p:
        target = p.ladder.target
        prompt = p.tokenize("def the return value")
        answers = [
            p.generate(prompt, GREEDY.with_(max_tokens=n), SpecConfig(mode=m)).token_ids
            for n, m in ((12, "target"), (40, "sd"), (7, "target"))
        ]
        answers.insert(1, [])
        alone = [score_answer(target, prompt, a) for a in answers]
        before = target.model.timer.n_tokens
        together = quality.score_answers(target, prompt, answers)
        evaluated = target.model.timer.n_tokens - before
        assert target.model.n_past == 0  # the cache is left empty
    assert [(q.tokens, q.argmax) for q in together] == [(q.tokens, q.argmax) for q in alone]
    assert [q.nll for q in together] == pytest.approx([q.nll for q in alone], rel=1e-6)
    assert together[1].tokens == 0 and together[0].tokens == len(answers[0]) > 0
    # the prompt's first len - 1 tokens once, then each answer's tokens (its last one unfed)
    # plus the prompt's last token
    assert evaluated == len(prompt) - 1 + sum(len(a) for a in answers if a)


@pytest.fixture(scope="module")
def scored(ladder_paths: LadderPaths):  # type: ignore[no-untyped-def]
    """target, sd, and fsd accepting every draft token (tau 10), quality scored, plus two
    HumanEval-shaped problems whose tests the target's answer cannot pass."""
    configs = [
        BenchConfig.of(SpecConfig(), "target"),
        BenchConfig.of(SpecConfig(), "sd"),
        BenchConfig.of(SpecConfig(), "fsd", tau_t=10.0),
    ]
    problems = [
        {
            "task_id": f"Tiny/{i}",
            "prompt": "def f():\n",
            "entry_point": "f",
            "test": "def check(candidate):\n    assert False\n",
        }
        for i in range(2)
    ]
    with load_ladder(ladder_paths) as p:
        run = run_bench(
            p,
            configs,
            PROMPTS,
            GREEDY,
            repeats=2,
            warmup=False,
            chat=False,
            humaneval_problems=problems,
            quality=True,
        )
    return run, aggregate(run)


def test_quality_ranks_a_lossy_row_under_the_target(scored) -> None:  # type: ignore[no-untyped-def]
    run, rows = scored
    target, sd, fsd = rows
    assert [s.quality is not None for s in run.samples] == [s.repeat == 0 for s in run.samples]
    assert all(s.quality is not None for s in run.humaneval_samples)
    assert target.argmax_share is not None and target.argmax_share >= 0.95
    assert sd.argmax_share == pytest.approx(target.argmax_share, abs=0.05)  # lossless
    assert fsd.argmax_share is not None and fsd.nll is not None and target.nll is not None
    assert fsd.argmax_share < target.argmax_share - 0.05
    assert fsd.nll > target.nll
    for r in rows:
        assert r.humaneval_n == 2 and r.humaneval_pass_at_1 == 0.0 and r.humaneval_passed == []
        assert r.humaneval_tps is not None and r.humaneval_tps > 0
        assert r.humaneval_argmax_share is not None and r.humaneval_nll is not None
    assert target.humaneval_speedup == 1.0


def test_quality_in_table_json_csv_and_chart(scored, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run, rows = scored
    table = format_table(rows)
    head = table.splitlines()[0].split()
    assert {"pass@1", "top1", "nll"} <= set(head)
    fsd_line = next(ln for ln in table.splitlines() if ln.startswith("fsd tau_t=10.0"))
    assert f"{rows[2].argmax_share:.3f}" in fsd_line
    doc = json.loads(json.dumps(report(run, rows)))
    assert doc["rows"][2]["argmax_share"] == round(rows[2].argmax_share, 4)
    assert doc["rows"][0]["humaneval_passed"] == []
    lines = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert float(lines[2]["nll"]) == pytest.approx(rows[2].nll, abs=1e-4)
    assert float(lines[0]["humaneval_speedup"]) == 1.0
    png = plot_bench(rows, tmp_path / "quality.png", title="tiny\nmachine, date")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_auto_verbose_names_the_lossy_chains_it_ran(pyramid: Pyramid) -> None:
    """Priced as a GPU, auto runs model chains; with --allow-lossy they are fuzzy and -v says
    so, naming the thresholds; without it, nothing is called lossy."""
    gpu = shaped_costs(pyramid, per_token=0.02, draft=0.15)
    prompt = pyramid.tokenize("the model of the tree")
    lossy = SpecConfig(mode="auto", allow_lossy=True, tau_q=0.03, tau_t=0.07)
    _, stats = generate(pyramid, prompt, lossy, GREEDY, gpu)
    assert stats.auto is not None
    ran = [c for c in stats.auto.choices.values() if c.chain in {"draft", "qualifier", "pyramid"}]
    assert ran and all(c.lossy for c in ran)
    assert all("target js <= 0.07" in c.lossy for c in ran)
    assert all("qualifier js <= 0.03" in c.lossy for c in ran if c.chain == "pyramid")
    details = "\n".join(stats.auto.details())
    assert "LOSSY" in details and "may differ from the target's" in details
    _, stats = generate(pyramid, prompt, SpecConfig(mode="auto"), GREEDY, gpu)
    assert stats.auto is not None and not any(c.lossy for c in stats.auto.choices.values())
    assert "LOSSY" not in "\n".join(stats.auto.details())


def test_auto_stats_keep_the_lossy_label() -> None:
    auto = AutoStats()
    auto.record("target", 0, 1)
    auto.record("draft", 4, 3, "draft->target js <= 0.05")
    auto.record("draft", 4, 5, "draft->target js <= 0.05")
    assert auto.to_dict()["choices"][1]["lossy"] == "draft->target js <= 0.05"
    assert any("2 rounds ran a lossy chain" in line for line in auto.details())


def test_default_thresholds_are_the_presets() -> None:
    """The shipped default ladder's preset states the calibrated thresholds SpecConfig
    defaults to, and both copies of models.toml are the same file."""
    shipped = (ROOT / "pyramid_gguf" / "models.toml").read_text(encoding="utf-8")
    assert (ROOT / "models.toml").read_text(encoding="utf-8") == shipped
    demo = tomllib.loads(shipped)["presets"]["qwen2.5-coder-demo"]
    spec = SpecConfig()
    assert (demo["tau_q"], demo["tau_t"]) == (spec.tau_q, spec.tau_t)


def test_cli_scores_lossy_sweeps_by_default(ladder_paths: LadderPaths, tmp_path: Path) -> None:
    """A sweep with a lossy mode scores quality unless --no-quality; --json-file keeps the
    report (with where and when it was measured) beside the table."""
    from click.testing import CliRunner

    from pyramid_gguf.cli.main import main

    base = ["bench", "-m", str(ladder_paths.target), "--draft", str(ladder_paths.draft)]
    base += ["-n", "8", "--repeats", "1", "--prompts", "code", "--limit", "1", "-t", "1"]
    base += ["-c", "256", "--quiet", "--raw", "--no-warmup"]
    out = CliRunner().invoke(
        main,
        [*base, "--modes", "fsd", "--sweep", "tau_t=0.1,10", "--json-file", str(tmp_path / "r")],
    )
    assert out.exit_code == 0, out.output
    assert "top1" in out.stdout.splitlines()[0]
    doc = json.loads((tmp_path / "r").read_text())
    assert [r["argmax_share"] is not None for r in doc["rows"]] == [True, True, True]
    assert len(doc["meta"]["date"]) == 10 and doc["meta"]["machine"]
    assert isinstance(doc["meta"]["argv"], list)  # the command line (pytest's, here)
    out = CliRunner().invoke(main, [*base, "--modes", "sd", "--json"])
    assert out.exit_code == 0, out.output
    assert all(r["argmax_share"] is None for r in json.loads(out.stdout)["rows"])
    out = CliRunner().invoke(main, [*base, "--modes", "fsd", "--no-quality", "--json"])
    assert all(r["argmax_share"] is None for r in json.loads(out.stdout)["rows"])
