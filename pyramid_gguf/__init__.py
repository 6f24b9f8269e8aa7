"""pyramid-gguf: Pyramid speculative decoding (draft -> qualifier -> target) over llama.cpp.

The public API (:class:`Pyramid` and its results) loads llama.cpp when first used, so the
pure parts (``pyramid_gguf.decoding.runtime.verification``, the planner's arithmetic, the configs)
import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core.grammar import Grammar
from .core.ladder import NGRAM, LadderPaths
from .core.load import LoadConfig
from .core.sampling import SamplingConfig
from .core.spec import SpecConfig

if TYPE_CHECKING:
    from .api import Completion, Pyramid, Response

__all__ = [
    "NGRAM",
    "Completion",
    "Grammar",
    "LadderPaths",
    "LoadConfig",
    "Pyramid",
    "Response",
    "SamplingConfig",
    "SpecConfig",
]

_API = ("Completion", "Pyramid", "Response")


def __getattr__(name: str) -> Any:
    if name in _API:
        from . import api  # loads llama.cpp (before numpy: see api.py)

        return getattr(api, name)
    raise AttributeError(f"module 'pyramid_gguf' has no attribute {name!r}")
