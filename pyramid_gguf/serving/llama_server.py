"""llama-server's simple routes, as its own server names and shapes them (``tools/server`` in
llama.cpp): OpenAI's routes without the ``/v1`` prefix (``/models``, ``/completions``,
``/chat/completions``: the same handlers, :func:`.openai_routes.register`), ``POST /tokenize``
(``content``, ``add_special``, ``parse_special``, ``with_pieces``), ``POST /detokenize``
(``tokens``), ``POST /apply-template`` (a chat's ``messages`` and ``tools`` -> ``prompt``),
``GET /props`` (the default generation settings, slots, chat template, model path, build),
``GET /slots`` (read-only: each slot's ``id``, ``n_ctx``, ``is_processing``) and the native
``POST /completion`` (``prompt`` as text or token ids, ``n_predict``...; answered with
``content``, ``stop_type``, ``timings``..., or streamed as ``data:`` chunks, the last with
``stop: true``).

``/completion`` generates through the one path (:meth:`.service.Service.admit` onto
:meth:`Pyramid.submit <pyramid_gguf.api.Pyramid.submit>`); the rest read the target's
vocabulary, chat template and the slots. A field that would change the answer and that we do
not honour is a 400, like every other route's.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.responses import Response as HTTPResponse

from ..api import GenerationStats, Job, Response
from ..chat import parse_tool_request
from ..core.errors import UserError
from ..core.sampling import SamplingConfig
from ..core.spec import SpecConfig
from .errors import ApiError, error_of
from .jobs import ClientGone, Deliver, Reader
from .openai import timings
from .openai_routes import register
from .schemas import ChatMessage, GenerationRequest
from .service import Service, event_stream, sse

#: llama.cpp's ``LLAMA_DEFAULT_SEED``: what ``/props`` shows for a random seed.
RANDOM_SEED = 0xFFFFFFFF


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: ``content`` text, or llama-server's mixed list of texts and token ids
    (texts tokenized, ids kept; BOS only before the first text, with ``add_special``)."""

    model_config = ConfigDict(extra="forbid")

    content: str | list[str | int] = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[int] = Field(default_factory=list)


class ApplyTemplateRequest(BaseModel):
    """``POST /apply-template``: a chat request's ``messages`` and ``tools``. Its other fields
    (sampling, ``model``...) are ignored: they do not change the prompt; those that would and
    that we do not honour are refused (:data:`_REFUSED`)."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage] = Field(min_length=1)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    add_generation_prompt: bool = True


class NativeCompletionRequest(GenerationRequest):
    """``POST /completion``: llama-server's native completion. ``prompt`` (required): text (BOS
    added, special tokens parsed) or token ids; ``n_predict``: the most tokens (-1: the server's
    limit); ``return_tokens``: the answer's token ids in ``tokens``; ``cache_prompt`` is taken
    and changes nothing (a slot whose cache the prompt continues is always reused). The
    sampling fields, ``stop``, ``ignore_eos``, ``json_schema`` and ``grammar`` are
    :class:`~.schemas.GenerationRequest`'s; ``n_probs`` and the sampler fields we do not run are
    refused unless neutral (:data:`~.schemas.UNSUPPORTED`)."""

    prompt: str | list[int]
    return_tokens: bool = False
    cache_prompt: bool = True

    @field_validator("n_predict")
    @classmethod
    def _no_zero(cls, n: int | None) -> int | None:
        if n == 0:
            raise ValueError("n_predict must be -1 (the server's limit) or at least 1")
        return n


#: Fields of ``/apply-template`` that change the prompt and that we do not honour, with the
#: values that change nothing.
_REFUSED: dict[str, tuple[Any, ...]] = {
    "chat_template_kwargs": (None, {}),
    "continue_final_message": (None, False),
    "chat_template": (None,),
}


def routes(service: Service) -> APIRouter:
    """llama-server's simple routes over ``service``."""
    router = APIRouter()
    register(router, service, "")
    pyramid = service.pyramid
    target = pyramid.ladder.target
    vocab = target.vocab

    def check_ids(tokens: list[int], param: str) -> None:
        bad = next((t for t in tokens if not 0 <= t < target.n_vocab), None)
        if bad is not None:
            raise ApiError(
                400,
                f"{param}: token id {bad} is not in the model's vocabulary "
                f"(0 to {target.n_vocab - 1})",
                param=param,
            )

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        parts = [body.content] if isinstance(body.content, str) else body.content
        tokens: list[int] = []
        first = True
        for part in parts:
            if isinstance(part, int):
                tokens.append(part)
                continue
            special = body.add_special and first
            tokens += vocab.tokenize(part, add_special=special, parse_special=body.parse_special)
            first = False
        check_ids(tokens, "content")
        if not body.with_pieces:
            return {"tokens": tokens}
        return {
            "tokens": [
                {"id": t, "piece": _piece(vocab.token_bytes(t, special=True))} for t in tokens
            ]
        }

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_ids(body.tokens, "tokens")
        data = b"".join(vocab.token_bytes(t, special=True) for t in body.tokens)
        return {"content": data.decode("utf-8", errors="replace")}

    @router.post("/apply-template")
    async def apply_template(body: ApplyTemplateRequest) -> dict[str, Any]:
        extra = body.model_extra or {}
        for name, neutral in _REFUSED.items():
            if name in extra and not any(extra[name] == n for n in neutral):
                raise ApiError(400, f"{name} is not supported", param=name)
        try:
            offered = parse_tool_request(body.tools, body.tool_choice, body.parallel_tool_calls)
        except UserError as e:
            raise ApiError(400, str(e), param="tools") from None
        shown = offered.tools if offered is not None and offered.choice.mode != "none" else None
        prompt = pyramid.apply_chat_template(
            [m.as_dict() for m in body.messages],
            service.settings.chat_template,
            tools=shown,
            add_generation_prompt=body.add_generation_prompt,
        )
        return {"prompt": prompt}

    @router.post("/completion")
    async def completion(request: Request, body: NativeCompletionRequest) -> HTTPResponse:
        sampling, spec = body.sampling(service.settings.sampling), body.spec(service.spec)
        if isinstance(body.prompt, str):
            tokens = pyramid.tokenize(body.prompt)
        else:
            check_ids(body.prompt, "prompt")
            tokens = list(body.prompt)

        def submit(deliver: Deliver) -> Job:
            return pyramid.submit(tokens, sampling, spec, deliver=deliver)

        admitted = await service.admit(request, submit)
        if admitted is None:
            return HTTPResponse(status_code=499)
        reader, first = admitted
        shape = NativeShape(
            model=service.model_name,
            prompt=b"".join(vocab.token_bytes(t, special=True) for t in tokens).decode(
                "utf-8", errors="replace"
            ),
            settings=generation_settings(sampling, spec, body.stream),
            stops=sampling.stop,
            piece=vocab.token_bytes,
            return_tokens=body.return_tokens,
        )
        if body.stream:
            return event_stream(_native_events(reader, first, shape))
        try:
            steps = await service.collect(request, reader, first)
        except ClientGone:
            return HTTPResponse(status_code=499)
        for step in steps:
            shape.add(step)
        return JSONResponse(shape.final(steps[-1], stream=False))

    @router.get("/slots")
    async def slots(fail_on_no_slot: bool = False) -> list[dict[str, Any]]:
        now = pyramid.snapshot()
        if fail_on_no_slot and all(now.slot_busy):
            raise ApiError(503, "no slot available", type="unavailable_error")
        return [
            {"id": i, "n_ctx": target.n_ctx, "is_processing": busy, "n_prompt_tokens": held}
            for i, (busy, held) in enumerate(zip(now.slot_busy, now.slot_cached, strict=True))
        ]

    @router.get("/props")
    async def props() -> dict[str, Any]:
        params = _params(service.settings.sampling)
        template = pyramid.template(service.settings.chat_template)
        return {
            "default_generation_settings": {"n_ctx": target.n_ctx, "params": params},
            "total_slots": pyramid.snapshot().slots,
            "model_alias": service.model_name,
            "model_path": str(target.loaded.path),
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": True,
            "endpoint_props": False,
            "endpoint_metrics": True,
            "chat_template": template.source,
            "bos_token": vocab.token_text(vocab.bos),
            "eos_token": vocab.token_text(vocab.eos),
            "build_info": build_info(),
            "is_sleeping": False,
        }

    return router


def _params(sampling: SamplingConfig) -> dict[str, Any]:
    """llama-server's sampling ``params`` of ``sampling``."""
    return {
        "seed": RANDOM_SEED if sampling.seed is None else sampling.seed,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "n_predict": sampling.max_tokens,
        "stop": list(sampling.stop),
        "ignore_eos": sampling.ignore_eos,
    }


def generation_settings(sampling: SamplingConfig, spec: SpecConfig, stream: bool) -> dict[str, Any]:
    """``/completion``'s ``generation_settings``: the settings the answer ran with."""
    grammar = sampling.grammar
    return _params(sampling) | {
        "max_tokens": sampling.max_tokens,
        "stream": stream,
        "n_probs": 0,
        "grammar": grammar.text if grammar is not None and grammar.kind == "gbnf" else "",
        "speculative.mode": spec.mode,
    }


@dataclass
class NativeShape:
    """One ``/completion`` answer as llama-server shapes it: the steps read so far (their text
    and token ids), its streamed chunks and its last body."""

    model: str
    prompt: str
    settings: dict[str, Any]
    stops: Sequence[str]
    #: A token's bytes, as the text was rendered (control tokens empty).
    piece: Callable[[int], bytes]
    return_tokens: bool = False
    texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)

    def add(self, step: Response) -> None:
        self.texts.append(step.text)
        self.ids += step.token_ids

    def partial(self, step: Response) -> dict[str, Any]:
        """A streamed chunk of ``step``'s text and tokens."""
        return {
            "index": 0,
            "content": step.text,
            "tokens": list(step.token_ids),
            "stop": False,
            "tokens_predicted": step.stats.generated_tokens,
            "tokens_evaluated": step.stats.prompt_tokens,
        }

    def final(self, last: Response, *, stream: bool) -> dict[str, Any]:
        """The last body (streamed: its content and tokens were in the chunks before)."""
        stats = last.stats
        content = "".join(self.texts)
        stop_type, word = self.stop_of(last.finish_reason, content, stats)
        return {
            "index": 0,
            "content": "" if stream else content,
            "tokens": self.ids if self.return_tokens and not stream else [],
            "stop": True,
            "model": self.model,
            "tokens_predicted": stats.generated_tokens,
            "tokens_evaluated": stats.prompt_tokens,
            "generation_settings": self.settings,
            "prompt": self.prompt,
            "has_new_line": "\n" in content,
            "truncated": False,  # a prompt over the context is a 400, never cut
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": stats.prompt_tokens + stats.generated_tokens,
            "timings": timings(stats),
        }

    def stop_of(self, reason: str | None, content: str, stats: GenerationStats) -> tuple[str, str]:
        """llama-server's ``stop_type`` and ``stopping_word``. A stop string that ended the
        answer starts where ``content`` ends in the delivered tokens' text, or, when the token
        that completed it brought no text (it is then counted in ``generated_tokens`` but never
        delivered), that text's tail is its start. An end-of-generation token is neither
        delivered nor counted: every counted token was delivered."""
        if reason == "length":
            return "limit", ""
        if reason != "stop":
            return "none", ""
        data = b"".join(self.piece(t) for t in self.ids)
        raw = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data)  # no half char
        at, tail = len(content), raw[len(content) :]
        unread = len(self.ids) < stats.generated_tokens
        for stop in self.stops:
            if raw.startswith(stop, at) or (unread and stop.startswith(tail)):
                return "word", stop
        return "eos", ""


async def _native_events(
    reader: Reader, first: Response, shape: NativeShape
) -> AsyncGenerator[str, None]:
    """``/completion``'s stream: a ``data:`` chunk per step with text or tokens, then the last
    with ``stop: true`` and the totals (no ``[DONE]``, as llama-server's native stream); an
    error after the headers went out is an ``error`` chunk. Leaving early cancels the
    generation."""
    try:
        step: Response | None = first
        while step is not None:
            shape.add(step)
            if step.text or step.token_ids:
                yield sse(shape.partial(step))
            if step.finish_reason is not None:
                yield sse(shape.final(step, stream=True))
            step = await reader.next()
    except Exception as e:
        yield sse(error_of(e).body())
    finally:
        reader.close()


def _piece(data: bytes) -> str | list[int]:
    """A token's piece as llama-server shows it: its text, or its bytes when not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


@cache
def build_info() -> str:
    """``pyramid-gguf <version> (llama-cpp-python <version>)``."""
    return (
        f"pyramid-gguf {_version('pyramid-gguf')} (llama-cpp-python {_version('llama_cpp_python')})"
    )


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
