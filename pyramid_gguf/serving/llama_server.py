"""llama-server's simple routes, as its own server names and shapes them (``tools/server`` in
llama.cpp): OpenAI's routes without the ``/v1`` prefix (``/models``, ``/completions``,
``/chat/completions``: the same handlers, :func:`.openai_routes.register`), ``POST /tokenize``
(``content``, ``add_special``, ``parse_special``, ``with_pieces``), ``POST /detokenize``
(``tokens``), ``POST /apply-template`` (a chat's ``messages`` and ``tools`` -> ``prompt``) and
``GET /props`` (the default generation settings, slots, chat template, model path, build).

Nothing here generates: these read the target's vocabulary and chat template. A field that
would change the answer and that we do not honour is a 400, like every other route's.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ..chat import parse_tool_request
from ..core.errors import UserError
from .errors import ApiError
from .openai_routes import register
from .schemas import ChatMessage
from .service import Service

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

    @router.get("/props")
    async def props() -> dict[str, Any]:
        sampling = service.settings.sampling
        params = {
            "seed": RANDOM_SEED if sampling.seed is None else sampling.seed,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "n_predict": sampling.max_tokens,
            "stop": list(sampling.stop),
            "ignore_eos": sampling.ignore_eos,
        }
        template = pyramid.template(service.settings.chat_template)
        return {
            "default_generation_settings": {"n_ctx": target.n_ctx, "params": params},
            "total_slots": pyramid.snapshot().slots,
            "model_alias": service.model_name,
            "model_path": str(target.loaded.path),
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": False,
            "endpoint_props": False,
            "endpoint_metrics": True,
            "chat_template": template.source,
            "bos_token": vocab.token_text(vocab.bos),
            "eos_token": vocab.token_text(vocab.eos),
            "build_info": build_info(),
            "is_sleeping": False,
        }

    return router


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
