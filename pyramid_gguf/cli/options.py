"""Option groups shared by ``run``, ``bench``, ``tune`` and ``serve``, and configs built from them.

Each decorator adds a group of flags; each ``*_from`` function turns the parsed flags into a
frozen config object, so commands pass configs, never loose kwargs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..api import Pyramid
from ..config import (
    DIVERGENCES,
    FUZZY_VARIANTS,
    KV_TYPES,
    MODES,
    LoadConfig,
    SamplingConfig,
    SpecConfig,
    default_mode,
    default_threads,
)
from ..errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


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
    default=4096,
    show_default=True,
    help="Context window of each model, in tokens.",
)
batch_size_option = click.option(
    "--batch-size",
    "-b",
    "n_batch",
    type=int,
    default=512,
    show_default=True,
    help="Largest llama_decode batch.",
)
cache_type_k_option = click.option(
    "--cache-type-k",
    "type_k",
    type=click.Choice(KV_TYPES),
    default="f16",
    show_default=True,
    help="KV cache type for K.",
)
cache_type_v_option = click.option(
    "--cache-type-v",
    "type_v",
    type=click.Choice(KV_TYPES),
    default="f16",
    show_default=True,
    help="KV cache type for V.",
)


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
                metavar="GGUF|ngram",
                help="Draft (smallest) model, or 'ngram' for prompt lookup.",
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
                default=-1,
                show_default=True,
                help="Layers to offload per model (-1: all).",
            ),
            click.option(
                "--threads",
                "-t",
                "n_threads",
                type=int,
                default=None,
                help=f"CPU threads for generation and batches [default: {default_threads()}].",
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
                "--verify-batch",
                type=int,
                default=7,
                show_default=True,
                help="Largest micro-batch while generating; 7 keeps lossless modes "
                "token-identical to target decoding (llama.cpp switches kernels at 8), "
                "0 = one llama_decode per verification (faster on GPUs).",
            ),
            click.option(
                "--vram",
                metavar="SIZE|auto",
                default=None,
                help="Fit the ladder into this much GPU memory (8GiB, 6GB, 512MiB; auto: "
                "free memory per nvidia-smi): plans --n-gpu-layers per tier.",
            ),
        ],
        f,
    )


def sampling_options(f: F) -> F:
    """Sampling warp, seed and stop conditions."""
    return _apply(
        [
            click.option(
                "--max-tokens",
                "-n",
                type=int,
                default=256,
                show_default=True,
                help="Tokens to generate at most.",
            ),
            click.option(
                "--temperature",
                "--temp",
                "temperature",
                type=float,
                default=0.8,
                show_default=True,
                help="0 is greedy.",
            ),
            click.option("--top-k", type=int, default=40, show_default=True, help="0 disables."),
            click.option(
                "--top-p", type=float, default=0.95, show_default=True, help="1 disables."
            ),
            click.option(
                "--min-p", type=float, default=0.05, show_default=True, help="0 disables."
            ),
            click.option("--seed", "-s", type=int, default=None, help="Random seed."),
            click.option("--stop", multiple=True, help="Stop string (repeatable)."),
            click.option(
                "--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence."
            ),
        ],
        f,
    )


def spec_options(f: F) -> F:
    """Decoding mode and speculative knobs (defaults come from the ladder when not given)."""
    return _apply(
        [
            click.option(
                "--mode",
                type=click.Choice(MODES),
                default=None,
                help="Decoding mode [default: psd-exact with 3 models, sd with 2, target with 1].",
            ),
            click.option(
                "--l-d",
                "l_d",
                type=int,
                default=None,
                help="Draft tokens per qualifier check [default: 4].",
            ),
            click.option(
                "--l-q",
                "l_q",
                type=int,
                default=None,
                help="Qualified tokens per target check [default: 8].",
            ),
            click.option(
                "--tau-q",
                "tau_q",
                type=float,
                default=None,
                help="Fuzzy threshold of the draft->qualifier stage (psd-f).",
            ),
            click.option(
                "--tau-t",
                "tau_t",
                type=float,
                default=None,
                help="Fuzzy threshold of the stage into the target (fsd, psd-a, psd-f).",
            ),
            click.option(
                "--divergence",
                type=click.Choice(DIVERGENCES),
                default=None,
                help="Fuzzy divergence [default: js].",
            ),
            click.option(
                "--fuzzy-variant",
                type=click.Choice(FUZZY_VARIANTS),
                default=None,
                help="reducible (default) or pure (the FSD paper).",
            ),
            click.option(
                "--p-min",
                "p_min",
                type=float,
                default=None,
                help="Stop drafting when the draft's top probability falls under this.",
            ),
        ],
        f,
    )


def load_config_from(params: dict[str, Any]) -> LoadConfig:
    """A :class:`LoadConfig` from the flags of :func:`ladder_options`."""
    threads = params.get("n_threads") or default_threads()
    return LoadConfig(
        n_ctx=params["n_ctx"],
        n_batch=params["n_batch"],
        n_gpu_layers=params["n_gpu_layers"],
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=params["flash_attn"],
        type_k=params["type_k"],
        type_v=params["type_v"],
        verify_batch=params.get("verify_batch", 7),
    )


def sampling_config_from(params: dict[str, Any]) -> SamplingConfig:
    """A :class:`SamplingConfig` from the flags of :func:`sampling_options`."""
    return SamplingConfig(
        temperature=params["temperature"],
        top_k=params["top_k"],
        top_p=params["top_p"],
        min_p=params["min_p"],
        seed=params["seed"],
        max_tokens=params["max_tokens"],
        stop=tuple(params["stop"]),
        ignore_eos=params["ignore_eos"],
    )


SPEC_FLAGS = ("mode", "l_d", "l_q", "tau_q", "tau_t", "divergence", "fuzzy_variant", "p_min")


def spec_config_from(params: dict[str, Any], base: SpecConfig) -> SpecConfig:
    """``base`` (the ladder's recommendation or the default) with the flags the user gave."""
    changes = {k: params[k] for k in SPEC_FLAGS if params.get(k) is not None}
    return base.with_(**changes) if changes else base


Resolved = tuple[dict[str, Any], SpecConfig, str]


def resolve_ladder(params: dict[str, Any]) -> Resolved:
    """``({"target", "qualifier", "draft"}, base spec, name)`` from the ladder flags.

    ``--preset`` (or the default preset when no model is given) is fetched if missing. The base
    spec is what ``pyramid-gguf tune`` saved for this ladder, else the preset's recommendation,
    else the lossless default for the number of tiers; flags then override it.
    """
    given = [params.get(k) for k in ("target", "qualifier", "draft")]
    if params.get("preset") and any(given):
        raise UserError(
            "give either --preset or model paths (--target/--qualifier/--draft), not both"
        )
    if params.get("target") is None and any(given):
        raise UserError("--target is required when --draft or --qualifier is given")
    if params.get("target") is None:
        from ..presets import DEFAULT_PRESET, resolve_preset

        r = resolve_preset(params.get("preset") or DEFAULT_PRESET)
        paths: dict[str, Any] = {"target": r.target, "qualifier": r.qualifier, "draft": r.draft}
        base, name = r.spec, r.name
    else:
        paths = {k: params.get(k) for k in ("target", "qualifier", "draft")}
        n_tiers = 1 + (paths["draft"] is not None) * (1 + (paths["qualifier"] is not None))
        base, name = SpecConfig(mode=default_mode(n_tiers)), Path(paths["target"]).stem
    from ..tune import load_tuned

    return paths, load_tuned(paths) or base, name


def load_pyramid(
    params: dict[str, Any], *, spec: SpecConfig | None = None, resolved: Resolved | None = None
) -> Pyramid:
    """Load the ladder of the flags of :func:`ladder_options`; ``spec`` defaults to the
    ladder's base spec with the flags of :func:`spec_options` applied. ``resolved``: what
    :func:`resolve_ladder` already returned for these flags (not resolved again).
    """
    paths, base, name = resolved or resolve_ladder(params)
    load = load_config_from(params)
    return Pyramid.from_paths(
        paths["target"],
        draft=paths["draft"],
        qualifier=paths["qualifier"],
        load=load,
        spec=spec or spec_config_from(params, base),
        name=name,
        tier_loads=_planned_loads(params.get("vram"), load, **paths),
    )


def _planned_loads(
    vram: str | None, load: LoadConfig, target: Any, qualifier: Any, draft: Any
) -> dict[str, LoadConfig] | None:
    """Per-tier load configs from the memory planner when ``--vram`` is given."""
    if vram is None:
        return None
    from ..planner import plan_ladder, resolve_budget, tier_load_config

    model_draft = None if draft is None or str(draft) == "ngram" else draft
    plan = plan_ladder(
        resolve_budget(vram),
        draft=model_draft,
        qualifier=qualifier,
        target=target,
        n_ctx=load.n_ctx,
        n_ubatch=load.n_batch,
        type_k=load.type_k,
        type_v=load.type_v,
    )
    return {tier: tier_load_config(plan, tier, load) for tier in plan.tier_names}
