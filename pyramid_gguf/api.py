"""The Python API: :class:`Pyramid` loads a ladder once and generates with any mode.

Layered like mlx-lm: :func:`pyramid_gguf.engine.decode` yields token ids; :meth:`Pyramid.stream`
wraps them in small :class:`Response` objects (text delta, token ids, finish reason, running
stats); :meth:`Pyramid.generate` joins the stream; the OpenAI-shaped methods wrap ``generate``
and ``stream``.

>>> with Pyramid.from_paths("8b.gguf", draft="1b.gguf", qualifier="3b.gguf") as p:  # doctest: +SKIP
...     print(p.generate("def fib(n):", SamplingConfig(temperature=0)).text)
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import LoadConfig, SamplingConfig, SpecConfig, default_mode
from .engine import NGRAM, Ladder, check_mode, decode
from .errors import UserError
from .native import NativeModel, check_gguf_path, format_chat
from .sampling import make_rng
from .stats import GenerationStats
from .textstream import TextStream
from .tiers import ModelTier
from .vocab import check_same_vocabulary

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class Response:
    """One step of a stream: the new text and tokens, and the running stats."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    stats: GenerationStats


@dataclass(frozen=True)
class Completion:
    """A finished generation."""

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats
    prompt_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Pyramid:
    """A loaded ladder (target, optional qualifier, optional draft or ``"ngram"``).

    Generation is serialised: one request at a time holds the models (a lock), so one object
    can be shared by threads (the server queues in front of it).
    """

    def __init__(self, ladder: Ladder, spec: SpecConfig, name: str = "pyramid") -> None:
        self.ladder = ladder
        self.spec = spec
        self.name = name
        self._lock = threading.Lock()

    # --- construction ----------------------------------------------------------------------

    @classmethod
    def from_paths(
        cls,
        target: str | Path,
        *,
        draft: str | Path | None = None,
        qualifier: str | Path | None = None,
        load: LoadConfig | None = None,
        spec: SpecConfig | None = None,
        name: str | None = None,
        tier_loads: dict[str, LoadConfig] | None = None,
    ) -> Pyramid:
        """Load the models (all paths are checked before any is loaded) and check vocabularies.

        ``tier_loads`` overrides ``load`` per tier (``draft``/``qualifier``/``target``), as a
        memory plan does.
        """
        load = load or LoadConfig()
        tier_loads = tier_loads or {}
        named = [("target", target), ("qualifier", qualifier)]
        if draft is not None and str(draft) != NGRAM:
            named.append(("draft", draft))
        checked = {tier: check_gguf_path(path) for tier, path in named if path is not None}
        models: dict[str, NativeModel] = {}
        try:
            for tier, path in checked.items():
                models[tier] = NativeModel(path, tier_loads.get(tier, load))
            order = [models[t] for t in ("target", "qualifier", "draft") if t in models]
            check_same_vocabulary(order)
        except BaseException:
            for m in models.values():
                m.close()
            raise
        tiers = {t: ModelTier(t, m) for t, m in models.items()}
        draft_tier: ModelTier | str | None = NGRAM if str(draft) == NGRAM else tiers.get("draft")
        ladder = Ladder(tiers["target"], tiers.get("qualifier"), draft_tier)
        if spec is None:
            spec = SpecConfig(mode=default_mode(ladder.n_tiers))
        check_mode(spec, ladder)
        return cls(ladder, spec, name or Path(target).stem)

    @classmethod
    def from_preset(
        cls, preset: str, *, load: LoadConfig | None = None, spec: SpecConfig | None = None
    ) -> Pyramid:
        """Load a ``models.toml`` preset, fetching what is missing first."""
        from .presets import resolve_preset

        r = resolve_preset(preset)
        return cls.from_paths(
            r.target,
            draft=r.draft,
            qualifier=r.qualifier,
            load=load,
            spec=spec or r.spec,
            name=preset,
        )

    def close(self) -> None:
        for m in self.ladder.models:
            m.model.close()

    def __enter__(self) -> Pyramid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- text ------------------------------------------------------------------------------

    @property
    def target(self) -> NativeModel:
        return self.ladder.target.model

    def tokenize(self, text: str) -> list[int]:
        return self.target.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.target.detokenize(tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], chat_template: str | None = None
    ) -> str:
        """The prompt text of a chat, from the target GGUF's ``tokenizer.chat_template``."""
        template = chat_template or self.target.chat_template()
        if template is None:
            raise UserError(
                f"{self.target.path.name} has no chat template (tokenizer.chat_template); "
                "pass --chat-format / chat_template, or send a plain prompt"
            )
        return format_chat(
            template,
            messages,
            bos_token=self.target.token_text(self.target.bos),
            eos_token=self.target.token_text(self.target.eos),
        )

    def chat_tokens(
        self, messages: list[dict[str, Any]], chat_template: str | None = None
    ) -> list[int]:
        """Token ids of a templated chat (BOS once, special tokens parsed)."""
        tokens = self.tokenize(self.apply_chat_template(messages, chat_template))
        bos = self.target.bos
        if len(tokens) > 1 and tokens[0] == bos and tokens[1] == bos:
            tokens = tokens[1:]
        return tokens

    # --- generation ------------------------------------------------------------------------

    def stream(
        self,
        prompt: Prompt,
        sampling: SamplingConfig | None = None,
        spec: SpecConfig | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> Iterator[Response]:
        """Yield :class:`Response` steps; the last one carries the finish reason.

        ``prompt``: text (tokenized with BOS, special tokens parsed) or token ids. Text never
        contains half a UTF-8 character nor any part of a stop string. Setting ``cancel`` ends
        the generation at the next token with finish reason ``cancelled``.
        """
        sampling = sampling or SamplingConfig()
        spec = spec or self.spec
        check_mode(spec, self.ladder)
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        stats = GenerationStats(mode=spec.mode)
        text = TextStream(sampling.stop)
        with self._lock:
            steps = decode(self.ladder, tokens, spec, sampling, make_rng(sampling.seed), stats)
            try:
                for token in steps:
                    delta = text.feed(self.target.token_bytes(token))
                    if text.stopped:
                        stats.finish_reason = "stop"
                        if delta:
                            yield Response(delta, [token], None, stats)
                        break
                    yield Response(delta, [token], None, stats)
                    if cancel is not None and cancel.is_set():
                        stats.finish_reason = "cancelled"
                        break
            finally:
                steps.close()
        yield Response(text.flush(), [], stats.finish_reason or "length", stats)

    def generate(
        self,
        prompt: Prompt,
        sampling: SamplingConfig | None = None,
        spec: SpecConfig | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> Completion:
        """Generate to the end and return the joined :class:`Completion`."""
        texts: list[str] = []
        ids: list[int] = []
        last: Response | None = None
        for last in self.stream(prompt, sampling, spec, cancel=cancel):
            texts.append(last.text)
            ids += last.token_ids
        assert last is not None
        return Completion(
            "".join(texts),
            ids,
            last.finish_reason or "length",
            last.stats,
            prompt_tokens=last.stats.prompt_tokens,
        )

    # --- OpenAI-shaped results (like llama-cpp-python's) -----------------------------------

    def create_completion(
        self, prompt: Prompt, sampling: SamplingConfig | None = None, spec: SpecConfig | None = None
    ) -> dict[str, Any]:
        """A ``text_completion`` dict with ``usage`` and a ``timings`` extra."""
        c = self.generate(prompt, sampling, spec)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [
                {"index": 0, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
            ],
            "usage": usage(c.stats),
            "timings": timings(c.stats),
        }

    def create_chat_completion(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingConfig | None = None,
        spec: SpecConfig | None = None,
        *,
        chat_template: str | None = None,
    ) -> dict[str, Any]:
        """A ``chat.completion`` dict with ``usage`` and a ``timings`` extra."""
        c = self.generate(self.chat_tokens(messages, chat_template), sampling, spec)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
            ],
            "usage": usage(c.stats),
            "timings": timings(c.stats),
        }


def usage(stats: GenerationStats) -> dict[str, int]:
    """OpenAI ``usage`` of a generation."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
    }


def timings(stats: GenerationStats) -> dict[str, Any]:
    """llama-server style ``timings``, with per-stage ``draft_n`` / ``draft_n_accepted``."""
    return {
        "prompt_n": stats.prompt_tokens,
        "prompt_ms": round(stats.prompt_seconds * 1000, 2),
        "prompt_per_second": round(stats.prompt_tps, 2),
        "predicted_n": stats.generated_tokens,
        "predicted_ms": round(stats.generation_seconds * 1000, 2),
        "predicted_per_second": round(stats.generation_tps, 2),
        "draft_n": sum(s.draft_n for s in stats.stages),
        "draft_n_accepted": sum(s.draft_n_accepted for s in stats.stages),
        "mode": stats.mode,
        "stages": [s.to_dict() for s in stats.stages],
    }
