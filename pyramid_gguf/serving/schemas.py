"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions`` (pydantic).

Unknown fields are ignored, as OpenAI clients send many, except those that would change the
answer and that we do not honour (:data:`UNSUPPORTED`): they are a 400, never silent neglect.
Sampling fields override the server's :class:`~pyramid_gguf.core.sampling.SamplingConfig`; the
speculative knobs of :data:`~pyramid_gguf.core.spec.SPEC_KNOBS` (under their names or aliases,
``l_D`` for ``l_d``) override its :class:`~pyramid_gguf.core.spec.SpecConfig`, for that request
only. Structured output comes as OpenAI's ``response_format`` or llama-server's ``json_schema``
and ``grammar`` (:meth:`GenerationRequest.grammar_config`); tools as OpenAI's ``tools``,
``tool_choice`` and ``parallel_tool_calls`` (:meth:`ChatCompletionRequest.tool_request`).
Nothing here loads native code.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..chat import ToolRequest, parse_tool_request
from ..core.errors import UserError
from ..core.grammar import Grammar
from ..core.sampling import (
    MAX_TOP_LOGPROBS,
    SamplingConfig,
    parse_logit_bias,
    parse_samplers,
    sampler_changes,
)
from ..core.spec import SPEC_KNOBS, SpecConfig
from ..core.textstream import encode_utf8
from ..grammar import check_grammar
from .errors import ApiError


def _same(value: Any, neutral: Any) -> bool:
    """``value`` is ``neutral``; a bool only equals a bool (``0 == False`` in Python)."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    return bool(value == neutral)


def _utf8(text: str) -> str:
    """``text`` if it has a UTF-8 form (JSON may hold lone surrogates like ``"\\ud800"``)."""
    try:
        encode_utf8(text, "the text")
    except UserError as e:
        raise ValueError(str(e)) from None
    return text


#: Fields that change the answer and that we do not honour, with the value that changes
#: nothing (sent by many clients as a default) and what to say instead.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "mirostat": (
        (None, 0),
        "mirostat is not supported (send 0): it adapts its target from each sampled token's "
        "surprise, a state and not a warp of the position, so a speculative verifier would have "
        "to replay it per accepted token",
    ),
    "best_of": ((None, 1), "best_of is not supported: one completion per request"),
    "echo": ((None, False), "echo is not supported"),
    "suffix": ((None, ""), "suffix (fill-in-the-middle) is not supported"),
    "functions": ((None, []), "functions is the old form of tools: send tools"),
    "function_call": ((None,), "function_call is the old form of tool_choice: send tool_choice"),
    "n_probs": ((None, 0), "n_probs is /completion's: here send logprobs (and top_logprobs)"),
    "continue_final_message": ((None, False), "continue_final_message is not supported"),
    "n_indent": ((None, 0), "n_indent is not supported"),
    "t_max_predict_ms": ((None, 0), "t_max_predict_ms is not supported"),
}


#: Most choices (``n``) one completion or chat completion may ask for (OpenAI's limit); each is
#: its own generation in the slots' queue (:mod:`.choices`).
MAX_CHOICES = 128


class StreamOptions(BaseModel):
    """OpenAI ``stream_options``."""

    include_usage: bool = False


def samplers(values: dict[str, Any], column: str | None = None) -> dict[str, Any]:
    """:func:`~pyramid_gguf.core.sampling.sampler_changes` of a request body (``column``: the
    dialect's names), a bad value a 400 naming its field."""
    try:
        return sampler_changes(values, column)
    except UserError as e:
        raise ApiError(400, str(e), param=str(e).split(" ", 1)[0]) from None


class GenerationRequest(BaseModel):
    """Fields shared by completions and chat completions.

    Fields not declared here are kept in ``model_extra``; the numeric sampler fields
    (:data:`~pyramid_gguf.core.sampling.SAMPLER_FIELDS`, :meth:`sampling`) and the speculative
    knobs (:data:`~pyramid_gguf.core.spec.SPEC_KNOBS`, :meth:`spec`) are read from there, and
    everything else is ignored.
    """

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    #: llama-server's name for it: the most tokens to generate (-1: until the end).
    n_predict: int | None = Field(None, ge=-1)
    # the numeric sampler fields (temperature, top_p...) are SAMPLER_FIELDS', read from
    # model_extra under their names (:meth:`sampling`), as the speculative knobs are
    #: Texts a repetition is not followed across (llama-server's: a non-empty list).
    dry_sequence_breakers: list[str] | None = Field(None, min_length=1)
    #: OpenAI's ``{"token id": bias}`` or llama-server's ``[[id, bias], ...]``.
    logit_bias: Any = None
    #: llama-server's sampler order: a list of names or a string of one-letter codes.
    samplers: Any = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    n: int = 1
    #: OpenAI's structured output: ``{"type": "text" | "json_object" | "json_schema", ...}``.
    response_format: dict[str, Any] | None = None
    #: llama-server's: a JSON schema, or a GBNF grammar.
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None

    #: Most choices (``n``) a request may ask for: one, except where a route fans out.
    max_choices: ClassVar[int] = 1

    @field_validator("n")
    @classmethod
    def _choices(cls, n: int) -> int:
        if cls.max_choices == 1 and n != 1:
            raise ValueError("only n=1 is supported here (n > 1: /v1/chat/completions)")
        if not 1 <= n <= cls.max_choices:
            raise ValueError(f"n must be from 1 to {cls.max_choices}")
        return n

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def token_limit(self) -> int | None:
        """``max_tokens``, else llama-server's ``n_predict`` (-1: until the end)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return self.n_predict if self.n_predict is not None and self.n_predict > 0 else None

    def top_logprobs(self) -> int | None:
        """Alternatives per token to report with log-probabilities, or None for none."""
        return None

    def sampling(self, base: SamplingConfig) -> SamplingConfig:
        """``base`` with the fields this request sets, its grammar included (UserError on bad
        values; a 400 for a field we do not honour, or a grammar that does not check)."""
        self.check_supported()
        changes: dict[str, object] = {
            k: v
            for k, v in (
                *samplers(self.model_extra or {}).items(),
                ("seed", self.seed),
                ("max_tokens", self.token_limit()),
                ("ignore_eos", self.ignore_eos),
            )
            if v is not None
        }
        if self.stop is not None:
            changes["stop"] = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if self.dry_sequence_breakers is not None:
            changes["dry_sequence_breakers"] = tuple(self.dry_sequence_breakers)
        try:
            if self.logit_bias is not None:
                changes["logit_bias"], changes["logit_bias_text"] = parse_logit_bias(
                    self.logit_bias
                )
        except UserError as e:
            raise ApiError(400, str(e), param="logit_bias") from None
        try:
            if self.samplers is not None:
                changes["samplers"] = parse_samplers(self.samplers)
        except UserError as e:
            raise ApiError(400, str(e), param="samplers") from None
        grammar = self.grammar_config()
        if grammar is not None:
            changes["grammar"] = grammar
        return base.with_(**changes) if changes else base

    def check_supported(self) -> None:
        """A 400 for a field that would change the answer and that we do not honour."""
        extra = self.model_extra or {}
        for name, (neutral, message) in UNSUPPORTED.items():
            if name in extra and not any(_same(extra[name], v) for v in neutral):
                raise ApiError(400, message, param=name)

    def grammar_config(self) -> Grammar | None:
        """The grammar the answer must match, from ``response_format``, ``json_schema`` or
        ``grammar`` (at most one), checked: a 400 naming the field and the problem."""
        fmt = self.response_format
        plain = fmt is not None and fmt.get("type") == "text"  # constrains nothing
        given = [
            k
            for k in ("response_format", "json_schema", "grammar")
            if getattr(self, k) is not None and not (k == "response_format" and plain)
        ]
        if len(given) > 1:
            raise ApiError(400, f"send one of {' and '.join(given)}", param=given[1])
        try:
            grammar = self._grammar()
            if grammar is not None:
                check_grammar(grammar)
        except UserError as e:
            raise ApiError(400, f"{given[0]}: {e}", param=given[0]) from None
        return grammar

    def _grammar(self) -> Grammar | None:
        if self.json_schema is not None:
            return Grammar.json_schema(self.json_schema)
        if self.grammar is not None:
            return Grammar.gbnf(self.grammar)
        fmt = self.response_format
        if fmt is None:
            return None
        kind = fmt.get("type")
        if kind == "text":
            return None
        if kind == "json_object":  # llama-server also takes a schema here
            schema = fmt.get("schema")
            return Grammar.json_object() if schema is None else Grammar.json_schema(schema)
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise UserError("json_schema.schema must be a JSON schema object")
            strict = spec.get("strict")
            return Grammar.json_schema(spec["schema"], strict=strict is not False)
        raise UserError(f"type must be text, json_object or json_schema, got {kind!r}")

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
    max_choices: ClassVar[int] = MAX_CHOICES

    def top_logprobs(self) -> int | None:
        return self.logprobs

    def check_supported(self) -> None:
        super().check_supported()
        for name in ("tools", "tool_choice"):
            if (self.model_extra or {}).get(name) is not None:
                raise ApiError(400, f"{name} needs /v1/chat/completions", param=name)

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
    max_choices: ClassVar[int] = MAX_CHOICES
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    logprobs: bool = False
    top_logprobs_: int | None = Field(None, alias="top_logprobs", ge=0, le=MAX_TOP_LOGPROBS)
    #: Variables for the chat template (llama-server's, e.g. ``{"enable_thinking": false}``).
    chat_template_kwargs: dict[str, Any] | None = None
    #: llama-server's: a whole answer also carries ``__verbose``, the prompt as the template
    #: rendered it and the answer's raw text.
    verbose: bool = False

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or super().token_limit()

    def tool_request(self) -> ToolRequest | None:
        """The request's tools and how to use them (None: no tools); a 400 naming the field
        for a tool without a name, an invalid schema, a ``tool_choice`` naming no tool..."""
        try:
            return parse_tool_request(self.tools, self.tool_choice, self.parallel_tool_calls)
        except UserError as e:
            where = ("parallel_tool_calls", "tool_choice")
            param = next((k for k in where if k in str(e)), "tools")
            raise ApiError(400, str(e), param=param) from None

    def top_logprobs(self) -> int | None:
        """OpenAI's rule: ``top_logprobs`` needs ``logprobs: true``."""
        if self.top_logprobs_ is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs_ or 0) if self.logprobs else None
