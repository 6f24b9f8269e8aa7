"""Embedding routes over an :class:`~pyramid_gguf.embeddings.Embedder` (``serve
--embedding-model``), a model of its own beside the ladder.

- OpenAI's ``POST /v1/embeddings``: ``input`` a text, a list of texts, token ids or lists of
  token ids, and llama-server's forms too: a list mixing texts and ids (one input), prompt
  objects ``{"prompt_string": text}`` and ``{"content": [{"type": "text", "text": ...}]}`` (the
  texts joined; image, audio and video parts are a 400: the model reads text);
  ``encoding_format`` ``float`` or ``base64`` (little-endian float32);
  ``dimensions`` only as the model's own length (a 400 otherwise: we do not shorten vectors);
  ``model`` ignored (the answer names the embedding model). Answered ``{"object": "list",
  "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}``.
- llama-server's ``POST /embeddings`` and legacy ``/embedding``: the same body (or ``content``
  for ``input``), answered ``[{"index", "embedding": [[...]]}]``: one vector per input, or one
  per token with pooling ``none`` (which OpenAI's route refuses, as llama-server does).
  ``embd_normalize`` (-1, 0, 2, p) is honoured on both.
- Ollama's ``POST /api/embed`` (``input`` a text or texts; ``truncate``, default true, keeps
  an input's first tokens that fit the context, false makes a too-long input a 400; ``options``
  and ``keep_alive`` change nothing here) answered ``{"model", "embeddings", "total_duration",
  "load_duration", "prompt_eval_count"}``, and its legacy ``POST /api/embeddings``
  (``prompt`` -> ``{"embedding": [...]}``, not normalised, as Ollama's).

Each dialect answers errors in its own shape (OpenAI's, Ollama's ``{"error": ...}``: the
routers' dialects); with no embedding model loaded every route is a 400 saying how to load one.
The model runs on a worker thread of the slots' pool, admitted through its one bounded queue
as every generation (a 503 when it is full, cancelled when the client leaves, stopped by the
server's shutdown), its calls taking turns.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response as HTTPResponse

from ..core.errors import ContextOverflow, UserError
from ..embeddings import Embedded, Embedder, Input
from .errors import ApiError
from .http_errors import LLAMA, OLLAMA, OPENAI, json_body, router
from .jobs import ClientGone
from .service import Service, service_of

NO_MODEL = (
    "no embedding model is loaded: start `pyramid-gguf serve` with --embedding-model FILE.gguf"
)


#: Content parts a text model cannot read (llama-server's multimodal prompt objects).
MEDIA_PARTS = ("image_url", "input_audio", "input_video")


def parse_inputs(value: Any, param: str = "input") -> list[Input]:
    """OpenAI's (and llama-server's) ``input``: a text, token ids (one input; a list mixing
    ids and texts is llama-server's one mixed prompt), a prompt object, or a non-empty list of
    texts, id lists and prompt objects."""
    if isinstance(value, str | dict):
        return [_input(value, param)]
    if not isinstance(value, list) or not value:
        raise ApiError(
            400,
            f"{param} must be a text, token ids, a prompt object or a non-empty list",
            param=param,
        )
    if any(_is_id(v) for v in value):
        return [_piece_list(value, param)]
    return [_input(v, f"{param}[{i}]") for i, v in enumerate(value)]


def _input(value: Any, param: str) -> Input:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return _prompt_object(value, param)
    return _piece_list(value, param)


def _prompt_object(value: dict[str, Any], param: str) -> str:
    """The text of llama-server's prompt object: ``{"prompt_string": text}`` (without
    ``multimodal_data``) or ``{"content": [parts]}``, its text parts joined."""
    if "prompt_string" in value:
        text = value["prompt_string"]
        if not isinstance(text, str):
            raise ApiError(400, f"{param}.prompt_string must be a text", param=param)
        if value.get("multimodal_data"):
            raise ApiError(400, f"{param}: the embedding model reads text only", param=param)
        return text
    parts = value.get("content")
    if not isinstance(parts, list):
        raise ApiError(
            400,
            f'{param} must be {{"prompt_string": text}} or {{"content": [parts]}}, the parts '
            'like {"type": "text", "text": ...}',
            param=param,
        )
    return "".join(_text_part(p, f"{param}.content[{i}]") for i, p in enumerate(parts))


def _text_part(part: Any, param: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    if kind in MEDIA_PARTS:
        raise ApiError(
            400, f"{param}: the embedding model reads text only, not {kind}", param=param
        )
    if kind == "text":
        raise ApiError(400, f"{param}.text must be a text", param=param)
    raise ApiError(400, f'{param}: unknown content part type {kind!r} (only "text")', param=param)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _piece_list(value: Any, param: str) -> list[int | str]:
    if not isinstance(value, list) or not all(_is_id(v) or isinstance(v, str) for v in value):
        raise ApiError(400, f"{param} must be a text or a list of token ids", param=param)
    return value


def _normalize(body: dict[str, Any]) -> int | None:
    p = body.get("embd_normalize")
    if p is not None and (not _is_id(p) or p < -1 or p == 1):
        raise ApiError(400, f"embd_normalize must be -1, 0, 2 or more, got {p!r}")
    return p


def _vector(v: np.ndarray, b64: bool) -> Any:
    if b64:
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return v.tolist()


def openai_body(result: Embedded, model: str, b64: bool) -> dict[str, Any]:
    """OpenAI's answer of pooled vectors (``[n, n_embd]``)."""
    data = []
    for i, v in enumerate(result.vectors):
        item = {"object": "embedding", "index": i, "embedding": _vector(v, b64)}
        data.append(item | ({"encoding_format": "base64"} if b64 else {}))
    usage = {"prompt_tokens": result.total_tokens, "total_tokens": result.total_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def native_body(result: Embedded) -> list[dict[str, Any]]:
    """llama-server's non-OpenAI answer: per input a list of vectors (one when pooled)."""
    rows = [v[None, :] if v.ndim == 1 else v for v in result.vectors]
    return [{"index": i, "embedding": r.tolist()} for i, r in enumerate(rows)]


def routes() -> list[APIRouter]:
    """Every embedding route, each on its dialect's router (answering how to load a model
    without one)."""
    openai, llama, ollama = router(OPENAI), router(LLAMA), router(OLLAMA)
    openai.add_api_route("/v1/embeddings", v1_embeddings, methods=["POST"])
    for path in ("/embeddings", "/embedding"):
        llama.add_api_route(path, native_embeddings, methods=["POST"])
    ollama.add_api_route("/api/embed", api_embed, methods=["POST"])
    ollama.add_api_route("/api/embeddings", api_embeddings, methods=["POST"])
    return [openai, llama, ollama]


def _loaded(request: Request) -> tuple[Service, Embedder]:
    """The request's service and its embedding model (a 400 saying how to load one)."""
    service = service_of(request)
    embedder = request.app.state.embedder
    if embedder is None:
        raise ApiError(400, NO_MODEL)
    assert isinstance(embedder, Embedder)
    return service, embedder


async def _run(
    request: Request, inputs: list[Input], truncate: bool, normalize: int | None
) -> Embedded | HTTPResponse:
    """The inputs' vectors, computed on a worker of the slots' pool (admitted through its one
    bounded queue: a 503 when it is full); a bare 499 when the client left first."""
    service, model = _loaded(request)

    def task() -> Embedded:
        return model.run(inputs, truncate=truncate, normalize=normalize)

    try:
        return await service.run(request, task)
    except ClientGone:
        return HTTPResponse(status_code=499)
    except ContextOverflow as e:
        raise ApiError(400, str(e), code="context_length_exceeded") from None
    except UserError as e:
        raise ApiError(400, str(e)) from None


async def _llama_or_openai(request: Request, oai: bool) -> HTTPResponse:
    body = await json_body(request)
    _, model = _loaded(request)
    if "input" in body:
        value = body["input"]
    elif "content" in body:  # llama-server's own field: its own answer too
        value, oai = body["content"], False
    else:
        raise ApiError(400, '"input" or "content" must be provided')
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise ApiError(400, f'encoding_format must be "float" or "base64", got {fmt!r}')
    dims = body.get("dimensions")
    if dims is not None and dims != model.n_embd:
        raise ApiError(
            400,
            f"dimensions {dims!r} is not supported: this model's vectors have "
            f"{model.n_embd} (send {model.n_embd} or omit it)",
            param="dimensions",
        )
    if oai and model.pooling == "none":
        raise ApiError(
            400,
            "pooling 'none' gives one vector per token, which OpenAI's shape cannot hold: "
            "use /embeddings, or start serve with --pooling mean, cls or last",
        )
    result = await _run(request, parse_inputs(value), False, _normalize(body))
    if not isinstance(result, Embedded):
        return result
    if not oai:
        return JSONResponse(native_body(result))
    return JSONResponse(openai_body(result, model.name, fmt == "base64"))


async def v1_embeddings(request: Request) -> HTTPResponse:
    """OpenAI's ``POST /v1/embeddings``."""
    return await _llama_or_openai(request, oai=True)


async def native_embeddings(request: Request) -> HTTPResponse:
    """llama-server's ``POST /embeddings`` and ``/embedding``."""
    return await _llama_or_openai(request, oai=False)


def _checked_dimensions(body: dict[str, Any], model: Embedder) -> None:
    dims = body.get("dimensions")
    if dims not in (None, 0, model.n_embd):
        raise ApiError(
            400,
            f"dimensions {dims!r} is not supported: this model's vectors have {model.n_embd}",
        )


def _pooled(model: Embedder) -> None:
    if model.pooling == "none":
        raise ApiError(
            400, "pooling 'none' gives no vector per input: start serve with --pooling mean"
        )


async def api_embed(request: Request) -> HTTPResponse:
    """Ollama's ``POST /api/embed``."""
    started = time.monotonic()
    body = await json_body(request)
    _, model = _loaded(request)
    value = body.get("input")
    if isinstance(value, str):
        inputs: list[Input] = [value] if value else []
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        inputs = list(value)
    elif value is None:
        inputs = []
    else:
        raise ApiError(400, "input must be a string or a list of strings")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ApiError(400, f"truncate must be true or false, got {truncate!r}")
    _checked_dimensions(body, model)
    name = str(body.get("model") or model.name)
    if not inputs:  # Ollama's answer to nothing: the model is there, no vectors
        return JSONResponse({"model": name, "embeddings": []})
    _pooled(model)
    result = await _run(request, inputs, truncate, None)
    if not isinstance(result, Embedded):
        return result
    assert isinstance(result.vectors, np.ndarray)
    return JSONResponse(
        {
            "model": name,
            "embeddings": result.vectors.tolist(),
            "total_duration": int((time.monotonic() - started) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": result.total_tokens,
        }
    )


async def api_embeddings(request: Request) -> HTTPResponse:
    """Ollama's legacy ``POST /api/embeddings``."""
    body = await json_body(request)
    _, model = _loaded(request)
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string")
    if not prompt:
        return JSONResponse({"embedding": []})
    _pooled(model)
    result = await _run(request, [prompt], False, -1)
    if not isinstance(result, Embedded):
        return result
    return JSONResponse({"embedding": result.vectors[0].tolist()})
