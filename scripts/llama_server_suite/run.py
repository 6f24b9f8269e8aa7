#!/usr/bin/env python3
"""Run llama.cpp's own llama-server unit tests against ``pyramid-gguf serve``.

The tests (``tools/server/tests`` of the llama.cpp vendored in llama-cpp-python's sdist, and the
chat templates under ``models/templates`` that some of them read) are fetched once with
``pip download --no-deps --no-binary :all: llama-cpp-python==VERSION`` into the cache folder
(``--sdist`` takes a local sdist or extracted tree instead). Each run copies them to a fresh work
folder, points ``LLAMA_SERVER_BIN_PATH`` at :mod:`shim` (llama-server's flags onto ``serve``),
runs pytest on the chosen files without the tests marked ``slow`` and writes, under ``--out``
(``docs/llama-server-tests``), ``results.json`` and ``results.md``: per file the tests passed,
failed and skipped, and every failure with its reason, classified by :mod:`classify`. Tests
not run this time (other ``--files``, or a run stopped with Ctrl-C) keep their outcome from the
``results.json`` already there; ``--reclassify`` only classifies that file's outcomes again.

Two changes to the harness, none to a test: ``conftest.py`` no longer starts every preset once
to download its model (the shim maps the test models to local ones; it would refuse the
reranking and vision presets and fail the whole session), and a stand-in ``wget`` module is put
on the path when the real one is missing (only ``download_file`` uses it, in tests not run here).

    python3 scripts/llama_server_suite/run.py                        # the ten files
    python3 scripts/llama_server_suite/run.py --files tokenize,basic --sdist ~/sdist.tar.gz
    python3 scripts/llama_server_suite/run.py --files embedding --out /tmp/e --work /tmp/e-work
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from classify import classify, reason

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VERSION = "0.3.36"
FILES = (
    "basic",
    "chat_completion",
    "completion",
    "security",
    "ctx_shift",
    "ignore_eos",
    "metrics",
    "tokenize",
    "template",
    "embedding",
    "compat_anthropic",
    "compat_oai_responses",
)
#: What is taken out of the sdist, under its ``vendor/llama.cpp``.
KEPT = ("tools/server/tests/", "models/templates/")
CONFTEST_LOAD = "        ServerPreset.load_all()"


@dataclass(frozen=True)
class Outcome:
    """One test's result: ``passed``, ``failed`` or ``skipped``, and why (its message)."""

    file: str
    test: str
    outcome: str
    message: str = ""
    category: str = ""
    reason: str = ""


def default_cache() -> Path:
    home = os.environ.get("PYRAMID_GGUF_HOME")
    root = Path(home) if home else Path.home() / ".cache" / "pyramid-gguf"
    return root / "llama-server-tests"


def fetch_sdist(cache: Path) -> Path:
    """llama-cpp-python's sdist in ``cache``, downloaded with pip when missing."""
    found = sorted(cache.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={VERSION}", "-d", str(cache)],
        check=True,
    )  # fmt: skip
    return next(cache.glob("llama_cpp_python-*.tar.gz"))


def extract(sdist: Path, into: Path) -> Path:
    """The llama.cpp tree (only :data:`KEPT`) of ``sdist`` (a tarball or an extracted
    folder) under ``into``; returns its ``tools/server/tests``."""
    tree = into / "llama.cpp"
    tests = tree / "tools" / "server" / "tests"
    if tests.is_dir():
        return tests
    if sdist.is_dir():
        vendor = sdist / "vendor" / "llama.cpp"
        for part in KEPT:
            shutil.copytree(vendor / part, tree / part)
        return tests
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            _, _, rest = member.name.partition("/vendor/llama.cpp/")
            if member.isfile() and rest.startswith(KEPT):
                member.name = rest
                tar.extract(member, tree, filter="data")
    return tests


def prepare(tests: Path, work: Path) -> Path:
    """A fresh copy of the tests in ``work``, with the harness changes of the module's
    docstring; returns the copy's tests folder."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(tests.parents[2], work / "llama.cpp")
    copy = work / "llama.cpp" / "tools" / "server" / "tests"
    conftest = copy / "conftest.py"
    text = conftest.read_text(encoding="utf-8")
    if CONFTEST_LOAD not in text:
        raise SystemExit(f"{conftest}: the preset download line moved; update run.py")
    conftest.write_text(
        text.replace(CONFTEST_LOAD, "        pass  # pyramid-gguf: no downloads, see run.py"),
        encoding="utf-8",
    )
    if importlib.util.find_spec("wget") is None:
        stubs = work / "stubs"
        stubs.mkdir()
        (stubs / "wget.py").write_text(
            "def download(url, out=None):\n"
            "    raise RuntimeError('no downloads in this run: ' + url)\n",
            encoding="utf-8",
        )
    return copy


def run_pytest(tests: Path, work: Path, files: list[str], port: int) -> Path:
    """pytest over ``files`` (non-slow tests), its JUnit XML report's path."""
    report = work / "junit.xml"
    env = dict(os.environ)
    binary = work / "llama-server"  # the shim under llama-server's name, executable
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "shim.py"}" "$@"\n')
    binary.chmod(0o755)
    env["LLAMA_SERVER_BIN_PATH"] = str(binary)
    env["PORT"] = str(port)
    env["PYRAMID_SHIM_LOG"] = str(work / "shim.log")
    stubs = work / "stubs"
    if stubs.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(stubs), env.get("PYTHONPATH")]))
    paths = [f"unit/test_{name}.py" for name in files]
    command = [sys.executable, "-m", "pytest", *paths, "-m", "not slow", "-p", "no:cacheprovider",
               "-q", "-rA", f"--junitxml={report}", "-o", "junit_family=xunit1"]  # fmt: skip
    with open(work / "pytest.log", "w", encoding="utf-8") as log:
        subprocess.run(command, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT)
    return report


def read_report(report: Path) -> list[Outcome]:
    """Every test case of a JUnit XML report, classified."""
    outcomes = []
    for case in ET.parse(report).getroot().iter("testcase"):
        file = case.get("classname", "").rpartition(".")[2].removeprefix("test_")
        test = case.get("name", "")
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = "skipped" if kind == "skipped" else "failed"
                message = (node.get("message") or node.text or "").strip()
                break
        outcomes.append(_outcome(file, test, outcome, _one_line(message)))
    return outcomes


def _outcome(file: str, test: str, outcome: str, message: str) -> Outcome:
    """One test's outcome, classified (:mod:`classify`)."""
    why = reason(file, test) if outcome != "passed" else ""
    return Outcome(file, test, outcome, message, classify(file, test, outcome, message), why)


def _one_line(message: str, limit: int = 300) -> str:
    line = " ".join(message.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def merged(path: Path, new: list[Outcome]) -> list[Outcome]:
    """``new`` after the earlier run's outcomes (in ``path``) of the tests not run again
    (``--files`` runs some files, an interrupted run some tests), all classified again."""
    ran = {(o.file, o.test) for o in new}
    tests = json.loads(path.read_text(encoding="utf-8"))["tests"] if path.is_file() else []
    kept = [t for t in tests if (t["file"], t["test"]) not in ran]
    old = [_outcome(t["file"], t["test"], t["outcome"], t["message"]) for t in kept]
    return old + new


@dataclass(frozen=True)
class FileRow:
    """One test file's counts."""

    file: str
    tests: int
    passed: int
    failed: int
    skipped: int
    #: Failures whose assertion depends on the upstream test model's text or tokens.
    model_bound: int

    def cells(self) -> str:
        """The markdown row's cells after the file's name."""
        ran = self.passed + self.failed
        return (
            f"| {self.tests} | {self.passed} | {self.failed} | {self.skipped} "
            f"| {self.model_bound} | {_share(self.passed, ran)} "
            f"| {_share(self.passed, ran - self.model_bound)} |"
        )


def summary(outcomes: list[Outcome], files: list[str]) -> list[FileRow]:
    """Per file: tests, passed, failed, skipped and the model-bound failures."""
    rows = []
    for name in files:
        mine = [o for o in outcomes if o.file == name]
        passed = sum(o.outcome == "passed" for o in mine)
        failed = sum(o.outcome == "failed" for o in mine)
        bound = sum(o.outcome == "failed" and o.category == "model-bound" for o in mine)
        rows.append(FileRow(name, len(mine), passed, failed, len(mine) - passed - failed, bound))
    return rows


def markdown(rows: list[FileRow], outcomes: list[Outcome], model: str) -> str:
    """``results.md``: the table, then every test not passed, grouped by category."""
    total = FileRow(
        "all",
        tests=sum(r.tests for r in rows),
        passed=sum(r.passed for r in rows),
        failed=sum(r.failed for r in rows),
        skipped=sum(r.skipped for r in rows),
        model_bound=sum(r.model_bound for r in rows),
    )
    lines = [
        "# llama-server's unit tests against `pyramid-gguf serve`",
        "",
        f"llama.cpp's `tools/server/tests` from llama-cpp-python {VERSION}'s sdist, non-slow "
        f"tests, run by `scripts/llama_server_suite/run.py` through `shim.py` ({model}).",
        "Model-bound: the assertion depends on the upstream test model's own text or tokens.",
        "",
        "| file | tests | passed | failed | skipped | of the failed, model-bound | passed "
        "| passed, of the tests not model-bound |",
        "|---|---|---|---|---|---|---|---|",
        *(f"| {r.file} {r.cells()}" for r in rows),
        f"| **all** {total.cells()}",
        "",
        "## Tests not passed, by reason",
        "",
    ]
    left = [o for o in outcomes if o.outcome != "passed"]
    for category in sorted({o.category for o in left}):
        group = [o for o in left if o.category == category]
        lines += [f"### {category} ({len(group)})", ""]
        lines += [
            f"- `{o.file}::{o.test}`: {o.reason or o.outcome}"
            + (f" (says: {o.message[:160]})" if o.message else "")
            for o in group
        ]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default=",".join(FILES), help="test files, without test_")
    parser.add_argument("--sdist", type=Path, help="a local sdist (tarball or extracted)")
    parser.add_argument("--cache", type=Path, default=default_cache())
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "llama-server-tests")
    parser.add_argument("--port", type=int, default=18080, help="the servers' port")
    parser.add_argument(
        "--work", type=Path, help="the run's work folder, made anew [default: CACHE/work]"
    )
    parser.add_argument(
        "--reclassify", action="store_true", help="run nothing: classify results.json again"
    )
    args = parser.parse_args()
    files = [f.strip().removeprefix("test_").removesuffix(".py") for f in args.files.split(",")]
    if args.reclassify:
        outcomes = merged(args.out / "results.json", [])
    else:
        sdist = args.sdist.expanduser() if args.sdist else fetch_sdist(args.cache)
        tests = extract(sdist, args.cache)
        work = args.work or args.cache / "work"
        copy = prepare(tests, work)
        report = run_pytest(copy, work, files, args.port)
        outcomes = merged(args.out / "results.json", read_report(report))
    files = [f for f in FILES if f in {o.file for o in outcomes}] or files
    rows = summary(outcomes, files)
    from shim import SUBSTITUTES, TINY_BERT

    names = sorted(set(SUBSTITUTES.values()))
    model = f"stand-ins: {', '.join(names)}; for bge-small {TINY_BERT} (tiny_bert.py)"
    args.out.mkdir(parents=True, exist_ok=True)
    data = {
        "version": VERSION,
        "files": [asdict(r) for r in rows],
        "tests": [asdict(o) for o in outcomes],
    }
    (args.out / "results.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (args.out / "results.md").write_text(markdown(rows, outcomes, model), encoding="utf-8")
    for r in rows:
        print(f"{r.file:<16} {r.passed:>3}/{r.tests:<3} passed ({r.failed} failed)")


if __name__ == "__main__":
    main()
