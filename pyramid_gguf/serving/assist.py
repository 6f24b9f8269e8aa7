"""What an assistant's chat request asks of the engine, and how its answer is read back.

:func:`chat_sampling` turns a request's grammar (``response_format``...) and tools into the
:class:`~pyramid_gguf.core.sampling.SamplingConfig` the engine runs: a whole-answer grammar
(``tool_choice`` required or a named function: the answer is one or more calls whose arguments
match the tool's schema), or lazy triggers (``auto``: free text until the model opens a call,
then the call's grammar). The tool-call format is the one the model's own chat template renders
(:mod:`pyramid_gguf.chat`). :class:`CallStream` reads the answer back, as it grows and when it
ends: content text and OpenAI ``tool_calls``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..api import Pyramid
from ..chat import (
    CallIds,
    Delta,
    Message,
    Tool,
    ToolCallFormat,
    ToolRequest,
    constraint,
    diff,
)
from ..core.errors import UserError
from ..core.sampling import SamplingConfig


@dataclass(frozen=True)
class ChatPlan:
    """A chat request's sampling and tools: ``tools`` are rendered into the prompt, and
    ``calls`` (a tool-call format) reads calls out of the answer; None when no tools apply."""

    sampling: SamplingConfig
    tools: ToolRequest | None = None
    calls: ToolCallFormat | None = None

    @property
    def rendered(self) -> tuple[Tool, ...] | None:
        """The tools the prompt shows the model (None: none)."""
        return None if self.tools is None else self.tools.tools

    @property
    def special(self) -> bool:
        """The answer's text renders control tokens, as the call parser reads them."""
        return self.calls is not None


def chat_sampling(
    pyramid: Pyramid,
    sampling: SamplingConfig,
    tools: ToolRequest | None,
    chat_template: str | None = None,
) -> ChatPlan:
    """The plan of a chat whose request samples with ``sampling`` (its grammar, if any,
    included) and offers ``tools`` (None: none). ``tool_choice: "none"`` renders no tools and
    reads no calls. A one-line :class:`UserError` when the model's template has no tool-call
    format we read, or when a grammar and tools are asked for together."""
    if tools is None or tools.choice.mode == "none":
        return ChatPlan(sampling)
    template = pyramid.template(chat_template)
    fmt = template.tool_format
    if fmt is None:
        raise UserError(
            f"tools: the chat template ({template.name}) renders no tool-call format "
            "pyramid-gguf reads (Hermes/Qwen <tool_call> or Llama 3.x JSON)"
        )
    if sampling.grammar is not None:
        raise UserError("tools and a response format together are not supported")
    found = constraint(fmt, tools, pyramid.special_texts(fmt.markers))
    if found is not None:
        sampling = sampling.with_(grammar=found.grammar, triggers=found.triggers)
    return ChatPlan(sampling, tools, fmt)


@dataclass
class CallStream:
    """One answer's text read as content and tool calls by ``fmt``: :meth:`feed` each text
    delta (streaming), :meth:`finish` at the end. Call ids are drawn once per call."""

    fmt: ToolCallFormat
    ids: CallIds = field(default_factory=CallIds)
    text: str = ""
    sent: Message = field(default_factory=lambda: Message(""))

    def feed(self, delta: str) -> Delta:
        """What the answer so far adds to what was sent: content, then call deltas."""
        self.text += delta
        return self._send(self.fmt.parse_partial(self.text, self.ids))

    def finish(self) -> tuple[Message, Delta]:
        """The whole answer parsed, and what it adds to what was sent."""
        final = self.fmt.parse(self.text, self.ids)
        return final, self._send(final)

    def _send(self, current: Message) -> Delta:
        out = diff(self.sent, current)
        self.sent = current
        return out
