"""A streamed token's event written from a prepared template is byte for byte the event built
from its dict (OpenAI's chunks, llama-server's ``/completion`` chunks, Ollama's lines), and a
:class:`~pyramid_gguf.serving.jobs.Reader` hands the event loop every item a slot's thread
delivers, in order. No model: the shapes and the reader alone."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from pyramid_gguf.api import END, GenerationStats, Response, TokenLogprob
from pyramid_gguf.serving import choices, ollama
from pyramid_gguf.serving.jobs import Reader, Totals
from pyramid_gguf.serving.llama_server import NativeShape
from pyramid_gguf.serving.openai import ResponseShape
from pyramid_gguf.serving.service import sse

#: Texts whose JSON needs escapes: quotes, backslashes, controls, non-ASCII, separators.
TEXTS = ["hi", ' "q" \\ /', "\n\t\r", "é中😀", "\x00\x1f\x7f", "\u2028\u2029", "</s>", " "]


def _step(text: str, ids: list[int], logprobs: tuple[TokenLogprob, ...] = ()) -> Response:
    stats = GenerationStats(mode="target", prompt_tokens=42, generated_tokens=len(ids) + 3)
    return Response(text=text, token_ids=ids, finish_reason=None, stats=stats, logprobs=logprobs)


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("logprobs", [True, False])
def test_a_text_event_is_the_chunk_serialised(chat: bool, logprobs: bool) -> None:
    """Every choice of ``n`` (its own index, the first's id), every text: the same bytes as
    ``sse(shape.chunk(text))``, and it stays so when the shape's id changes."""
    shape = ResponseShape(chat=chat, model='a "model" é\\', logprobs=logprobs)
    for each in choices.shapes(shape, 3):
        for text in TEXTS:
            assert each.text_event(text) == sse(each.chunk(text))
            data = json.loads(each.text_event(text).removeprefix("data: "))
            assert data["choices"][0]["index"] == each.index
    shape.id = "chatcmpl-other"
    assert shape.text_event("x") == sse(shape.chunk("x"))
    assert '"chatcmpl-other"' in shape.text_event("x")


def _native(index: int = 0) -> NativeShape:
    return NativeShape(
        model="m",
        prompt="p",
        settings={},
        stops=(),
        piece=lambda t: b"",
        n_ctx=128,
        index=index,
    )


@pytest.mark.parametrize("ids", [[], [7], [1, 22, 333]])
def test_a_completion_chunk_is_the_partial_serialised(ids: list[int]) -> None:
    for index in (0, 2):
        shape = _native(index)
        for text in TEXTS:
            step = _step(text, ids)
            assert shape.partial_event(step) == sse(shape.partial(step))
    lp = TokenLogprob(7, b"x", -0.5, ((7, b"x", -0.5), (8, b"y", -1.5)))
    step = _step("x", [7], (lp,))
    event = _native().partial_event(step)
    assert event == sse(_native().partial(step))
    assert "completion_probabilities" in event


@pytest.mark.parametrize("chat", [True, False])
def test_an_ollama_line_is_the_line_serialised(chat: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ollama, "_now", lambda: "2026-11-28T18:00:00.123456Z")
    answer = ollama.Answer('a "model" é', chat, None)
    for text in TEXTS:
        expected = json.dumps(answer.line(text), ensure_ascii=False) + "\n"
        assert answer.line_event(text) == expected


def test_a_reader_gets_every_item_a_thread_delivers_in_order() -> None:
    """Items posted from another thread while the reader waits or not: all of them, in order,
    then the end; the totals count the emitted tokens."""

    async def main() -> tuple[list[str], int]:
        totals = Totals()
        reader = Reader(totals, set())
        steps = [_step(str(i), [i]) for i in range(200)]

        def slot() -> None:
            for i, step in enumerate(steps):
                reader.deliver(step)
                if i % 7 == 0:
                    threading.Event().wait(0.001)  # the reader waits for some, not others
            reader.deliver(END)

        thread = threading.Thread(target=slot)
        thread.start()
        got = []
        while (step := await reader.next()) is not None:
            got.append(step.text)
        thread.join()
        return got, sum(n for _, n in totals._recent)

    got, emitted = asyncio.run(main())
    assert got == [str(i) for i in range(200)]
    assert emitted == 200


def test_an_aborted_reader_raises_while_it_waits() -> None:
    async def main() -> None:
        reader = Reader(Totals(), set())
        waiting = asyncio.ensure_future(reader.next())
        await asyncio.sleep(0)
        reader.abort(RuntimeError("gone"))
        with pytest.raises(RuntimeError, match="gone"):
            await waiting

    asyncio.run(main())
