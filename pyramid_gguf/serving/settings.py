"""Server settings and chat formats: how ``pyramid-gguf serve`` answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UserError
from ..core.sampling import SamplingConfig
from ..core.spec import SpecConfig

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Named chat formats for ``--chat-format`` (a Jinja file or template text works too).
CHAT_FORMATS: dict[str, str] = {"chatml": CHATML_TEMPLATE}


def resolve_chat_format(value: str | None) -> str | None:
    """A Jinja chat template from a format name, a template file or template text."""
    if value is None:
        return None
    if value in CHAT_FORMATS:
        return CHAT_FORMATS[value]
    if "{%" in value or "{{" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise UserError(
        f"unknown chat format {value!r}: give one of {', '.join(CHAT_FORMATS)}, "
        "a Jinja template file or template text"
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

    def __post_init__(self) -> None:
        if self.queue_size < 1:
            raise UserError(f"--queue-size must be at least 1, got {self.queue_size}")
