"""Chat templates: rendering messages with a GGUF's Jinja ``tokenizer.chat_template``."""

from __future__ import annotations

from typing import Any, cast

from ..core.errors import UserError


def format_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
) -> str:
    """Render ``messages`` with a Jinja chat template (llama-cpp-python's formatter)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    formatter = Jinja2ChatFormatter(
        template=template,
        eos_token=eos_token,
        bos_token=bos_token,
        add_generation_prompt=add_generation_prompt,
    )
    try:
        return formatter(messages=cast(Any, messages)).prompt
    except Exception as e:  # jinja2 raises many types for bad templates / messages
        raise UserError(f"chat template failed: {e}") from None
