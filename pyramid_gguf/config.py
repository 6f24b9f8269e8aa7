"""Typed, frozen configuration objects.

Every knob a user can turn lives in one of three records, built once (by the CLI, the server
or the Python API) and passed down unchanged:

- :class:`LoadConfig`: how one GGUF file is loaded into llama.cpp.
- :class:`SamplingConfig`: how tokens are sampled and when generation stops.
- :class:`SpecConfig`: which decoding mode runs and its speculative knobs.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from .errors import UserError
from .modes import MODE_NAMES, Mode, ModeInfo, mode_info

Divergence = Literal["js", "kl", "tv"]
FuzzyVariant = Literal["reducible", "pure"]
ExactRule = Literal["exact", "greedy-match"]
KvType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]

DIVERGENCES: tuple[Divergence, ...] = ("js", "kl", "tv")
FUZZY_VARIANTS: tuple[FuzzyVariant, ...] = ("reducible", "pure")
EXACT_RULES: tuple[ExactRule, ...] = ("exact", "greedy-match")
KV_TYPES: tuple[KvType, ...] = (
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "iq4_nl",
)


def cache_home() -> Path:
    """Where pyramid-gguf keeps models, tuned configs and cost curves: ``$PYRAMID_GGUF_HOME``,
    default ``~/.cache/pyramid-gguf``."""
    return Path(os.environ.get("PYRAMID_GGUF_HOME") or "~/.cache/pyramid-gguf").expanduser()


def unwritable(directory: Path) -> str | None:
    """Why no file can be written in ``directory`` (created if missing), or None when one can.

    Tried, not inferred from permission bits: a read-only file system, a file in the way or a
    directory of another user all fail here, before anything slow is done for nothing.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def require_writable(directory: Path, what: str) -> None:
    """A :class:`UserError` unless files can be written in ``directory`` (``what`` is for)."""
    problem = unwritable(directory)
    if problem is not None:
        raise UserError(
            f"cannot write {what} to {directory}: {problem} "
            "(set PYRAMID_GGUF_HOME to a writable directory)"
        )


def default_threads() -> int:
    """All cores: llama-cpp-python's own default (`cpu_count // 2`) leaves half the CPU idle."""
    return max(1, os.cpu_count() or 1)


#: ggml's thread pool holds at most this many threads (GGML_MAX_N_THREADS); more crash it.
GGML_MAX_THREADS = 512
#: Smallest context llama.cpp creates: it pads ``n_ctx`` up to a multiple of 256 cells.
MIN_CTX = 256
#: Temperatures below this count as 0 (greedy): dividing logits by them overflows to NaN, and
#: short of that they sample the argmax anyway unless two logits lie within about 1e-5.
MIN_TEMPERATURE = 1e-6


def max_threads() -> int:
    """Most threads a command accepts: four per core (ggml's cap at most). Past the core count
    llama.cpp's threads spin waiting for each other (5000 threads on 2 cores ran at 0.1
    tokens/s), and past ggml's cap its thread pool crashes."""
    return min(GGML_MAX_THREADS, 4 * default_threads())


def check_threads(n: int, flag: str = "--threads") -> None:
    """A :class:`UserError` unless ``1 <= n <=`` :func:`max_threads`."""
    if n < 1:
        raise UserError(f"{flag} must be at least 1")
    if n > max_threads():
        raise UserError(
            f"{flag} {n} is more than this machine can use: it has {default_threads()} cores, "
            f"so at most {max_threads()} threads (llama.cpp slows down past the core count)"
        )


@dataclass(frozen=True)
class LoadConfig:
    """How one GGUF file is loaded.

    ``n_gpu_layers=-1`` offloads every layer when llama.cpp is built with a GPU backend and is
    ignored on a CPU-only build. ``flash_attn=None`` lets llama.cpp decide.
    """

    n_ctx: int = 4096
    n_batch: int = 512
    n_gpu_layers: int = -1
    n_threads: int = field(default_factory=default_threads)
    n_threads_batch: int = field(default_factory=default_threads)
    flash_attn: bool | None = None
    type_k: KvType = "f16"
    type_v: KvType = "f16"
    #: Split the target's verification batches into micro-batches whose logits are
    #: bit-identical to one-token decoding on this machine (found by a probe, cached with the
    #: cost curve), so greedy output equals ``target`` exactly; costs what batching saves.
    #: Off: one batch per verification, and greedy text may differ from ``target`` only at
    #: floating-point near-ties (docs/ALGORITHMS.md, "What lossless means").
    strict_identity: bool = False
    #: llama.cpp's extra weight buffer types (CPU_REPACK, AMX). None: llama.cpp's own choice,
    #: except where it would use the AMX kernels, which crash on batched decodes: there extra
    #: types are off and the weights the repacking kernels take go to CPU_REPACK by tensor
    #: overrides (native/buffers.py). True: llama.cpp's own choice, AMX included. False: none,
    #: every CPU weight in the plain buffer (no repacked kernels).
    extra_buffers: bool | None = None
    #: llama.cpp's op offload: large batches over weights kept on the CPU run on the GPU, the
    #: weights copied through a compute buffer there (for a tier with no GPU layers, about its
    #: output head plus the logits of one micro-batch). The planner turns it off for a tier
    #: whose buffer does not fit the budget. No effect on a CPU-only build.
    op_offload: bool = True
    #: Test hook: use state snapshots for rollback even when the cache supports truncation.
    force_snapshot_rollback: bool = False
    #: Test hook: the AMX placement (extra types off, CPU_REPACK by overrides) on any CPU.
    force_repack_overrides: bool = False

    def __post_init__(self) -> None:
        if self.n_ctx < MIN_CTX:
            raise UserError(
                f"--ctx-size must be at least {MIN_CTX} (llama.cpp's smallest context; it "
                f"rounds up to a multiple of {MIN_CTX}), got {self.n_ctx}"
            )
        if self.n_batch < 1:
            raise UserError(f"--batch-size must be positive, got {self.n_batch}")
        for n in (self.n_threads, self.n_threads_batch):
            check_threads(n)
        if self.n_gpu_layers < -1:
            raise UserError(f"--n-gpu-layers must be -1 (all) or >= 0, got {self.n_gpu_layers}")
        if self.force_repack_overrides and self.extra_buffers is not None:
            raise UserError("force_repack_overrides places the weights itself: drop extra_buffers")
        for name, value in (("type_k", self.type_k), ("type_v", self.type_v)):
            if value not in KV_TYPES:
                raise UserError(f"{name} must be one of {', '.join(KV_TYPES)}, got {value!r}")


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling warp and stop conditions, shared by every tier so ``p`` and ``q`` compare.

    The warp is temperature, then top-k, then top-p, then min-p (llama.cpp's order and
    defaults). ``temperature == 0`` is greedy: one-hot on the argmax, lowest id on ties.
    ``top_k <= 0`` disables top-k; ``top_p >= 1`` and ``min_p <= 0`` disable theirs.
    Temperatures below :data:`MIN_TEMPERATURE` are stored as 0. ``seed``: None or -1 (llama.cpp's
    convention) draws a random seed; -1 is stored as None.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise UserError(f"--temperature must be >= 0, got {self.temperature}")
        if not math.isfinite(self.temperature):
            raise UserError(f"--temperature must be a finite number, got {self.temperature}")
        if self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        if self.seed == -1:
            object.__setattr__(self, "seed", None)
        elif self.seed is not None and self.seed < 0:
            raise UserError(f"--seed must be >= 0, or -1 for a random seed, got {self.seed}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise UserError(f"--min-p must be in [0, 1], got {self.min_p}")
        if self.max_tokens < 1:
            raise UserError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise UserError("stop strings must not be empty")

    def with_(self, **changes: object) -> SamplingConfig:
        """A copy with some fields replaced (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SpecConfig:
    """Decoding mode and speculative knobs (docs/ALGORITHMS.md; :data:`SPEC_KNOBS` lists them).

    ``mode``: ``auto`` (the default) picks a chain and a block size each round.
    ``l_d``: tokens the bottom proposer drafts per stage-1 verification.
    ``l_q``: tokens the qualifier buffers before the target verifies (three tiers only).
    ``tau_q`` / ``tau_t``: fuzzy thresholds of the stage ending at the qualifier / target;
    they only act in the fuzzy modes. Defaults calibrated on the default ladder (greedy, all
    164 HumanEval problems, 256 tokens): at 0.02 / 0.02 ``psd-a``, ``psd-f`` and ``fsd`` solve
    at least what the target solves (target 84; psd-a 89, psd-f 89, fsd 87); ``tau_q`` 0.3
    cost ``psd-f`` 8 problems; at the papers' ``tau_t`` 0.5 ``psd-a`` solved 7 of the first 12
    and ``fsd`` 1, against 9 (docs/ALGORITHMS.md, "Fuzzy thresholds"; docs/BENCHMARKS.md).
    ``p_min``: stop drafting when the draft's top probability (temperature-1 softmax) falls
    under it; 0 disables. ``exact_rule``: ``greedy-match`` swaps speculative sampling for
    llama.cpp's token matching (comparison).
    """

    mode: Mode = "auto"
    l_d: int = 4
    l_q: int = 8
    tau_q: float = 0.02
    tau_t: float = 0.02
    divergence: Divergence = "js"
    fuzzy_variant: FuzzyVariant = "reducible"
    p_min: float = 0.0
    #: Rule of the lossless stages: speculative sampling, or llama.cpp's token matching.
    exact_rule: ExactRule = "exact"
    #: Fixed modes: shortest suffix match the n-gram drafter proposes from (``auto`` weighs
    #: every match by what its length is worth).
    ngram_min: int = 3
    #: ``auto``: most tokens proposed to the target in one round.
    max_block: int = 16
    #: ``auto``: may also pick lossy chains (fuzzy rules with ``tau_q`` / ``tau_t``).
    allow_lossy: bool = False

    def __post_init__(self) -> None:
        if self.exact_rule not in EXACT_RULES:
            raise UserError(
                f"unknown exact rule {self.exact_rule!r}; valid: {', '.join(EXACT_RULES)}"
            )
        mode_info(self.mode)
        if self.divergence not in DIVERGENCES:
            raise UserError(
                f"unknown divergence {self.divergence!r}; valid: {', '.join(DIVERGENCES)}"
            )
        if self.fuzzy_variant not in FUZZY_VARIANTS:
            raise UserError(
                f"unknown fuzzy variant {self.fuzzy_variant!r}; valid: {', '.join(FUZZY_VARIANTS)}"
            )
        if self.l_d < 1:
            raise UserError(f"--l-d must be at least 1, got {self.l_d}")
        if self.l_q < 1:
            raise UserError(f"--l-q must be at least 1, got {self.l_q}")
        for flag, tau in (("--tau-q", self.tau_q), ("--tau-t", self.tau_t)):
            if not math.isfinite(tau):  # negative is fine: the fuzzy rule then accepts nothing
                raise UserError(f"{flag} must be a finite number, got {tau}")
        if not 0 <= self.p_min < 1:
            raise UserError(f"--p-min must be in [0, 1), got {self.p_min}")
        if self.ngram_min < 2:
            raise UserError(f"--ngram-min must be at least 2, got {self.ngram_min}")
        if self.max_block < 1:
            raise UserError(f"--max-block must be at least 1, got {self.max_block}")

    @property
    def info(self) -> ModeInfo:
        """The mode's row of the mode table (tiers needed, rules, losslessness, knobs)."""
        return mode_info(self.mode)

    @property
    def lossless(self) -> bool:
        """Output distributed exactly as the target's."""
        return self.info.lossless and not (self.info.auto and self.allow_lossy)

    def with_(self, **changes: object) -> SpecConfig:
        """A copy with some fields replaced (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Knob:
    """One :class:`SpecConfig` field as users set it: flag, type, choices and help.

    The CLI, the server's request fields, ``bench --sweep``, ``models.toml`` presets and
    ``tune`` all read this list, so a knob is declared once.
    """

    name: str
    type: type
    help: str
    #: Other spellings accepted in request bodies and presets (``l_D`` for ``l_d``).
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: object, where: str) -> object:
        """``value`` if it has this knob's type (ints pass as floats), else a :class:`UserError`."""
        if self.type is bool:
            if not isinstance(value, bool):
                raise UserError(f"{where}: expected true or false, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (self.type, int)):
            raise UserError(f"{where}: expected {self.type.__name__}, got {value!r}")
        if isinstance(value, int) and self.type is not int:
            if self.type is not float:
                raise UserError(f"{where}: expected {self.type.__name__}, got {value!r}")
            value = float(value)
        if self.choices and value not in self.choices:
            raise UserError(f"{where}: {value!r} is not one of {', '.join(self.choices)}")
        return value

    def from_text(self, text: str, where: str) -> object:
        """A value typed on a command line (``--sweep l_d=2,4``)."""
        if self.type is bool:
            flag = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
            value = flag.get(text.strip().lower())
            if value is None:
                raise UserError(f"{where}: {text.strip()!r} is not true or false")
            return value
        try:
            value = self.type(text.strip())
        except ValueError:
            raise UserError(
                f"{where}: {text.strip()!r} is not a valid {self.type.__name__}"
            ) from None
        return self.check(value, where)


SPEC_KNOBS: tuple[Knob, ...] = (
    Knob("mode", str, "Decoding mode.", choices=MODE_NAMES),
    Knob("l_d", int, "Tokens the draft proposes per check.", aliases=("l_D",)),
    Knob("l_q", int, "Qualified tokens per target check.", aliases=("l_Q",)),
    Knob("tau_q", float, "Fuzzy threshold of the draft->qualifier stage.", aliases=("tau_Q",)),
    Knob("tau_t", float, "Fuzzy threshold of the stage into the target.", aliases=("tau_T",)),
    Knob("divergence", str, "Fuzzy divergence.", choices=DIVERGENCES),
    Knob("fuzzy_variant", str, "reducible or pure (the FSD paper).", choices=FUZZY_VARIANTS),
    Knob("p_min", float, "Stop drafting when the draft's top probability falls under this."),
    Knob("exact_rule", str, "Rule of the lossless stages.", choices=EXACT_RULES),
    Knob("ngram_min", int, "Fixed modes: shortest suffix match the n-gram drafter uses."),
    Knob("max_block", int, "auto: most tokens proposed to the target per round."),
    Knob("allow_lossy", bool, "auto: may also pick lossy (fuzzy) chains."),
)
KNOBS: dict[str, Knob] = {k.name: k for k in SPEC_KNOBS}
