"""How tokens are sampled and when generation stops: :class:`SamplingConfig`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .errors import UserError
from .grammar import Grammar, Trigger

#: Temperatures below this count as 0 (greedy): dividing logits by them overflows to NaN, and
#: short of that they sample the argmax anyway unless two logits lie within about 1e-5.
MIN_TEMPERATURE = 1e-6

#: Most alternatives per token a log-probability request may ask for (OpenAI's limit).
MAX_TOP_LOGPROBS = 20

#: llama.cpp's sampler names (``--samplers``, llama-server's ``samplers``), in its default
#: order: the chain every tier runs, then a draw from what is left.
DEFAULT_SAMPLERS: tuple[str, ...] = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
#: The samplers that read the tokens before the position (not only its logits).
HISTORY_SAMPLERS = ("penalties", "dry")
#: llama.cpp's default DRY sequence breakers: a repetition is not followed across them.
DRY_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")
#: llama.cpp's other spellings of sampler names, and its one-letter codes.
_SAMPLER_ALIASES = {
    "top-k": "top_k",
    "top-p": "top_p",
    "nucleus": "top_p",
    "typical-p": "typ_p",
    "typical": "typ_p",
    "typ-p": "typ_p",
    "typ": "typ_p",
    "min-p": "min_p",
    "temp": "temperature",
    "top-n-sigma": "top_n_sigma",
}
_SAMPLER_CHARS = {
    "e": "penalties",
    "d": "dry",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
}


def parse_samplers(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """llama.cpp's sampler order: names (``"top_k;temperature"`` or a list, aliases taken) or
    its one-letter codes (``"kt"``). An unknown one is a one-line UserError listing them."""
    if isinstance(value, str):
        if ";" not in value and value and all(c in _SAMPLER_CHARS for c in value):
            return tuple(_SAMPLER_CHARS[c] for c in value)
        value = [v for v in value.split(";") if v]
    out = []
    for raw in value:
        name = _SAMPLER_ALIASES.get(str(raw), str(raw))
        if name not in DEFAULT_SAMPLERS:
            known = ", ".join(DEFAULT_SAMPLERS)
            raise UserError(f"unknown sampler {raw!r} in samplers: known are {known}")
        out.append(name)
    return tuple(out)


def parse_logit_bias(
    value: object,
) -> tuple[tuple[tuple[int, float], ...], tuple[tuple[str, float], ...]]:
    """``(token, bias)`` pairs and ``(text, bias)`` pairs from OpenAI's ``{"id": bias}`` or
    llama-server's ``[[id or text, bias]]`` (a bias of ``false`` bans, as ``-inf`` does). A key
    that is not an integer is text, as llama-server reads it: every token of the text gets the
    bias (:attr:`SamplingConfig.logit_bias_text`). A malformed entry is one UserError line."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        if not all(isinstance(e, (list, tuple)) and len(e) == 2 for e in value):
            raise UserError("logit_bias must be {token: bias} or [[token, bias], ...]")
        items = [(e[0], e[1]) for e in value]
    else:
        raise UserError("logit_bias must be {token: bias} or [[token, bias], ...]")
    ids: list[tuple[int, float]] = []
    texts: list[tuple[str, float]] = []
    for key, bias in items:
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise UserError(f"logit_bias: {key!r} must be a token id or text")
        if bias is False:
            value_of = -math.inf
        elif isinstance(bias, (int, float)) and not isinstance(bias, bool):
            value_of = float(bias)
        else:
            raise UserError(f"logit_bias: the bias of {key!r} must be a number or false")
        if isinstance(key, int):
            ids.append((key, value_of))
            continue
        try:
            ids.append((int(key), value_of))
        except ValueError:
            if not key:
                raise UserError("logit_bias: an empty text has no tokens to bias") from None
            texts.append((key, value_of))
    return tuple(ids), tuple(texts)


@dataclass(frozen=True)
class SamplerField:
    """One numeric :class:`SamplingConfig` field as users set it, declared once in
    :data:`SAMPLER_FIELDS` (as the speculative knobs are in
    :data:`~pyramid_gguf.core.spec.SPEC_KNOBS`): the CLI flags, the request schemas, Ollama's
    options and the config's own checks all read the table.

    ``name`` is the config's field and the request field of OpenAI's and llama-server's bodies
    (the Responses API's too, whose other fields are read as chat completions reads them);
    ``flag`` (and ``aliases``) the CLI's, llama.cpp's spelling; ``ollama`` / ``anthropic`` the
    name in Ollama's ``options`` and in Anthropic's Messages body (None: that dialect has no
    such field); ``neutral`` the value that turns it off (None: no switch). A value must be a
    number of the field's type, a finite one when ``finite``, passing ``valid`` (else
    ``"WHERE must be RULE, got VALUE"``, WHERE the flag, request field or option it came as).
    """

    name: str
    type: type[int] | type[float]
    flag: str
    help: str
    aliases: tuple[str, ...] = ()
    ollama: str | None = None
    anthropic: str | None = None
    neutral: float | None = None
    finite: bool = False
    valid: Callable[[float], bool] | None = None
    rule: str = ""

    def problem(self, value: object) -> str | None:
        """What is wrong with ``value`` as this field (``"must be ..., got ..."``), or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, got {value!r}"
        if self.type is int and not (isinstance(value, int) or value.is_integer()):
            return f"must be an integer, got {value!r}"
        if self.finite and not math.isfinite(value):
            return f"must be a finite number, got {value}"
        if self.valid is not None and not self.valid(value):
            return f"must be {self.rule}, got {value}"
        return None

    def take(self, value: object, where: str) -> int | float:
        """``value`` as this field's type, or a one-line :class:`UserError` naming ``where``
        (the request field or option it came as)."""
        problem = self.problem(value)
        if problem is not None:
            raise UserError(f"{where} {problem}")
        assert isinstance(value, (int, float))
        return self.type(value)

    def check(self, value: float) -> None:
        """A one-line :class:`UserError` naming the flag when ``value`` is out of range."""
        self.take(value, self.flag)


_ALL_TOKENS = "-1: all"
#: Every numeric sampler field, in the CLI's order (llama.cpp's chain after the first four).
#: Seed, token limit, stop strings, logit biases, the samplers' order and DRY's breakers are
#: no numbers and each dialect spells them its own way: they stay beside the table.
SAMPLER_FIELDS: tuple[SamplerField, ...] = (
    SamplerField(
        "temperature", float, "--temperature", "0 is greedy.", aliases=("--temp",),
        ollama="temperature", anthropic="temperature", finite=True, valid=lambda v: v >= 0,
        rule=">= 0",
    ),
    SamplerField(
        "top_k", int, "--top-k", "0 disables.", ollama="top_k", anthropic="top_k", neutral=0
    ),
    SamplerField(
        "top_p", float, "--top-p", "1 disables.", ollama="top_p", anthropic="top_p",
        neutral=1, valid=lambda v: 0 < v <= 1, rule="in (0, 1]",
    ),
    SamplerField(
        "min_p", float, "--min-p", "0 disables.", ollama="min_p", neutral=0,
        valid=lambda v: 0 <= v <= 1, rule="in [0, 1]",
    ),
    SamplerField(
        "typical_p", float, "--typical", "Locally typical sampling; 1 disables.",
        ollama="typical_p", neutral=1, finite=True, valid=lambda v: v > 0,
        rule="> 0 (1 disables it)",
    ),
    SamplerField(
        "top_n_sigma", float, "--top-nsigma",
        "Keep logits within N standard deviations of the top; <= 0 disables.",
        neutral=-1, finite=True,
    ),
    SamplerField(
        "xtc_probability", float, "--xtc-probability",
        "XTC: chance of removing the top choices; 0 disables.",
        neutral=0, valid=lambda v: 0 <= v <= 1, rule="in [0, 1]",
    ),
    SamplerField(
        "xtc_threshold", float, "--xtc-threshold",
        "XTC: choices above this probability may be removed; > 0.5 disables.",
        valid=lambda v: 0 <= v <= 1, rule="in [0, 1]",
    ),
    SamplerField(
        "dynatemp_range", float, "--dynatemp-range",
        "Dynamic temperature in [temp - range, temp + range]; 0 disables.",
        neutral=0, finite=True, valid=lambda v: v >= 0, rule=">= 0",
    ),
    SamplerField(
        "dynatemp_exponent", float, "--dynatemp-exp", "Dynamic temperature exponent.",
        finite=True,
    ),
    SamplerField(
        "repeat_penalty", float, "--repeat-penalty", "Penalise repeated tokens; 1 disables.",
        ollama="repeat_penalty", neutral=1, finite=True, valid=lambda v: v > 0,
        rule="> 0 (1 disables it)",
    ),
    SamplerField(
        "repeat_last_n", int, "--repeat-last-n",
        "Tokens the penalties read (prompt included); -1: all, 0 disables.",
        ollama="repeat_last_n", valid=lambda v: v >= -1, rule=f">= -1 ({_ALL_TOKENS})",
    ),
    SamplerField(
        "presence_penalty", float, "--presence-penalty", "0 disables.",
        ollama="presence_penalty", neutral=0, finite=True,
    ),
    SamplerField(
        "frequency_penalty", float, "--frequency-penalty", "0 disables.",
        ollama="frequency_penalty", neutral=0, finite=True,
    ),
    SamplerField(
        "dry_multiplier", float, "--dry-multiplier",
        "DRY: lower tokens that extend a repetition by multiplier * base ** "
        "(length - allowed length); 0 disables.",
        neutral=0, finite=True,
    ),
    SamplerField("dry_base", float, "--dry-base", "DRY's base (>= 1).", finite=True),
    SamplerField(
        "dry_allowed_length", int, "--dry-allowed-length",
        "Repetitions DRY leaves alone, in tokens.", valid=lambda v: v >= 0, rule=">= 0",
    ),
    SamplerField(
        "dry_penalty_last_n", int, "--dry-penalty-last-n",
        "Tokens DRY reads (prompt included); -1: all, 0 disables.",
        valid=lambda v: v >= -1, rule=f">= -1 ({_ALL_TOKENS})",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling warp and stop conditions, shared by every tier so ``p`` and ``q`` compare.

    The warp is llama.cpp's sampler chain: ``logit_bias``, then ``samplers`` in order (by
    default :data:`DEFAULT_SAMPLERS`: penalties, dry, top-n-sigma, top-k, typical, top-p,
    min-p, XTC, temperature), with llama.cpp's definitions and defaults
    (:mod:`~pyramid_gguf.decoding.runtime.warps`). ``temperature == 0`` is greedy: one-hot on
    the argmax, lowest id on ties. ``top_k <= 0``, ``top_p >= 1``, ``min_p <= 0``,
    ``typical_p >= 1``, ``top_n_sigma <= 0``, ``xtc_probability == 0``, ``dynatemp_range == 0``,
    ``repeat_penalty == 1`` (with zero presence and frequency penalties) disable theirs;
    ``repeat_last_n``: the tokens the penalties read (-1: all, prompt included). DRY
    (``dry_multiplier`` 0: off) lowers a token that would extend a repetition longer than
    ``dry_allowed_length`` by ``dry_multiplier * dry_base ** (length - dry_allowed_length)``,
    reading the last ``dry_penalty_last_n`` tokens (-1: all), never across
    ``dry_sequence_breakers``. Temperatures
    below :data:`MIN_TEMPERATURE` are stored as 0. ``seed``: None or -1 (llama.cpp's
    convention) draws a random seed; -1 is stored as None. ``grammar`` / ``triggers`` constrain
    the answer (structured output, tool calls; docs/ALGORITHMS.md, "Grammars").
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    #: The whole answer must match this grammar (a JSON schema, any JSON object, GBNF, ...):
    #: every tier samples from its distribution restricted to the allowed tokens.
    grammar: Grammar | None = None
    #: Lazy grammars: the answer is free until one's text appears (a tool call opening).
    triggers: tuple[Trigger, ...] = ()
    # llama.cpp's other samplers (after the fields above, which keep their positions)
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    #: ``(token id, bias)`` added to the logits before every sampler; ``-inf`` bans a token.
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: ``(text, bias)``: every token of the text (tokenized without BOS or special tokens, as
    #: llama-server does) gets the bias; :meth:`Pyramid.submit <pyramid_gguf.api.Pyramid.submit>`
    #: turns them into :attr:`logit_bias` with the target's vocabulary.
    logit_bias_text: tuple[tuple[str, float], ...] = ()
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: tuple[str, ...] = DRY_BREAKERS

    def __post_init__(self) -> None:
        for sampler in SAMPLER_FIELDS:
            sampler.check(getattr(self, sampler.name))
        if self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        if self.seed == -1:
            object.__setattr__(self, "seed", None)
        elif self.seed is not None and self.seed < 0:
            raise UserError(f"--seed must be >= 0, or -1 for a random seed, got {self.seed}")
        self._check_chain()
        if self.max_tokens < 1:
            raise UserError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise UserError("stop strings must not be empty")
        if self.grammar is not None and self.triggers:
            raise UserError("an answer has one grammar: a whole-answer one or lazy triggers")
        if self.ignore_eos and (self.grammar is not None or self.triggers):
            raise UserError("ignore_eos cannot go with a grammar: the grammar ends the answer")

    def _check_chain(self) -> None:
        """What the table's ranges do not say: DRY's, the biases, the samplers' order."""
        self._check_dry()
        for token, bias in (*self.logit_bias, *self.logit_bias_text):
            if isinstance(token, int) and token < 0:
                raise UserError(f"logit_bias: token ids are >= 0, got {token}")
            if math.isnan(bias) or bias == math.inf:
                raise UserError(f"logit_bias: the bias of {token!r} must be finite or -inf")
        unknown = [s for s in self.samplers if s not in DEFAULT_SAMPLERS]
        if unknown:
            known = ", ".join(DEFAULT_SAMPLERS)
            raise UserError(f"unknown sampler {unknown[0]!r} in samplers: known are {known}")
        history = [i for i, s in enumerate(self.samplers) if s in HISTORY_SAMPLERS]
        xtc = self.samplers.index("xtc") if "xtc" in self.samplers else len(self.samplers)
        if self.xtc_probability > 0 and history and xtc < history[-1]:
            raise UserError("samplers: put xtc after penalties and dry")

    def _check_dry(self) -> None:
        """DRY's base (only while DRY is on) and its breakers."""
        if self.dry_multiplier != 0 and self.dry_base < 1:
            raise UserError(f"--dry-base must be >= 1, got {self.dry_base}")
        if any(not isinstance(b, str) or not b for b in self.dry_sequence_breakers):
            raise UserError("--dry-sequence-breaker: the breakers must be non-empty strings")

    def with_(self, **changes: object) -> SamplingConfig:
        """A copy with some fields replaced (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def sampler_changes(
    values: dict[str, Any], column: str | None = None, prefix: str = ""
) -> dict[str, Any]:
    """The sampler fields set in ``values`` (a request body or Ollama's ``options``), each read
    under a dialect's name (``column``: :class:`SamplerField`'s attribute naming it; None: the
    field's own name), as :class:`SamplingConfig` changes; a one-line :class:`UserError` naming
    the bad one (``prefix`` before its name: Ollama's ``"option "``)."""
    changes: dict[str, Any] = {}
    for field in SAMPLER_FIELDS:
        key = field.name if column is None else getattr(field, column)
        if key is not None and values.get(key) is not None:
            changes[field.name] = field.take(values[key], f"{prefix}{key}")
    return changes
