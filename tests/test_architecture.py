"""The import graph matches docs/ARCHITECTURE.md: layers import downward only, with no cycles,
and the pure parts import without llama.cpp; its maps name every module and script by path."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyramid_gguf"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
#: Script folders named as a whole (a kit with its own entry point), not file by file.
KITS = ("scripts/gpu/",)

#: Layers, lowest first (docs/ARCHITECTURE.md). A module may import its own layer or lower.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("grammar", "chat"),
    ("native",),
    ("models",),
    ("decoding", "decoding.pricing"),
    ("decoding.runtime",),
    ("decoding.offline",),
    ("planning",),
    ("runtime",),
    ("api", "embeddings"),
    ("bench", "serving"),
    ("cli", "__main__"),
)
#: Packages split into layers of their own (``decoding.runtime`` is one part, not ``decoding``).
SPLIT = ("decoding",)
#: Packages of one layer that must not import each other.
APART = {("bench", "serving"), ("serving", "bench"), ("grammar", "chat"), ("chat", "grammar")}


def layer_of(part: str) -> int:
    for i, names in enumerate(LAYERS):
        if part in names:
            return i
    raise AssertionError(f"pyramid_gguf.{part} is in no layer of docs/ARCHITECTURE.md")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every ``pyramid_gguf`` module ``path`` imports, at any depth (functions included)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("pyramid_gguf")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("pyramid_gguf"):
                continue
            if node.module is None:  # from . import native
                out |= {f"{target}.{a.name}" for a in node.names}
            else:
                out.add(target)
    return out


def top_part(module: str) -> str | None:
    """``pyramid_gguf.api`` -> ``api``, ``pyramid_gguf.decoding.runtime.auto`` ->
    ``decoding.runtime``; the package itself -> None."""
    parts = module.split(".")
    if len(parts) > 3 and parts[1] in SPLIT:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else None


GRAPH = {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_imports_run_downward() -> None:
    assert len(GRAPH) > 40 and "pyramid_gguf.decoding.runtime.auto" in GRAPH
    wrong = []
    for module, targets in GRAPH.items():
        here = top_part(module)
        if here is None:  # pyramid_gguf/__init__.py: the public names, loaded lazily
            continue
        for target in targets:
            there = top_part(target)
            if there is None:
                wrong.append(f"{module} -> {target} (the package root)")
            elif layer_of(there) > layer_of(here) or (here, there) in APART:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports running up the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(GRAPH.get(m, ())):
            t = t if t in GRAPH else t.rsplit(".", 1)[0]  # from pkg import name
            if state.get(t) == 1:
                cycles.append(" -> ".join([*path[path.index(t) :], t]))
            elif t in GRAPH and t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in GRAPH:
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize(
    "module",
    [
        "pyramid_gguf",
        "pyramid_gguf.core.spec",
        "pyramid_gguf.decoding.runtime.verification",
        "pyramid_gguf.decoding.runtime.sampling",
        "pyramid_gguf.decoding.pricing.policy",
        "pyramid_gguf.decoding.pricing.chains",
        "pyramid_gguf.decoding.pricing.estimates",
        "pyramid_gguf.planning.vram",
        "pyramid_gguf.planning.compose",
        "pyramid_gguf.serving.schemas",
        "pyramid_gguf.grammar",
        "pyramid_gguf.chat",
        "pyramid_gguf.planning.hardware",
    ],
)
def test_pure_modules_import_without_llama_cpp(module: str) -> None:
    code = f"import sys, {module}; print('llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_public_api_loads_llama_cpp_before_numpy() -> None:
    """``from pyramid_gguf import Pyramid`` loads llama.cpp's libraries before numpy's (a CUDA
    model segfaulted in one environment otherwise: docs/ARCHITECTURE.md, "Loading order")."""
    code = (
        "import sys, pyramid_gguf; assert 'numpy' not in sys.modules; "
        "order = []\n"
        "class Watch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name in ('numpy', 'llama_cpp'): order.append(name)\n"
        "sys.meta_path.insert(0, Watch())\n"
        "from pyramid_gguf import Pyramid\n"
        "print(order[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "llama_cpp"


@pytest.mark.parametrize("module", ["pyramid_gguf.api", "pyramid_gguf.serving.openai"])
def test_the_python_api_imports_without_a_web_framework(module: str) -> None:
    """``Pyramid`` and ``create_chat_completion`` (an OpenAI dict without a server) import with
    fastapi, starlette and uvicorn unavailable."""
    code = (
        "import sys\n"
        "class NoWeb:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('fastapi', 'starlette', 'uvicorn'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, NoWeb())\n"
        f"import {module}\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-500:]


def map_paths(block: str) -> set[str]:
    """The paths a map (a code block of docs/ARCHITECTURE.md) names: a folder at the start of a
    line (``cli/``) or indented two under one (``  runtime/``) holds the file names after it,
    until the next folder or a file at the start of a line (``api.py``); a name with a slash
    (``pricing/chains.py``) is read from its folder, its folder's parent or the map's root."""
    top = folder = ""
    out: set[str] = set()
    for line in block.splitlines():
        if m := re.match(r"(\w+)/(\s|$)", line):
            top = folder = f"{m.group(1)}/"
        elif m := re.match(r"  (\w+)/(\s|$)", line):
            folder = f"{top}{m.group(1)}/"
        elif re.match(r"[\w.]+\.\w+\s", line):
            top = folder = ""
        for name in re.findall(r"(?<![\w./-])((?:\w+/)*[\w.]+\.(?:py|sh))\b", line):
            out |= {f"{folder}{name}", f"{top}{name}", name}
    return out


def documented() -> tuple[set[str], set[str]]:
    """What docs/ARCHITECTURE.md names: package paths (its first map, plus any package-relative
    path written in its text) and repository paths (its second map: tests and scripts)."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```\n(.*?)```", text, flags=re.S)
    prose = re.sub(r"```\n.*?```", "", text, flags=re.S)
    in_text = set(re.findall(r"(?<![\w./-])((?:\w+/)*[\w.]+\.py)\b", prose))
    return map_paths(blocks[0]) | in_text, map_paths(blocks[1])


def test_the_map_names_every_module_by_its_path() -> None:
    """Every module of the package is named where it lives (``planning/remote.py`` is not
    ``core/remote.py``): a module added without a line in its folder's entry fails here."""
    package, _ = documented()
    missing = [
        rel
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__init__.py" and (rel := p.relative_to(PACKAGE).as_posix()) not in package
    ]
    assert not missing, f"docs/ARCHITECTURE.md does not name: {', '.join(missing)}"


def test_the_map_names_every_script_by_its_path() -> None:
    _, outside = documented()
    scripts = ROOT / "scripts"
    missing = [
        rel
        for p in sorted(scripts.rglob("*"))
        if p.suffix in (".py", ".sh")
        and not (rel := p.relative_to(ROOT).as_posix()).startswith(KITS)
        and rel not in outside
    ]
    kits = [k for k in KITS if not re.search(rf"^  {k.split('/')[1]}/", DOC.read_text(), re.M)]
    assert not missing + kits, f"docs/ARCHITECTURE.md does not name: {', '.join(missing + kits)}"


def test_the_map_reader_tells_folders_apart() -> None:
    """The check above is by path: a file name under the wrong folder does not count."""
    paths = map_paths("core/       remote.py (RpcConfig)\nmodels/     fetch.py (remote.py)\n")
    assert {"core/remote.py", "models/remote.py", "models/fetch.py"} <= paths
    assert "planning/remote.py" not in paths
    nested = map_paths("decoding/   x\n  runtime/    rounds.py and pricing/chains.py\napi.py  a\n")
    assert {"decoding/runtime/rounds.py", "decoding/pricing/chains.py", "api.py"} <= nested


#: Where a loaded ladder's tiers may be reached into; everything above reads
#: :class:`~pyramid_gguf.runtime.facts.LadderFacts` (``Pyramid.vocab``, ``n_ctx``, ``tiers()``...).
TIER_OWNERS = ("decoding/runtime/", "native/", "planning/", "runtime/")


def test_no_caller_above_the_runtime_reaches_through_the_ladders_tiers() -> None:
    # (``cal.loaded``: a calibration measured on a busy machine, not a tier's model)
    reach = re.compile(r"ladder\.(target|draft|qualifier)\b|(?<!\bcal)\.loaded\b")
    wrong = [
        f"{rel}:{i}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if not (rel := p.relative_to(PACKAGE).as_posix()).startswith(TIER_OWNERS)
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if reach.search(line)
    ]
    assert not wrong, "reaching through ladder tiers: " + ", ".join(wrong)
