"""``pyramid-gguf run``: answer one prompt with a ladder, streaming text to stdout, or chat.

Statistics go to stderr (one line, plus per-stage detail with ``--verbose``); ``--json`` prints
one JSON object to stdout instead of streaming. Ctrl-C keeps what was generated (its JSON object
says ``"finish_reason": "interrupted"``) and exits 130.

With no prompt and a terminal on stdin, ``run`` is an interactive chat (as ``ollama run`` and
``llama-cli -cnv``): each turn sends the whole conversation through the target's chat
template, and the target's KV cache, which still holds the conversation so far, spares
evaluating it again. ``/bye`` or Ctrl-D leaves; Ctrl-C stops an answer.
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from ..api import GenerationStats, Pyramid
from ..core.errors import UserError
from ..core.sampling import SamplingConfig
from ..core.spec import SpecConfig
from ..core.textstream import encode_utf8
from ..native.rpc import abort_hook
from .ladders import load_pyramid, resolve_ladder
from .options import (
    LadderArgs,
    chat_template_from,
    chat_template_option,
    command,
    grammar_options,
    ladder_options,
    sampling_config_from,
    sampling_options,
    spec_config_from,
    spec_options,
)

CHAT_HELP = (
    "/bye (or Ctrl-D) leaves, /clear forgets the conversation, /help shows this; "
    'a message between """ lines may span lines; Ctrl-C stops an answer'
)


def stdin_is_terminal() -> bool:
    """Whether stdin is a terminal (then ``run`` without a prompt opens a chat)."""
    return sys.stdin.isatty()


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str | None:
    """The prompt from ``-p``, ``--file`` or piped stdin (exactly one), checked to be UTF-8.

    None when none is given and stdin is a terminal: the interactive chat.
    """
    given = [p for p in (prompt, prompt_file) if p is not None]
    if len(given) > 1:
        raise UserError("give the prompt once: -p/--prompt or -f/--file, not both")
    if prompt is not None:
        encode_utf8(prompt, "the prompt (-p)")
        return prompt
    if prompt_file is not None:
        try:
            return prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read prompt file {prompt_file}: {e}") from None
    if stdin_is_terminal():
        return None
    try:
        text = sys.stdin.read()
    except UnicodeDecodeError as e:
        raise UserError(f"the prompt on stdin is not valid UTF-8: {e.reason}") from None
    if text:
        encode_utf8(text, "the prompt on stdin")
        return text
    raise UserError("no prompt: use -p TEXT, -f FILE, or pipe text on stdin")


@command()
@click.option("--prompt", "-p", default=None, help="Prompt text.")
@click.option(
    "--file",
    "-f",
    "prompt_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Read the prompt from a file.",
)
@click.option(
    "--chat/--raw",
    default=None,
    help="Send the prompt as a user message through the target GGUF's chat template, or as "
    "raw text [default: chat when the target has a template].",
)
@click.option("--system", default=None, help="System message (implies --chat).")
@chat_template_option
@ladder_options
@sampling_options
@grammar_options
@spec_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text and stats).")
@click.option("--verbose", "-v", is_flag=True, help="Per-stage and per-tier statistics on stderr.")
def run(
    prompt: str | None,
    prompt_file: Path | None,
    chat: bool | None,
    system: str | None,
    chat_template: str | None,
    as_json: bool,
    verbose: bool,
    **params: Any,
) -> None:
    """Generate an answer to a prompt.

    \b
    pyramid-gguf run -p "def quicksort(xs):"                      # default ladder
    pyramid-gguf run --draft 1b.gguf --qualifier 3b.gguf --target 8b.gguf -p "..."
    pyramid-gguf run --draft ngram --target 8b.gguf --mode sd -f prompt.txt
    """
    text = read_prompt(prompt, prompt_file)
    template = chat_template_from(chat_template)
    sampling = sampling_config_from(params)
    if system is not None and chat is False:
        raise UserError("--system needs the chat template; drop --raw")
    if chat_template is not None and chat is False:
        raise UserError("--chat-template renders a chat; drop --raw")
    if system is not None:
        encode_utf8(system, "--system")
    if text is None and (as_json or chat is False):
        flag = "--json" if as_json else "--raw"
        raise UserError(f"{flag} needs a prompt: use -p TEXT, -f FILE, or pipe text on stdin")
    args = LadderArgs.from_params(params)
    resolved = resolve_ladder(args)
    spec = spec_config_from(params, resolved.spec)
    with load_pyramid(args, resolved, spec) as pyramid:
        if text is None:
            chat_session(pyramid, sampling, spec, system=system, verbose=verbose, template=template)
            return
        if chat is None:
            chat = system is not None or template is not None or pyramid.chat_template is not None
        if chat:
            messages = [{"role": "user", "content": text}]
            if system is not None:
                messages.insert(0, {"role": "system", "content": system})
            tokens: list[int] = pyramid.chat_tokens(messages, template)
            if verbose:
                click.echo(f"chat template: {pyramid.template(template).name}", err=True)
        else:
            tokens = pyramid.tokenize(text)
        result = _generate(pyramid, tokens, sampling, spec, stream_text=not as_json)
        weights = {t.name: t.weights for t in pyramid.tiers()}
        _report(result, pyramid.name, as_json=as_json, verbose=verbose, weights=weights)
        if result.finish_reason == "interrupted":
            raise KeyboardInterrupt  # after the partial answer: exit 130, as on any Ctrl-C


def chat_session(
    pyramid: Pyramid,
    sampling: SamplingConfig,
    spec: SpecConfig,
    *,
    system: str | None,
    verbose: bool,
    template: str | None = None,
) -> None:
    """The interactive chat: read a message, answer it through the chat template (``template``,
    Jinja text; None: the target GGUF's), repeat.

    The whole conversation is templated again each turn; the prefix that the target's KV cache
    still holds (everything before the new message, where the answers' tokens are how their
    text tokenizes) is not evaluated again. A turn that no longer fits the context is refused
    (and forgotten) without ending the chat.
    """
    if template is None and pyramid.chat_template is None:
        click.echo(
            f"{pyramid.model_path.name} has no chat template: using the built-in ChatML",
            err=True,
        )
    with contextlib.suppress(ImportError):  # not on every platform
        import readline  # noqa: F401  (line editing and history for input())
    start = [{"role": "system", "content": system}] if system is not None else []
    messages: list[dict[str, Any]] = list(start)
    click.echo(f"chatting with {pyramid.name} (mode {spec.mode}): {CHAT_HELP}", err=True)
    while True:
        try:
            text = _read_message()
        except EOFError:  # Ctrl-D
            click.echo("")
            return
        command = text.strip()
        if not command:
            continue
        if command in ("/bye", "/exit", "/quit"):
            return
        if command == "/clear":
            messages = list(start)
            click.echo("(conversation cleared)", err=True)
            continue
        if command in ("/help", "/?"):
            click.echo(CHAT_HELP, err=True)
            continue
        if command.startswith("/") and " " not in command:
            click.echo(f"unknown command {command}; /help lists them", err=True)
            continue
        try:
            encode_utf8(text, "the message")
            turn = [*messages, {"role": "user", "content": text}]
            tokens = pyramid.chat_tokens(turn, template)
            result = _generate(pyramid, tokens, sampling, spec, stream_text=True)
        except UserError as e:  # the conversation outgrew the context, ...
            click.echo(f"Error: {e}", err=True)
            continue
        click.echo("")
        messages += [
            {"role": "user", "content": text},
            {"role": "assistant", "content": result.text},
        ]
        if verbose and result.stats is not None:
            _print_stats(result.stats, verbose=True)


def _read_message() -> str:
    """One message from the terminal: a line, or the lines between triple quotes."""
    line = input(">>> ")
    if not line.lstrip().startswith('"""'):
        return line
    rest = line.lstrip()[3:]
    lines = []
    while not rest.rstrip().endswith('"""'):
        lines.append(rest)
        rest = input("... ")
    lines.append(rest.rstrip()[:-3])
    return "\n".join(lines).strip("\n")


@dataclass
class _Result:
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    stats: GenerationStats | None = None


def _generate(
    pyramid: Pyramid,
    tokens: list[int],
    sampling: SamplingConfig,
    spec: SpecConfig,
    *,
    stream_text: bool,
) -> _Result:
    """Run the generation, echoing text as it comes when ``stream_text``. Ctrl-C ends it with
    finish reason ``interrupted``, keeping what was generated."""
    out = _Result()
    pieces: list[str] = []

    def lost(line: str) -> None:
        """llama.cpp aborts (an RPC server lost): the answer so far before the exit."""
        if not stream_text:
            doc = {"text": "".join(pieces), "tokens": out.tokens, "finish_reason": "error"}
            click.echo(json.dumps({**doc, "error": line}, indent=2))

    try:
        with abort_hook(lost):
            for step in pyramid.stream(tokens, sampling, spec):
                pieces.append(step.text)
                out.tokens += step.token_ids
                out.stats = step.stats
                if stream_text and step.text:
                    click.echo(step.text, nl=False)
                    sys.stdout.flush()
                out.finish_reason = step.finish_reason or out.finish_reason
    except KeyboardInterrupt:
        out.finish_reason = "interrupted"
        if out.stats is not None:
            out.stats.finish_reason = "interrupted"
    out.text = "".join(pieces)
    return out


def _report(
    result: _Result, model: str, *, as_json: bool, verbose: bool, weights: dict[str, str]
) -> None:
    """The answer as one JSON object, or the stats line (and ``-v`` detail, with where each
    tier's weights are) on stderr."""
    stats = result.stats
    if as_json:
        doc = {
            "text": result.text,
            "tokens": result.tokens,
            "finish_reason": result.finish_reason,
            "model": model,
            "stats": stats.to_dict() if stats is not None else None,
        }
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo("")
    sys.stdout.flush()
    if stats is not None:
        _print_stats(stats, verbose=verbose, weights=weights)


def _print_stats(
    stats: GenerationStats, *, verbose: bool, weights: dict[str, str] | None = None
) -> None:
    """The stats line on stderr, and with ``verbose`` per-stage, per-tier and ``auto`` detail
    (and where each tier's ``weights`` are)."""
    click.echo(stats.summary(), err=True)
    if not verbose:
        return
    for s in stats.stages:
        click.echo(
            f"  {s.name}: draft_n={s.draft_n} draft_n_accepted={s.draft_n_accepted} "
            f"mean_accepted={s.mean_accepted:.2f} histogram={s.histogram}",
            err=True,
        )
    for t in stats.tiers:
        click.echo(
            f"  {t.name}: {t.n_evals} evals, {t.n_tokens} tokens, {t.seconds:.3f} s", err=True
        )
    click.echo(f"  scheduler: {stats.scheduler_seconds:.3f} s", err=True)
    for name, where in (weights or {}).items():
        click.echo(f"  {name} weights: {where}", err=True)
    for line in stats.auto.details() if stats.auto is not None else []:
        click.echo(f"  {line}", err=True)
