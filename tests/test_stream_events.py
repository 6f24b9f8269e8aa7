"""A streamed OpenAI chunk written from a prepared template is byte for byte the chunk built
from its dict, and a
:class:`~pyramid_gguf.serving.jobs.Reader` hands the event loop every item a slot's thread
delivers, in order. No model: the shapes and the reader alone."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from pyramid_gguf.api import END, GenerationStats, Response, TokenLogprob
from pyramid_gguf.serving import choices
from pyramid_gguf.serving.jobs import Reader, Totals
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
