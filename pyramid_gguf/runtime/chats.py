"""Chat prompts of a loaded ladder: the template a chat renders with (a request's, the target
GGUF's, else the built-in ChatML), its tokens, and :class:`ChatPrompt`, a chat turn ready to
generate with its sampling and tool-call reader, whatever API it came through."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import native
from ..chat import (
    CallStream,
    ChatTemplate,
    GenericFormat,
    Tool,
    ToolCallFormat,
    ToolRequest,
    constraint,
    normalise_messages,
    probe_caps,
    prompt_messages,
)
from ..core.errors import UserError
from ..core.sampling import SamplingConfig
from ..decoding.runtime.tiers import ModelTier


@dataclass(frozen=True)
class ChatPrompt:
    """A chat turn ready to generate (:meth:`Chats.prepare`): its prompt ``tokens``, the
    ``sampling`` its answer runs with (the request's, plus a response format's or the tools'
    grammar), and ``calls``, the tool-call format that reads calls out of the answer (None: no
    tools). With tools the answer's text renders control tokens (``special``), which only the
    call reader sees: :meth:`reader` turns the text into content and calls, dropping the
    ``controls`` (control-token texts that are not the format's markers) from content."""

    tokens: list[int]
    sampling: SamplingConfig
    calls: ToolCallFormat | None = None
    controls: frozenset[str] = frozenset()

    @property
    def special(self) -> bool:
        """Whether the answer's text renders control tokens (for the call parser)."""
        return self.calls is not None

    def reader(self) -> CallStream | None:
        """A reader of this answer's content and tool calls (None without tools)."""
        if self.calls is None:
            return None
        return CallStream(self.calls, controls=self.controls)


class Chats:
    """Chat prompts for the ``target`` tier. ``kwargs``: variables every render gets
    (``serve --chat-template-kwargs``), under a request's own; the caller may replace it."""

    def __init__(self, target: ModelTier) -> None:
        self.target = target
        self.kwargs: dict[str, Any] = {}

    def template(self, chat_template: str | None = None) -> ChatTemplate:
        """``chat_template`` (Jinja text), else the target GGUF's, else the built-in ChatML
        (:attr:`ChatTemplate.name` says which)."""
        if chat_template is not None:
            return ChatTemplate(chat_template, "--chat-template")
        return ChatTemplate.from_gguf(self.target.loaded.chat_template())

    def render(
        self,
        messages: list[dict[str, Any]],
        chat_template: str | None = None,
        *,
        tools: Sequence[Tool] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of a chat (OpenAI messages, tool calls and results included) and
        ``tools``, rendered by :meth:`template` (the assistant's turn opened unless
        ``add_generation_prompt`` is false; ``template_kwargs``, a request's
        ``chat_template_kwargs``, set template variables such as ``enable_thinking``)."""
        vocab = self.target.vocab
        return self.template(chat_template).render(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=vocab.token_text(vocab.bos),
            eos_token=vocab.token_text(vocab.eos),
            kwargs={**self.kwargs, **(template_kwargs or {})},
        )

    def tokens(
        self,
        messages: list[dict[str, Any]],
        chat_template: str | None = None,
        *,
        tools: Sequence[Tool] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a rendered chat (BOS once, special tokens parsed)."""
        text = self.render(messages, chat_template, tools=tools, template_kwargs=template_kwargs)
        vocab = self.target.vocab
        tokens = vocab.tokenize(text)
        if len(tokens) > 1 and tokens[0] == vocab.bos and tokens[1] == vocab.bos:
            tokens = tokens[1:]
        return tokens

    def prepare(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingConfig | None = None,
        tools: ToolRequest | None = None,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> ChatPrompt:
        """A chat turn ready to submit: ``messages`` rendered with the tools to show, and the
        answer's sampling: ``sampling`` (its grammar, a response format, included) or, with
        ``tools``, the calls' grammar (``tool_choice`` required or a named function: the answer
        is calls whose arguments match the tool's schema) or lazy triggers (``auto``: free text
        until the model opens a call). ``tool_choice: "none"`` shows no tools and reads no
        calls. A template that writes no tool-call format we read gets llama.cpp's generic JSON
        format, taught in the system message (:mod:`~pyramid_gguf.chat.generic`). A one-line
        :class:`UserError` when a grammar and tools come together."""
        sampling = sampling or SamplingConfig()
        calls: ToolCallFormat | None = None
        shown: tuple[Tool, ...] | None = None
        if tools is not None and tools.choice.mode != "none":
            calls = self.template(chat_template).tool_format
            if sampling.grammar is not None:
                raise UserError("tools and a response format together are not supported")
            found = constraint(calls, tools, self.special_texts(calls.markers))
            if found is not None:
                sampling = sampling.with_(grammar=found.grammar, triggers=found.triggers)
            shown = tools.tools
            if isinstance(calls, GenericFormat):  # taught in the system message, as llama.cpp
                caps = probe_caps(
                    lambda m, t: self.render(m, chat_template, tools=t, add_generation_prompt=False)
                )
                messages = prompt_messages(normalise_messages(messages), shown, caps)
        tokens = self.tokens(messages, chat_template, tools=shown, template_kwargs=template_kwargs)
        controls = self.control_texts if calls is not None else frozenset()
        return ChatPrompt(tokens, sampling, calls, controls)

    @functools.cached_property
    def control_texts(self) -> frozenset[str]:
        """The texts of the vocabulary's control tokens (``<|im_start|>``...): what renders
        only with special tokens, never content (read once: 0.3 s on Qwen's 152k)."""
        vocab = self.target.vocab
        out = set()
        for t in range(vocab.n_vocab):
            if vocab.token_bytes(t) == b"":
                text = vocab.token_bytes(t, special=True).decode("utf-8", errors="ignore")
                if text:
                    out.add(text)
        return frozenset(out)

    def special_texts(self, texts: Sequence[str]) -> frozenset[str]:
        """Those of ``texts`` that are single special tokens of the vocabulary (a tool-call
        format's markers, which grammars then name as tokens, not as text)."""
        tokenizer = native.grammar_tokenizer(self.target.model)  # the grammar engine's view
        out = set()
        for text in texts:
            ids = self.target.vocab.tokenize(text, add_special=False, parse_special=True)
            if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
                out.add(text)
        return frozenset(out)
