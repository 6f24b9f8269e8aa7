"""The Python API: :class:`Pyramid` loads a ladder once and generates with any mode.

Layered like mlx-lm: :func:`pyramid_gguf.decoding.runtime.engine.decode` yields token ids;
:meth:`Pyramid.stream` wraps them in small :class:`Response` objects (text delta, token ids,
finish reason, running stats); :meth:`Pyramid.generate` joins the stream. OpenAI-shaped
bodies are built on top of this, in :mod:`pyramid_gguf.serving.openai`.

>>> with Pyramid.from_paths("8b.gguf", draft="1b.gguf", qualifier="3b.gguf") as p:  # doctest: +SKIP
...     print(p.generate("def fib(n):", SamplingConfig(temperature=0)).text)
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order": a CUDA model
# segfaulted in one PyTorch environment when numpy was imported first).
from . import native  # isort: skip

# isort: split
import numpy as np

from .chat import (
    CallStream,
    ChatTemplate,
    GenericFormat,
    Tool,
    ToolCallFormat,
    ToolRequest,
    constraint,
    normalise_messages,
    probe_caps,
    prompt_messages,
)
from .core.errors import UserError
from .core.ladder import LadderPaths, NGram
from .core.load import LoadConfig
from .core.remote import RpcConfig
from .core.sampling import MAX_TOP_LOGPROBS, SamplingConfig
from .core.spec import SpecConfig
from .core.textstream import TextStream
from .decoding.pricing.costs import CostCurve
from .decoding.runtime.calibrate import Calibration, calibrate
from .decoding.runtime.engine import decode, make_guide, make_scheduler
from .decoding.runtime.ngram import NGramPool
from .decoding.runtime.sampling import Sampler, log_softmax, top_ids
from .decoding.runtime.slots import Job, PoolClosed, PoolSnapshot, QueueFull, SlotPool
from .decoding.runtime.stats import GenerationStats, StageStats
from .decoding.runtime.tiers import Ladder, load_ladder
from .grammar import check_grammar
from .models.resolve import resolve_ladder

__all__ = [
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
    "TokenLogprob",
]

Prompt = str | Sequence[int]
_DROPPED = np.zeros(0, dtype=np.float32)
#: What a job's reader receives: each :class:`Response`, an exception that ended the
#: generation, then this (the end).
END = None


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability (natural log, temperature 1, before any sampling warp) of
    one emitted token, its bytes (``piece``), and the ``top`` alternatives as
    ``(id, bytes, logprob)``, most likely first."""

    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()


@dataclass(frozen=True)
class Response:
    """One step of a stream: the new text and tokens, the running stats, and (when asked for)
    the target's log-probabilities of the tokens."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    stats: GenerationStats
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Completion:
    """A finished generation."""

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats
    prompt_tokens: int = 0


@dataclass(frozen=True)
class ChatPrompt:
    """A chat turn ready to generate (:meth:`Pyramid.prepare_chat`): its prompt ``tokens``, the
    ``sampling`` its answer runs with (the request's, plus a response format's or the tools'
    grammar), and ``calls``, the tool-call format that reads calls out of the answer (None: no
    tools). With tools the answer's text renders control tokens (``special``), which only the
    call reader sees: :meth:`reader` turns the text into content and calls, dropping the
    ``controls`` (control-token texts that are not the format's markers) from content."""

    tokens: list[int]
    sampling: SamplingConfig
    calls: ToolCallFormat | None = None
    controls: frozenset[str] = frozenset()

    @property
    def special(self) -> bool:
        """Whether the answer's text renders control tokens (for the call parser)."""
        return self.calls is not None

    def reader(self) -> CallStream | None:
        """A reader of this answer's content and tool calls (None without tools)."""
        if self.calls is None:
            return None
        return CallStream(self.calls, controls=self.controls)


class Pyramid:
    """A loaded ladder (target, optional qualifier, optional draft or the n-gram drafter).

    It holds ``LoadConfig.parallel`` slots (:class:`~.decoding.runtime.slots.SlotPool`), the one
    door of every request: :meth:`submit` admits a generation (at most :attr:`queue_size` at
    once, else :class:`QueueFull`) and a slot's worker thread runs it, handing each step to the
    caller's ``deliver``; :meth:`stream` and :meth:`generate` read it for you. Up to
    ``parallel`` generations run at once, their model calls evaluated together in one batch per
    tier; more wait in the queue. A generation runs ahead of its reader, so a reader that is
    slow (or reads two streams in turn) holds up nobody; closing a stream (or
    :meth:`Job.cancel`) ends its generation at the next token.
    ``share_ngrams``: the n-gram drafter also searches this object's earlier generations (the
    server turns it on). :attr:`template_kwargs`: variables every chat template render gets
    (``serve --chat-template-kwargs``), under a request's own.
    """

    def __init__(
        self,
        ladder: Ladder,
        spec: SpecConfig,
        name: str = "pyramid",
        *,
        share_ngrams: bool = False,
    ) -> None:
        ladder.shape.check(spec.mode)
        self.ladder = ladder
        self.spec = spec
        self.name = name
        self.pool = NGramPool() if share_ngrams else None
        self.slots = SlotPool(ladder)
        self._calibration: dict[str, Calibration] | None = None
        self._calibrating = threading.Lock()
        self.template_kwargs: dict[str, Any] = {}

    # --- construction ----------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        paths: LadderPaths,
        *,
        load: LoadConfig | None = None,
        spec: SpecConfig | None = None,
        name: str | None = None,
        vram: str | int | None = None,
        ram: str | int | None = None,
        tier_loads: Mapping[str, LoadConfig] | None = None,
        rpc: RpcConfig | None = None,
        share_ngrams: bool = False,
        say: Callable[[str], None] | None = None,
    ) -> Pyramid:
        """Load the models of ``paths`` (all checked before any is loaded), check that they
        share one vocabulary; ``spec`` defaults to ``auto``.

        ``vram`` (a ``--vram`` value such as ``"6GiB"``, or bytes): load the placement
        :func:`~pyramid_gguf.planning.plan.plan_ladder` ranks first for that budget (which
        tiers, and each one's GPU layers) among those that fit ``ram`` (a ``--ram`` value, or
        bytes; None: this machine's RAM), telling ``say`` what it chose. ``tier_loads``
        overrides ``load`` per tier (``draft``/``qualifier``/``target``) instead. ``rpc``
        puts its tiers on llama.cpp RPC servers (every layer there, spread over their devices
        after this machine's GPUs; see :class:`~pyramid_gguf.core.remote.RpcConfig`).
        """
        spec = spec or SpecConfig()
        paths.shape.check(spec.mode)  # before planning or loading anything
        base = load or LoadConfig()
        if vram is not None:
            from .planning.plan import PlanInputs, describe, load_plan, plan_ladder

            inputs = PlanInputs(ram=ram)
            ranking = plan_ladder(paths, vram, base, name=name, spec=spec, inputs=inputs)
            if say is not None:
                say(describe(ranking, vram))
            paths, tier_loads = load_plan(paths, ranking, base)
        if rpc is not None:
            tier_loads = rpc.place(paths.model_files(), base, tier_loads)
        ladder = load_ladder(paths, base, tier_loads)
        try:
            return cls(ladder, spec, name or paths.target.stem, share_ngrams=share_ngrams)
        except BaseException:
            ladder.close()
            raise

    @classmethod
    def from_paths(
        cls,
        target: str | Path,
        *,
        draft: str | Path | NGram | None = None,
        qualifier: str | Path | None = None,
        load: LoadConfig | None = None,
        spec: SpecConfig | None = None,
        name: str | None = None,
        vram: str | int | None = None,
        ram: str | int | None = None,
    ) -> Pyramid:
        """:meth:`load` from file names (``draft="ngram"`` is the n-gram drafter); ``spec``
        defaults to what ``tune`` saved for these files, else ``auto``, as on the CLI."""
        r = resolve_ladder(paths=LadderPaths.of(target, qualifier, draft), fetch=False)
        return cls.load(r.paths, load=load, spec=spec or r.spec, name=name, vram=vram, ram=ram)

    @classmethod
    def from_preset(
        cls,
        preset: str,
        *,
        load: LoadConfig | None = None,
        spec: SpecConfig | None = None,
        vram: str | int | None = None,
        ram: str | int | None = None,
    ) -> Pyramid:
        """Load a ``models.toml`` preset, fetching what is missing first; ``spec`` defaults to
        what ``tune`` saved for its files, else the preset's recommendation, as on the CLI."""
        r = resolve_ladder(preset)
        return cls.load(r.paths, load=load, spec=spec or r.spec, name=preset, vram=vram, ram=ram)

    def close(self) -> None:
        """Cancel what is running or queued, wait for it, and free the models."""
        self.slots.close()
        self.ladder.close()

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

    def calibrate(
        self, *, refresh: bool = False, say: Callable[[str], None] | None = None
    ) -> dict[str, Calibration]:
        """Each tier's batch cost curve (and, with ``strict_identity``, the target's identity
        probe), measured once per machine and cached; ``refresh`` measures again (once every
        slot is free: it evaluates on the models' contexts)."""
        return self._calibrate(refresh, say)

    def _calibrate(
        self, refresh: bool, say: Callable[[str], None] | None
    ) -> dict[str, Calibration]:
        if self._calibration is not None and not refresh:
            return self._calibration
        with self._calibrating, self.slots.exclusive():
            if self._calibration is not None and not refresh:
                return self._calibration
            out = {}
            for tier in self.ladder.models:
                strict = tier is self.ladder.target and tier.model.cfg.strict_identity
                out[tier.name] = cal = calibrate(tier, probe=strict, refresh=refresh, say=say)
                if strict:
                    tier.chunk = cal.identity_batch or 1
            self._calibration = out
        return self._calibration

    def costs(self) -> dict[str, CostCurve]:
        """The cost curve of each tier as ``auto`` prices it (strict micro-batches included)."""
        return self._costs()

    def _costs(self) -> dict[str, CostCurve]:
        cal = self._calibrate(False, None)
        return {t.name: cal[t.name].curve.with_chunk(t.chunk) for t in self.ladder.models}

    def __enter__(self) -> Pyramid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- text ------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (BOS added where the model asks for it, specials parsed)."""
        return self.ladder.target.vocab.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.ladder.target.vocab.detokenize(tokens)

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, ...)."""
        return self.ladder.target.is_eog(token)

    @property
    def chat_template(self) -> str | None:
        """The target GGUF's ``tokenizer.chat_template``, or None."""
        return self.ladder.target.loaded.chat_template()

    def template(self, chat_template: str | None = None) -> ChatTemplate:
        """The chat template prompts are rendered with: ``chat_template`` (Jinja text), else the
        target GGUF's, else the built-in ChatML (:attr:`ChatTemplate.name` says which)."""
        if chat_template is not None:
            return ChatTemplate(chat_template, "--chat-template")
        return ChatTemplate.from_gguf(self.chat_template)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        chat_template: str | None = None,
        *,
        tools: Sequence[Tool] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of a chat (OpenAI messages, tool calls and results included) and
        ``tools``, rendered by :meth:`template` (the assistant's turn opened unless
        ``add_generation_prompt`` is false; ``template_kwargs``, a request's
        ``chat_template_kwargs``, set template variables such as ``enable_thinking``)."""
        vocab = self.ladder.target.vocab
        return self.template(chat_template).render(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=vocab.token_text(vocab.bos),
            eos_token=vocab.token_text(vocab.eos),
            kwargs={**self.template_kwargs, **(template_kwargs or {})},
        )

    def chat_tokens(
        self,
        messages: list[dict[str, Any]],
        chat_template: str | None = None,
        *,
        tools: Sequence[Tool] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a templated chat (BOS once, special tokens parsed)."""
        text = self.apply_chat_template(
            messages, chat_template, tools=tools, template_kwargs=template_kwargs
        )
        tokens = self.tokenize(text)
        bos = self.ladder.target.vocab.bos
        if len(tokens) > 1 and tokens[0] == bos and tokens[1] == bos:
            tokens = tokens[1:]
        return tokens

    def prepare_chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingConfig | None = None,
        tools: ToolRequest | None = None,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> ChatPrompt:
        """A chat turn ready to :meth:`submit`, whatever API it came through: ``messages``
        (OpenAI's shape, tool calls and results included) rendered by :meth:`template` with the
        tools to show (and ``template_kwargs``, :meth:`apply_chat_template`'s), and the answer's
        sampling: ``sampling`` (its grammar, a response format,
        included) or, with ``tools``, the calls' grammar (``tool_choice`` required or a named
        function: the answer is calls whose arguments match the tool's schema) or lazy
        triggers (``auto``: free text until the model opens a call). ``tool_choice: "none"``
        shows no tools and reads no calls. A template that writes no tool-call format we read
        gets llama.cpp's generic JSON format, taught in the system message
        (:mod:`~pyramid_gguf.chat.generic`). A one-line :class:`UserError` when a grammar and
        tools come together."""
        sampling = sampling or SamplingConfig()
        calls: ToolCallFormat | None = None
        shown: tuple[Tool, ...] | None = None
        if tools is not None and tools.choice.mode != "none":
            template = self.template(chat_template)
            calls = template.tool_format
            if sampling.grammar is not None:
                raise UserError("tools and a response format together are not supported")
            found = constraint(calls, tools, self.special_texts(calls.markers))
            if found is not None:
                sampling = sampling.with_(grammar=found.grammar, triggers=found.triggers)
            shown = tools.tools
            if isinstance(calls, GenericFormat):  # taught in the system message, as llama.cpp
                caps = probe_caps(
                    lambda m, t: self.apply_chat_template(
                        m, chat_template, tools=t, add_generation_prompt=False
                    )
                )
                messages = prompt_messages(normalise_messages(messages), shown, caps)
        tokens = self.chat_tokens(
            messages, chat_template, tools=shown, template_kwargs=template_kwargs
        )
        controls = self.control_texts if calls is not None else frozenset()
        return ChatPrompt(tokens, sampling, calls, controls)

    @functools.cached_property
    def control_texts(self) -> frozenset[str]:
        """The texts of the target vocabulary's control tokens (``<|im_start|>``...): what
        renders only with special tokens, never content (read once: 0.3 s on Qwen's 152k)."""
        vocab = self.ladder.target.vocab
        out = set()
        for t in range(vocab.n_vocab):
            if vocab.token_bytes(t) == b"":
                text = vocab.token_bytes(t, special=True).decode("utf-8", errors="ignore")
                if text:
                    out.add(text)
        return frozenset(out)

    def special_texts(self, texts: Sequence[str]) -> frozenset[str]:
        """Those of ``texts`` that are single special tokens of the vocabulary (a tool-call
        format's markers, which grammars then name as tokens, not as text)."""
        target = self.ladder.target
        tokenizer = native.grammar_tokenizer(target.model)  # the grammar engine's view
        out = set()
        for text in texts:
            ids = target.vocab.tokenize(text, add_special=False, parse_special=True)
            if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
                out.add(text)
        return frozenset(out)

    # --- generation ------------------------------------------------------------------------

    def submit(
        self,
        prompt: Prompt,
        sampling: SamplingConfig | None = None,
        spec: SpecConfig | None = None,
        *,
        deliver: Callable[[Response | BaseException | None], None],
        logprobs: int | None = None,
        special: bool = False,
    ) -> Job:
        """Admit one generation and return its :class:`Job` (``job.cancel()`` ends it at the
        next token). Its :class:`Response` steps go to ``deliver`` as they come, on the thread
        of the slot that decodes it (so ``deliver`` must only hand them on), then an exception
        if one ended it, then :data:`END` (None). Raises at once, before anything runs: a
        one-line :class:`UserError` for a bad argument, :class:`QueueFull` when
        :attr:`queue_size` generations are admitted, :class:`PoolClosed` once the pyramid is
        closing.

        ``prompt``: text (tokenized with BOS, special tokens parsed) or token ids. Text never
        contains half a UTF-8 character nor any part of a stop string. ``logprobs``: give each
        token the target's log-probability and that many alternatives (0 to
        :data:`MAX_TOP_LOGPROBS`; None: none). ``special``: render control tokens in the text
        (a tool call's ``<|python_tag|>``), as a tool-call parser needs.
        """
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise UserError(f"logprobs must be 0 to {MAX_TOP_LOGPROBS}, got {logprobs}")
        sampling = self._token_biases(sampling or SamplingConfig())
        spec = spec or self.spec
        for grammar in [sampling.grammar, *(g.grammar for g in sampling.triggers)]:
            if grammar is not None:
                check_grammar(grammar)  # a one-line error before anything runs
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]

        def work(job: Job) -> bool:
            """Run the generation; whether it ended by being cancelled (a reader that stops
            listening after the end cancels nothing)."""
            reason: str | None = None
            try:
                for step in self._generate(job, tokens, sampling, spec, logprobs, special):
                    reason = step.finish_reason or reason
                    deliver(step)
            except BaseException as e:  # the reader raises it
                deliver(e)
            finally:
                deliver(END)
            return reason == "cancelled"

        return self.slots.submit(tokens, work)

    def _token_biases(self, sampling: SamplingConfig) -> SamplingConfig:
        """``sampling`` with its text biases as token biases (each token of the text, tokenized
        as llama-server does: no BOS, special tokens as text), every id checked against the
        target's vocabulary (a one-line UserError)."""
        vocab = self.ladder.target.vocab
        extra = [
            (token, bias)
            for text, bias in sampling.logit_bias_text
            for token in vocab.tokenize(text, add_special=False, parse_special=False)
        ]
        n_vocab = self.ladder.target.n_vocab
        bad = next((t for t, _ in (*sampling.logit_bias, *extra) if t >= n_vocab), None)
        if bad is not None:
            raise UserError(
                f"logit_bias: token id {bad} is not in the vocabulary (0 to {n_vocab - 1})"
            )
        if not sampling.logit_bias_text:
            return sampling
        return sampling.with_(logit_bias=(*sampling.logit_bias, *extra), logit_bias_text=())

    def stream(
        self,
        prompt: Prompt,
        sampling: SamplingConfig | None = None,
        spec: SpecConfig | None = None,
        *,
        logprobs: int | None = None,
        special: bool = False,
    ) -> Iterator[Response]:
        """Yield the :class:`Response` steps of one generation (:meth:`submit`'s arguments);
        the last one carries the finish reason. Closing the iterator (or leaving a ``for``
        loop over it) ends the generation at its next token and waits for its slot to be
        free."""
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

    def _generate(
        self,
        job: Job,
        tokens: list[int],
        sampling: SamplingConfig,
        spec: SpecConfig,
        logprobs: int | None,
        special: bool,
    ) -> Iterator[Response]:
        """The steps of ``job``, on its worker thread: a slot, a generation on it, its text and
        log-probabilities; ends when the job is cancelled, at the next token."""
        stats = GenerationStats(mode=spec.mode)
        text = TextStream(sampling.stop)
        vocab = self.ladder.target.vocab
        costs = self._costs() if spec.info.auto else None  # before a slot: it may calibrate
        if self.ladder.target.model.cfg.strict_identity:
            self._calibrate(False, None)  # the identity probe sets the target's micro-batch
        generated: list[int] = []
        with self.slots.take(job) as slot:
            if slot is None:  # cancelled while every slot was held
                yield Response("", [], "cancelled", stats)
                return
            try:
                ladder = slot.ladder
                sampler = Sampler(sampling, vocab=vocab)  # DRY's breakers are found in it
                guide = make_guide(ladder, sampling, len(tokens))
                scheduler, prefill = make_scheduler(  # a fixed mode's tiers are checked here, once
                    ladder, spec, sampler, stats, costs=costs, pool=self.pool, guide=guide,
                    load=slot,
                )  # fmt: skip
                rows: list[np.ndarray] | None = [] if logprobs is not None else None
                steps = decode(ladder, tokens, scheduler, prefill, sampler, stats, rows, guide)
                try:
                    for token in steps:
                        lp: tuple[TokenLogprob, ...] = ()
                        if rows is not None and logprobs is not None:
                            lp = (self._logprob(token, rows[len(generated)], logprobs),)
                            rows[len(generated)] = _DROPPED  # rows are large: keep none
                        generated.append(token)
                        delta = text.feed(vocab.token_bytes(token, special=special))
                        if text.stopped:
                            stats.finish_reason = "stop"
                            if delta:
                                yield Response(delta, [token], None, stats, lp)
                            break
                        yield Response(delta, [token], None, stats, lp)
                        if job.cancelled:
                            stats.finish_reason = "cancelled"
                            break
                finally:
                    steps.close()
            finally:
                if self.pool is not None:
                    self.pool.add([*tokens, *generated])
        yield Response(text.flush(), [], stats.finish_reason or "length", stats)

    def _logprob(self, token: int, row: np.ndarray, top: int) -> TokenLogprob:
        """``token``'s log-probability under the target's ``row`` ``[V]``, and ``top`` others
        (under a grammar: the row masked to the allowed tokens, and only those)."""
        lp = log_softmax(row)
        vocab = self.ladder.target.vocab
        ids = [int(i) for i in top_ids(lp, top) if np.isfinite(lp[i])]
        alts = tuple((i, vocab.token_bytes(i), float(lp[i])) for i in ids)
        return TokenLogprob(token, vocab.token_bytes(token), float(lp[token]), alts)

    def generate(
        self,
        prompt: Prompt,
        sampling: SamplingConfig | None = None,
        spec: SpecConfig | None = None,
        *,
        special: bool = False,
    ) -> Completion:
        """Generate to the end and return the joined :class:`Completion`."""
        texts: list[str] = []
        ids: list[int] = []
        last: Response | None = None
        for last in self.stream(prompt, sampling, spec, special=special):
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
