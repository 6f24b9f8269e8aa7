"""``pyramid-gguf serve``: the OpenAI-compatible server (:mod:`pyramid_gguf.serving.app`) on
uvicorn.

The address is bound before any model is loaded, so a port in use or an unknown host fails at
once with one ``Error:`` line; uvicorn then serves on that socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Any

import click

from ..api import Pyramid
from ..core.errors import UserError
from ..core.load import MAX_PARALLEL, LoadConfig
from ..core.sampling import SamplingConfig
from ..embeddings import POOLING, Embedder, EmbeddingConfig
from ..serving.settings import ServerSettings, resolve_chat_format
from .ladders import load_pyramid, resolve_ladder
from .options import LadderArgs, command, ladder_options, spec_config_from, spec_options

__all__ = ["serve"]


@command()
@ladder_options
@spec_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--api-key",
    envvar="PYRAMID_GGUF_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' (or 'X-Api-Key: KEY') on every route but /health "
    "and /metrics (env PYRAMID_GGUF_API_KEY).",
)
@click.option(
    "--cors-origins",
    default="*",
    show_default=True,
    help="Comma-separated origins a browser page may call from ('*': any, as llama-server; "
    "'': none).",
)
@click.option(
    "--metrics/--no-metrics",
    default=True,
    show_default=True,
    help="Serve GET /metrics (off: it answers 501, as llama-server without --metrics).",
)
@click.option(
    "--slots/--no-slots",
    default=True,
    show_default=True,
    help="Serve GET /slots (off: it answers 501, as llama-server with --no-slots).",
)
@click.option(
    "--parallel",
    "-np",
    type=click.IntRange(1, MAX_PARALLEL),
    default=1,
    show_default=True,
    help="Requests decoded at once, batched together (each slot gets --ctx-size tokens of "
    "KV cache).",
)
@click.option(
    "--queue-size",
    type=int,
    default=16,
    show_default=True,
    help="Requests admitted at once (the running ones included); more get 503.",
)
@click.option(
    "--embedding-model",
    metavar="FILE.gguf",
    default=None,
    help="A model of its own for the embedding routes (/v1/embeddings, /embeddings, Ollama's "
    "/api/embed) [default: none; they answer 400].",
)
@click.option(
    "--pooling",
    type=click.Choice(list(POOLING)),
    default=None,
    help="How --embedding-model pools its tokens [default: its GGUF's pooling_type; a model "
    "without one: none, llama.cpp's default, one vector per token].",
)
@click.option(
    "--embedding-ctx-size",
    type=int,
    default=512,
    show_default=True,
    help="Most tokens of one input to --embedding-model (and of one batch of inputs).",
)
@click.option(
    "--chat-template",
    "--chat-format",
    "chat_format",
    metavar="NAME|FILE|TEXT",
    default=None,
    help="Chat template: a llama.cpp name (chatml, llama3, gemma, mistral-v7, ...), a Jinja "
    "file or Jinja text [default: the target GGUF's tokenizer.chat_template].",
)
@click.option(
    "--chat-template-kwargs",
    metavar="JSON",
    default=None,
    help="Variables for the chat template, a JSON object (as llama-server's: "
    "'{\"enable_thinking\": false}'); a request's chat_template_kwargs override them.",
)
@click.option(
    "--ngram-pool/--no-ngram-pool",
    default=True,
    show_default=True,
    help="Let the n-gram drafter search earlier answers too (a repeated or similar request "
    "drafts from them; lossless modes stay lossless). --no-ngram-pool: each request drafts "
    "from its own text only.",
)
@click.option(
    "--model-name",
    "--alias",
    "model_name",
    default=None,
    help="Model id reported by /v1/models [default: the preset or target file name].",
)
@click.option(
    "--temp",
    "temperature",
    type=float,
    default=None,
    help="Default sampling temperature of requests that send none (llama-server's --temp) "
    "[default: 0.8].",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Default sampling seed of requests that send none (-1: random) [default: random].",
)
@click.option(
    "--n-predict",
    "-n",
    "n_predict",
    type=int,
    default=None,
    help="Default most tokens of an answer whose request sends no limit (-1: until the context "
    "is full, as llama-server) [default: 256].",
)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
    help="uvicorn log level.",
)
def serve(**params: Any) -> None:
    """OpenAI-compatible server: /v1/completions, /v1/chat/completions, /v1/models, /health,
    /metrics.

    One engine answers up to --parallel requests at once from a bounded queue, every slot's
    tokens in one batch per model (auto prices each slot's speculation against that batch);
    responses carry usage and llama-server style timings with per-stage draft statistics.
    Ctrl-C cancels the requests in flight (they get a 503) and stops.

    Greedy answers may change once the server has answered similar requests: the prompt cache
    and the shared n-gram pool change how a prompt is evaluated and which blocks are verified,
    which moves floating-point near-ties (as llama-server's prompt cache does).
    --strict-identity makes greedy output match plain target decoding exactly.
    """
    if params["queue_size"] < params["parallel"]:
        raise UserError(
            f"--queue-size ({params['queue_size']}) must be at least --parallel "
            f"({params['parallel']}): the running requests count against it"
        )
    settings = ServerSettings(
        api_key=params["api_key"],
        queue_size=params["queue_size"],
        model_name=params["model_name"],
        chat_template=resolve_chat_format(params["chat_format"]),
        sampling=default_sampling(params),
        cors_origins=tuple(o.strip() for o in params["cors_origins"].split(",") if o.strip()),
        metrics=params["metrics"],
        slots=params["slots"],
        chat_template_kwargs=template_kwargs(params["chat_template_kwargs"]),
    )
    args = LadderArgs.from_params(params)
    sockets = listen(params["host"], params["port"])
    if args.rpc is not None and not params.get("worker"):
        from ..serving.supervisor import supervise  # the models in a process a lost link may end

        try:
            supervise(params, sockets, args.rpc.endpoints)
        finally:
            for sock in sockets:
                sock.close()
        return
    embedder = None
    try:
        embedder = load_embedder(params, args.load)
        resolved = resolve_ladder(args)
        spec = spec_config_from(params, resolved.spec)
        with load_pyramid(args, resolved, spec, share_ngrams=params["ngram_pool"]) as pyramid:
            _serve(pyramid, settings, sockets, params, embedder)
    finally:
        if embedder is not None:
            embedder.close()
        for sock in sockets:
            sock.close()


def worker() -> None:
    """A worker process of ``serve --rpc`` (:mod:`pyramid_gguf.serving.supervisor`): the
    server on loopback at the port its front chose, the parameters from its environment."""
    from ..serving.supervisor import WORKER_ENV

    params = json.loads(os.environ[WORKER_ENV])
    params.update(host="127.0.0.1", worker=True)  # the key and CORS are checked here, as ever
    try:
        assert serve.callback is not None
        serve.callback(**params)
    except UserError as e:
        click.echo(f"Error: {e}", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def default_sampling(params: dict[str, Any]) -> SamplingConfig:
    """The sampling of a request that sends none: ``--temp``, ``--seed``, ``--n-predict``
    (-1: the context's limit, the largest context a ladder may have)."""
    changes: dict[str, Any] = {}
    if params["temperature"] is not None:
        changes["temperature"] = params["temperature"]
    if params["seed"] is not None:
        changes["seed"] = params["seed"]
    n = params["n_predict"]
    if n is not None:
        changes["max_tokens"] = params["n_ctx"] if n == -1 else n
    return SamplingConfig(**changes)


def template_kwargs(text: str | None) -> dict[str, Any]:
    """``--chat-template-kwargs``: a JSON object (a one-line UserError for anything else)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UserError(f"--chat-template-kwargs is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise UserError("--chat-template-kwargs must be a JSON object, e.g. '{\"a\": 1}'")
    return value


def load_embedder(params: dict[str, Any], load: LoadConfig) -> Embedder | None:
    """``--embedding-model`` loaded with ``--pooling``, the ladder's threads and GPU layers;
    None without it."""
    path = params["embedding_model"]
    if path is None:
        if params["pooling"] is not None:
            raise UserError("--pooling applies to --embedding-model: give one")
        return None
    cfg = EmbeddingConfig(
        pooling=params["pooling"],
        n_ctx=params["embedding_ctx_size"],
        n_gpu_layers=load.n_gpu_layers,
        n_threads=load.n_threads,
    )
    embedder = Embedder.load(path, cfg)
    click.echo(
        f"embeddings: {embedder.name} (pooling {embedder.pooling}, {embedder.n_embd} "
        f"dimensions, inputs up to {embedder.n_ctx} tokens)",
        err=True,
    )
    return embedder


def _serve(
    pyramid: Pyramid,
    settings: ServerSettings,
    sockets: list[socket.socket],
    params: dict[str, Any],
    embedder: Embedder | None = None,
) -> None:
    import uvicorn

    from ..serving.app import Server, create_app

    app = create_app(pyramid, settings, embedder)
    host, port = params["host"], sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    click.echo(
        f"serving {settings.model_name or pyramid.name} (mode {pyramid.spec.mode}) "
        f"on http://{shown}:{port}/v1",
        err=True,
    )
    config = uvicorn.Config(app, log_level=params["log_level"], timeout_graceful_shutdown=5)
    server = Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # the Ctrl-C that stopped it: exit 0
        server.run(sockets=sockets)
    if not server.started:
        raise UserError("the server did not start (see uvicorn's log above)")


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address ``host`` resolves to (as asyncio's servers bind them),
    or a one-line :class:`UserError` (unknown host, port in use, no permission)."""
    where = f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"cannot listen on {where}: {getattr(e, 'strerror', None) or e}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr[0], port, *addr[2:]))
            port = sock.getsockname()[1]  # port 0: the free port found, for every address
    except OSError as e:
        for sock in sockets:
            sock.close()
        raise UserError(f"cannot listen on {where}: {e.strerror or e}") from None
    return sockets
