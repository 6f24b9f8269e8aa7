"""Tiny-model ladders for the bench / tune tests (same vocabulary, loads in milliseconds)."""

from __future__ import annotations

from pathlib import Path

from pyramid_gguf.api import Pyramid
from pyramid_gguf.bench import BenchPrompt
from pyramid_gguf.config import LoadConfig
from pyramid_gguf.synth import write_tiny_llama

PROMPTS = [
    BenchPrompt("code", "a", "def the return value"),
    BenchPrompt("edit", "b", "the tree node and the graph path"),
]


def write_ladder(folder: Path) -> dict[str, Path]:
    """``{"target", "qualifier", "draft"}`` tiny GGUFs in ``folder``."""
    return {
        "target": write_tiny_llama(folder / "target.gguf", seed=10),
        "qualifier": write_tiny_llama(folder / "qualifier.gguf", seed=11, base_seed=10, noise=0.2),
        "draft": write_tiny_llama(folder / "draft.gguf", seed=12, base_seed=10, noise=0.3),
    }


def load_ladder(paths: dict[str, Path], *, qualifier: bool = True) -> Pyramid:
    return Pyramid.from_paths(
        paths["target"],
        draft=paths["draft"],
        qualifier=paths["qualifier"] if qualifier else None,
        load=LoadConfig(n_ctx=256, n_threads=1, n_threads_batch=1),
    )
