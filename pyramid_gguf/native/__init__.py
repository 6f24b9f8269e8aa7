"""The one adapter over llama.cpp: the only package that imports ``llama_cpp``.

- :mod:`.backend`: process-wide start-up, log sink, build / CPU / GPU facts, quantizing.
- :mod:`.handles`: one owner per native object (model, context, batch).
- :mod:`.buffers`: which buffer types hold the weights; repacking without the AMX kernels.
- :mod:`.model`: :class:`NativeModel`, evaluation with exactly the logits rows asked for.
- :mod:`.sequence`: :class:`ModelSequence`, one sequence as decoding sees it, and
  :class:`SequenceView`, a parallel slot's sequence of a shared model.
- :mod:`.rollback`: KV-cache rollback (suffix removal or saved sequence states).
- :mod:`.vocab`: tokenizer and special tokens.
- :mod:`.grammar`: llguidance's tokenizer built from a model's vocabulary.
- :mod:`.embedding`: :class:`EmbeddingModel`, a model loaded for embeddings (pooled, batched).
- :mod:`.routing`: :func:`~.routing.record_routes`, the experts an MoE routes each token to.
- :mod:`.compute`: the one thread every ``llama_decode`` runs on (OpenMP's pools per thread).
"""

from .backend import (
    build_id,
    devices,
    ftype_names,
    gpu_device,
    quantize,
    supports_gpu_offload,
    system_info,
)
from .buffers import build_has_amx_kernels, peer_llama
from .embedding import EmbeddingConfig, EmbeddingModel
from .grammar import grammar_tokenizer
from .model import EvalTimer, NativeModel, Part
from .mtp import MtpSequence
from .sequence import Evaluate, ModelSequence, SequenceView
from .vocab import Vocab

__all__ = [
    "EmbeddingConfig",
    "EmbeddingModel",
    "EvalTimer",
    "Evaluate",
    "ModelSequence",
    "MtpSequence",
    "NativeModel",
    "Part",
    "SequenceView",
    "Vocab",
    "build_has_amx_kernels",
    "build_id",
    "devices",
    "ftype_names",
    "gpu_device",
    "grammar_tokenizer",
    "peer_llama",
    "quantize",
    "supports_gpu_offload",
    "system_info",
]
