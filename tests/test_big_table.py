"""scripts/big_table.py (issue 48 part 7): the agreement sweep re-draws what it says, the H200
shape keeps the desktop's one-token cost, and bad flags are one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "scripts" / "gpu")]

import big_table  # noqa: E402

from pyramid_gguf.core.errors import UserError  # noqa: E402
from pyramid_gguf.planning.compose import DeviceProfile  # noqa: E402
from pyramid_gguf.planning.sources import cpu_profile, traces_for  # noqa: E402


@pytest.mark.parametrize(("d", "q"), [(0.6, 0.7), (0.9, 0.5)])
def test_the_sweep_redraws_each_tier_at_its_rate(d: float, q: float) -> None:
    shipped = traces_for("qwen2.5-coder-demo")
    again = big_table.redrawn(shipped, {"draft": d, "qualifier": q})
    assert again.agreement("draft") == pytest.approx(d, abs=0.03)
    assert again.agreement("qualifier") == pytest.approx(q, abs=0.03)
    for a, b in zip(shipped.traces, again.traces, strict=True):
        assert a.answer == b.answer
        assert a.tiers["draft"].top == b.tiers["draft"].top  # the tops stay as recorded


def test_sweep_points_parse_and_bad_ones_are_refused() -> None:
    assert big_table._points("0.6:0.7,0.8:0.9") == ((0.6, 0.7), (0.8, 0.9))
    for bad in ("x", "0.6", "1.2:0.5", "0.5:-1"):
        with pytest.raises(UserError):
            big_table._points(bad)


def test_the_h200_shape_keeps_the_desktops_one_token_cost(tmp_path: Path) -> None:
    path = big_table.h200_shaped("ddr5-8core", tmp_path / "p.json")
    shaped, base = DeviceProfile.load(path), cpu_profile("ddr5-8core").profile
    shape = big_table.h200_cpu_shape()
    assert shaped.per_byte[0] == pytest.approx(base.per_byte[0])
    for n in (2, 4, 8, 16):
        assert shaped.per_byte[n - 1] / shaped.per_byte[0] == pytest.approx(shape[n - 1], rel=1e-4)
    # the two hosts' shapes differ (else the second table would say nothing new)
    assert any(abs(shape[n] - base.per_byte[n] / base.per_byte[0]) > 0.1 for n in range(16))


@pytest.mark.parametrize(
    "flags",
    [["--sweep", "2:3"], ["--max-block", "0"], ["--pcie", "9:9"], ["--card", "rtx-nope"]],
)
def test_bad_flags_are_one_line_errors(flags: list[str]) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "big_table.py"), *flags],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
