"""The one adapter over llama.cpp: the only package that imports ``llama_cpp``.

- :mod:`.backend`: process-wide start-up, log sink, build / CPU facts, quantizing.
- :mod:`.handles`: one owner per native object (model, context, batch).
- :mod:`.model`: :class:`NativeModel`, evaluation with exactly the logits rows asked for.
- :mod:`.rollback`: KV-cache rollback (suffix removal or saved sequence states).
- :mod:`.vocab`: tokenizer and special tokens. :mod:`.chat`: chat templates.
"""

from .backend import (
    build_id,
    cpu_has_amx,
    ftype_names,
    quantize,
    supports_gpu_offload,
    system_info,
)
from .chat import format_chat
from .handles import build_has_amx_kernels
from .model import EvalTimer, NativeModel
from .vocab import Vocab

__all__ = [
    "EvalTimer",
    "NativeModel",
    "Vocab",
    "build_has_amx_kernels",
    "build_id",
    "cpu_has_amx",
    "format_chat",
    "ftype_names",
    "quantize",
    "supports_gpu_offload",
    "system_info",
]
