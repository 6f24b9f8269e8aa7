"""Benchmarking decoding modes side by side: measurement, aggregation, output.

:func:`build_grid` turns modes and ``--sweep`` knobs into config rows; :func:`run_bench` runs
every row over every prompt, ``repeats`` times, interleaved (repeat -> prompt -> row, so machine
noise hits every row alike), and :func:`aggregate` reduces the samples to one
:class:`RowResult` per row: generation tok/s per repeat (all prompts of a repeat pooled:
tokens / seconds), its median and spread, the speedup against the ``target`` row of the same
run (ratio of medians; per-repeat ratios give the spread), per-stage acceptance summed from the
engine's :class:`~pyramid_gguf.stats.GenerationStats`, each tier's and the Python scheduler's
share of wall time, agreement with the target's tokens, and HumanEval pass@1 when asked.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import MODE_TIERS, MODES, SamplingConfig, SpecConfig
from .errors import UserError
from .stats import GenerationStats, StageStats

#: Knobs ``--sweep`` accepts, with their value types.
SWEEP_KNOBS: dict[str, type] = {
    "l_d": int,
    "l_q": int,
    "tau_q": float,
    "tau_t": float,
    "p_min": float,
    "divergence": str,
    "fuzzy_variant": str,
    "exact_rule": str,
}

#: Knobs that change what each mode does (a swept knob a mode ignores is not swept for it).
MODE_KNOBS: dict[str, frozenset[str]] = {
    "target": frozenset(),
    "sd": frozenset({"l_d", "p_min", "exact_rule"}),
    "fsd": frozenset({"l_d", "p_min", "tau_t", "divergence", "fuzzy_variant"}),
    "psd-exact": frozenset({"l_d", "l_q", "p_min", "exact_rule"}),
    "psd-a": frozenset(
        {"l_d", "l_q", "p_min", "exact_rule", "tau_t", "divergence", "fuzzy_variant"}
    ),
    "psd-f": frozenset({"l_d", "l_q", "p_min", "tau_q", "tau_t", "divergence", "fuzzy_variant"}),
}

PROMPT_SETS = ("code", "edit", "chat", "qa")


# --- prompts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: its set (``code``, ``edit``...), an id and the text."""

    set: str
    id: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.set}/{self.id}"


def _prompts_from_json(data: Any, set_name: str, where: str) -> list[BenchPrompt]:
    if isinstance(data, dict):  # {"set": [...], ...}
        return [p for name, items in data.items() for p in _prompts_from_json(items, name, where)]
    if not isinstance(data, list):
        raise UserError(f"{where}: expected a JSON list of prompts or an object of lists")
    out = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            out.append(BenchPrompt(set_name, str(i), item))
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            out.append(BenchPrompt(set_name, str(item.get("id", i)), item["text"]))
        else:
            raise UserError(f"{where}: prompt {i} is neither a string nor an object with 'text'")
    return out


def load_prompt_sets(names: Sequence[str] | None = None) -> list[BenchPrompt]:
    """The shipped prompt sets (``code``, ``edit``, ``chat``, ``qa``), all by default."""
    names = list(names) if names else list(PROMPT_SETS)
    unknown = [n for n in names if n not in PROMPT_SETS]
    if unknown:
        raise UserError(f"unknown prompt set {unknown[0]!r}; valid: {', '.join(PROMPT_SETS)}")
    base = Path(__file__).parent / "data" / "prompts"
    out: list[BenchPrompt] = []
    for name in dict.fromkeys(names):
        data = json.loads(base.joinpath(f"{name}.json").read_text(encoding="utf-8"))
        out += _prompts_from_json(data, name, f"prompt set {name}")
    return out


def load_prompt_file(path: str | Path) -> list[BenchPrompt]:
    """Prompts of a user file: JSON (a list of strings / ``{"id", "text"}`` objects, or an object
    of such lists keyed by set name), or plain text with prompts separated by blank lines."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read prompt file {p}: {e.strerror or e}") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{p}: invalid JSON ({e.msg} at line {e.lineno})") from None
        prompts = _prompts_from_json(data, p.stem, str(p))
    else:
        chunks = [c.strip("\n") for c in text.split("\n\n")]
        kept = [c for c in chunks if c.strip()]
        prompts = [BenchPrompt(p.stem, str(i), c) for i, c in enumerate(kept)]
    if not prompts:
        raise UserError(f"{p}: no prompts found")
    return prompts


# --- the grid --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """One row of the benchmark: a spec and the swept knob values that made it."""

    label: str
    spec: SpecConfig
    knobs: dict[str, Any] = field(default_factory=dict)


def available_modes(n_tiers: int, has_draft: bool, has_qualifier: bool) -> list[str]:
    """Modes a ladder can run: target always; 2-tier modes with a draft; 3-tier with both."""
    del n_tiers
    out = ["target"]
    if has_draft:
        out += [m for m in MODES if MODE_TIERS[m] == 2]
        if has_qualifier:
            out += [m for m in MODES if MODE_TIERS[m] == 3]
    return out


def parse_modes(text: str | Sequence[str] | None, allowed: Sequence[str]) -> list[str]:
    """``--modes sd,psd-exact`` -> the modes to run, ``target`` always first (the reference)."""
    if text is None or text == "" or text == "all":
        wanted = list(allowed)
    else:
        items = text.split(",") if isinstance(text, str) else list(text)
        wanted = [m.strip() for m in items if m.strip()]
    for m in wanted:
        if m not in MODES:
            raise UserError(f"unknown mode {m!r}; valid modes: {', '.join(MODES)}")
        if m not in allowed:
            raise UserError(
                f"mode {m} needs a {'qualifier and a ' if MODE_TIERS[m] == 3 else ''}draft "
                f"model; this ladder allows: {', '.join(allowed)}"
            )
    return ["target", *[m for m in dict.fromkeys(wanted) if m != "target"]]


def parse_sweep(items: Iterable[str]) -> list[tuple[str, list[Any]]]:
    """``["l_d=2,4,8", "tau_t=0.2,0.4"]`` -> ``[("l_d", [2, 4, 8]), ("tau_t", [0.2, 0.4])]``."""
    out: list[tuple[str, list[Any]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not values.strip():
            raise UserError(f"malformed --sweep {item!r}; expected KNOB=V1,V2 (e.g. l_d=2,4,8)")
        if key not in SWEEP_KNOBS:
            raise UserError(f"cannot sweep {key!r}; valid knobs: {', '.join(SWEEP_KNOBS)}")
        if any(k == key for k, _ in out):
            raise UserError(f"--sweep {key} given twice")
        kind = SWEEP_KNOBS[key]
        parsed: list[Any] = []
        for v in values.split(","):
            v = v.strip()
            try:
                parsed.append(kind(v))
            except ValueError:
                raise UserError(f"--sweep {key}: {v!r} is not a valid {kind.__name__}") from None
        out.append((key, list(dict.fromkeys(parsed))))
    return out


def _label(mode: str, knobs: dict[str, Any]) -> str:
    return mode + "".join(f" {k}={v}" for k, v in knobs.items())


def build_grid(
    modes: Sequence[str], base: SpecConfig, sweeps: Sequence[tuple[str, list[Any]]] = ()
) -> list[BenchConfig]:
    """One row per mode and point of the cartesian grid of the knobs that mode uses.

    ``target`` is one row; a mode gets ``prod(len(values))`` rows over the swept knobs it uses
    (``tau_t`` is not swept for ``sd``). Invalid values raise :class:`UserError`.
    """
    rows: list[BenchConfig] = []
    for mode in modes:
        used = [(k, vs) for k, vs in sweeps if k in MODE_KNOBS[mode]]
        for point in itertools.product(*(vs for _, vs in used)):
            knobs = {k: v for (k, _), v in zip(used, point, strict=True)}
            spec = base.with_(mode=mode, **knobs)
            rows.append(BenchConfig(_label(mode, knobs), spec, knobs))
    return rows


# --- measurement -----------------------------------------------------------------------------


@dataclass
class Sample:
    """One generation of one row on one prompt."""

    row: int
    prompt: str
    repeat: int
    token_ids: list[int]
    stats: GenerationStats


@dataclass
class BenchRun:
    """Everything :func:`run_bench` measured."""

    configs: list[BenchConfig]
    prompts: list[BenchPrompt]
    sampling: SamplingConfig
    repeats: int
    samples: list[Sample]
    peak_rss: dict[int, float]
    humaneval: dict[int, list[Any]] = field(default_factory=dict)
    seconds: float = 0.0


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (models of every tier included)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


Progress = Callable[[int], None]


def encode_prompt(pyramid: Any, prompt: BenchPrompt, chat: bool) -> list[int]:
    """Token ids of a prompt: through the target's chat template when ``chat``, else raw."""
    if chat:
        return list(pyramid.chat_tokens([{"role": "user", "content": prompt.text}]))
    return list(pyramid.tokenize(prompt.text))


def run_bench(
    pyramid: Any,
    configs: Sequence[BenchConfig],
    prompts: Sequence[BenchPrompt],
    sampling: SamplingConfig,
    *,
    repeats: int = 3,
    warmup: bool = True,
    chat: bool | None = None,
    humaneval_problems: Sequence[dict[str, Any]] = (),
    humaneval_timeout: float = 10.0,
    progress: Progress | None = None,
) -> BenchRun:
    """Run every config over every prompt ``repeats`` times, interleaved.

    ``pyramid`` is a loaded :class:`~pyramid_gguf.api.Pyramid`. ``chat=None`` uses the
    target's chat template when it has one. ``progress(n)`` is called after each generation.
    """
    if repeats < 1:
        raise UserError(f"--repeats must be at least 1, got {repeats}")
    if not prompts:
        raise UserError("no prompts to run")
    if not configs or configs[0].spec.mode != "target":
        raise UserError("the first benchmark row must be the target reference")
    if chat is None:
        chat = pyramid.target.chat_template() is not None
    encoded = {p.key: encode_prompt(pyramid, p, chat) for p in prompts}
    t0 = time.perf_counter()
    if warmup:
        first = encoded[prompts[0].key]
        for c in configs:
            pyramid.generate(first, sampling.with_(max_tokens=min(8, sampling.max_tokens)), c.spec)
    samples: list[Sample] = []
    peak: dict[int, float] = {}
    for r in range(repeats):
        for p in prompts:
            for i, c in enumerate(configs):
                done = pyramid.generate(encoded[p.key], sampling, c.spec)
                samples.append(Sample(i, p.key, r, list(done.token_ids), done.stats))
                peak[i] = peak_rss_mib()
                if progress:
                    progress(1)
    he: dict[int, list[Any]] = {}
    if humaneval_problems:
        from .humaneval import STOP, check, truncate

        he_sampling = sampling.with_(stop=tuple(dict.fromkeys((*sampling.stop, *STOP))))
        for problem in humaneval_problems:
            for i, c in enumerate(configs):
                done = pyramid.generate(problem["prompt"], he_sampling, c.spec)
                he.setdefault(i, []).append(
                    check(problem, truncate(done.text), timeout=humaneval_timeout)
                )
                if progress:
                    progress(1)
    return BenchRun(
        list(configs), list(prompts), sampling, repeats, samples, peak, he, time.perf_counter() - t0
    )


def total_steps(n_configs: int, n_prompts: int, repeats: int, n_humaneval: int = 0) -> int:
    """Generations :func:`run_bench` will report to ``progress``."""
    return n_configs * (n_prompts * repeats + n_humaneval)


# --- aggregation -----------------------------------------------------------------------------


def sum_stages(stats: Iterable[GenerationStats]) -> list[StageStats]:
    """Per-stage sums of ``draft_n``, ``draft_n_accepted``, verifications and histograms."""
    out: dict[str, StageStats] = {}
    for s in stats:
        for st in s.stages:
            out.setdefault(st.name, StageStats(st.name)).merge(st)
    return list(out.values())


def agreement(reference: Sequence[int], tokens: Sequence[int]) -> tuple[float, float]:
    """(prefix, positional) agreement of ``tokens`` with ``reference``.

    prefix: length of the common prefix over the reference length (1.0 = identical up to the
    end); positional: positions holding the same token over the longer length.
    """
    n = max(len(reference), len(tokens))
    if n == 0:
        return 1.0, 1.0
    prefix = 0
    for a, b in zip(reference, tokens, strict=False):
        if a != b:
            break
        prefix += 1
    same = sum(a == b for a, b in zip(reference, tokens, strict=False))
    return prefix / max(len(reference), 1), same / n


def _spread(values: Sequence[float]) -> dict[str, float]:
    vals = sorted(values)
    out = {"median": statistics.median(vals), "min": vals[0], "max": vals[-1]}
    if len(vals) >= 4:
        q = statistics.quantiles(vals, n=4)
        out |= {"q1": q[0], "q3": q[2]}
    return out


@dataclass
class RowResult:
    """One row's aggregated results."""

    label: str
    mode: str
    knobs: dict[str, Any]
    spec: dict[str, Any]
    lossless: bool
    n_samples: int
    generated_tokens: int
    tps: dict[str, float]
    tps_repeats: list[float]
    speedup: float
    speedup_repeats: list[float]
    tps_by_set: dict[str, float]
    stages: list[StageStats]
    time_share: dict[str, float]
    agreement_prefix: float
    agreement_positional: float
    peak_rss_mib: float
    humaneval_pass_at_1: float | None = None
    humaneval_n: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stages"] = [s.to_dict() for s in self.stages]
        r4 = lambda x: round(x, 4)  # noqa: E731
        d["tps"] = {k: round(v, 2) for k, v in self.tps.items()}
        d["tps_repeats"] = [round(v, 2) for v in self.tps_repeats]
        d["tps_by_set"] = {k: round(v, 2) for k, v in self.tps_by_set.items()}
        d["speedup"] = r4(self.speedup)
        d["speedup_repeats"] = [r4(v) for v in self.speedup_repeats]
        d["time_share"] = {k: r4(v) for k, v in self.time_share.items()}
        d["agreement_prefix"] = r4(self.agreement_prefix)
        d["agreement_positional"] = r4(self.agreement_positional)
        d["peak_rss_mib"] = round(self.peak_rss_mib, 1)
        return d


def _tps(samples: Iterable[Sample]) -> float:
    tokens = seconds = 0.0
    for s in samples:
        tokens += s.stats.generated_tokens
        seconds += s.stats.generation_seconds
    return tokens / seconds if seconds > 0 else 0.0


def aggregate(run: BenchRun) -> list[RowResult]:
    """One :class:`RowResult` per config of ``run`` (row 0 is the target reference)."""
    by_row: dict[int, list[Sample]] = {}
    for s in run.samples:
        by_row.setdefault(s.row, []).append(s)
    reference = {s.prompt: s.token_ids for s in by_row.get(0, []) if s.repeat == 0}
    target_tps = [_tps(s for s in by_row.get(0, []) if s.repeat == r) for r in range(run.repeats)]
    target_median = statistics.median(target_tps)
    rows = []
    for i, c in enumerate(run.configs):
        samples = by_row.get(i, [])
        tps_r = [_tps(s for s in samples if s.repeat == r) for r in range(run.repeats)]
        tps = _spread(tps_r)
        if i == 0:
            speedup, speedup_r = 1.0, [1.0] * run.repeats
        else:
            speedup = tps["median"] / target_median if target_median > 0 else 0.0
            speedup_r = [a / b if b > 0 else 0.0 for a, b in zip(tps_r, target_tps, strict=True)]
        sets = dict.fromkeys(p.set for p in run.prompts)
        by_set = {
            name: _tps(s for s in samples if s.prompt.split("/", 1)[0] == name) for name in sets
        }
        wall = sum(s.stats.prompt_seconds + s.stats.generation_seconds for s in samples)
        share: dict[str, float] = {}
        for s in samples:
            for t in s.stats.tiers:
                if t.seconds > 0 or t.n_tokens > 0:
                    share[t.name] = share.get(t.name, 0.0) + t.seconds
        share["scheduler"] = sum(s.stats.scheduler_seconds for s in samples)
        share = {k: v / wall if wall > 0 else 0.0 for k, v in share.items()}
        agree = [agreement(reference.get(s.prompt, []), s.token_ids) for s in samples]
        he = run.humaneval.get(i)
        rows.append(
            RowResult(
                label=c.label,
                mode=c.spec.mode,
                knobs=dict(c.knobs),
                spec=asdict(c.spec),
                lossless=c.spec.lossless,
                n_samples=len(samples),
                generated_tokens=sum(s.stats.generated_tokens for s in samples),
                tps=tps,
                tps_repeats=tps_r,
                speedup=speedup,
                speedup_repeats=speedup_r,
                tps_by_set=by_set,
                stages=sum_stages(s.stats for s in samples),
                time_share=share,
                agreement_prefix=statistics.fmean(a for a, _ in agree) if agree else 0.0,
                agreement_positional=statistics.fmean(b for _, b in agree) if agree else 0.0,
                peak_rss_mib=run.peak_rss.get(i, 0.0),
                humaneval_pass_at_1=(sum(r.passed for r in he) / len(he)) if he else None,
                humaneval_n=len(he) if he else 0,
            )
        )
    return rows


# --- output ----------------------------------------------------------------------------------


def report(
    run: BenchRun, rows: Sequence[RowResult], meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``--json`` document."""
    return {
        "meta": {
            **(meta or {}),
            "repeats": run.repeats,
            "prompts": [p.key for p in run.prompts],
            "sampling": asdict(run.sampling),
            "seconds": round(run.seconds, 2),
            "peak_rss_mib": round(max(run.peak_rss.values(), default=peak_rss_mib()), 1),
        },
        "rows": [r.to_dict() for r in rows],
    }


def _stage_text(r: RowResult) -> str:
    return (
        "  ".join(
            f"{s.name} {100 * s.acceptance_rate:.0f}%/{s.mean_accepted:.2f}" for s in r.stages
        )
        or "-"
    )


def _share_text(r: RowResult) -> str:
    return " ".join(
        f"{k[0] if k != 'scheduler' else 'py'}{100 * v:.0f}" for k, v in r.time_share.items()
    )


def format_table(rows: Sequence[RowResult]) -> str:
    """The human-readable table: one line per row."""
    he = any(r.humaneval_pass_at_1 is not None for r in rows)
    width = max([len("config"), *(len(r.label) for r in rows)])
    head = (
        f"{'config':<{width}} {'tok/s':>8} {'min-max':>13} {'speedup':>7} {'agree':>6} "
        + (f"{'pass@1':>6} " if he else "")
        + f"{'RSS MiB':>8}  {'time % (d/q/t/py)':<20} acceptance (rate/mean accepted)"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        spread = f"{r.tps['min']:.1f}-{r.tps['max']:.1f}"
        line = (
            f"{r.label:<{width}} {r.tps['median']:>8.1f} {spread:>13} {r.speedup:>6.2f}x "
            f"{r.agreement_positional:>6.2f} "
        )
        if he:
            line += f"{r.humaneval_pass_at_1 if r.humaneval_pass_at_1 is not None else 0:>6.2f} "
        line += f"{r.peak_rss_mib:>8.0f}  {_share_text(r):<20} {_stage_text(r)}"
        lines.append(line)
    lines.append(
        "tok/s: generation median over repeats (min-max); speedup: median / target median; "
        "agree: positional token agreement with target"
    )
    return "\n".join(lines)


CSV_FIELDS = (
    "label",
    "mode",
    "knobs",
    "lossless",
    "n_samples",
    "generated_tokens",
    "tps_median",
    "tps_min",
    "tps_max",
    "speedup",
    "speedup_min",
    "speedup_max",
    "agreement_prefix",
    "agreement_positional",
    "humaneval_pass_at_1",
    "peak_rss_mib",
    "time_share",
    "stages",
    "tps_by_set",
)


def to_csv(rows: Sequence[RowResult]) -> str:
    """One CSV line per row; stage acceptance and time shares as ``name=value`` lists."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_FIELDS)
    for r in rows:
        w.writerow(
            [
                r.label,
                r.mode,
                json.dumps(r.knobs),
                r.lossless,
                r.n_samples,
                r.generated_tokens,
                round(r.tps["median"], 2),
                round(r.tps["min"], 2),
                round(r.tps["max"], 2),
                round(r.speedup, 4),
                round(min(r.speedup_repeats), 4),
                round(max(r.speedup_repeats), 4),
                round(r.agreement_prefix, 4),
                round(r.agreement_positional, 4),
                "" if r.humaneval_pass_at_1 is None else round(r.humaneval_pass_at_1, 4),
                round(r.peak_rss_mib, 1),
                ";".join(f"{k}={v:.4f}" for k, v in r.time_share.items()),
                ";".join(
                    f"{s.name}={s.acceptance_rate:.4f}/{s.mean_accepted:.3f}" for s in r.stages
                ),
                ";".join(f"{k}={v:.2f}" for k, v in r.tps_by_set.items()),
            ]
        )
    return buf.getvalue()
