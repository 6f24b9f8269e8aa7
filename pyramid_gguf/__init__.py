"""pyramid-gguf: Pyramid speculative decoding (draft -> qualifier -> target) over llama.cpp."""

# llama.cpp's libraries load before numpy's: in a PyTorch environment with numpy 2.5 on an H100
# machine, loading a CUDA model segfaulted when numpy had been imported first (README, "On a
# GPU"). Every submodule import runs this file first.
import llama_cpp  # noqa: F401

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
