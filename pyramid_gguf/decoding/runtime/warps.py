"""llama.cpp's sampler chain as pure numpy, one function per sampler (its ``llama-sampler.cpp``).

A row of logits stands for llama.cpp's candidate array: a token removed by a sampler has logit
``-inf``, so every later sampler (and the final softmax) sees only the candidates left, as
llama.cpp's shrunken array does. The rows travel as :class:`Cands`: the whole vocabulary at
first, only the kept columns (with their token ids) once top-k has cut them, so the samplers
after it read ``k`` columns, not ``V``. Every function leaves its input untouched.

The chain is split in two (:func:`adjust`, :func:`finish`) so that each tier can run the part
that reads the position's prefix (``logit_bias``, the repetition penalties, DRY) where it has
the prefix at hand, and the rest, which reads only the row, wherever it warps. DRY's sequence
breakers are texts: :func:`breaker_table` finds the tokens that hold or begin them.

XTC is random per position in llama.cpp (with probability ``xtc_probability`` it removes the
top choices); its marginal distribution is the mixture ``(1 - P) * chain + P *
chain_with_cut``, which :func:`finish` returns, so every tier draws from one deterministic
distribution and exact speculative sampling stays lossless (docs/ALGORITHMS.md, "Sampling
warps").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...core.sampling import HISTORY_SAMPLERS, SamplingConfig

NEG_INF = -np.inf


@dataclass(frozen=True)
class Cands:
    """Rows of candidates: logits ``vals`` ``[n, m]`` (``-inf``: removed) of the tokens
    ``ids`` ``[n, m]``; ``ids`` None: every token, column ``j`` is token ``j`` (``m = V``)."""

    vals: np.ndarray
    ids: np.ndarray | None = None

    def token_ids(self) -> np.ndarray:
        """``[n, m]`` token ids (a broadcast view when every token is there)."""
        if self.ids is not None:
            return self.ids
        return np.broadcast_to(np.arange(self.vals.shape[-1]), self.vals.shape)

    def again(self, vals: np.ndarray) -> Cands:
        """The same tokens with new logits."""
        return Cands(vals, self.ids)

    def dense(
        self, vocab: int, values: np.ndarray | None = None, fill: float = NEG_INF
    ) -> np.ndarray:
        """``values`` (default: the logits) spread over the vocabulary, ``fill`` elsewhere.
        ``[n, m] -> [n, V]``."""
        v = self.vals if values is None else values
        if self.ids is None:
            return v
        out = np.full((len(v), vocab), fill, dtype=np.float64)
        np.put_along_axis(out, self.ids, v, axis=-1)
        return out

    def columns(self, i: int, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where ``tokens`` are among row ``i``'s candidates: (the columns, which of
        ``tokens`` are there)."""
        if self.ids is None:
            found = (tokens >= 0) & (tokens < self.vals.shape[-1])
            return tokens[found], found
        row = self.ids[i]
        order = np.argsort(row)
        at = np.clip(np.searchsorted(row, tokens, sorter=order), 0, len(row) - 1)
        found = row[order[at]] == tokens
        return order[at][found], found


def _probs(vals: np.ndarray) -> np.ndarray:
    """Softmax over each row's candidates (0 for removed ones), float64. ``[n, m] -> [n, m]``."""
    vals = np.asarray(vals, dtype=np.float64)
    top = np.max(vals, axis=-1, keepdims=True)
    e = np.exp(vals - np.where(np.isfinite(top), top, 0.0))
    return e / e.sum(axis=-1, keepdims=True)


def _sorted(c: Cands, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Row ``i``'s candidate columns, largest logit first (lowest token id on ties), and their
    probabilities (softmax over the candidates). ``-> [k], [k]``."""
    row = np.asarray(c.vals[i], dtype=np.float64)
    cols = np.flatnonzero(np.isfinite(row))
    ids = cols if c.ids is None else c.ids[i, cols]
    cols = cols[np.lexsort((ids, -row[cols]))]
    if not len(cols):
        return cols, np.zeros(0)
    e = np.exp(row[cols] - row[cols[0]])
    return cols, e / e.sum()


def _keep(c: Cands, keep: list[np.ndarray]) -> Cands:
    """Only the columns ``keep[i]`` of each row ``i`` stay candidates."""
    out = np.full_like(c.vals, NEG_INF, dtype=np.float64)
    for i, cols in enumerate(keep):
        out[i, cols] = c.vals[i, cols]
    return c.again(out)


# --- samplers that read the prefix --------------------------------------------------------


def logit_bias(c: Cands, bias: Sequence[tuple[int, float]]) -> Cands:
    """Add each ``(token, bias)`` (``-inf`` bans); ids outside the vocabulary are skipped, as
    llama.cpp skips them."""
    tokens = np.array([t for t, _ in bias], dtype=np.int64)
    amounts = np.array([b for _, b in bias], dtype=np.float64)
    out = c.vals.astype(np.float64, copy=True)
    for i in range(len(out)):
        cols, found = c.columns(i, tokens)
        np.add.at(out[i], cols, amounts[found])
    return c.again(out)


def penalties(
    c: Cands,
    histories: Sequence[Sequence[int]],
    *,
    last_n: int,
    repeat: float,
    frequency: float,
    presence: float,
) -> Cands:
    """llama.cpp's ``penalties``: each token seen ``n > 0`` times in the last ``last_n`` of row
    ``i``'s history (``-1``: all of it) has its logit divided by ``repeat`` (multiplied when
    ``<= 0``), then lowered by ``n * frequency + presence``."""
    if last_n == 0 or (repeat == 1.0 and frequency == 0.0 and presence == 0.0):
        return c
    out = c.vals.astype(np.float64, copy=True)
    for i, history in enumerate(histories):
        window = np.asarray(history[-last_n:] if last_n > 0 else history, dtype=np.int64)
        tokens, counts = np.unique(window, return_counts=True)
        cols, found = c.columns(i, tokens)
        v = out[i, cols]
        v = np.where(v <= 0, v * repeat, v / repeat)
        out[i, cols] = v - (counts[found] * frequency + presence)
    return c.again(out)


#: A DRY breaker table: each token that holds a breaker's text, or whose end begins one, and
#: the token sequences that complete the breaker after it (empty: the token alone holds it).
Breakers = Mapping[int, frozenset[tuple[int, ...]]]
#: llama.cpp's limits: a breaker's bytes, and the tokens of a breaker's tail.
MAX_BREAKER_BYTES = 40
MAX_BREAKER_TAIL = 20
#: ``log`` of float32's largest value: DRY clamps its exponent below it.
_FLOAT_MAX_LOG = np.float32(88.7228391)


def breaker_table(
    pieces: Sequence[bytes], tokenize: Callable[[bytes], list[int]], texts: Sequence[str]
) -> dict[int, frozenset[tuple[int, ...]]]:
    """llama.cpp's DRY breaker table (``get_overlapping_token_sequences``) of ``texts``:
    ``pieces[t]`` is token ``t`` detokenized alone (``[V]``), ``tokenize`` tokenizes bytes
    without BOS or special tokens. A token holding a whole breaker maps to the empty tail; a
    token whose last bytes begin one maps to the tokens of the rest of it (at most
    :data:`MAX_BREAKER_TAIL`)."""
    table: dict[int, set[tuple[int, ...]]] = {}
    tails: dict[bytes, tuple[int, ...]] = {}
    for text in texts:
        s = text.encode("utf-8")[:MAX_BREAKER_BYTES]
        if not s:
            continue
        head = s[:1]
        for token, word in enumerate(pieces):
            if head not in word:
                continue
            if s in word:
                table.setdefault(token, set()).add(())
                continue
            pos = word.find(head)
            while pos >= 0:
                if s.startswith(word[pos:]):
                    rest = s[len(word) - pos :]
                    if rest not in tails:
                        tails[rest] = tuple(tokenize(rest)[:MAX_BREAKER_TAIL])
                    table.setdefault(token, set()).add(tails[rest])
                pos = word.find(head, pos + 1)
    return {t: frozenset(v) for t, v in table.items()}


def dry_penalties(
    history: Sequence[int],
    breakers: Breakers,
    *,
    multiplier: float,
    base: float,
    allowed_length: int,
    last_n: int,
) -> dict[int, float]:
    """llama.cpp's DRY (``llama_sampler_dry_apply``) after one ``history``: how much to lower
    each token's logit. A token that would extend a repetition, a run of the last tokens that
    appeared earlier, longer than ``allowed_length`` tokens, is lowered by ``multiplier *
    base ** (length - allowed_length)``; the run stops at the last breaker, reading the last
    ``last_n`` tokens (-1: all). Tokens that are a breaker alone are never lowered."""
    if multiplier == 0 or base < 1 or last_n == 0:
        return {}
    window = list(history[-last_n:] if last_n > 0 else history)
    n = len(window)
    if n <= allowed_length:
        return {}
    rat = window[::-1]  # rat[i]: the token i from the end
    limit = _repeat_limit(rat, breakers)
    if limit < allowed_length:
        return {}
    counts = _repeat_counts(rat, limit)
    longest: dict[int, int] = {}
    for i in range(n - 1):
        if counts[i] >= allowed_length:
            token = rat[n - 2 - i]
            longest[token] = max(longest.get(token, 0), counts[i])
    top = int(_FLOAT_MAX_LOG / np.log(np.float32(base))) if base > 1.000001 else 0
    out = {}
    for token, length in longest.items():
        if () in breakers.get(token, ()):
            continue
        exponent = length - allowed_length
        if top > 0 and exponent > top:
            exponent = top
        out[token] = multiplier * base**exponent
    return out


def _repeat_limit(rat: list[int], breakers: Breakers) -> int:
    """The longest repetition DRY follows: up to the most recent breaker (step 1)."""
    for i, token in enumerate(rat):
        longest = -1
        for tail in breakers.get(token, ()):
            size = len(tail)
            if longest < size <= i and all(tail[o] == rat[i - o - 1] for o in range(size)):
                longest = size
        if longest >= 0:
            return i - longest
    return len(rat)


def _repeat_counts(rat: list[int], limit: int) -> list[int]:
    """llama.cpp's reverse Z-algorithm (step 2), its clamping to ``limit`` included:
    ``counts[n - 1 - k]`` is how many of the last tokens repeat ending ``k`` tokens back."""
    n = len(rat)
    last = n - 1
    counts = [0] * n
    lt = rt = 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat[m] == rat[m + k]:
                m += 1
            counts[last - k] = min(m, limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            p = k - lt
            right = rt - k + 1
            if counts[last - p] < right:
                counts[last - k] = min(counts[last - p], limit)
            else:
                i = rt + 1
                while i < n and rat[i] == rat[i - k]:
                    i += 1
                counts[last - k] = min(i - k, limit)
                lt, rt = k, i - 1
    return counts


def dry(
    c: Cands, histories: Sequence[Sequence[int]], breakers: Breakers, cfg: SamplingConfig
) -> Cands:
    """DRY on each row ``i`` after ``histories[i]`` (:func:`dry_penalties`)."""
    out = c.vals.astype(np.float64, copy=True)
    for i, history in enumerate(histories):
        lower = dry_penalties(
            history,
            breakers,
            multiplier=cfg.dry_multiplier,
            base=cfg.dry_base,
            allowed_length=cfg.dry_allowed_length,
            last_n=cfg.dry_penalty_last_n,
        )
        if not lower:
            continue
        tokens = np.fromiter(lower, dtype=np.int64, count=len(lower))
        amounts = np.fromiter(lower.values(), dtype=np.float64, count=len(lower))
        cols, found = c.columns(i, tokens)
        out[i, cols] -= amounts[found]
    return c.again(out)


# --- samplers of the row alone ---------------------------------------------------------------


def top_k(c: Cands, k: int) -> Cands:
    """Keep the ``k`` largest, the lowest ids among ties at the edge (llama.cpp's partial sort
    breaks them arbitrarily; every tier must break them alike); ``k <= 0`` keeps all. The rows
    shrink to ``k`` columns."""
    if k <= 0 or k >= c.vals.shape[-1]:
        return c
    keep = np.argpartition(-c.vals, k - 1, axis=-1)[:, :k]
    edge = np.take_along_axis(c.vals, keep, axis=-1).min(axis=-1, keepdims=True)
    ids = c.token_ids()
    for i in np.flatnonzero((c.vals >= edge).sum(axis=-1) > k):  # ties at the edge
        above = np.flatnonzero(c.vals[i] > edge[i])
        tied = np.flatnonzero(c.vals[i] == edge[i])
        tied = tied[np.argsort(ids[i, tied], kind="stable")][: k - len(above)]
        keep[i] = np.concatenate([above, tied])
    vals = np.take_along_axis(c.vals, keep, axis=-1).astype(np.float64)
    return Cands(vals, np.take_along_axis(ids, keep, axis=-1))


def top_p(c: Cands, p: float) -> Cands:
    """Keep the smallest prefix (by probability) whose mass reaches ``p``; ``p >= 1`` keeps
    all. A relative epsilon absorbs rounding, so a prefix summing to exactly ``p`` is not
    extended by one token."""
    if p >= 1.0:
        return c
    keep = []
    for i in range(len(c.vals)):
        cols, pi = _sorted(c, i)
        before = np.cumsum(pi) - pi
        keep.append(cols[before < p * (1 - 1e-9)])
    return _keep(c, keep)


def min_p(c: Cands, p: float) -> Cands:
    """Keep tokens whose probability is at least ``p`` times the top one's (a logit at least
    ``max + log p``); ``p <= 0`` keeps all."""
    if p <= 0:
        return c
    floor = np.max(c.vals, axis=-1, keepdims=True) + np.log(p)
    return c.again(np.where(c.vals >= floor, c.vals, NEG_INF))


def typical(c: Cands, p: float) -> Cands:
    """Locally typical sampling: order candidates by ``|-log p_i - H|`` (``H`` the entropy) and
    keep the shortest run whose mass exceeds ``p``; ``p >= 1`` keeps all."""
    if p >= 1.0:
        return c
    keep = []
    for i in range(len(c.vals)):
        cols, pi = _sorted(c, i)
        logs = np.log(pi, out=np.full_like(pi, NEG_INF), where=pi > 0)
        entropy = -np.sum(np.where(pi > 0, pi * logs, 0.0))
        order = np.argsort(np.abs(-logs - entropy), kind="stable")
        over = np.flatnonzero(np.cumsum(pi[order]) > p)
        last = int(over[0]) + 1 if len(over) else len(order)
        keep.append(cols[order[:last]])
    return _keep(c, keep)


def top_n_sigma(c: Cands, n: float) -> Cands:
    """Keep tokens within ``n`` standard deviations (of the candidates' logits) of the top
    logit; ``n <= 0`` keeps all."""
    if n <= 0:
        return c
    z = c.vals
    alive = np.isfinite(z)
    count = alive.sum(axis=-1, keepdims=True)
    vals = np.where(alive, z, 0.0)
    mean = vals.sum(axis=-1, keepdims=True) / np.maximum(count, 1)
    std = np.sqrt(np.where(alive, (vals - mean) ** 2, 0.0).sum(-1, keepdims=True) / count)
    floor = np.max(z, axis=-1, keepdims=True) - n * std
    return c.again(np.where((count <= 1) | (z >= floor), z, NEG_INF))


def xtc_cut(c: Cands, threshold: float) -> Cands:
    """XTC when it fires: of the candidates with probability ``>= threshold`` (a leading run,
    largest first), remove all but the least likely; ``threshold > 0.5`` or fewer than two
    candidates: nothing."""
    if threshold > 0.5:
        return c
    out = c.vals.astype(np.float64, copy=True)
    for i in range(len(out)):
        cols, pi = _sorted(c, i)
        if len(cols) < 2:
            continue
        above = pi >= threshold
        run = len(above) if above.all() else int(np.argmin(above))
        if run > 1:
            out[i, cols[: run - 1]] = NEG_INF
    return c.again(out)


def temperature(c: Cands, temp: float, dyn_range: float, exponent: float) -> Cands:
    """llama.cpp's ``temp_ext``: divide by ``temp`` (``<= 0``: keep only the argmax, lowest
    id on ties). With ``dyn_range > 0`` the temperature of each row is
    ``lo + (hi - lo) * (H / log m) ** exponent`` for ``lo = max(0, temp - dyn_range)``,
    ``hi = temp + dyn_range``, ``H`` the entropy of its ``m`` candidates."""
    temps = np.full(len(c.vals), temp, dtype=np.float64)
    if dyn_range > 0:
        lo, hi = max(0.0, temp - dyn_range), temp + dyn_range
        probs = _probs(c.vals)
        for i, row in enumerate(c.vals):
            m = int(np.isfinite(row).sum())
            if m <= 1:
                temps[i] = 1.0  # nothing to scale: llama.cpp leaves a single candidate alone
                continue
            pi = probs[i][probs[i] > 0]
            entropy = float(-np.sum(pi * np.log(pi)))
            temps[i] = lo + (hi - lo) * (entropy / np.log(m)) ** exponent
    out = c.vals / np.where(temps > 0, temps, 1.0)[:, None]
    for cold in np.flatnonzero(temps <= 0):
        best = _argmax(c, int(cold))
        out[cold] = NEG_INF
        out[cold, best] = c.vals[cold, best]
    return c.again(out)


def _argmax(c: Cands, i: int) -> int:
    """Row ``i``'s column of the largest logit, the lowest token id on ties."""
    row = c.vals[i]
    if c.ids is None:
        return int(np.argmax(row))
    tied = np.flatnonzero(row == row.max())
    return int(tied[np.argmin(c.ids[i, tied])])


# --- the chain --------------------------------------------------------------------------------


def _step(
    name: str,
    c: Cands,
    cfg: SamplingConfig,
    histories: Sequence[Sequence[int]],
    breakers: Breakers | None = None,
) -> Cands:
    """One named sampler of ``cfg.samplers`` on ``c``."""
    if name == "dry":
        return dry(c, histories, breakers or {}, cfg) if _on(name, cfg) else c
    if name == "penalties":
        return penalties(
            c,
            histories,
            last_n=cfg.repeat_last_n,
            repeat=cfg.repeat_penalty,
            frequency=cfg.frequency_penalty,
            presence=cfg.presence_penalty,
        )
    if name == "top_k":
        return top_k(c, cfg.top_k)
    if name == "top_p":
        return top_p(c, cfg.top_p)
    if name == "min_p":
        return min_p(c, cfg.min_p)
    if name == "typ_p":
        return typical(c, cfg.typical_p)
    if name == "top_n_sigma":
        return top_n_sigma(c, cfg.top_n_sigma)
    if name == "temperature":
        return temperature(c, cfg.temperature, cfg.dynatemp_range, cfg.dynatemp_exponent)
    return c  # "xtc" is the mixture in finish


def split(cfg: SamplingConfig) -> int:
    """How many of ``cfg.samplers`` :func:`adjust` runs: up to the last one that reads the
    prefix and is on (0: none is)."""
    active = [i for i, s in enumerate(cfg.samplers) if s in HISTORY_SAMPLERS and _on(s, cfg)]
    return active[-1] + 1 if active else 0


def _on(name: str, cfg: SamplingConfig) -> bool:
    if name == "penalties":
        off = cfg.repeat_penalty == 1.0 and cfg.frequency_penalty == 0.0
        return cfg.repeat_last_n != 0 and not (off and cfg.presence_penalty == 0.0)
    if name == "dry":
        return dry_on(cfg)
    return False


def dry_on(cfg: SamplingConfig) -> bool:
    """DRY can lower a token: llama.cpp's test of a DRY sampler that is not empty."""
    return (
        "dry" in cfg.samplers
        and cfg.dry_multiplier != 0
        and cfg.dry_base >= 1
        and cfg.dry_penalty_last_n != 0
    )


def adjust(
    z: np.ndarray,
    cfg: SamplingConfig,
    histories: Sequence[Sequence[int]] | None = None,
    breakers: Breakers | None = None,
) -> np.ndarray:
    """``logit_bias`` then the samplers up to the last that reads the prefix, row ``i`` after
    ``histories[i]`` (None: empty histories); DRY stops at ``breakers`` (:func:`breaker_table`
    of ``cfg.dry_sequence_breakers``; None: none). ``[n, V] -> [n, V]``, float64 when
    changed."""
    rows = np.atleast_2d(np.asarray(z))
    c = Cands(rows)
    if cfg.logit_bias:
        c = logit_bias(c, cfg.logit_bias)
    hist = histories if histories is not None else [()] * len(rows)
    for name in cfg.samplers[: split(cfg)]:
        c = _step(name, c, cfg, hist, breakers)
    return c.dense(rows.shape[-1])


def finish(z: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """The samplers after :func:`adjust`'s, then the final softmax: probabilities
    ``[n, V]`` float64. With XTC on, the mixture ``(1 - P) * without + P * with its cut``."""
    rows = np.atleast_2d(np.asarray(z))
    vocab = rows.shape[-1]
    names = cfg.samplers[split(cfg) :]
    no_rows: list[Sequence[int]] = []
    c = Cands(rows)
    if not xtc_on(cfg) or "xtc" not in names:
        for name in names:
            c = _step(name, c, cfg, no_rows)
        return c.dense(vocab, _probs(c.vals), 0.0)
    at = names.index("xtc")
    for name in names[:at]:
        c = _step(name, c, cfg, no_rows)
    kept, cut = c, xtc_cut(c, cfg.xtc_threshold)
    for name in names[at + 1 :]:
        kept = _step(name, kept, cfg, no_rows)
        cut = _step(name, cut, cfg, no_rows)
    p = cfg.xtc_probability
    with_ = cut.dense(vocab, _probs(cut.vals), 0.0)
    return (1 - p) * kept.dense(vocab, _probs(kept.vals), 0.0) + p * with_


def xtc_on(cfg: SamplingConfig) -> bool:
    """XTC can remove a token: fires sometimes, and its threshold can be met."""
    return cfg.xtc_probability > 0 and cfg.xtc_threshold <= 0.5 and "xtc" in cfg.samplers


def is_greedy(cfg: SamplingConfig) -> bool:
    """Every warped row is one-hot on the argmax of the adjusted logits (lowest id on ties):
    the temperature sampler runs at 0 without a dynamic range, and nothing between
    :func:`adjust` and it can drop the argmax (locally typical sampling or XTC)."""
    if cfg.temperature != 0 or cfg.dynatemp_range > 0 or "temperature" not in cfg.samplers:
        return False
    at = cfg.samplers.index("temperature")
    start = split(cfg)
    if at < start:
        return True
    between = cfg.samplers[start:at]
    typical_on = "typ_p" in between and cfg.typical_p < 1
    return not typical_on and not ("xtc" in between and xtc_on(cfg))
