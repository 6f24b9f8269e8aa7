"""Tiny-model ladders for the bench / tune tests (same vocabulary, loads in milliseconds)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from synth import write_tiny_llama

from pyramid_gguf.api import Pyramid
from pyramid_gguf.bench.prompts import BenchPrompt
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.load import LoadConfig

PROMPTS = [
    BenchPrompt("code", "a", "def the return value"),
    BenchPrompt("edit", "b", "the tree node and the graph path"),
]


def write_ladder(folder: Path) -> LadderPaths:
    """A three-tier ladder of tiny GGUFs in ``folder``."""
    return LadderPaths(
        target=write_tiny_llama(folder / "target.gguf", seed=10),
        qualifier=write_tiny_llama(folder / "qualifier.gguf", seed=11, base_seed=10, noise=0.2),
        draft=write_tiny_llama(folder / "draft.gguf", seed=12, base_seed=10, noise=0.3),
    )


def load_ladder(paths: LadderPaths, *, qualifier: bool = True) -> Pyramid:
    return Pyramid.load(
        paths if qualifier else replace(paths, qualifier=None),
        load=LoadConfig(n_ctx=256, n_threads=1, n_threads_batch=1),
    )
