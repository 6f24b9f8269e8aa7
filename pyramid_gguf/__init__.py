"""pyramid-gguf: Pyramid speculative decoding (draft -> qualifier -> target) over llama.cpp."""

from .api import Completion, Pyramid, Response
from .config import LoadConfig, SamplingConfig, SpecConfig

__all__ = ["Completion", "LoadConfig", "Pyramid", "Response", "SamplingConfig", "SpecConfig"]
