"""Server settings and chat formats: how ``pyramid-gguf serve`` answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..chat.named import NAMED_TEMPLATES
from ..core.errors import UserError
from ..core.sampling import SamplingConfig
from ..core.spec import SpecConfig


def resolve_chat_format(value: str | None, flag: str = "--chat-template") -> str | None:
    """A Jinja chat template from one of llama.cpp's template names (``chatml``, ``llama3``,
    ``gemma``...: :mod:`~pyramid_gguf.chat.named`), a template file or template text; anything
    else a one-line UserError listing the names."""
    if value is None:
        return None
    if value in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[value]
    if "{%" in value or "{{" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{flag}: cannot read {path}: {e}") from None
    raise UserError(
        f"{flag}: unknown chat format {value!r} (neither a file nor Jinja text): known names "
        f"are {', '.join(NAMED_TEMPLATES)}"
    )


@dataclass(frozen=True)
class ServerSettings:
    """How the server answers: auth, queue bound, model name and default configs.

    ``spec=None`` uses the loaded ladder's own :class:`SpecConfig`; ``chat_template=None``
    uses the target GGUF's template.
    """

    api_key: str | None = None
    queue_size: int = 16
    model_name: str | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    spec: SpecConfig | None = None
    chat_template: str | None = None
    #: Origins a browser page may call from (CORS; ``"*"``: any, llama-server's default;
    #: empty: no CORS headers, a page of another origin cannot call).
    cors_origins: tuple[str, ...] = ("*",)
    #: Whether ``GET /metrics`` and ``GET /slots`` answer (else 501, as llama-server without
    #: ``--metrics`` or with ``--no-slots``).
    metrics: bool = True
    slots: bool = True
    #: Variables every chat template render gets (llama-server's ``--chat-template-kwargs``,
    #: e.g. ``{"enable_thinking": false}``); a request's ``chat_template_kwargs`` override them.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.queue_size < 1:
            raise UserError(f"--queue-size must be at least 1, got {self.queue_size}")
