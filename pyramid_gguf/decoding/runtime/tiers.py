"""Model tiers: loaded models that score a context plus new tokens in one batch.

:class:`ModelTier` keeps no logits between calls. Its cache always holds some prefix of what
it was last asked about; :meth:`ModelTier.score` rolls back to the part of ``context[:-1]`` it
already holds and evaluates ``[unseen context..., last_committed, y_1..y_k]`` in one
``llama_decode``, asking only for the ``k + 1`` rows it needs. :class:`Ladder` holds the loaded
tiers; :func:`load_ladder` loads one from a :class:`~pyramid_gguf.core.ladder.LadderPaths`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, cast, overload

import numpy as np

from ...core.files import check_gguf_path
from ...core.ladder import Drafter, LadderPaths, LadderShape
from ...core.load import LoadConfig
from ...models.vocab_check import check_same_vocabulary
from ...native import EvalTimer, ModelSequence, MtpSequence, NativeModel, Vocab


def native_depth(tier: ModelTier) -> int | None:
    """The most tokens of its last evaluation ``tier`` drops natively when its cache cannot
    simply cut a suffix (a hybrid's ``n_rs_seq`` recurrent-state snapshots,
    native/rollback.py); None when that does not bound a round: a plain KV cache drops
    anything for nothing, and a cache without snapshots takes the saved-state path whatever
    the drop."""
    loaded = getattr(tier, "loaded", None)  # (a scripted target has no model)
    depth = int(getattr(loaded, "n_rs_seq", 0))
    return depth if depth > 0 and getattr(loaded, "snapshot_reason", None) else None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ModelTier:
    """One rung of the ladder (``name`` is ``draft``, ``qualifier`` or ``target``): the
    ``loaded`` model (weights, context) and the sequence of it this tier decodes, ``model``
    (the loaded model's own sequence 0 unless a parallel slot's view is given)."""

    def __init__(self, name: str, loaded: NativeModel, model: ModelSequence | None = None) -> None:
        self.name = name
        self.loaded = loaded
        self.model: ModelSequence = loaded if model is None else model
        #: Largest micro-batch of a generation-time evaluation; 0: one batch. Set by
        #: ``--strict-identity`` to the size whose logits equal one-token decoding.
        self.chunk = 0

    @property
    def vocab(self) -> Vocab:
        return self.model.vocab

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    @property
    def timer(self) -> EvalTimer:
        """Time and tokens this tier has spent inside llama.cpp."""
        return self.model.timer

    def sync(self, committed: Sequence[int]) -> None:
        """Roll the cache back to the longest prefix of ``committed[:-1]`` it holds."""
        self.model.rollback(common_prefix(self.model.tokens, committed[:-1]))

    def score(self, context: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Raw logits after ``context`` and after each of ``tokens``: ``[len(tokens) + 1, V]``.

        Row ``i`` is the distribution of the token following ``context + tokens[:i]``.
        ``context`` must not be empty.
        """
        self.sync(context)
        held = self.model.n_past
        feed = [*context[held:], *tokens]
        first = len(context) - 1 - held
        return self.model.eval(feed, range(first, len(feed)), chunk=self.chunk)

    def step(self, token: int) -> np.ndarray:
        """Append one token the tier has just been scored up to; return the next row ``[V]``."""
        return self.model.eval([token], [0])[0]

    def lag(self, committed: Sequence[int]) -> int:
        """Committed tokens this tier would have to evaluate before it could propose: all
        after the prefix its cache shares with them (it may hold its own rejected tokens past
        that, which a sync rolls back)."""
        return max(len(committed) - 1 - common_prefix(self.model.tokens, committed[:-1]), 0)

    @overload
    def prefill(self, prompt: Sequence[int], *, logits: Literal[True]) -> np.ndarray: ...

    @overload
    def prefill(self, prompt: Sequence[int], *, logits: Literal[False] = ...) -> None: ...

    def prefill(self, prompt: Sequence[int], *, logits: bool = False) -> np.ndarray | None:
        """Evaluate the prompt as llama.cpp does (one batch, or ``n_batch`` chunks) and, with
        ``logits``, return the row after its last token ``[V]`` (the first token's
        distribution). Whatever prefix the cache already holds is reused, except with
        ``strict_identity``: a reused prefix was evaluated in another batch split, which rounds
        differently, so the prompt is evaluated afresh."""
        strict = self.model.cfg.strict_identity
        held = 0 if strict else common_prefix(self.model.tokens, prompt)
        if logits and held == len(prompt):
            held -= 1  # the last token's row is needed, so evaluate it again
        self.model.rollback(held)
        if held >= len(prompt):
            return None
        rows = self.model.eval(prompt[held:], [-1] if logits else ())
        return rows[0] if logits else None

    def is_eog(self, token: int) -> bool:
        return self.model.vocab.is_eog(token)

    def close(self) -> None:
        """Free the loaded model (a slot's view of it owns nothing)."""
        if self.model is self.loaded:
            self.loaded.close()


@dataclass(frozen=True)
class Ladder:
    """The loaded tiers. ``draft`` is a model tier, a drafter with no model (a
    :class:`~pyramid_gguf.core.ladder.Drafter` such as
    :data:`~pyramid_gguf.core.ladder.NGRAM`), or None."""

    target: ModelTier
    qualifier: ModelTier | None = None
    draft: ModelTier | Drafter | None = None

    @property
    def models(self) -> list[ModelTier]:
        """The loaded models, smallest first."""
        tiers = (self.draft, self.qualifier, self.target)
        return [t for t in tiers if t is not None and not isinstance(t, Drafter)]

    @property
    def n_tiers(self) -> int:
        return sum(t is not None for t in (self.draft, self.qualifier, self.target))

    @property
    def shape(self) -> LadderShape:
        """Which tiers are present (what chains and modes need to know)."""
        drafter = self.draft.name if isinstance(self.draft, Drafter) else None
        return LadderShape(tuple(m.name for m in self.models), drafter)

    def tier(self, name: str) -> ModelTier:
        """The loaded model of tier ``name`` (``draft``, ``qualifier`` or ``target``)."""
        for m in self.models:
            if m.name == name:
                return m
        raise ValueError(f"this ladder has no {name} model")

    @property
    def tier_names(self) -> list[str]:
        """Names of the tiers present (a drafter with no model by its name, ``ngram``),
        smallest first."""
        tiers = (self.draft, self.qualifier, self.target)
        return [t.name for t in tiers if isinstance(t, ModelTier | Drafter)]

    def close(self) -> None:
        for m in self.models:
            m.close()


def load_ladder(
    paths: LadderPaths, load: LoadConfig, tier_loads: Mapping[str, LoadConfig] | None = None
) -> Ladder:
    """Load every model file of ``paths`` (all checked before any is loaded) and check that
    they share one vocabulary. ``tier_loads`` overrides ``load`` per tier (a memory plan)."""
    files = {tier: check_gguf_path(p) for tier, p in paths.model_files().items()}
    drafter = paths.drafter
    head = drafter is not None and drafter.loads == "target-head"
    models: dict[str, NativeModel] = {}
    try:
        for tier in reversed(files):  # target first: the others are checked against it
            cfg = (tier_loads or {}).get(tier, load)
            if tier == "target" and head:
                cfg = replace(cfg, load_mtp=True)
            models[tier] = NativeModel(files[tier], cfg)
        check_same_vocabulary(list(models.values()))
        if head:  # the target's own head drafts: a model tier named draft
            models["draft"] = cast(NativeModel, MtpSequence(models["target"]))
    except BaseException:
        for m in models.values():
            m.close()
        raise
    tiers = {t: ModelTier(t, m) for t, m in models.items()}
    draft: ModelTier | Drafter | None = tiers.get("draft")
    if drafter is not None and not drafter.model:
        draft = drafter
    return Ladder(tiers["target"], tiers.get("qualifier"), draft)
