"""A prefix one sequence's cache holds, given to another sequence of the same context unevaluated.

Parallel slots are sequences of one context. Loaded without ``--strict-identity``, every
sequence lives in one unified KV cache (``kv_unified``), where ``llama_memory_seq_cp`` adds a
sequence to cells another one holds: metadata only, nothing copied or evaluated. So a prompt
that starts the way another slot's cache does (a chat template's system prompt) evaluates only
what follows, and the other slot keeps its cache (llama-server gets the prefix by moving the
request into the other slot, cutting its cache). The cells hold what evaluating the same tokens
at the same positions left there, as a slot reusing its own cache does.

Only plain KV caches share: a sliding window may already have dropped cells that tokens after
the prefix attend to, a recurrent state is one per sequence rather than one per position, and
a context whose decodes feed a hook (an MTP head reads the target's hidden states) would miss
the shared tokens. Nor with ``--strict-identity``: a stream per sequence, and a prompt is
evaluated afresh there anyway.
"""

from __future__ import annotations

import llama_cpp

from .model import NativeModel


def can_share(model: NativeModel) -> bool:
    """Whether sequences of ``model``'s context may share a prefix (:func:`share_prefix`)."""
    return (
        model.n_seq > 1
        and not model.cfg.strict_identity
        and model.snapshot_reason is None
        and not model.decode_hooks
    )


def share_prefix(model: NativeModel, src: int, dst: int, n: int) -> None:
    """Make sequence ``dst`` hold exactly the first ``n`` tokens sequence ``src`` holds (the
    same cells; ``dst``'s own cache is cleared first). The caller holds whatever guards the
    context (the slots' batcher lock): nothing else may touch it meanwhile."""
    if not can_share(model):
        raise ValueError(f"{model.path.name}: its sequences cannot share cells")
    held = model.held(src)
    if src == dst or not 0 <= n <= len(held):
        raise ValueError(f"cannot share {n} tokens of sequence {src} ({len(held)}) with {dst}")
    prefix = held[:n]
    model.clear(dst)
    if n == 0:
        return
    llama_cpp.llama_memory_seq_cp(model._ctx.memory, src, dst, 0, n)
    model.held(dst).extend(prefix)  # the model's own list: this module is part of its adapter
