"""Option groups shared by the commands, and the typed configs built from them.

Each decorator adds a group of flags; each ``*_from`` function turns the parsed flags into a
frozen object (:class:`LadderArgs`, :class:`~pyramid_gguf.core.sampling.SamplingConfig`,
:class:`~pyramid_gguf.core.spec.SpecConfig`), so commands pass typed configs, never loose kwargs.
The speculative flags are generated from :data:`~pyramid_gguf.core.spec.SPEC_KNOBS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from ..core.errors import UserError
from ..core.grammar import Grammar
from ..core.ladder import DRAFTERS, TIERS, LadderPaths
from ..core.load import KV_TYPES, LoadConfig, default_threads
from ..core.remote import RpcConfig
from ..core.sampling import SAMPLER_FIELDS, SamplerField, SamplingConfig, parse_samplers
from ..core.spec import SPEC_KNOBS, SpecConfig
from ..grammar import check_grammar
from ..serving.settings import resolve_chat_format

F = TypeVar("F", bound=Callable[..., Any])

#: The config classes' own defaults: flags show them, never restate them.
LOAD = LoadConfig()
SAMPLING = SamplingConfig()


def one_line(e: click.UsageError, path: str) -> click.ClickException:
    """Click's usage error as our one ``Error:`` line, pointing at ``path``'s help."""
    return click.ClickException(f"{e.format_message()} (see '{path} --help')")


def command_path(parent: click.Context | None, info_name: str | None) -> str:
    return " ".join(filter(None, [parent.command_path if parent else "", info_name]))


class OneLineUsage:
    """Mixed into a click command or group: a malformed command line (unknown flag, a value of
    the wrong type, an invalid choice) is one ``Error:`` line and exit status 1, where click
    would answer with its usage block and status 2. No arguments at all still shows help."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)  # type: ignore[misc]
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as e:
            raise one_line(e, command_path(parent, info_name)) from None


class PyramidCommand(OneLineUsage, click.Command):
    """A click command whose bad input is one ``Error:`` line and exit status 1: a malformed
    command line (:class:`OneLineUsage`) and a :class:`UserError` raised while running."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as e:
            raise click.ClickException(str(e)) from None


def command(**attrs: Any) -> Callable[[F], click.Command]:
    """``click.command`` with :class:`PyramidCommand` (user errors as one line)."""
    return click.command(cls=PyramidCommand, **attrs)


def _apply(options: list[Callable[[F], F]], f: F) -> F:
    for option in reversed(options):
        f = option(f)
    return f


#: Single options shared with commands that take paths but not a whole ladder (``plan``).
ctx_size_option = click.option(
    "--ctx-size",
    "-c",
    "n_ctx",
    type=int,
    default=LOAD.n_ctx,
    show_default=True,
    help="Context window of each model, in tokens.",
)
batch_size_option = click.option(
    "--batch-size",
    "-b",
    "n_batch",
    type=int,
    default=LOAD.n_batch,
    show_default=True,
    help="Largest llama_decode batch.",
)
cache_type_k_option = click.option(
    "--cache-type-k",
    "type_k",
    type=click.Choice(KV_TYPES),
    default=LOAD.type_k,
    show_default=True,
    help="KV cache type for K.",
)
cache_type_v_option = click.option(
    "--cache-type-v",
    "type_v",
    type=click.Choice(KV_TYPES),
    default=LOAD.type_v,
    show_default=True,
    help="KV cache type for V.",
)

#: System RAM as a budget, beside ``--vram`` (``planning/ram.py``).
ram_option = click.option(
    "--ram",
    metavar="SIZE|auto",
    default="auto",
    show_default=True,
    help="System RAM to plan for, e.g. 32GiB, 16GB (auto: this machine's, from /proc/meminfo): "
    "placements whose host memory exceeds it, less a reserve of max(2GiB, 10%) for the OS, "
    "are not ranked.",
)


#: Where llama.cpp keeps the weights left on the CPU beside a GPU (``LoadConfig.use_mmap`` /
#: ``no_host``), and the card's link the planner prices op offload over (``LoadConfig.pcie``).
placement_options = [
    click.option(
        "--no-mmap",
        "no_mmap",
        is_flag=True,
        help="Read the weights instead of mapping the file: beside a GPU, CPU layers go to its "
        "pinned host buffer (op offload copies them at the link's rate; RAM not shared).",
    ),
    click.option(
        "--no-host",
        "no_host",
        is_flag=True,
        help="llama.cpp's --no-host: CPU layers repacked for the CPU's kernels instead of the "
        "GPU's host buffer (faster small batches; op offload cannot copy them).",
    ),
    click.option(
        "--pcie",
        metavar="GEN:LANES",
        default=None,
        help="The GPU's PCIe link for predictions, e.g. 4:16, 5:8 [default: the card profile's].",
    ),
]


def ladder_options(f: F) -> F:
    """``--draft/--qualifier/--target/--preset`` and how each model is loaded."""
    return _apply(
        [
            click.option(
                "--target", "-m", "target", metavar="GGUF", help="Target (largest) model."
            ),
            click.option(
                "--qualifier", metavar="GGUF", help="Qualifier (mid-size) model, for psd-* modes."
            ),
            click.option(
                "--draft",
                metavar="|".join(["GGUF", *DRAFTERS]),
                help="Draft (smallest) model, or a drafter: "
                + "; ".join(f"'{d}' for {d.summary}" for d in DRAFTERS.values())
                + ".",
            ),
            click.option(
                "--preset",
                metavar="NAME",
                help="A ladder from models.toml (fetched if missing); the default without models.",
            ),
            ctx_size_option,
            batch_size_option,
            click.option(
                "--n-gpu-layers",
                "-ngl",
                "n_gpu_layers",
                type=int,
                default=LOAD.n_gpu_layers,
                show_default=True,
                help="Layers to offload per model (-1: all).",
            ),
            *moe_options,
            click.option(
                "--threads",
                "-t",
                "n_threads",
                type=int,
                default=None,
                help=f"CPU threads for generation and batches [default: {LOAD.n_threads}].",
            ),
            click.option(
                "--flash-attn/--no-flash-attn",
                "flash_attn",
                default=None,
                help="Force flash attention on or off (default: llama.cpp decides).",
            ),
            cache_type_k_option,
            cache_type_v_option,
            click.option(
                "--strict-identity",
                is_flag=True,
                help="Greedy output bit-identical to target decoding on this machine: "
                "verifications in the micro-batches a probe finds exact (slower).",
            ),
            click.option(
                "--vram",
                metavar="SIZE|auto",
                default=None,
                help="Fit the ladder into this much GPU memory (8GiB, 6GB, 512MiB; auto: "
                "free memory per nvidia-smi): plans --n-gpu-layers per tier.",
            ),
            ram_option,
            *placement_options,
            *rpc_options,
        ],
        f,
    )


#: llama.cpp's ``--n-cpu-moe`` / ``--cpu-moe``: a mixture of experts' routed experts in CPU
#: memory, the rest where ``--n-gpu-layers`` puts it (``LoadConfig.n_cpu_moe``).
moe_options = [
    click.option(
        "--n-cpu-moe",
        "-ncmoe",
        "n_cpu_moe",
        type=int,
        default=0,
        show_default=True,
        help="Keep the routed experts of the first N layers in CPU memory (llama.cpp's "
        "--n-cpu-moe); attention and shared weights go where --n-gpu-layers puts them.",
    ),
    click.option(
        "--cpu-moe",
        "-cmoe",
        "cpu_moe",
        is_flag=True,
        help="Keep the routed experts of every layer in CPU memory (llama.cpp's --cpu-moe).",
    ),
]


#: llama.cpp's ``--rpc`` and where the tiers go on it (``core/remote.py``).
rpc_options = [
    click.option(
        "--rpc",
        metavar="HOST:PORT[,...]",
        default=None,
        help="llama.cpp RPC servers (pyramid-gguf rpc-server, or llama.cpp's rpc-server) to run "
        "tiers on; no authentication or encryption: a trusted network only.",
    ),
    click.option(
        "--rpc-tiers",
        metavar="TIERS",
        default=None,
        help="Tiers on the --rpc servers, comma-separated [default: target].",
    ),
    click.option(
        "--rpc-output/--no-rpc-output",
        "rpc_output",
        default=False,
        help="Put the remote tiers' output layer there too (logits cross the link instead of "
        "hidden states) [default: kept here].",
    ),
]


def _sampler_option(field: SamplerField) -> Callable[[F], F]:
    """The flag of one sampler field of :data:`~pyramid_gguf.core.sampling.SAMPLER_FIELDS`."""
    default = getattr(SAMPLING, field.name)
    return click.option(
        field.flag, *field.aliases, field.name,
        type=field.type, default=default, show_default=True, help=field.help,
    )  # fmt: skip


def sampling_options(f: F) -> F:
    """Sampling warp, seed and stop conditions."""
    return _apply(
        [
            click.option(
                "--max-tokens",
                "-n",
                type=int,
                default=SAMPLING.max_tokens,
                show_default=True,
                help="Tokens to generate at most.",
            ),
            *(_sampler_option(field) for field in SAMPLER_FIELDS),
            click.option(
                "--dry-sequence-breaker",
                "dry_sequence_breakers",
                metavar="TEXT",
                multiple=True,
                help="A text DRY does not follow a repetition across, replacing the defaults "
                "('\\n', ':', '\"', '*'); 'none': no breakers (repeatable).",
            ),
            click.option(
                "--samplers",
                metavar="NAMES",
                default=None,
                help="Sampler order, ';'-separated llama.cpp names "
                f"[default: {';'.join(SAMPLING.samplers)}].",
            ),
            click.option(
                "--logit-bias",
                "-l",
                "logit_bias",
                metavar="TOKEN_ID(+/-)BIAS",
                multiple=True,
                help="Add BIAS to a token's logit, as 15043+1 or 15043-inf (repeatable).",
            ),
            click.option("--seed", "-s", type=int, default=None, help="Random seed."),
            click.option("--stop", multiple=True, help="Stop string (repeatable)."),
            click.option(
                "--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence."
            ),
        ],
        f,
    )


def grammar_options(f: F) -> F:
    """Structured output: a JSON schema, a GBNF grammar or any JSON object."""
    return _apply(
        [
            click.option(
                "--json-schema",
                metavar="FILE|JSON",
                default=None,
                help="The answer is JSON valid under this schema (a file or inline JSON).",
            ),
            click.option(
                "--grammar",
                metavar="FILE|GBNF",
                default=None,
                help="The answer matches this llama.cpp GBNF grammar (a file or inline text).",
            ),
            click.option(
                "--format",
                "answer_format",
                type=click.Choice(["json"]),
                default=None,
                help="json: the answer is one JSON object (Ollama's --format json).",
            ),
        ],
        f,
    )


def grammar_from(params: dict[str, Any]) -> Grammar | None:
    """The :class:`Grammar` of :func:`grammar_options`' flags (at most one of them), checked."""
    given = [k for k in ("json_schema", "grammar", "answer_format") if params.get(k)]
    if len(given) > 1:
        raise UserError("give one of --json-schema, --grammar and --format json")
    if not given:
        return None
    if params.get("answer_format"):
        grammar = Grammar.json_object()
    elif params.get("json_schema"):
        grammar = Grammar.json_schema(_file_or_text(params["json_schema"], "--json-schema"))
    else:
        grammar = Grammar.gbnf(_file_or_text(params["grammar"], "--grammar"))
    check_grammar(grammar)
    return grammar


def _file_or_text(value: str, flag: str) -> str:
    """The contents of the file ``value`` names, else ``value`` itself (inline text)."""
    path = Path(value).expanduser()
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{flag}: cannot read {path}: {e}") from None
    if value.lstrip().startswith(("{", "root", "#")) or "::=" in value:
        return value
    raise UserError(f"{flag}: {value} is neither a file nor an inline grammar or schema")


#: ``--chat-template``: llama.cpp's named templates, a Jinja file or Jinja text.
chat_template_option = click.option(
    "--chat-template",
    "chat_template",
    metavar="NAME|FILE|TEXT",
    default=None,
    help="Chat template: a llama.cpp name (chatml, llama3, gemma, mistral-v7, ...), a Jinja "
    "file or Jinja text [default: the target GGUF's].",
)


def chat_template_from(value: str | None) -> str | None:
    """The Jinja source ``--chat-template`` names: one of llama.cpp's named templates, a file,
    or template text; anything else a one-line UserError listing the names."""
    return resolve_chat_format(value, "--chat-template")


def _knob_option(name: str) -> Callable[[F], F]:
    knob = next(k for k in SPEC_KNOBS if k.name == name)
    kind: Any = click.Choice(knob.choices) if knob.choices else knob.type
    return click.option(knob.flag, knob.name, type=kind, default=None, help=knob.help)


def spec_options(f: F) -> F:
    """Decoding mode and every speculative knob; a knob not given keeps the ladder's value."""
    return _apply([_knob_option(k.name) for k in SPEC_KNOBS], f)


@dataclass(frozen=True)
class LadderArgs:
    """What the ladder flags asked for: a preset (or the default) or model files, and how to
    load them."""

    preset: str | None
    paths: LadderPaths | None
    load: LoadConfig
    vram: str | None = None
    #: System RAM the ``--vram`` plan must fit (``auto``: this machine's).
    ram: str = "auto"
    #: Tiers on llama.cpp RPC servers (``--rpc``).
    rpc: RpcConfig | None = None

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> LadderArgs:
        given = [params.get(k) for k in TIERS]
        if params.get("preset") and any(given):
            raise UserError(
                "give either --preset or model paths (--target/--qualifier/--draft), not both"
            )
        if params.get("target") is None and any(given):
            raise UserError("--target is required when --draft or --qualifier is given")
        paths = None
        if params.get("target") is not None:
            paths = LadderPaths.of(params["target"], params.get("qualifier"), params.get("draft"))
        return cls(
            params.get("preset"),
            paths,
            load_config_from(params),
            params.get("vram"),
            params.get("ram") or "auto",
            RpcConfig.from_flags(
                params.get("rpc"), params.get("rpc_tiers"), bool(params.get("rpc_output"))
            ),
        )


def load_config_from(params: dict[str, Any]) -> LoadConfig:
    """A :class:`LoadConfig` from the flags of :func:`ladder_options`."""
    threads = params.get("n_threads")
    threads = default_threads() if threads is None else threads
    return LoadConfig(
        n_ctx=params["n_ctx"],
        n_batch=params["n_batch"],
        n_gpu_layers=params["n_gpu_layers"],
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=params["flash_attn"],
        type_k=params["type_k"],
        type_v=params["type_v"],
        strict_identity=bool(params.get("strict_identity")),
        parallel=params.get("parallel") or 1,
        n_cpu_moe=params.get("n_cpu_moe") or 0,
        cpu_moe=bool(params.get("cpu_moe")),
        use_mmap=not params.get("no_mmap"),
        no_host=bool(params.get("no_host")),
        pcie=params.get("pcie"),
    )


def sampling_config_from(params: dict[str, Any]) -> SamplingConfig:
    """A :class:`SamplingConfig` from the flags of :func:`sampling_options`."""
    return SamplingConfig(
        **{f.name: params.get(f.name, getattr(SAMPLING, f.name)) for f in SAMPLER_FIELDS},
        dry_sequence_breakers=_dry_breakers(params.get("dry_sequence_breakers", ())),
        logit_bias=tuple(_logit_bias(v) for v in params.get("logit_bias", ())),
        samplers=parse_samplers(params["samplers"])
        if params.get("samplers")
        else SAMPLING.samplers,
        seed=params["seed"],
        max_tokens=params["max_tokens"],
        stop=tuple(params.get("stop", ())),
        ignore_eos=params["ignore_eos"],
        grammar=grammar_from(params),
    )


def _dry_breakers(values: tuple[str, ...]) -> tuple[str, ...]:
    """llama.cpp's ``--dry-sequence-breaker``: given ones replace the defaults, ``none`` clears
    them, and escapes (``\\n``) are read as llama.cpp reads them."""
    if not values:
        return SAMPLING.dry_sequence_breakers
    return tuple(_ESCAPE.sub(lambda m: _ESCAPES[m.group(1)], v) for v in values if v != "none")


_ESCAPE = re.compile(r"\\([ntr'\"\\])")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "'": "'", '"': '"', "\\": "\\"}


_LOGIT_BIAS = re.compile(r"\s*(\d+)\s*([+-])\s*(\S+)\s*")


def _logit_bias(value: str) -> tuple[int, float]:
    """llama.cpp's ``--logit-bias TOKEN_ID(+/-)BIAS``: ``15043+1``, ``15043-1``, ``15043-inf``."""
    found = _LOGIT_BIAS.fullmatch(value)
    try:
        if found is None:
            raise ValueError(value)
        bias = float(found.group(3))
    except ValueError:
        raise UserError(f"--logit-bias: {value!r} is not TOKEN_ID(+/-)BIAS, e.g. 15043+1") from None
    return int(found.group(1)), -bias if found.group(2) == "-" else bias


def spec_config_from(params: dict[str, Any], base: SpecConfig) -> SpecConfig:
    """``base`` (the ladder's recommendation or the default) with the knobs the user gave."""
    changes = {k.name: params[k.name] for k in SPEC_KNOBS if params.get(k.name) is not None}
    return base.with_(**changes) if changes else base
