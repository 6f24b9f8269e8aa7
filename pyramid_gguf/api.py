"""The Python API: :class:`Pyramid` loads a ladder once and generates with any mode.

Layered like mlx-lm: :func:`pyramid_gguf.decoding.runtime.engine.decode` yields token ids;
:meth:`Pyramid.stream` wraps them in small :class:`Response` objects (text delta, token ids,
finish reason, running stats); :meth:`Pyramid.generate` joins the stream. OpenAI-shaped
bodies are built on top of this, in :mod:`pyramid_gguf.serving.openai`. What ``Pyramid``
delegates (loading, calibration, chat templates, logit biases, a generation's steps, the
ladder's facts) lives in :mod:`pyramid_gguf.runtime`.

>>> with Pyramid.from_paths("8b.gguf", draft="1b.gguf", qualifier="3b.gguf") as p:  # doctest: +SKIP
...     print(p.generate("def fib(n):", SamplingConfig(temperature=0)).text)
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order": a CUDA model
# segfaulted in one PyTorch environment when numpy was imported first).
from . import native  # isort: skip  # noqa: F401

# isort: split
from .chat import ChatTemplate, ToolRequest
from .core.errors import UserError
from .core.ladder import Drafter, LadderPaths
from .core.load import LoadConfig
from .core.remote import RpcConfig
from .core.sampling import MAX_TOP_LOGPROBS, SamplingConfig
from .core.spec import SpecConfig
from .decoding.pricing.costs import CostCurve
from .decoding.pricing.estimates import KeepMemory
from .decoding.runtime.calibrate import Calibration
from .decoding.runtime.ngram import NGramPool
from .decoding.runtime.slots import Job, PoolClosed, PoolSnapshot, QueueFull, SlotPool
from .decoding.runtime.stats import GenerationStats, StageStats
from .decoding.runtime.tiers import Ladder
from .grammar import check_grammar
from .models.resolve import resolve_ladder
from .runtime.biases import token_biases
from .runtime.calibration import calibrate_ladder, priced_costs
from .runtime.chats import ChatPrompt, Chats
from .runtime.facts import LadderFacts, TierFacts
from .runtime.generation import generation_steps, job_work
from .runtime.loading import load_for
from .runtime.steps import END, Completion, Prompt, Response, TokenLogprob

__all__ = [
    "END",
    "ChatPrompt",
    "Completion",
    "GenerationStats",
    "Job",
    "PoolClosed",
    "PoolSnapshot",
    "Prompt",
    "Pyramid",
    "QueueFull",
    "Response",
    "StageStats",
    "TierFacts",
    "TokenLogprob",
]


class Pyramid(LadderFacts):
    """A loaded ladder (target, optional qualifier, optional draft or the n-gram drafter).

    It holds ``LoadConfig.parallel`` slots (:class:`~.decoding.runtime.slots.SlotPool`), the one
    door of every request: :meth:`submit` admits a generation (at most :attr:`queue_size` at
    once, else :class:`QueueFull`) and a slot's worker thread runs it, handing each step to the
    caller's ``deliver``; :meth:`stream` and :meth:`generate` read it for you. Up to
    ``parallel`` generations run at once, their model calls evaluated together in one batch per
    tier; more wait in the queue. A generation runs ahead of its reader; closing a stream (or
    :meth:`Job.cancel`) ends its generation at the next token. ``share_ngrams``: the n-gram
    drafter also searches this object's earlier generations (the server turns it on). Read-only
    facts of the ladder (:attr:`vocab`, :attr:`model_path`, :meth:`tiers`...) come from
    :class:`~pyramid_gguf.runtime.facts.LadderFacts`.
    """

    def __init__(
        self, ladder: Ladder, spec: SpecConfig, name: str = "pyramid", *, share_ngrams: bool = False
    ) -> None:
        ladder.shape.check(spec.mode)
        self.ladder = ladder
        self.spec = spec
        self.name = name
        self.pool = NGramPool() if share_ngrams else None
        #: What ``auto``'s generations learned of the model chains' keep rates, for the next.
        self.keep_memory = KeepMemory()
        self.slots = SlotPool(ladder)
        self.chats = Chats(ladder.tier("target"))
        #: A chat's prompt text, and its token ids (:meth:`Chats.render
        #: <pyramid_gguf.runtime.chats.Chats.render>`, :meth:`~.runtime.chats.Chats.tokens`).
        self.apply_chat_template = self.chats.render
        self.chat_tokens = self.chats.tokens
        self._calibration: dict[str, Calibration] | None = None
        self._calibrating = threading.Lock()

    # --- construction ----------------------------------------------------------------------

    @classmethod
    def load(
        cls, paths: LadderPaths, *, load: LoadConfig | None = None, spec: SpecConfig | None = None,
        name: str | None = None, vram: str | int | None = None, ram: str | int | None = None,
        tier_loads: Mapping[str, LoadConfig] | None = None, rpc: RpcConfig | None = None,
        share_ngrams: bool = False, say: Callable[[str], None] | None = None,
    ) -> Pyramid:  # fmt: skip
        """Load the models of ``paths`` (all checked before any is loaded, the mode first),
        check that they share one vocabulary; ``spec`` defaults to ``auto``. ``vram``, ``ram``,
        ``tier_loads``, ``rpc``, ``say``: :func:`~pyramid_gguf.runtime.loading.load_for`'s."""
        spec = spec or SpecConfig()
        ladder = load_for(
            paths, load or LoadConfig(), spec, name=name, vram=vram, ram=ram,
            tier_loads=tier_loads, rpc=rpc, say=say,
        )  # fmt: skip
        try:
            return cls(ladder, spec, name or paths.target.stem, share_ngrams=share_ngrams)
        except BaseException:
            ladder.close()
            raise

    @classmethod
    def from_paths(
        cls, target: str | Path, *, draft: str | Path | Drafter | None = None,
        qualifier: str | Path | None = None, load: LoadConfig | None = None,
        spec: SpecConfig | None = None, name: str | None = None, vram: str | int | None = None,
        ram: str | int | None = None,
    ) -> Pyramid:  # fmt: skip
        """:meth:`load` from file names (``draft="ngram"`` is the n-gram drafter); ``spec``
        defaults to what ``tune`` saved for these files, else ``auto``, as on the CLI."""
        r = resolve_ladder(paths=LadderPaths.of(target, qualifier, draft), fetch=False)
        return cls.load(r.paths, load=load, spec=spec or r.spec, name=name, vram=vram, ram=ram)

    @classmethod
    def from_preset(
        cls, preset: str, *, load: LoadConfig | None = None, spec: SpecConfig | None = None,
        vram: str | int | None = None, ram: str | int | None = None,
    ) -> Pyramid:  # fmt: skip
        """Load a ``models.toml`` preset, fetching what is missing first; ``spec`` defaults to
        what ``tune`` saved for its files, else the preset's recommendation, as on the CLI."""
        r = resolve_ladder(preset)
        return cls.load(r.paths, load=load, spec=spec or r.spec, name=preset, vram=vram, ram=ram)

    def close(self) -> None:
        """Cancel what is running or queued, wait for it, and free the models."""
        self.slots.close()
        self.ladder.close()

    def __enter__(self) -> Pyramid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def queue_size(self) -> int | None:
        """Generations admitted at once, the running ones included (None: no bound)."""
        return self.slots.queue_size

    @queue_size.setter
    def queue_size(self, size: int | None) -> None:
        if size is not None and size < 1:
            raise UserError(f"the queue size must be at least 1, got {size}")
        self.slots.queue_size = size

    def snapshot(self) -> PoolSnapshot:
        """What the slots and the queue are doing now."""
        return self.slots.snapshot()

    # --- the machine -----------------------------------------------------------------------

    def calibrate(self, *, refresh: bool = False, say: Callable[[str], None] | None = None
                  ) -> dict[str, Calibration]:  # fmt: skip
        """Each tier's batch cost curve (and, with ``strict_identity``, the target's identity
        probe), measured once per machine and cached; ``refresh`` measures again (once every
        slot is free: it evaluates on the models' contexts). From then on the slots' batches
        are padded where a curve says a few more rows cost less."""
        with self._calibrating:
            if self._calibration is None or refresh:
                with self.slots.exclusive():
                    self._calibration = calibrate_ladder(self.ladder, refresh=refresh, say=say)
                # the slots' batches take the padding rows their measured curves say pay
                self.slots.batcher.use_costs({k: c.curve for k, c in self._calibration.items()})
            return self._calibration

    def costs(self) -> dict[str, CostCurve]:
        """The cost curve of each tier as ``auto`` prices it (strict micro-batches included)."""
        return priced_costs(self.ladder, self.calibrate())

    # --- chats (:class:`~pyramid_gguf.runtime.chats.Chats`) --------------------------------

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """Variables every chat template render gets (``serve --chat-template-kwargs``)."""
        return self.chats.kwargs

    @template_kwargs.setter
    def template_kwargs(self, kwargs: dict[str, Any]) -> None:
        self.chats.kwargs = kwargs

    def template(self, chat_template: str | None = None) -> ChatTemplate:
        """``chat_template``, else the target GGUF's, else the built-in ChatML."""
        return self.chats.template(chat_template)

    def prepare_chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingConfig | None = None,
        tools: ToolRequest | None = None,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> ChatPrompt:
        """A chat turn ready to :meth:`submit`, whatever API it came through: its prompt, the
        answer's sampling (a response format's or the tools' grammar) and tool-call reader
        (:meth:`Chats.prepare <pyramid_gguf.runtime.chats.Chats.prepare>`)."""
        return self.chats.prepare(messages, sampling, tools, chat_template, template_kwargs)

    @property
    def control_texts(self) -> frozenset[str]:
        """The texts of the vocabulary's control tokens (``<|im_start|>``...)."""
        return self.chats.control_texts

    # --- generation ------------------------------------------------------------------------

    def submit(
        self, prompt: Prompt, sampling: SamplingConfig | None = None,
        spec: SpecConfig | None = None, *,
        deliver: Callable[[Response | BaseException | None], None],
        logprobs: int | None = None, special: bool = False,
    ) -> Job:  # fmt: skip
        """Admit one generation and return its :class:`Job` (``job.cancel()`` ends it at the
        next token). Its :class:`Response` steps go to ``deliver`` as they come, on the thread
        of the slot that decodes it (so ``deliver`` must only hand them on), then an exception
        if one ended it, then :data:`END` (None). Raises at once, before anything runs: a
        one-line :class:`UserError` for a bad argument, :class:`QueueFull` when
        :attr:`queue_size` generations are admitted, :class:`PoolClosed` once closing.

        ``prompt``: text (tokenized with BOS, special tokens parsed) or token ids. Text never
        contains half a UTF-8 character nor any part of a stop string. ``logprobs``: give each
        token the target's log-probability and that many alternatives (0 to
        :data:`MAX_TOP_LOGPROBS`; None: none). ``special``: render control tokens in the text
        (a tool call's ``<|python_tag|>``), as a tool-call parser needs.
        """
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise UserError(f"logprobs must be 0 to {MAX_TOP_LOGPROBS}, got {logprobs}")
        sampling = token_biases(sampling or SamplingConfig(), self.vocab)
        spec = spec or self.spec
        for grammar in [sampling.grammar, *(g.grammar for g in sampling.triggers)]:
            if grammar is not None:
                check_grammar(grammar)  # a one-line error before anything runs
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        steps = functools.partial(self._generate, tokens=tokens, sampling=sampling, spec=spec,
                                  logprobs=logprobs, special=special)  # fmt: skip
        return self.slots.submit(tokens, job_work(steps, deliver))

    def _generate(
        self, job: Job, tokens: list[int], sampling: SamplingConfig, spec: SpecConfig,
        logprobs: int | None, special: bool,
    ) -> Iterator[Response]:  # fmt: skip
        """The steps of ``job`` on its slot's thread (tests wrap it to slow a slot down)."""
        return generation_steps(
            self.slots, job, tokens, sampling, spec, costs=self.costs, pool=self.pool,
            memory=self.keep_memory, logprobs=logprobs, special=special,
        )  # fmt: skip

    def stream(
        self, prompt: Prompt, sampling: SamplingConfig | None = None,
        spec: SpecConfig | None = None, *, logprobs: int | None = None, special: bool = False,
    ) -> Iterator[Response]:  # fmt: skip
        """Yield the :class:`Response` steps of one generation (:meth:`submit`'s arguments);
        the last one carries the finish reason. Closing the iterator (or leaving a ``for``
        loop over it) ends the generation at its next token and waits for its slot."""
        steps: queue.SimpleQueue[Response | BaseException | None] = queue.SimpleQueue()
        job = self.submit(
            prompt, sampling, spec, deliver=steps.put, logprobs=logprobs, special=special
        )
        try:
            while (item := steps.get()) is not END:
                if isinstance(item, BaseException):
                    raise item
                assert item is not None
                yield item
        finally:
            job.cancel()  # no-op once it has finished
            job.wait()

    def generate(
        self, prompt: Prompt, sampling: SamplingConfig | None = None,
        spec: SpecConfig | None = None, *, special: bool = False,
    ) -> Completion:  # fmt: skip
        """Generate to the end and return the joined :class:`Completion`.

        Unlike :meth:`stream`, the steps are collected on the slot's thread and this thread
        wakes once, at the end: no thread wakes per token beside the decoding (on a machine
        whose cores all decode, such a wake-up takes its time from the next token)."""
        steps: list[Response | BaseException | None] = []
        ended = threading.Event()

        def collect(item: Response | BaseException | None) -> None:
            steps.append(item)
            if item is END:
                ended.set()

        job = self.submit(prompt, sampling, spec, deliver=collect, special=special)
        try:
            ended.wait()
        finally:
            job.cancel()  # no-op once it has finished (a Ctrl-C ends it at its next token)
            job.wait()
        texts: list[str] = []
        ids: list[int] = []
        last: Response | None = None
        for item in steps[:-1]:
            if isinstance(item, BaseException):
                raise item
            assert item is not None
            last = item
            texts.append(item.text)
            ids += item.token_ids
        assert last is not None
        return Completion(
            "".join(texts), ids, last.finish_reason or "length", last.stats,
            prompt_tokens=last.stats.prompt_tokens,
        )  # fmt: skip
