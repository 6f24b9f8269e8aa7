"""Structured output: grammars (JSON schema, GBNF, Lark, regex) and their per-sequence state.

- :mod:`.compile`: a :class:`~pyramid_gguf.core.grammar.Grammar` (what the user asked for)
  compiled and checked without a model (the server's 400s).
- :mod:`.constraint`: :class:`Constraint`, one sequence's allowed tokens, draft checks and
  rollback, over an llguidance tokenizer (:func:`pyramid_gguf.native.grammar.grammar_tokenizer`).
- :mod:`.masking`: masks applied to logits (pure numpy).

Never imports ``llama_cpp``; ``import pyramid_gguf.grammar`` loads only llguidance, and numpy
with the first use of :class:`Constraint` or the masking helpers (llama.cpp's libraries must
load before numpy's: ``pyramid_gguf/api.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .compile import check_grammar, compile_grammar

if TYPE_CHECKING:
    from .constraint import Constraint
    from .masking import mask_logits, masked_argmax

__all__ = ["Constraint", "check_grammar", "compile_grammar", "mask_logits", "masked_argmax"]


def __getattr__(name: str) -> Any:
    if name == "Constraint":
        from .constraint import Constraint

        return Constraint
    if name in ("mask_logits", "masked_argmax"):
        from . import masking

        return getattr(masking, name)
    raise AttributeError(f"module 'pyramid_gguf.grammar' has no attribute {name!r}")
