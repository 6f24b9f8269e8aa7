"""OpenAI's routes: ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (streamed as server-sent events when ``stream`` is true).
:func:`register` adds the same handlers for llama-server's dialect (its unprefixed ``/models``
and ``/chat/completions``: :mod:`.llama_server`, whose ``/completions`` is its native one), which
also refuses a chat ending in two assistant messages, as llama-server does. A prompt over a
slot's context is a 400 before anything runs (:meth:`.service.Service.check_context`).

Bodies are parsed by :mod:`.schemas`, chats prepared by :meth:`Pyramid.prepare_chat
<pyramid_gguf.api.Pyramid.prepare_chat>`, generations answered by the :class:`~.service.Service`
(``n`` of them through :mod:`.choices`), each choice shaped by a :class:`Choice` over
:mod:`.openai`'s bodies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response as HTTPResponse

from ..api import Job, Prompt, Response, TokenLogprob
from ..chat import CallStream
from . import choices
from .errors import ApiError
from .http_errors import LLAMA, OPENAI, dialect_of, router
from .jobs import Deliver, Reader
from .openai import ResponseShape
from .schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest
from .service import Submit, service_of, sse, stream

#: Admits choice ``i``'s generation, given its reader's ``deliver``.
ChoiceSubmit = Callable[[Deliver, int], Job]


async def _events(
    steps: AsyncIterator[Response],
    shape: ResponseShape,
    calls: CallStream | None,
    llama: bool = False,
) -> AsyncIterator[str]:
    """The SSE events of a choice's ``steps``. With ``calls`` the text is read as content and
    tool calls, streamed as ``delta.tool_calls``."""
    if shape.chat:
        role = shape.chunk("", role=True)
        if llama:  # llama-server's role chunk has a null content, OpenAI's an empty one
            role["choices"][0]["delta"]["content"] = None
        yield sse(role)
    held: list[TokenLogprob] = []  # tokens whose text is held back (half a character)
    async for step in steps:
        held += step.logprobs
        if step.finish_reason is not None:
            text, called = step.text, False
            deltas: tuple[dict[str, Any], ...] = ()
            if calls is not None:
                calls.feed(step.text)
                message, last = calls.finish()
                text, deltas, called = last.content, last.tool_calls, bool(message.calls)
            yield sse(
                shape.final_chunk(
                    text, step.finish_reason, step.stats, held, tool_calls=deltas, called=called
                )
            )
            if shape.include_usage:
                yield sse(shape.usage_chunk(step.stats))
        elif calls is not None:
            delta = calls.feed(step.text)
            if delta.content or delta.tool_calls or held:
                content = delta.content or None
                yield sse(shape.chunk(content, logprobs=held, tool_calls=delta.tool_calls))
                held = []
        elif step.text and held:
            yield sse(shape.chunk(step.text, logprobs=held))
            held = []
        elif step.text:
            yield shape.text_event(step.text)


@dataclass
class Choice:
    """One choice's answer in OpenAI's shape (a :class:`~.service.Shape`): ``shape`` builds its
    bodies, ``calls`` reads content and tool calls out of its text (None: no tools), ``llama``
    answers a late error in llama-server's shape, ``verbose`` (``verbose: true``) is added to
    the whole body as ``__verbose``, with the raw text as its ``content``."""

    shape: ResponseShape
    calls: CallStream | None = None
    llama: bool = False
    verbose: dict[str, Any] | None = None

    def events(self, reader: Reader, first: Response) -> AsyncIterator[str]:
        """The SSE body, then ``[DONE]``; an error after the headers went out is an ``error``
        event (in llama-server's shape when ``llama``)."""

        def late(error: ApiError) -> str:
            return sse(error.llama_body() if self.llama else error.body())

        def events(steps: AsyncIterator[Response]) -> AsyncIterator[str]:
            return _events(steps, self.shape, self.calls, self.llama)

        return stream(reader, first, events, late, end=sse("[DONE]"))

    def whole(self, steps: list[Response]) -> dict[str, Any]:
        text = "".join(s.text for s in steps)
        logprobs = [lp for s in steps for lp in s.logprobs]
        last = steps[-1]
        message = self.calls.parse(text) if self.calls is not None else None
        body = self.shape.full(text, last.finish_reason, last.stats, logprobs, message)
        if self.verbose is not None:
            body["__verbose"] = self.verbose | {"content": text}
        return body


def routes() -> APIRouter:
    """OpenAI's routes, under ``/v1``."""
    out = router(OPENAI)
    register(out, "/v1")
    return out


def register(out: APIRouter, prefix: str, *, llama: bool = False) -> None:
    """Add OpenAI's three routes to ``out`` under ``prefix``; ``llama``: llama-server's
    dialect, only ``/models`` and ``/chat/completions``."""
    out.add_api_route(f"{prefix}/models", models, methods=["GET"])
    if not llama:
        out.add_api_route(f"{prefix}/completions", completions, methods=["POST"])
    out.add_api_route(f"{prefix}/chat/completions", chat_completions, methods=["POST"])


def check_turns(messages: Sequence[dict[str, Any]]) -> None:
    """llama-server's 400 for a chat ending in two assistant messages (it continues the last
    one, and cannot continue two)."""
    roles = [m.get("role") for m in messages[-2:]]
    if roles == ["assistant", "assistant"]:
        raise ApiError(
            400,
            "Cannot have 2 or more assistant messages at the end of the list.",
            param="messages",
        )


async def _answer(
    request: Request,
    body: GenerationRequest,
    shape: ResponseShape,
    submit: ChoiceSubmit,
    reader_of: Callable[[], CallStream | None] = lambda: None,
    verbose: dict[str, Any] | None = None,
) -> HTTPResponse:
    """``body.n`` choices (each its own generation, its own call reader), one answer."""
    llama = dialect_of(request.scope) is LLAMA
    shapes = [Choice(s, reader_of(), llama, verbose) for s in choices.shapes(shape, body.n)]
    submits = [_choice(submit, i) for i in range(body.n)]
    return await service_of(request).answer_all(
        request, submits, shapes, body.stream, merge=choices.merged, join=choices.joined
    )


async def models(request: Request) -> dict[str, Any]:
    """The ladder's card, and the embedding model's when one is loaded."""
    service = service_of(request)
    card = {
        "id": service.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "pyramid-gguf",
        "meta": {"mode": service.spec.mode, "tiers": service.pyramid.ladder.tier_names},
    }
    cards = [card]
    if service.embedding is not None:  # what /v1/embeddings answers with
        embedding = service.embedding
        meta = {"kind": "embedding", "n_embd": embedding.n_embd}
        cards.append(card | {"id": embedding.name, "meta": meta})
    return {"object": "list", "data": cards}


async def completions(request: Request, body: CompletionRequest) -> HTTPResponse:
    """``POST /v1/completions``: a prompt (text or token ids) continued."""
    service = service_of(request)
    pyramid = service.pyramid
    sampling, spec = body.sampling(service.settings.sampling), body.spec(service.spec)
    prompt: Prompt = body.prompt  # type: ignore[assignment]
    if isinstance(prompt, str):
        prompt = pyramid.tokenize(prompt)
    else:
        _check_token_ids(prompt, pyramid.n_vocab)
    service.check_context(prompt)
    top = body.top_logprobs()

    def submit(deliver: Deliver, choice: int) -> Job:
        sampled = choices.seeded(sampling, choice)
        return pyramid.submit(prompt, sampled, spec, deliver=deliver, logprobs=top)

    shape = ResponseShape(
        chat=False,
        model=service.model_name,
        include_usage=body.include_usage,
        logprobs=top is not None,
    )
    return await _answer(request, body, shape, submit)


async def chat_completions(request: Request, body: ChatCompletionRequest) -> HTTPResponse:
    """``POST /v1/chat/completions``: a chat turn answered (tools, structured output)."""
    service = service_of(request)
    pyramid, settings = service.pyramid, service.settings
    sampling, spec = body.sampling(settings.sampling), body.spec(service.spec)
    messages = [m.as_dict() for m in body.messages]
    if dialect_of(request.scope) is LLAMA:
        check_turns(messages)
    tools = body.tool_request()
    top = body.top_logprobs()
    chat = pyramid.prepare_chat(
        messages, sampling, tools, settings.chat_template, body.chat_template_kwargs
    )
    service.check_context(chat.tokens)

    def submit(deliver: Deliver, choice: int) -> Job:
        return pyramid.submit(
            chat.tokens, choices.seeded(chat.sampling, choice), spec, deliver=deliver,
            logprobs=top, special=chat.special,
        )  # fmt: skip

    shape = ResponseShape(
        chat=True,
        model=service.model_name,
        include_usage=body.include_usage,
        logprobs=top is not None,
    )
    verbose = None
    if body.verbose:
        verbose = {"prompt": pyramid.vocab.detokenize(chat.tokens, special=True)}
    return await _answer(request, body, shape, submit, chat.reader, verbose)


def _choice(submit: ChoiceSubmit, index: int) -> Submit:
    """Choice ``index``'s submit."""
    return lambda deliver: submit(deliver, index)


def _check_token_ids(prompt: Sequence[int], n_vocab: int) -> None:
    """A 400 naming the first prompt token id outside the target's vocabulary."""
    bad = next((t for t in prompt if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ApiError(
            400,
            f"prompt: token id {bad} is not in the model's vocabulary (0 to {n_vocab - 1})",
            param="prompt",
        )
