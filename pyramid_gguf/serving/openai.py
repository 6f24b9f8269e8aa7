"""OpenAI-shaped response bodies: the one builder of completion and chat completion objects.

:class:`ResponseShape` knows the id, model and kind (text or chat) of one response and builds
its whole body or its streamed chunks; :func:`usage` and :func:`timings` (llama-server names,
per-stage ``draft_n`` / ``draft_n_accepted``) are attached to both. The HTTP server and the
llama-cpp-python style helpers :func:`create_completion` and :func:`create_chat_completion`
(an OpenAI dict from a :class:`~pyramid_gguf.api.Pyramid`, no server, no web framework) use it
alike; a chat is prepared by :meth:`Pyramid.prepare_chat <pyramid_gguf.api.Pyramid.prepare_chat>`
for both.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from typing import Any

from pydantic import ValidationError

from ..api import GenerationStats, Prompt, Pyramid, TokenLogprob
from ..chat import Message
from ..core.errors import UserError
from ..core.sampling import SamplingConfig
from ..core.spec import SpecConfig
from .errors import ApiError, validation_error
from .schemas import ChatCompletionRequest

#: Serialises one value as ``json.dumps(value, ensure_ascii=False)`` does.
_JSON = json.JSONEncoder(ensure_ascii=False)
#: A text delta's place in a chunk serialised once (:meth:`ResponseShape.text_event`).
_MARK = "\x00pyramid-gguf text\x00"


@cache
def system_fingerprint() -> str:
    """``system_fingerprint``: llama-server's is ``b<build>-<commit>``; ours
    ``b<version>-pyramid-gguf``, the server's version (answers may change with it)."""
    try:
        version = metadata.version("pyramid-gguf")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"b{version}-pyramid-gguf"


def json_string(text: str) -> str:
    """``text`` as a JSON string, as ``json.dumps(text, ensure_ascii=False)`` writes it (the
    one part of a streamed token's event that changes, the rest serialised once)."""
    return _JSON.encode(text)


def finish_reason(reason: str | None, called: bool = False) -> str:
    """OpenAI's finish reason of ours: ``stop`` (``tool_calls`` when the answer ``called``
    tools); anything else ends by ``length`` (an answer cut short, even inside a call)."""
    if reason != "stop":
        return "length"
    return "tool_calls" if called else "stop"


def usage(stats: GenerationStats) -> dict[str, Any]:
    """OpenAI ``usage`` of a generation; ``prompt_tokens_details.cached_tokens``: the prompt
    tokens reused from the cache (llama-server's ``timings.cache_n``)."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.prompt_tokens - stats.prompt_evaluated},
    }


def timings(stats: GenerationStats) -> dict[str, Any]:
    """llama-server style ``timings``, with per-stage ``draft_n`` / ``draft_n_accepted``.

    As in llama-server, ``prompt_n`` counts the prompt tokens evaluated for this request and
    ``cache_n`` those reused from the cache, so ``prompt_per_second`` is ``prompt_n`` over
    ``prompt_ms`` (``usage.prompt_tokens`` is their sum); ``predicted_per_second`` counts the
    ``predicted_n - 1`` tokens after the first, which comes from the prompt's logits at no
    decode step (``predicted_ms`` starts after it). Both rates are of the ms shown, unrounded,
    so a client dividing the fields gets them exactly.
    """
    prompt_ms = round(stats.prompt_seconds * 1000, 2)
    predicted_ms = round(stats.generation_seconds * 1000, 2)
    return {
        "cache_n": stats.prompt_tokens - stats.prompt_evaluated,
        "prompt_n": stats.prompt_evaluated,
        "prompt_ms": prompt_ms,
        "prompt_per_second": rate(stats.prompt_evaluated, prompt_ms),
        "predicted_n": stats.generated_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_second": rate(decode_steps(stats.generated_tokens), predicted_ms),
        "draft_n": sum(s.draft_n for s in stats.stages),
        "draft_n_accepted": sum(s.draft_n_accepted for s in stats.stages),
        "forced_n": stats.forced_n,
        "forced_n_accepted": stats.forced_n_accepted,
        "mode": stats.mode,
        "stages": [s.to_dict() for s in stats.stages],
    }


def decode_steps(generated: int) -> int:
    """The generated tokens that cost a decode step: all but the first (llama-server's
    ``n_gen_steps``)."""
    return max(generated - 1, 0)


def rate(n: int, ms: float) -> float:
    """``n`` tokens over ``ms`` milliseconds, per second (0.0 when no time was measured)."""
    return 1e3 / ms * n if ms > 0 else 0.0


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def chat_logprobs(lps: Sequence[TokenLogprob]) -> dict[str, Any]:
    """Chat's ``logprobs``: per token its text, log-probability, bytes and alternatives."""
    return {
        "content": [
            {
                "token": _text(t.piece),
                "logprob": t.logprob,
                "bytes": list(t.piece),
                "top_logprobs": [
                    {"token": _text(b), "logprob": lp, "bytes": list(b)} for _, b, lp in t.top
                ],
            }
            for t in lps
        ]
    }


def completion_logprobs(lps: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy completions ``logprobs``: parallel lists, text offsets from ``offset``."""
    offsets, at = [], offset
    for t in lps:
        offsets.append(at)
        at += len(_text(t.piece))
    return {
        "tokens": [_text(t.piece) for t in lps],
        "token_logprobs": [t.logprob for t in lps],
        "top_logprobs": [{_text(b): lp for _, b, lp in t.top} for t in lps],
        "text_offset": offsets,
    }


@dataclass
class ResponseShape:
    """Ids and kind of one response, and how its chunks look."""

    chat: bool
    model: str
    include_usage: bool = False
    #: Whether the request asked for log-probabilities (``logprobs`` is then never null).
    logprobs: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    #: Characters of text already sent (completions' ``text_offset``).
    sent: int = 0
    #: Which of the request's ``n`` choices this is.
    index: int = 0
    #: :meth:`text_event`'s event around its text, and the ids it was built for.
    _template: tuple[tuple[str, int, int], str, str] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "choices": choices,
        }

    def _logprobs(self, lps: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.chat:
            return chat_logprobs(lps)
        out = completion_logprobs(lps, self.sent)
        self.sent += sum(len(_text(t.piece)) for t in lps)
        return out

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        *,
        role: bool = False,
        logprobs: Sequence[TokenLogprob] = (),
        tool_calls: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """One streamed chunk: a text delta (with its tokens' ``logprobs`` when asked for),
        ``delta.tool_calls`` entries, the role (chat's first), or the finish reason."""
        lp = self._logprobs(logprobs) if logprobs or not role else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = list(tool_calls)
            choice = {"index": self.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": self.index, "text": text or "", "logprobs": lp, "finish_reason": finish}
        return self._envelope("text_completion", [choice])

    def text_event(self, text: str) -> str:
        """The server-sent event of a text delta without log-probabilities, exactly
        ``sse(self.chunk(text))``: the chunk around the text is serialised once per response,
        each token only its text (the streamed answer's per-token work)."""
        key = (self.id, self.created, self.index)
        template = self._template
        if template is None or template[0] != key:
            whole = json.dumps(self.chunk(_MARK), ensure_ascii=False)
            head, tail = whole.split(json_string(_MARK))
            template = self._template = (key, f"data: {head}", f"{tail}\n\n")
        return f"{template[1]}{json_string(text)}{template[2]}"

    def usage_chunk(self, stats: GenerationStats) -> dict[str, Any]:
        """The last chunk when ``stream_options.include_usage``: no choices, only usage (and
        ``timings``, as llama-server sends them)."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._envelope(obj, []) | {"usage": usage(stats), "timings": timings(stats)}

    def final_chunk(
        self,
        text: str,
        reason: str | None,
        stats: GenerationStats,
        logprobs: Sequence[TokenLogprob] = (),
        tool_calls: Sequence[dict[str, Any]] = (),
        called: bool = False,
    ) -> dict[str, Any]:
        """The streamed chunk with the finish reason (and the last text and call deltas), plus
        ``timings``; ``called``: the answer called tools."""
        text_or_none = (text or None) if self.chat else text
        finish = finish_reason(reason, called)
        chunk = self.chunk(text_or_none, finish, logprobs=logprobs, tool_calls=tool_calls)
        return chunk | {"timings": timings(stats)}

    def full(
        self,
        text: str,
        reason: str | None,
        stats: GenerationStats,
        logprobs: Sequence[TokenLogprob] = (),
        message: Message | None = None,
    ) -> dict[str, Any]:
        """A non-streamed response with ``usage`` and ``timings`` (and ``logprobs`` of every
        token when asked for). ``message``: the answer read as content and tool calls (chat
        with tools), else ``text`` is the content."""
        calls = message.calls if message is not None else ()
        finish = finish_reason(reason, bool(calls))
        lp = self._logprobs(logprobs)
        if self.chat:
            body: dict[str, Any] = {"role": "assistant", "content": text}
            if message is not None:
                body["content"] = message.content
                if calls:
                    body["tool_calls"] = [c.to_openai() for c in calls]
            choice: dict[str, Any] = {
                "index": self.index,
                "message": body,
                "logprobs": lp,
                "finish_reason": finish,
            }
            obj = "chat.completion"
        else:
            choice = {"index": self.index, "text": text, "logprobs": lp, "finish_reason": finish}
            obj = "text_completion"
        return self._envelope(obj, [choice]) | {"usage": usage(stats), "timings": timings(stats)}


def create_completion(
    pyramid: Pyramid,
    prompt: Prompt,
    sampling: SamplingConfig | None = None,
    spec: SpecConfig | None = None,
) -> dict[str, Any]:
    """A ``text_completion`` dict with ``usage`` and a ``timings`` extra, as
    llama-cpp-python's ``Llama.create_completion`` returns."""
    c = pyramid.generate(prompt, sampling, spec)
    return ResponseShape(chat=False, model=pyramid.name).full(c.text, c.finish_reason, c.stats)


def create_chat_completion(
    pyramid: Pyramid,
    messages: list[dict[str, Any]],
    sampling: SamplingConfig | None = None,
    spec: SpecConfig | None = None,
    *,
    chat_template: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    parallel_tool_calls: bool | None = None,
    response_format: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` dict with ``usage`` and a ``timings`` extra, as llama-cpp-python's
    ``Llama.create_chat_completion`` returns: the prompt built with the target GGUF's chat
    template (or ``chat_template``), ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` and
    ``response_format`` as OpenAI takes them (a one-line :class:`UserError` for bad ones)."""
    fields = {
        "messages": messages,
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel_tool_calls,
        "response_format": response_format,
    }
    try:
        request = ChatCompletionRequest.model_validate(fields)
        sampling = request.sampling(sampling or SamplingConfig())
        offered = request.tool_request()
        turns = [m.as_dict() for m in request.messages]
    except ApiError as e:
        raise UserError(e.message) from None
    except ValidationError as e:
        raise UserError(validation_error(e.errors()).message) from None
    chat = pyramid.prepare_chat(turns, sampling, offered, chat_template)
    c = pyramid.generate(chat.tokens, chat.sampling, spec, special=chat.special)
    reader = chat.reader()
    message = reader.parse(c.text) if reader is not None else None
    shape = ResponseShape(chat=True, model=pyramid.name)
    return shape.full(c.text, c.finish_reason, c.stats, message=message)
