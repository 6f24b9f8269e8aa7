"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions`` (pydantic).

Unknown fields are ignored, as OpenAI clients send many. Sampling fields override the
server's :class:`~pyramid_gguf.core.sampling.SamplingConfig`; the speculative knobs of
:data:`~pyramid_gguf.core.spec.SPEC_KNOBS` (under their names or aliases, ``l_D`` for ``l_d``)
override its :class:`~pyramid_gguf.core.spec.SpecConfig`, for that request only.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.errors import UserError
from ..core.sampling import MAX_TOP_LOGPROBS, SamplingConfig
from ..core.spec import SPEC_KNOBS, SpecConfig
from ..core.textstream import encode_utf8
from .http_errors import ApiError


def _utf8(text: str) -> str:
    """``text`` if it has a UTF-8 form (JSON may hold lone surrogates like ``"\\ud800"``)."""
    try:
        encode_utf8(text, "the text")
    except UserError as e:
        raise ValueError(str(e)) from None
    return text


class StreamOptions(BaseModel):
    """OpenAI ``stream_options``."""

    include_usage: bool = False


class GenerationRequest(BaseModel):
    """Fields shared by completions and chat completions.

    Fields not declared here are kept in ``model_extra``; the speculative knobs are read from
    there (:meth:`spec`) and everything else is ignored.
    """

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    n: int = 1

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def token_limit(self) -> int | None:
        return self.max_tokens

    def top_logprobs(self) -> int | None:
        """Alternatives per token to report with log-probabilities, or None for none."""
        return None

    def sampling(self, base: SamplingConfig) -> SamplingConfig:
        """``base`` with the fields this request sets (UserError on bad values)."""
        changes: dict[str, object] = {
            k: v
            for k, v in (
                ("temperature", self.temperature),
                ("top_p", self.top_p),
                ("top_k", self.top_k),
                ("min_p", self.min_p),
                ("seed", self.seed),
                ("max_tokens", self.token_limit()),
                ("ignore_eos", self.ignore_eos),
            )
            if v is not None
        }
        if self.stop is not None:
            changes["stop"] = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        return base.with_(**changes) if changes else base

    def spec(self, base: SpecConfig) -> SpecConfig:
        """``base`` with the speculative knobs this request sets.

        A value of the wrong type or choice is a 400 naming the field; an out-of-range value
        is the :class:`UserError` of :class:`SpecConfig` (also a 400).
        """
        extra = self.model_extra or {}
        changes: dict[str, object] = {}
        for knob in SPEC_KNOBS:
            for key in (knob.name, *knob.aliases):
                if extra.get(key) is not None:
                    try:
                        changes[knob.name] = knob.check(extra[key], key)
                    except UserError as e:
                        raise ApiError(400, str(e), param=key) from None
        return base.with_(**changes) if changes else base


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``: one prompt, as text or token ids. ``logprobs``: report the
    target's log-probability of each token with that many alternatives."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def top_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError("exactly one prompt per request is supported")
            prompt = prompt[0]
        return _utf8(prompt) if isinstance(prompt, str) else prompt


class ChatMessage(BaseModel):
    """One chat message; content as text or a list of text parts."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_is_utf8(cls, content: Any) -> Any:
        return _utf8(content) if isinstance(content, str) else content

    def as_dict(self) -> dict[str, Any]:
        """The message for the chat template, content flattened to text."""
        out = self.model_dump(exclude_none=True)
        out["content"] = _text_content(self.content)
        return out


def _text_content(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, "only text content parts are supported", param="messages")
        parts.append(part["text"])
    return "".join(parts)


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs_: int | None = Field(None, alias="top_logprobs", ge=0, le=MAX_TOP_LOGPROBS)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def top_logprobs(self) -> int | None:
        """OpenAI's rule: ``top_logprobs`` needs ``logprobs: true``."""
        if self.top_logprobs_ is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs_ or 0) if self.logprobs else None
