"""The docs say what the code does: the README's and docs/ALGORITHMS.md's mode tables (the
modes of :data:`~pyramid_gguf.core.modes.MODES`, lossless or not, tiers needed), docs/USAGE.md's
knob table (:data:`~pyramid_gguf.core.spec.SPEC_KNOBS` with
:class:`~pyramid_gguf.core.spec.SpecConfig`'s defaults), and every command the README and docs
show (docs/ARCHITECTURE.md's map is checked by tests/test_architecture.py)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from pyramid_gguf.core.modes import MODES
from pyramid_gguf.core.spec import SPEC_KNOBS, SpecConfig

ROOT = Path(__file__).resolve().parents[1]
NEEDS = {1: "target", 2: "draft, target", 3: "all three"}


def table_rows(path: Path, header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with ``header``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(header))
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", ln.strip().strip("|"))])
    return rows


def first_code(cell: str) -> str:
    return re.findall(r"`([^`]+)`", cell)[0]


@pytest.mark.parametrize(
    ("doc", "header"),
    [("README.md", "| mode | draft -> qualifier"), ("docs/ALGORITHMS.md", "| mode | stage 1")],
)
def test_mode_tables_match_the_mode_table(doc: str, header: str) -> None:
    rows = table_rows(ROOT / doc, header)
    by_mode = {first_code(r[0]): r for r in rows}
    assert list(by_mode) == list(MODES)
    for name, row in by_mode.items():
        lossless_cell = row[3]
        assert lossless_cell.startswith("yes" if MODES[name].lossless else "no"), (doc, name)
        if doc == "README.md":
            assert row[4] == NEEDS[MODES[name].n_tiers], (name, row[4])


def shown(value: object) -> str:
    """How the README's knob table writes a default."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        return f"`{value}`"
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_knob_table_matches_spec_knobs_and_defaults() -> None:
    rows = table_rows(ROOT / "docs" / "USAGE.md", "| knob | meaning | default |")
    defaults = {f.name: f.default for f in fields(SpecConfig)}
    documented: dict[str, str] = {}
    for row in rows:
        flags = re.findall(r"`--([a-z-]+)`", row[0])
        values = [v.strip() for v in re.sub(r"\s*\(.*\)", "", row[2]).split(",")]
        if len(values) == 1:
            values = values * len(flags)
        documented |= {f.replace("-", "_"): v for f, v in zip(flags, values, strict=True)}
    knobs = {k.name for k in SPEC_KNOBS} - {"mode"}  # the mode has its own table
    assert set(documented) == knobs
    for name, value in documented.items():
        assert value == shown(defaults[name]), (name, value)


#: The pages whose commands a user copies.
COMMAND_DOCS = ("README.md", "docs/USAGE.md", "docs/SERVING.md")


def readme_commands(docs: tuple[str, ...] = COMMAND_DOCS) -> list[str]:
    """Every ``pyramid-gguf ...`` line of the bash blocks of ``docs`` (comments dropped)."""
    text = "\n".join((ROOT / d).read_text(encoding="utf-8") for d in docs)
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = [ln.split("  #")[0].strip() for b in blocks for ln in b.splitlines()]
    cmds = []
    for ln in lines:
        for part in ln.split("&&"):
            part = part.strip()
            if part.startswith("pyramid-gguf"):
                cmds.append(part)
    return cmds


def test_the_readme_shows_commands() -> None:
    assert len(readme_commands(("README.md",))) >= 10


def test_the_readme_is_short_and_sets_up_in_one_command() -> None:
    """At most 150 lines, the rest in docs/; its first command installs through
    scripts/install.sh (llama-cpp-python compiled once, with RPC) and the tests reuse it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    first = re.findall(r"```bash\n(.*?)```", text, flags=re.S)[0].strip()
    assert first.startswith("scripts/install.sh && pyramid-gguf run -p ")
    assert "scripts/install.sh dev" in (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")


@pytest.mark.parametrize("line", readme_commands())
def test_every_readme_command_parses(line: str) -> None:
    """Each command the README shows names a real command and flags it accepts (parsed as the
    CLI parses it, nothing run)."""
    import shlex

    import click

    from pyramid_gguf.cli.main import main

    args = shlex.split(line)[1:]
    ctx = main.make_context("pyramid-gguf", args)
    command: click.Command = main
    while isinstance(command, click.Group):
        rest = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        if not rest:
            break
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None, line
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    assert command is not main, line
