"""llama-server's simple routes, as its own server names and shapes them (``tools/server`` in
llama.cpp): OpenAI's routes without the ``/v1`` prefix (``/models``, ``/chat/completions``: the
same handlers, :func:`.openai_routes.register`), ``POST /chat/completions/input_tokens`` (a
chat's prompt length), ``POST /tokenize``
(``content``, ``add_special``, ``parse_special``, ``with_pieces``), ``POST /detokenize``
(``tokens``), ``POST /apply-template`` (a chat's ``messages`` and ``tools`` -> ``prompt``),
``GET /props`` (the default generation settings, slots, chat template, model path, build),
``GET /slots`` (read-only: each slot's ``id``, ``n_ctx``, ``is_processing``) and the native
``POST /completion`` (also ``/completions``, as llama-server: ``prompt`` as text or token ids,
``n_predict``...; answered with ``content``, ``stop_type``, ``timings`` (numbers only, as
llama-server's; the mode and per-stage statistics under ``speculative``)..., or streamed as
``data:`` chunks, the last with ``stop: true``). Errors are answered in llama-server's shape
(:meth:`.errors.ApiError.llama_body`).

``/completion`` generates through the one path (:meth:`.service.Service.admit` onto
:meth:`Pyramid.submit <pyramid_gguf.api.Pyramid.submit>`); the rest read the target's
vocabulary, chat template and the slots. A field that would change the answer and that we do
not honour is a 400, like every other route's.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.responses import Response as HTTPResponse

from ..api import GenerationStats, Job, Response, TokenLogprob
from ..chat import parse_tool_request
from ..core.errors import UserError
from ..core.sampling import MAX_TOP_LOGPROBS, SAMPLER_FIELDS, SamplingConfig
from ..core.spec import SpecConfig
from .errors import ApiError
from .http_errors import LLAMA, router
from .jobs import Deliver, Reader
from .openai import decode_steps, timings
from .openai_routes import register
from .schemas import ChatCompletionRequest, ChatMessage, GenerationRequest
from .service import Service, Submit, service_of, sse, stream

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
    """``POST /apply-template``: a chat request's ``messages``, ``tools`` and
    ``chat_template_kwargs`` (over the server's ``--chat-template-kwargs``). Its other fields
    (sampling, ``model``...) are ignored: they do not change the prompt; those that would and
    that we do not honour are refused (:data:`_REFUSED`)."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage] = Field(min_length=1)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


def split_prompt(prompt: Any) -> list[list[str | int]]:
    """llama-server's ``prompt`` as a list of prompts, each a list of texts and token ids: text,
    token ids, or both mixed in one list are one prompt; a list of those (without ids at its
    top level) and of ``{"prompt_string": text}`` objects is several prompts."""
    if isinstance(prompt, list) and prompt and not any(_is_id(p) for p in prompt):
        return [_one_prompt(p) for p in prompt]
    return [_one_prompt(prompt)]


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_prompt(prompt: Any) -> list[str | int]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, dict):
        if "multimodal_data" in prompt:
            raise ValueError("multimodal_data: this server reads no images or audio")
        text = prompt.get("prompt_string")
        if not isinstance(text, str) or len(prompt) != 1:
            raise ValueError('a prompt object is {"prompt_string": text}')
        return [text]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_id(p) for p in prompt):
        return list(prompt)
    raise ValueError("give text, token ids, both mixed in one list, or a list of prompts")


class NativeCompletionRequest(GenerationRequest):
    """``POST /completion``: llama-server's native completion. ``prompt`` (required): text (BOS
    added, special tokens parsed), token ids, both mixed, or several prompts answered as a list
    (:func:`split_prompt`; not streamed); ``n_predict``: the most tokens (-1: the server's
    limit); ``return_tokens``: the answer's token ids in ``tokens``; ``cache_prompt`` is taken
    and changes nothing (a slot whose cache the prompt continues is always reused). The
    sampling fields, ``stop``, ``ignore_eos``, ``json_schema`` and ``grammar`` are
    :class:`~.schemas.GenerationRequest`'s; ``n_probs``: the target's log-probability of each
    token with that many alternatives, as ``completion_probabilities``; ``response_fields``:
    only these fields of the last body, a path like ``generation_settings/n_predict`` reaching
    into an object (:func:`nested_values`); the sampler fields we do not run are refused unless
    neutral (:data:`~.schemas.UNSUPPORTED`)."""

    prompt: list[list[str | int]]
    return_tokens: bool = False
    response_fields: list[str] = Field(default_factory=list)
    cache_prompt: bool = True
    n_probs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)

    def top_logprobs(self) -> int | None:
        return self.n_probs or None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompts(cls, prompt: Any) -> list[list[str | int]]:
        return split_prompt(prompt)

    @field_validator("n_predict")
    @classmethod
    def _no_zero(cls, n: int | None) -> int | None:
        if n == 0:
            raise ValueError("n_predict must be -1 (the server's limit) or at least 1")
        return n


#: Fields of ``/apply-template`` that change the prompt and that we do not honour, with the
#: values that change nothing.
_REFUSED: dict[str, tuple[Any, ...]] = {
    "continue_final_message": (None, False),
    "chat_template": (None,),
}


def routes() -> APIRouter:
    """llama-server's simple routes."""
    out = router(LLAMA)
    register(out, "", llama=True)
    out.add_api_route("/tokenize", tokenize, methods=["POST"])
    out.add_api_route("/detokenize", detokenize, methods=["POST"])
    out.add_api_route("/apply-template", apply_template, methods=["POST"])
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        out.add_api_route(path, input_tokens, methods=["POST"])
    for path in ("/completion", "/completions"):
        out.add_api_route(path, completion, methods=["POST"])
    out.add_api_route("/slots", slots, methods=["GET"])
    out.add_api_route("/props", props, methods=["GET"])
    return out


def _end_tokens(service: Service) -> list[int]:
    """The vocabulary's end-of-generation tokens (read once, when first asked)."""
    pyramid = service.pyramid
    if service.eog is None:
        service.eog = [t for t in range(pyramid.n_vocab) if pyramid.is_eog(t)]
    return service.eog


def _check_ids(service: Service, tokens: list[int], param: str) -> None:
    n_vocab = service.pyramid.n_vocab
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ApiError(
            400,
            f"{param}: token id {bad} is not in the model's vocabulary (0 to {n_vocab - 1})",
            param=param,
        )


async def tokenize(request: Request, body: TokenizeRequest) -> dict[str, Any]:
    """``POST /tokenize``: texts and ids as the target's token ids (with their pieces)."""
    service = service_of(request)
    vocab = service.pyramid.vocab
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
    _check_ids(service, tokens, "content")
    if not body.with_pieces:
        return {"tokens": tokens}
    return {
        "tokens": [{"id": t, "piece": _piece(vocab.token_bytes(t, special=True))} for t in tokens]
    }


async def detokenize(request: Request, body: DetokenizeRequest) -> dict[str, Any]:
    """``POST /detokenize``: token ids as text."""
    service = service_of(request)
    _check_ids(service, body.tokens, "tokens")
    return {"content": service.pyramid.vocab.detokenize(body.tokens, special=True)}


async def apply_template(request: Request, body: ApplyTemplateRequest) -> dict[str, Any]:
    """``POST /apply-template``: a chat's prompt as the template renders it."""
    service = service_of(request)
    extra = body.model_extra or {}
    for name, neutral in _REFUSED.items():
        if name in extra and not any(extra[name] == n for n in neutral):
            raise ApiError(400, f"{name} is not supported", param=name)
    try:
        offered = parse_tool_request(body.tools, body.tool_choice, body.parallel_tool_calls)
    except UserError as e:
        raise ApiError(400, str(e), param="tools") from None
    shown = offered.tools if offered is not None and offered.choice.mode != "none" else None
    prompt = service.pyramid.apply_chat_template(
        [m.as_dict() for m in body.messages],
        service.settings.chat_template,
        tools=shown,
        add_generation_prompt=body.add_generation_prompt,
        template_kwargs=body.chat_template_kwargs,
    )
    return {"prompt": prompt}


async def input_tokens(request: Request, body: ChatCompletionRequest) -> dict[str, Any]:
    """``POST /chat/completions/input_tokens``: a chat's prompt length."""
    service = service_of(request)
    sampling = body.sampling(service.settings.sampling)
    messages = [m.as_dict() for m in body.messages]
    chat = service.pyramid.prepare_chat(
        messages,
        sampling,
        body.tool_request(),
        service.settings.chat_template,
        body.chat_template_kwargs,
    )
    return {"input_tokens": len(chat.tokens)}


def _tokens_of(service: Service, parts: list[str | int]) -> list[int]:
    """One prompt's tokens: its texts tokenized (BOS before a first text), ids kept; checked
    against the vocabulary and a slot's context."""
    vocab = service.pyramid.vocab
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            tokens += vocab.tokenize(part, add_special=i == 0, parse_special=True)
        else:
            tokens.append(part)
    _check_ids(service, tokens, "prompt")
    service.check_context(tokens)
    return tokens


async def completion(request: Request, body: NativeCompletionRequest) -> HTTPResponse:
    """The native ``POST /completion``: each prompt continued, in llama-server's shape."""
    service = service_of(request)
    pyramid = service.pyramid
    vocab = pyramid.vocab
    prompts = [_tokens_of(service, parts) for parts in body.prompt]
    if len(prompts) > 1 and body.stream:
        raise ApiError(400, "several prompts are not streamed: send one", param="prompt")
    sampling, spec = body.sampling(service.settings.sampling), body.spec(service.spec)
    settings = generation_settings(
        sampling, spec, body.stream, _end_tokens(service) if sampling.ignore_eos else ()
    ) | {"n_probs": body.n_probs}

    def submit(tokens: list[int]) -> Submit:
        def go(deliver: Deliver) -> Job:
            top = body.top_logprobs()
            return pyramid.submit(tokens, sampling, spec, deliver=deliver, logprobs=top)

        return go

    def shape(tokens: list[int], index: int) -> NativeShape:
        text = b"".join(vocab.token_bytes(t, special=True) for t in tokens)
        return NativeShape(
            model=service.model_name,
            prompt=text.decode("utf-8", errors="replace"),
            settings=settings,
            stops=sampling.stop,
            piece=vocab.token_bytes,
            n_ctx=service.n_ctx,
            return_tokens=body.return_tokens,
            index=index,
            fields=tuple(body.response_fields),
        )

    return await service.answer_all(
        request,
        [submit(t) for t in prompts],
        [shape(t, i) for i, t in enumerate(prompts)],
        body.stream,
        join=lambda bodies: bodies[0] if len(bodies) == 1 else list(bodies),
    )


async def slots(request: Request, fail_on_no_slot: bool = False) -> list[dict[str, Any]]:
    """``GET /slots``: each slot's context, whether it is busy, what its cache holds."""
    service = service_of(request)
    now = service.pyramid.snapshot()
    if fail_on_no_slot and all(now.slot_busy):
        raise ApiError(503, "no slot available", type="unavailable_error")
    n_ctx = service.pyramid.n_ctx
    return [
        {"id": i, "n_ctx": n_ctx, "is_processing": busy, "n_prompt_tokens": held}
        for i, (busy, held) in enumerate(zip(now.slot_busy, now.slot_cached, strict=True))
    ]


async def props(request: Request) -> dict[str, Any]:
    """``GET /props``: the default generation settings, slots, template, model and build."""
    service = service_of(request)
    pyramid = service.pyramid
    vocab = pyramid.vocab
    params = _params(service.settings.sampling)
    template = pyramid.template(service.settings.chat_template)
    return {
        "default_generation_settings": {"n_ctx": pyramid.n_ctx, "params": params},
        "total_slots": pyramid.snapshot().slots,
        "model_alias": service.model_name,
        "model_path": str(pyramid.model_path),
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


def _params(sampling: SamplingConfig) -> dict[str, Any]:
    """llama-server's sampling ``params`` of ``sampling``."""
    return {
        "seed": RANDOM_SEED if sampling.seed is None else sampling.seed,
        **{f.name: getattr(sampling, f.name) for f in SAMPLER_FIELDS},
        "dry_sequence_breakers": list(sampling.dry_sequence_breakers),
        "samplers": list(sampling.samplers),
        "n_predict": sampling.max_tokens,
        "stop": list(sampling.stop),
        "ignore_eos": sampling.ignore_eos,
    }


def generation_settings(
    sampling: SamplingConfig, spec: SpecConfig, stream: bool, banned: Sequence[int] = ()
) -> dict[str, Any]:
    """``/completion``'s ``generation_settings``: the settings the answer ran with.
    ``logit_bias`` lists the request's biases, then the ``banned`` tokens (``ignore_eos``'s end
    tokens), a bias of -inf shown as null, as llama-server shows them."""
    grammar = sampling.grammar
    biases = [*sampling.logit_bias, *((t, -math.inf) for t in banned)]
    return _params(sampling) | {
        "logit_bias": [
            {"bias": bias if math.isfinite(bias) else None, "token": token}
            for token, bias in biases
        ],
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
    #: A slot's context: an answer cut there is ``truncated``.
    n_ctx: int
    return_tokens: bool = False
    #: The prompt's place among a request's prompts.
    index: int = 0
    #: ``response_fields``: the paths the last body keeps (all of it when empty).
    fields: tuple[str, ...] = ()
    texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    #: The tokens' log-probabilities (``n_probs``), in ``completion_probabilities``' shape.
    probs: list[dict[str, Any]] = field(default_factory=list)

    def events(self, reader: Reader, first: Response) -> AsyncIterator[str]:
        """The streamed body (:func:`_native_events`); an error after the headers went out is
        an ``error`` chunk."""

        def events(steps: AsyncIterator[Response]) -> AsyncIterator[str]:
            return _native_events(steps, self)

        return stream(reader, first, events, lambda error: sse(error.body()))

    def whole(self, steps: list[Response]) -> dict[str, Any]:
        """The body of the whole answer."""
        for step in steps:
            self.add(step)
        return self.final(steps[-1], stream=False)

    def add(self, step: Response) -> None:
        self.texts.append(step.text)
        self.ids += step.token_ids
        self.probs += [_probability(lp) for lp in step.logprobs]

    def partial(self, step: Response) -> dict[str, Any]:
        """A streamed chunk of ``step``'s text and tokens (and their probabilities)."""
        chunk = {
            "index": self.index,
            "content": step.text,
            "tokens": list(step.token_ids),
            "stop": False,
            "tokens_predicted": step.stats.generated_tokens,
            "tokens_evaluated": step.stats.prompt_tokens,
        }
        if step.logprobs:
            chunk["completion_probabilities"] = [_probability(lp) for lp in step.logprobs]
        return chunk

    def final(self, last: Response, *, stream: bool) -> dict[str, Any]:
        """The last body (streamed: its content and tokens were in the chunks before)."""
        stats = last.stats
        content = "".join(self.texts)
        stop_type, word = self.stop_of(last.finish_reason, content, stats)
        body: dict[str, Any] = {
            "index": self.index,
            "content": "" if stream else content,
            "tokens": self.ids if self.return_tokens and not stream else [],
            "stop": True,
            "model": self.model,
            "tokens_predicted": stats.generated_tokens,
            "tokens_evaluated": stats.prompt_tokens,
            "generation_settings": self.settings,
            "prompt": self.prompt,
            "has_new_line": "\n" in content,
            # a prompt over the context is a 400; an answer may fill the context, and stop there
            "truncated": last.finish_reason == "length"
            and stats.prompt_tokens + stats.generated_tokens >= self.n_ctx,
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": stats.prompt_tokens + stats.generated_tokens,
            **native_timings(stats),
        }
        if self.probs and not stream:  # streamed: each chunk carried its tokens'
            body["completion_probabilities"] = self.probs
        return nested_values(self.fields, body) if self.fields else body

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


def nested_values(paths: Sequence[str], body: dict[str, Any]) -> dict[str, Any]:
    """llama-server's ``response_fields``: ``{path: value}`` for each path (keys joined by
    ``/``) that reaches a value through ``body``'s objects; the others are left out."""
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


def native_timings(stats: GenerationStats) -> dict[str, Any]:
    """``timings`` as llama-server's native answer has them, every value a number (with its
    ``prompt_per_token_ms`` and ``predicted_per_token_ms``, per decode step as its rate), and
    ours that are not numbers (``mode``, per-stage ``stages``) beside them under
    ``speculative``."""
    numbers = timings(stats)
    speculative = {"mode": numbers.pop("mode"), "stages": numbers.pop("stages")}
    per_token = {
        "prompt_per_token_ms": _per(numbers["prompt_ms"], numbers["prompt_n"]),
        "predicted_per_token_ms": _per(
            numbers["predicted_ms"], decode_steps(numbers["predicted_n"])
        ),
    }
    return {"timings": numbers | per_token, "speculative": speculative}


def _per(ms: float, n: int) -> float:
    return round(ms / n, 3) if n else 0.0


async def _native_events(steps: AsyncIterator[Response], shape: NativeShape) -> AsyncIterator[str]:
    """``/completion``'s stream: a ``data:`` chunk per step with text or tokens, then the last
    with ``stop: true`` and the totals (no ``[DONE]``, as llama-server's native stream)."""
    async for step in steps:
        shape.add(step)
        if step.text or step.token_ids:
            yield sse(shape.partial(step))
        if step.finish_reason is not None:
            yield sse(shape.final(step, stream=True))


def _probability(lp: TokenLogprob) -> dict[str, Any]:
    """One token of llama-server's ``completion_probabilities``: the target's log-probability
    before sampling, and its ``n_probs`` alternatives."""

    def entry(token: int, piece: bytes, logprob: float) -> dict[str, Any]:
        text = piece.decode("utf-8", errors="ignore")
        return {"id": token, "token": text, "bytes": list(piece), "logprob": logprob}

    top = [entry(*alt) for alt in lp.top]
    return entry(lp.token, lp.piece, lp.logprob) | {"top_logprobs": top}


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
