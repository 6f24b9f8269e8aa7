"""``serve --parallel``: several requests decoded at once, under load, with nothing lost.

Tiny synthetic models behind a live uvicorn server with four slots:

- a load test: 64 requests from 16 clients against 4 slots and a queue of 8; every request is
  answered, or refused with a 503 and ``Retry-After``, and every answer is its own prompt's
  (the ladder runs with ``--strict-identity``, so an answer equals its solo one exactly); the
  server's memory is flat afterwards and every slot free;
- ``/health`` and ``/metrics`` (Prometheus text) answer while every slot is busy;
- a client that disconnects frees its slot for the next request at once;
- bad requests sent among good ones are refused alone.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from serving_support import Live, Models, live_server, wait_until, write_models

from pyramid_gguf.api import Pyramid
from pyramid_gguf.cli.main import main
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.serving.settings import ServerSettings

SLOTS = 4
LOAD = LoadConfig(n_ctx=512, n_batch=256, n_threads=1, n_threads_batch=1, parallel=SLOTS)
PROMPTS = [f"{w} {n}" for w in ("the cat", "def fib", "import data", "class node") for n in "ab"]


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return write_models(tmp_path_factory.mktemp("slot-models"))


@pytest.fixture(scope="module")
def busy(models: Models) -> Iterator[Live]:
    """Four slots of the three-tier ladder (psd-exact, strict identity), a queue of eight."""
    pyramid = Pyramid.from_paths(
        models.target,
        draft=models.draft,
        qualifier=models.qualifier,
        load=replace(LOAD, strict_identity=True),
        spec=SpecConfig(mode="psd-exact"),
        name="tiny",
    )
    with pyramid, live_server(pyramid, ServerSettings(queue_size=8)) as server:
        yield server


def _body(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True} | extra


def _health(live: Live) -> dict[str, Any]:
    return httpx.get(f"{live.url}/health", timeout=5).json()  # type: ignore[no-any-return]


def _wait_idle(live: Live) -> dict[str, Any]:
    """/health once no request is queued or running and no slot is busy."""
    return wait_until(live.url, lambda h: not (h["in_flight"] or h["slots_processing"]), 30)


def test_load_64_requests_16_clients_4_slots(busy: Live) -> None:
    solo = {}
    with httpx.Client(timeout=60) as http:
        for prompt in PROMPTS:
            r = http.post(f"{busy.v1}/completions", json=_body(prompt))
            solo[prompt] = r.json()["choices"][0]["text"]
    before = _rss_mib()
    answered: list[tuple[str, str]] = []
    refused: list[httpx.Response] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        with httpx.Client(timeout=60) as http:
            for i in range(4):
                prompt = PROMPTS[(c + i) % len(PROMPTS)]
                stream = (c + i) % 2 == 0
                r = http.post(f"{busy.v1}/completions", json=_body(prompt, stream=stream))
                with lock:
                    if r.status_code == 503:
                        refused.append(r)
                        continue
                    assert r.status_code == 200, r.text
                    answered.append((prompt, _text(r, stream)))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(16)))
    assert len(answered) + len(refused) == 64
    assert answered, "every request was refused"
    for prompt, text in answered:
        assert text == solo[prompt], f"{prompt!r} got another prompt's answer (or a changed one)"
    for r in refused:
        assert r.headers["Retry-After"] == "1" and r.json()["error"]["code"] == "queue_full"
    health = _wait_idle(busy)
    assert health["slots_idle"] == SLOTS and health["in_flight"] == 0
    assert _rss_mib() - before < 64, "memory grew under load"
    # Another round of load leaves memory where it was.
    middle = _rss_mib()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(16)))
    assert _rss_mib() - middle < 16


def _text(r: httpx.Response, stream: bool) -> str:
    if not stream:
        return str(r.json()["choices"][0]["text"])
    import json

    texts = []
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            texts += [c["text"] for c in json.loads(line[6:])["choices"]]
    return "".join(texts)


def _slow(prompt: str) -> dict[str, Any]:
    return _body(prompt, max_tokens=400, stream=True)


def test_health_and_metrics_answer_while_every_slot_is_busy(busy: Live) -> None:
    _wait_idle(busy)
    with httpx.Client(timeout=30) as http:
        streams = [http.stream("POST", f"{busy.v1}/completions", json=_slow(p)) for p in PROMPTS]
        opened = [s.__enter__() for s in streams[:SLOTS]]
        try:
            lines = [r.iter_lines() for r in opened]
            for it in lines:
                assert next(it).startswith("data: ")
            t0 = time.monotonic()
            health = _health(busy)
            metrics = httpx.get(f"{busy.url}/metrics", timeout=5)
            assert time.monotonic() - t0 < 2
            assert health["slots_processing"] == SLOTS and health["slots_idle"] == 0
        finally:
            for s in streams[:SLOTS]:
                s.__exit__(None, None, None)
    assert metrics.headers["content-type"].startswith("text/plain")
    values = _prometheus(metrics.text)
    assert values["pyramid_gguf:requests_processing"] == SLOTS
    assert values["pyramid_gguf:slots"] == SLOTS
    assert values['pyramid_gguf:batch_tokens_total{tier="target"}'] > 0
    assert values["pyramid_gguf:n_decode_total"] > 0
    _wait_idle(busy)
    after = _prometheus(httpx.get(f"{busy.url}/metrics").text)
    assert after["pyramid_gguf:requests_processing"] == 0
    assert after["pyramid_gguf:requests_cancelled_total"] >= SLOTS  # the clients left


def _prometheus(text: str) -> dict[str, float]:
    """Samples of a Prometheus text body; every metric has its HELP and TYPE lines."""
    helped, typed, values = set(), set(), {}
    sample = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.e+-]+)$")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert kind in ("counter", "gauge")
            typed.add(name)
        else:
            m = sample.match(line)
            assert m, f"not a Prometheus sample: {line!r}"
            assert m.group(1) in helped and m.group(1) in typed
            values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


def test_a_client_that_leaves_frees_its_slot(busy: Live) -> None:
    _wait_idle(busy)
    with httpx.Client(timeout=30) as http:
        streams = [http.stream("POST", f"{busy.v1}/completions", json=_slow(p)) for p in PROMPTS]
        opened = [s.__enter__() for s in streams[:SLOTS]]
        lines = [r.iter_lines() for r in opened]
        for it in lines:
            next(it)
        streams[0].__exit__(None, None, None)  # one client leaves
        t0 = time.monotonic()
        r = http.post(f"{busy.v1}/completions", json=_body("the cat a", max_tokens=2))
        assert r.status_code == 200 and time.monotonic() - t0 < 10  # it got the freed slot
        for s in streams[1:SLOTS]:
            s.__exit__(None, None, None)
    _wait_idle(busy)


def test_bad_requests_among_good_ones_are_refused_alone(busy: Live) -> None:
    _wait_idle(busy)
    good = {p: httpx.post(f"{busy.v1}/completions", json=_body(p)).json() for p in PROMPTS[:3]}
    bad_bodies: list[Any] = [
        b"{not json",
        {"prompt": "x", "max_tokens": 0},
        {"prompt": "the cat " * 400, "max_tokens": 4},  # longer than a slot's context
        {"prompt": [1, 2, 10**9], "max_tokens": 2},
    ]

    def send(item: Any) -> httpx.Response:
        if isinstance(item, bytes):
            headers = {"Content-Type": "application/json"}
            return httpx.post(f"{busy.v1}/completions", content=item, headers=headers)
        return httpx.post(f"{busy.v1}/completions", json=item, timeout=60)

    work: list[Any] = [*(_body(p) for p in good), *bad_bodies]
    with ThreadPoolExecutor(len(work)) as pool:
        got = list(pool.map(send, work))
    for (prompt, want), r in zip(good.items(), got, strict=False):
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"] == want["choices"][0]["text"], prompt
    for r in got[len(good) :]:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"]
    assert _wait_idle(busy)["slots_idle"] == SLOTS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--parallel", "0"], "--parallel"),
        (["--parallel", "4", "--queue-size", "2"], "--queue-size (2) must be at least --parallel"),
    ],
)
def test_cli_refuses_bad_parallel_flags(models: Models, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["serve", "-m", str(models.target), *args])
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output
