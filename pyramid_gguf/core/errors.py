"""User-facing errors: one line, no traceback, non-zero exit at the CLI."""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix: a bad path, flag, file or request.

    The CLI prints ``Error: <message>`` and exits 1; the server answers 400. The message is
    a single line that says what is wrong and, where possible, what is valid.
    """


class ModelFileError(UserError):
    """A model path that is missing, a directory, not GGUF or truncated."""


class VocabularyMismatch(UserError):
    """Two tiers of a ladder do not share one vocabulary."""


class ContextOverflow(UserError):
    """The prompt (plus what must be generated) does not fit the context window."""
