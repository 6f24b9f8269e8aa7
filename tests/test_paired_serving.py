"""scripts/paired_serving.py (issue 52): the pairs alternate which server goes first, each
phase's verdict is the pairs' median and geometric mean with each side's worst first token,
the bars read those, and bad flags are one-line errors."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import paired_serving as ps  # noqa: E402
from parallel_bench import Phase, Record, ours_cmd, split_line, with_end_tokens  # noqa: E402


def phase(tokens: int, wall: float, ttft: float = 0.1) -> Phase:
    return Phase([Record(prompt=0, tokens=tokens, wall=wall, ttft=ttft)], wall)


def pair(kind: str, repeat: int, ours: Phase, peer: Phase) -> ps.Pair:
    return ps.Pair(kind, repeat, ps.first_side(0, repeat), ours, peer)


def test_each_prompt_starts_on_both_sides_and_repeats_swap() -> None:
    for r in range(4):
        firsts = [ps.first_side(i, r) for i in range(4)]
        assert firsts.count("ours") == firsts.count("peer") == 2  # alternating within a repeat
        assert [ps.first_side(i, r + 1) for i in range(4)] != firsts  # and swapped the next
    for i in range(4):  # over two repeats every prompt went first once on each side
        assert {ps.first_side(i, 0), ps.first_side(i, 1)} == set(ps.SIDES)


def test_a_verdict_is_the_pairs_median_and_geometric_mean() -> None:
    pairs = [
        pair("solo", 0, phase(100, 10.0), phase(100, 11.0)),  # 1.1x
        pair("solo", 0, phase(100, 10.0), phase(100, 8.0)),  # 0.8x
        pair("solo", 1, phase(50, 5.0), phase(100, 10.0)),  # tok/s, not tokens: 1.0x
        pair("together", 0, phase(400, 20.0), phase(400, 24.0)),
    ]
    v = ps.verdict(pairs, "solo")
    assert v.ratios == pytest.approx([1.1, 0.8, 1.0])
    assert v.median == pytest.approx(1.0)
    assert v.geomean == pytest.approx((1.1 * 0.8 * 1.0) ** (1 / 3))
    assert ps.verdict(pairs, "together").ratios == pytest.approx([1.2])


def test_a_pair_off_par_either_way_is_an_outlier() -> None:
    """A pair 0.356x (a stalled VM) or 1.3x has its step splits printed; near par, or with
    nothing produced, it does not."""
    ratio = {
        1.0: (10.0, 10.0),
        0.356: (10.0, 3.56),
        1.3: (10.0, 13.0),
        0.85: (10.0, 8.5),
        1.2: (10.0, 12.0),
    }
    off = {
        r: ps.outlier(pair("solo", 0, phase(100, ours), phase(100, peer)))
        for r, (ours, peer) in ratio.items()
    }
    assert off == {1.0: False, 0.356: True, 1.3: True, 0.85: False, 1.2: False}
    assert not ps.outlier(pair("solo", 0, phase(0, 10.0), phase(100, 10.0)))


def test_our_answers_that_stop_count_their_end_token_as_llama_server_counts_it() -> None:
    """The same 54-token answer reads 55 tokens from llama-server (its end token counted):
    ours that stopped gets it too, an answer cut at max_tokens or without usage does not."""
    recs = [
        Record(prompt=0, tokens=54, wall=2.0, finish_reason="stop", usage=True),
        Record(prompt=1, tokens=128, wall=4.0, finish_reason="length", usage=True),
        Record(prompt=2, tokens=7, wall=1.0, finish_reason="stop", usage=False),
    ]
    counted = with_end_tokens(Phase(recs, 4.0))
    assert [r.tokens for r in counted.records] == [55, 128, 7]
    same = Phase([Record(prompt=0, tokens=55, wall=2.0, finish_reason="stop", usage=True)], 2.0)
    assert pair("solo", 0, counted, same).ratio == pytest.approx((55 + 128 + 7) / 4.0 / 27.5)


def test_the_worst_first_token_is_a_repeats_worst_then_the_median_over_repeats() -> None:
    pairs = [
        pair("solo", 0, phase(10, 1.0, ttft=0.3), phase(10, 1.0, ttft=0.2)),
        pair("solo", 0, phase(10, 1.0, ttft=0.9), phase(10, 1.0, ttft=0.2)),  # repeat 0: 0.9
        pair("solo", 1, phase(10, 1.0, ttft=0.4), phase(10, 1.0, ttft=0.5)),  # repeat 1: 0.4
        pair("solo", 2, phase(10, 1.0, ttft=0.5), phase(10, 1.0, ttft=0.6)),  # repeat 2: 0.5
    ]
    v = ps.verdict(pairs, "solo")
    assert v.worst_ttft_ours == pytest.approx(0.5)
    assert v.worst_ttft_peer == pytest.approx(0.5)


def test_a_pair_with_nothing_produced_is_left_out_of_the_verdict() -> None:
    pairs = [
        pair("solo", 0, phase(0, 1.0), phase(10, 1.0)),
        pair("solo", 0, phase(12, 1.0), phase(10, 1.0)),
    ]
    v = ps.verdict(pairs, "solo")
    assert math.isnan(v.ratios[0])
    assert v.median == pytest.approx(1.2) and v.geomean == pytest.approx(1.2)


def test_the_bars_read_the_medians_and_first_tokens() -> None:
    solo = ps.Verdict("solo", [0.96], 0.969, 0.969, worst_ttft_ours=0.3, worst_ttft_peer=0.3)
    together = ps.Verdict("together", [1.1], 1.1, 1.1, worst_ttft_ours=0.4, worst_ttft_peer=0.3)
    met = {what: ok for what, ok, _ in ps.bars(solo, together)}
    assert met == {
        "four at once >= 1.1x llama-server": True,
        "one at a time >= 0.97x llama-server": False,
        "worst first token no worse than llama-server's, one at a time": True,
        "worst first token no worse than llama-server's, all at once": False,
    }


def test_against_our_own_other_mode_the_one_bar_is_never_below_it(tmp_path: Path) -> None:
    solo = ps.Verdict("solo", [1.0], 1.0, 1.0)
    below = ps.Verdict("together", [0.99], 0.99, 0.99)
    assert [(w, ok) for w, ok, _ in ps.bars(solo, below, "target")] == [
        ("all at once never below --mode target", False)
    ]
    assert ps.bars(solo, ps.Verdict("together", [1.0], 1.0, 1.0), "target")[0][1]
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    # no llama-server needed: the other side is ours, in the other mode
    args = ps.parse(
        ["--model", str(model), "--peer-home", str(tmp_path), "--against-mode", "target"]
    )
    assert args.against_mode == "target" and not hasattr(args, "peer_binary")


def test_ours_recalls_no_earlier_answers_unless_asked(tmp_path: Path) -> None:
    """The benchmarks send every prompt more than once: with the n-gram pool, ours would draft
    an answer from the same prompt's earlier answer, which llama-server cannot."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    base = ["--model", str(model), "--peer-home", str(tmp_path), "--against-mode", "target"]
    plain, pooled = ps.parse(base), ps.parse([*base, "--ngram-pool"])
    assert "--no-ngram-pool" in ours_cmd(plain, 1234)
    assert "--no-ngram-pool" not in ours_cmd(pooled, 1234)


@pytest.mark.parametrize(
    "flags",
    [
        ["--repeats", "0"],
        ["--model", "/nonexistent/x.gguf"],
        ["--peer-home", "/nonexistent"],
        ["--draft", "/nonexistent/d.gguf"],
    ],
)
def test_bad_flags_are_one_line_errors(flags: list[str], tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    args = ["--model", str(model), "--peer-home", str(tmp_path)] if "--model" not in flags else []
    if "--peer-home" in flags:
        args = ["--model", str(model)]
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "paired_serving.py"), *args, *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error: ")


def test_the_step_split_shows_the_padding_rows_only_when_there_were_some() -> None:
    m = {
        "n_decode_total": 10.0,
        "shared_steps_total": 8.0,
        'step_seconds_total{part="llama_decode"}': 1.2,
        'shared_step_seconds_total{part="llama_decode"}': 1.0,
        'shared_step_seconds_total{part="between"}': 0.02,
    }
    plain = split_line("ours", m)
    assert "per batch ms: llama_decode 120.0" in plain and "padding" not in plain
    padded = split_line("ours", {**m, "batch_padding_rows_total": 6.0})
    assert padded.endswith("; 6 padding rows (a cheaper kernel)")
