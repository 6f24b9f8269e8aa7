"""Tune ``auto`` in seconds: replay recorded greedy answers through its scheduler, priced by a
cost curve, with no model loaded; and llama.cpp's n-gram drafters on the same answers.

``record`` decodes every shipped prompt (and the README's first one) with plain greedy
decoding on the default ladder's target and saves prompt and answer tokens with the target's
measured cost curve. ``replay`` runs :class:`~pyramid_gguf.decoding.runtime.auto.AutoScheduler` on
those answers against a scripted target (:mod:`pyramid_gguf.decoding.offline.replay`) and prints,
per prompt set and answer length, the speedup over plain decoding that the cost model predicts: what
``auto`` would do on the real target, near-ties aside. Change a constant in
``decoding/pricing/policy.py`` or ``decoding/pricing/estimates.py``, replay, compare.

``--peers`` also replays llama.cpp's ``ngram-simple``, ``ngram-map-k`` and ``ngram-mod`` as
``llama-speculative-simple`` runs them with their default settings (:data:`PEERS`, read from
the llama.cpp that llama-cpp-python 0.3.36 vendors), priced by the same curve, and prints every
prompt at the longest length: ``auto``, each drafter, ``auto`` over the best of them, and the
copy bounds (:func:`~pyramid_gguf.decoding.offline.bound.copy_bound`: the most any n-gram drafter
could reach on that answer and curve, choosing its copies and blocks with perfect foresight; and,
unanchored, any drafter copying from the context).

    python scripts/lab/replay_auto.py record answers.json [-n 256] [-t 2]
    python scripts/lab/replay_auto.py replay answers.json [--curve recorded|avx512|curve.json] \\
        [--lengths 64,160,256] [--sets summarize,rag] [--peers] [-v]

``--curve avx512`` is issue 12's 2-core AVX-512 machine (ms per decode of 1..8 tokens: 34,
51, 68, 80, 129, 140, 160, 188); a JSON file holds ``{"seconds": [c(1), c(2), ...]}``. The
recorded curve stops at 16 tokens; llama.cpp's blocks of up to 49 are priced on its linear
extension, so give a curve measured that far (``--curve``) before trusting the peers' and the
bounds' columns.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from pyramid_gguf.decoding.offline.bound import copy_bound
from pyramid_gguf.decoding.offline.replay import replay
from pyramid_gguf.decoding.pricing.costs import CostCurve

FIRST_PROMPT = "Write a Python function that checks whether a number is prime."
AVX512_MS = (34, 51, 68, 80, 129, 140, 160, 188)


class NgramSimple:
    """``common_ngram_simple_draft``: the newest earlier occurrence of the last ``n`` tokens
    (``size_n`` 12); drafts the ``m`` (``size_m`` 48) tokens after it, none when fewer than
    ``n`` follow. ``--spec-draft-n-max`` does not reach it."""

    name = "ngram-simple"

    def __init__(self, prompt: Sequence[int], n: int = 12, m: int = 48) -> None:
        self.n, self.m = n, m

    def draft(self, tokens: Sequence[int], last: int) -> list[int]:
        cur, n = len(tokens), self.n
        if cur <= n + self.m + 1:
            return []
        pattern = [*tokens[cur - n + 1 :], last]
        for j in range(cur - n - 1, 0, -1):
            if tokens[j] == pattern[0] and list(tokens[j : j + n]) == pattern:
                copy = min(self.m, cur - (j + n))
                return list(tokens[j + n : j + n + copy]) if copy >= n else []
        return []

    def accept(self, kept: int) -> None:
        return None


class NgramMapK:
    """``common_ngram_map_draft`` with ``key_only``: a hash map from 12-token keys to the
    position stored first (the newest in the prompt, then the oldest in the answer), only for
    keys followed by more than ``m`` tokens; drafts ``min(m, kept last time from this key)``
    tokens (``m`` = 48 at first, never again once a draft from the key kept nothing)."""

    name = "ngram-map-k"

    def __init__(self, prompt: Sequence[int], n: int = 12, m: int = 48) -> None:
        self.n, self.m = n, m
        self.begin = len(prompt) - 1  # size_last_begin: the prompt without its last token
        self.key_map: dict[tuple[int, ...], int] = {}
        self.last_idx = 0  # key_map_last_idx
        self.kept: dict[tuple[int, ...], int] = {}  # per key: values[0].n_accepted
        self.drafted: tuple[int, ...] | None = None

    def _scan(self, tokens: Sequence[int], hi: int, lo: int, key: tuple[int, ...]) -> int:
        for j in range(hi, lo, -1):
            if tuple(tokens[j : j + self.n]) == key:
                return j
        return 0

    def draft(self, tokens: Sequence[int], last: int) -> list[int]:
        self.drafted = None
        cur, n, m = len(tokens), self.n, self.m
        if cur < 2 * n + m:
            return []
        key = (*tokens[cur - n + 1 :], last)
        pos = self.key_map.get(key, 0)
        if pos >= cur - n - m - 1:
            pos = 0
        prompt_end = self.begin - n - m - 1
        if pos == 0 and self.begin > n + m + 1:
            pos = self._scan(tokens, prompt_end, self.last_idx, key)
        if pos == 0:
            pos = self._scan(tokens, cur - n - m - 1, max(self.begin, self.last_idx), key)
        if self.begin > n + m + 1:  # hashes of new positions; the first stored stays
            for j in range(prompt_end, self.last_idx, -1):
                self.key_map.setdefault(tuple(tokens[j : j + n]), j)
        for j in range(cur - n - m - 1, max(self.begin, self.last_idx), -1):
            self.key_map.setdefault(tuple(tokens[j : j + n]), j)
        self.last_idx = max(cur - n - m - 1, self.last_idx)
        if pos == 0:
            return []
        self.drafted = key
        return list(tokens[pos + n : pos + n + min(m, self.kept.setdefault(key, m))])

    def accept(self, kept: int) -> None:
        if self.drafted is not None:
            self.kept[self.drafted] = kept


class NgramMod:
    """``common_ngram_mod``: a table from every 24-token window to the token after it (the
    newest wins; the answer is added in chunks of 32 tokens); drafts by chaining lookups, up to
    64 tokens and only when at least 48 chain; five drafts in a row keeping under a quarter
    rebuild the table."""

    name = "ngram-mod"

    def __init__(self, prompt: Sequence[int], n: int = 24, n_max: int = 64, n_min: int = 48):
        self.n, self.n_max, self.n_min = n, n_max, n_min
        self.table: dict[tuple[int, ...], int] = {}
        tokens = prompt[:-1]
        self.i_last = max(len(tokens) - n, 0)
        self._add(tokens, 0, self.i_last)
        self.drafted = 0
        self.low = 0

    def _add(self, tokens: Sequence[int], lo: int, hi: int) -> None:
        for i in range(lo, hi):
            self.table[tuple(tokens[i : i + self.n])] = tokens[i + self.n]

    def draft(self, tokens: Sequence[int], last: int) -> list[int]:
        self.drafted = 0
        cur, n = len(tokens), self.n
        if cur < n:
            return []
        if self.i_last + 32 < cur:
            self._add(tokens, self.i_last, cur - n)
            self.i_last = cur - n
        window = [*tokens[cur - n + 1 :], last]
        out: list[int] = []
        for i in range(self.n_max):
            t = self.table.get(tuple(window[i : i + n]))
            if t is None:
                if i < self.n_min:
                    return []
                break
            out.append(t)
            window.append(t)
        self.drafted = len(out)
        return out

    def accept(self, kept: int) -> None:
        if self.drafted == 0:
            return
        if kept / self.drafted >= 0.25:
            self.low = 0
            return
        self.low += 1
        if self.low >= 5:
            self.table, self.low, self.i_last = {}, 0, 0


#: llama.cpp's n-gram drafters as ``llama-speculative-simple --spec-type NAME`` runs them.
PEERS = (NgramSimple, NgramMapK, NgramMod)


def replay_peer(
    kind: type[NgramSimple] | type[NgramMapK] | type[NgramMod],
    prompt: Sequence[int],
    answer: Sequence[int],
    curve: CostCurve,
) -> float:
    """Speedup over plain decoding of llama.cpp's loop with drafter ``kind``, greedy (a draft
    is kept up to its first token that differs from the answer), priced by ``curve``."""
    drafter = kind(prompt)
    text = [*prompt, *answer]
    tokens, last = list(prompt[:-1]), prompt[-1]
    done, seconds = 0, 0.0
    while done < len(answer):
        room = len(answer) - done - 1  # llama.cpp's n_draft_max
        block = drafter.draft(tokens, last)[:room] if room > 0 else []
        at = len(prompt) + done
        kept = 0
        while kept < len(block) and block[kept] == text[at + kept]:
            kept += 1
        drafter.accept(kept)
        seconds += curve(len(block) + 1)
        new = text[at : at + kept + 1]
        tokens += [last, *new[:-1]]
        last = new[-1]
        done += len(new)
    return len(answer) * curve(1) / seconds


def record(args: argparse.Namespace) -> None:
    from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
    from pyramid_gguf.bench.prompts import load_prompt_sets
    from pyramid_gguf.models.presets import DEFAULT_PRESET, resolve_preset

    prompts = [(q.set, q.key, q.text) for q in load_prompt_sets()]
    prompts.append(("first", "first/prime", FIRST_PROMPT))
    load = LoadConfig(n_threads=args.threads, n_threads_batch=args.threads)
    out: dict[str, object] = {}
    with Pyramid.load(resolve_preset(DEFAULT_PRESET).paths, load=load) as p:
        out["seconds"] = list(p.costs()["target"].seconds)
        answers = {}
        for set_name, key, text in prompts:
            tokens = p.chat_tokens([{"role": "user", "content": text}])
            sampling = SamplingConfig(temperature=0, max_tokens=args.max_tokens)
            done = p.generate(tokens, sampling, SpecConfig(mode="target"))
            answers[key] = {"set": set_name, "prompt": list(tokens), "answer": done.token_ids}
            print(f"{key}: {len(done.token_ids)} tokens", flush=True)
        out["answers"] = answers
    args.file.write_text(json.dumps(out))


def curve_of(args: argparse.Namespace, recorded: list[float]) -> CostCurve:
    if args.curve == "recorded":
        return CostCurve(tuple(recorded))
    if args.curve == "avx512":
        return CostCurve(tuple(ms / 1000 for ms in AVX512_MS))
    return CostCurve(tuple(json.loads(Path(args.curve).read_text())["seconds"]))


def geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def replay_all(args: argparse.Namespace) -> None:
    data = json.loads(args.file.read_text())
    curve = curve_of(args, data["seconds"])
    lengths = [int(n) for n in args.lengths.split(",")]
    sets = set(args.sets.split(",")) if args.sets else None
    table: dict[str, dict[int, list[float]]] = {}
    rows: dict[str, dict[str, list[float]]] = {}  # set -> column -> per prompt (longest n)
    columns = ["auto", *(k.name for k in PEERS), "auto / best", "bound", "unanchored"]
    if args.peers:
        print(f"{'n=' + str(lengths[-1]):22s}" + "".join(f"{c:>15s}" for c in columns))
    for key, rec in data["answers"].items():
        if sets is not None and rec["set"] not in sets:
            continue
        for n in lengths:
            r = replay(rec["prompt"], rec["answer"][:n], curve)
            table.setdefault(rec["set"], {}).setdefault(n, []).append(r.speedup)
            if args.verbose:
                bets = r.auto.choices.get("ngram")
                print(
                    f"{key:22s} n={n:<4d} {r.speedup:.3f}x  n-gram rounds "
                    f"{bets.rounds if bets else 0}, saved {r.auto.savings:+.3f} s, "
                    f"shadows {r.auto.shadows} ({r.auto.shadow_credit:+.3f} s), "
                    f"unfunded {r.auto.unfunded}"
                )
        if args.peers:
            answer = rec["answer"][: lengths[-1]]
            row = {"auto": table[rec["set"]][lengths[-1]][-1]}
            row |= {k.name: replay_peer(k, rec["prompt"], answer, curve) for k in PEERS}
            row["auto / best"] = row["auto"] / max(row[k.name] for k in PEERS)
            row["bound"] = copy_bound(rec["prompt"], answer, curve)
            row["unanchored"] = copy_bound(rec["prompt"], answer, curve, anchored=False)
            for column, value in row.items():
                rows.setdefault(rec["set"], {}).setdefault(column, []).append(value)
            print(f"{key:22s}" + "".join(f"{v:>14.3f}x" for v in row.values()))
    if args.peers:
        print(f"\n{'geomean n=' + str(lengths[-1]):22s}" + "".join(f"{c:>15s}" for c in columns))
        for name, by_column in rows.items():
            line = "".join(f"{geomean(by_column[c]):>14.3f}x" for c in columns)
            print(f"{name:22s}{line}")
        print()
    print(f"{'set':10s}" + "".join(f"{'n=' + str(n):>9s}" for n in lengths))
    for name, by_n in table.items():
        print(f"{name:10s}" + "".join(f"{statistics.mean(by_n[n]):8.3f}x" for n in lengths))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="decode the prompts greedily and save the answers")
    rec.add_argument("file", type=Path)
    rec.add_argument("-n", "--max-tokens", type=int, default=256)
    rec.add_argument("-t", "--threads", type=int, default=2)
    rep = sub.add_parser("replay", help="replay saved answers through auto's scheduler")
    rep.add_argument("file", type=Path)
    rep.add_argument("--curve", default="recorded", help="recorded, avx512 or a JSON file")
    rep.add_argument("--lengths", default="64,160,256")
    rep.add_argument("--sets", default="", help="only these prompt sets (comma-separated)")
    rep.add_argument("--peers", action="store_true", help="also llama.cpp's n-gram drafters")
    rep.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    record(args) if args.command == "record" else replay_all(args)


if __name__ == "__main__":
    main()
