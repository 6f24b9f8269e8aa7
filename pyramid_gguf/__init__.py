"""pyramid-gguf: Pyramid speculative decoding (draft -> qualifier -> target) over llama.cpp."""

from .config import LoadConfig, SamplingConfig, SpecConfig
from .ladder import NGRAM, LadderPaths
from .serving.api import Completion, Pyramid, Response

__all__ = [
    "NGRAM",
    "Completion",
    "LadderPaths",
    "LoadConfig",
    "Pyramid",
    "Response",
    "SamplingConfig",
    "SpecConfig",
]
