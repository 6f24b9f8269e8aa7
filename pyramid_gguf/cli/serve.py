"""``pyramid-gguf serve``: the OpenAI-compatible server (:mod:`pyramid_gguf.server`) on uvicorn."""

from __future__ import annotations

from typing import Any

import click

from .ladders import load_pyramid, resolve_ladder
from .options import LadderArgs, command, ladder_options, spec_config_from, spec_options

__all__ = ["serve"]


@command()
@ladder_options
@spec_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--api-key",
    envvar="PYRAMID_GGUF_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1 (env PYRAMID_GGUF_API_KEY).",
)
@click.option(
    "--queue-size",
    type=int,
    default=16,
    show_default=True,
    help="Requests admitted at once (the running one included); more get 503.",
)
@click.option(
    "--chat-format",
    metavar="NAME|FILE",
    default=None,
    help="Chat template: 'chatml', a Jinja file or template text "
    "[default: the target GGUF's tokenizer.chat_template].",
)
@click.option(
    "--model-name",
    "--alias",
    "model_name",
    default=None,
    help="Model id reported by /v1/models [default: the preset or target file name].",
)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
    help="uvicorn log level.",
)
def serve(**params: Any) -> None:
    """OpenAI-compatible server: /v1/completions, /v1/chat/completions, /v1/models, /health.

    One engine answers requests one at a time from a bounded queue; responses carry usage and
    llama-server style timings with per-stage draft statistics.
    """
    import uvicorn

    from ..serving.app import create_app
    from ..serving.settings import ServerSettings, resolve_chat_format

    settings = ServerSettings(
        api_key=params["api_key"],
        queue_size=params["queue_size"],
        model_name=params["model_name"],
        chat_template=resolve_chat_format(params["chat_format"]),
    )
    args = LadderArgs.from_params(params)
    resolved = resolve_ladder(args)
    spec = spec_config_from(params, resolved.spec)
    pyramid = load_pyramid(args, resolved, spec, share_ngrams=True)
    try:
        app = create_app(pyramid, settings)
        click.echo(
            f"serving {settings.model_name or pyramid.name} (mode {pyramid.spec.mode}) "
            f"on http://{params['host']}:{params['port']}/v1",
            err=True,
        )
        uvicorn.run(
            app,
            host=params["host"],
            port=params["port"],
            log_level=params["log_level"],
            timeout_graceful_shutdown=5,
        )
    finally:
        pyramid.close()
