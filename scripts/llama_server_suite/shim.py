#!/usr/bin/env python3
"""A ``llama-server`` stand-in: llama-server's flags read, mapped onto ``pyramid-gguf serve``, and
exec'd, so llama.cpp's own server tests (``tools/server/tests``) can start our server.

Flags are handled in four ways (:data:`VALUED`, :data:`SWITCHES`):

- mapped: ``--model`` -> ``--target``, ``--ctx-size`` (llama-server's total over the slots)
  -> ``--ctx-size`` per slot (with ``--kv-unified``, the whole size for each slot),
  ``--parallel``, ``--temp``, ``--seed``, ``--n-predict``, ``--api-key``, ``--alias``,
  ``--chat-template[-file]`` -> ``--chat-format``, ``--metrics`` (``--no-metrics`` without
  it: llama-server serves ``/metrics`` only when asked), ``--slots``/``--no-slots``,
  ``--chat-template-kwargs``, ``--reasoning off`` -> ``{"enable_thinking": false}``...;
- the upstream test models on Hugging Face (``--hf-repo``, ``--hf-file``): replaced by a local
  model of ours (:data:`SUBSTITUTES`, under ``$PYRAMID_GGUF_HOME/models`` or
  ``~/.cache/pyramid-gguf/models``); the embedding model bge-small by a tiny BERT written once
  by :mod:`tiny_bert` (:data:`EMBEDDERS`); a model we have no stand-in for (rerankers, vision)
  ends the shim; llama-server's router preset (no model at all) gets the stand-in too, as
  the tests starting it only ask what any server answers (CORS; the router's own flags are
  refused);
- ``--embedding``: llama-server then embeds with its model; serve loads it as
  ``--embedding-model`` (with ``--pooling``; inputs up to the micro-batch, ``--ubatch-size``, as
  llama-server takes an encoder's input whole) beside the generation target it always needs:
  the same model, or SmolLM2 where the model is the tiny BERT, which cannot generate;
- ignored: flags that change no answer (``--cont-batching``, ``--ubatch-size``, ``--no-ui``,
  ``--offline``, ``--jinja``, ``--reasoning on|auto``...: our server always batches, renders
  chat templates with Jinja, ``enable_thinking`` true);
- refused: a flag that changes behaviour and that ``serve`` lacks (``--context-shift``,
  ``--lora``, ``--reranking``, ``--slot-save-path``...): the shim prints why and exits 2, so
  the test that asked for it fails, counted as unsupported.

Environment: ``PYRAMID_SHIM_MODE`` (default ``target``: plain decoding, one model) and
``PYRAMID_SHIM_THREADS`` (default 2) choose how the server decodes, ``PYRAMID_SHIM_STRICT=1``
adds ``--strict-identity`` (no prompt-prefix reuse, so llama-server's cache counts differ);
``PYRAMID_SHIM_LOG`` appends each command line run to a file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The upstream suite's Hugging Face models -> a local stand-in (file name under the models
#: folder). Their answers differ from the upstream model's, so tests asserting its text fail.
SUBSTITUTES: dict[str, str] = {
    "ggml-org/test-model-stories260K": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "ggml-org/models/tinyllamas/stories260K.gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "ggml-org/test-model-stories260K-infill": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "ggml-org/stories15M_MOE": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "bartowski/Phi-3.5-mini-instruct-GGUF:Q4_K_M": "qwen2.5-coder-0.5b-instruct.gguf",
}
#: The upstream embedding models -> the model whose vocabulary's words the tiny BERT takes
#: (:mod:`tiny_bert`), which is also the generation target beside it.
EMBEDDERS: dict[str, str] = {
    "ggml-org/models/bert-bge-small/ggml-model-f16.gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
}
#: The model serving for llama-server's router preset (started without a model).
ROUTER_STAND_IN = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The tiny BERT's file, in the suite's folder (:func:`suite_dir`).
TINY_BERT = "tiny-bert.gguf"
#: llama-server's micro-batch unless told (``--ubatch-size``), and serve's smallest context.
UBATCH = 512
MIN_EMBEDDING_CTX = 256

#: Flags with a value: llama-server's name(s) -> serve's flag ('' ignores it; None refuses it).
VALUED: dict[str, str | None] = {
    "--port": "--port",
    "--host": "--host",
    "--temp": "--temp",
    "--seed": "--seed",
    "--n-predict": "--n-predict",
    "-n": "--n-predict",
    "--threads": "--threads",
    "-t": "--threads",
    "--n-gpu-layers": "--n-gpu-layers",
    "-ngl": "--n-gpu-layers",
    "--api-key": "--api-key",
    "--cors-origins": "--cors-origins",
    "--model-draft": "--draft",
    "-md": "--draft",
    "-ctk": "--cache-type-k",
    "--cache-type-k": "--cache-type-k",
    "-ctv": "--cache-type-v",
    "--cache-type-v": "--cache-type-v",
    "--sleep-idle-seconds": None,
    "--cache-ram": None,
    "--grp-attn-n": None,
    "--grp-attn-w": None,
    "--slot-save-path": None,
    "--lora": None,
    "--spec-type": None,
    "--spec-draft-n-max": None,
    "--spec-draft-n-min": None,
    "--spec-synth-len": None,
    "--spec-synth-rates": None,
    "--reasoning-format": None,
    "--reasoning": None,
    "--chat-template-kwargs": "--chat-template-kwargs",
    "--mmproj-url": None,
    "--media-path": None,
    "--tools": None,
    "--tools-runtime": None,
    "--mcp-servers-config": None,
    "--mcp-servers-json": None,
    "--models-dir": None,
    "--models-max": None,
    "--models-preset": None,
    "--model-url": None,
    "--tags": None,
}

#: Switches: llama-server's name -> serve's switch ('' ignores it; None refuses it).
SWITCHES: dict[str, str | None] = {
    "--cont-batching": "",
    "--metrics": "--metrics",
    "--slots": "--slots",
    "--no-slots": "--no-slots",
    "--no-ui": "",
    "--offline": "",
    "--verbose": "",
    "--jinja": "",
    "--no-jinja": "",
    "--no-mmproj": "",
    "--swa-full": None,
    "--reranking": None,
    "--context-shift": None,
    "--no-models-autoload": None,
    "--no-cache-idle-slots": None,
    "--ui-mcp-proxy": None,
    "--backend_sampling": None,
}

#: Why a refused flag is refused, where more can be said than "serve has no such flag".
WHY: dict[str, str] = {
    "--context-shift": "context shifting (a full context drops old tokens) is not implemented",
    "--reranking": "no reranking on this server",
    "--lora": "LoRA adapters are not supported",
    "--slot-save-path": "saving and restoring slots is not supported",
    **dict.fromkeys(
        ("--models-dir", "--models-max", "--models-preset", "--no-models-autoload"),
        "the router mode (several models, loaded on demand) is not supported",
    ),
}


class Refused(Exception):
    """A flag or model ``serve`` cannot stand in for: the shim exits 2 with this message."""


def models_dir() -> Path:
    home = os.environ.get("PYRAMID_GGUF_HOME")
    root = Path(home) if home else Path.home() / ".cache" / "pyramid-gguf"
    return root / "models"


def suite_dir() -> Path:
    """The suite's cache folder (``run.py``'s), where the tiny BERT is written."""
    return models_dir().parent / "llama-server-tests"


def local_model(name: str) -> Path:
    path = models_dir() / name
    if not path.is_file():
        raise Refused(f"the stand-in model {path} is missing (pyramid-gguf pull fetches it)")
    return path


def substitute(repo: str, file: str | None) -> Path:
    """The local model standing in for Hugging Face's ``repo`` (and ``file``)."""
    key = f"{repo}/{file}" if file else repo
    name = SUBSTITUTES.get(key)
    if name is None:
        raise Refused(f"no local stand-in for the test model {key} (no Hugging Face access)")
    return local_model(name)


def bert_substitute(key: str) -> tuple[Path, Path]:
    """The tiny BERT standing in for the embedding model ``key`` (written on first use), and
    the generation target beside it."""
    target = local_model(EMBEDDERS[key])
    path = suite_dir() / TINY_BERT
    if not path.is_file():
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from tiny_bert import vocabulary_of, write_tiny_bert  # numpy only when asked

        path.parent.mkdir(parents=True, exist_ok=True)
        write_tiny_bert(path, *vocabulary_of(target))
    return path, target


def embedding_ctx(slot_ctx: int | None, batch: int | None, ubatch: int | None) -> int:
    """``--embedding-ctx-size``: the longest input llama-server embeds, one micro-batch (an
    encoder's input is never split) within a slot's context, at least serve's smallest."""
    limit = min(ubatch or UBATCH, batch or UBATCH, slot_ctx or UBATCH)
    return max(MIN_EMBEDDING_CTX, limit)


def translate(argv: Sequence[str]) -> list[str]:
    """``pyramid-gguf serve``'s arguments for llama-server's ``argv`` (a :class:`Refused` for
    one we cannot honour)."""
    out: list[str] = []
    ctx: int | None = None
    slots = 1
    model: str | None = None
    hf_repo: str | None = None
    hf_file: str | None = None
    chat: str | None = None
    flash: str | None = None
    embedding = False
    pooling: str | None = None
    batch: int | None = None
    ubatch: int | None = None
    unified = "--kv-unified" in argv
    args = [a for a in argv if a != "--kv-unified"]
    i = 0
    while i < len(args):
        flag = args[i]
        value = args[i + 1] if i + 1 < len(args) else None
        i += 1
        if flag == "--embedding":
            embedding = True
            continue
        if flag in SWITCHES:
            mapped = SWITCHES[flag]
            if mapped is None:
                raise Refused(f"{flag}: {WHY.get(flag, 'not supported by pyramid-gguf serve')}")
            if mapped:
                out.append(mapped)
            continue
        if value is None:
            raise Refused(f"{flag}: unknown flag or missing value")
        i += 1
        if flag in ("--model", "-m"):
            model = value
        elif flag in ("--hf-repo", "-hf", "-hfr"):
            hf_repo = value
        elif flag in ("--hf-file", "-hff"):
            hf_file = value
        elif flag in ("--ctx-size", "-c"):
            ctx = int(value)
        elif flag in ("--parallel", "-np"):
            slots = int(value)
        elif flag in ("--alias", "-a"):
            if "," in value:
                raise Refused(f"--alias {value}: several aliases of one model are not supported")
            out += ["--alias", value]
        elif flag in ("--chat-template", "--chat-template-file"):
            chat = value
        elif flag in ("-fa", "--flash-attn"):
            flash = value
        elif flag == "--pooling":
            pooling = value
        elif flag in ("--ubatch-size", "-ub"):
            ubatch = int(value)
        elif flag in ("--batch-size", "-b"):
            batch = int(value)
            out += ["--batch-size", value]
        elif flag == "--reasoning" and value in ("auto", "on"):
            continue  # enable_thinking true, as ours renders it
        elif flag == "--reasoning" and value == "off":
            out += ["--chat-template-kwargs", '{"enable_thinking": false}']
        elif flag == "--reasoning-format" and value == "none":
            continue  # thinking left in the content, as ours answers
        elif flag == "--host" and "," in value:
            raise Refused(f"--host {value}: listening on several addresses is not supported")
        elif flag in VALUED:
            mapped = VALUED[flag]
            if mapped is None:
                raise Refused(f"{flag}: {WHY.get(flag, 'not supported by pyramid-gguf serve')}")
            if mapped:
                out += [mapped, value]
        else:
            raise Refused(f"{flag}: unknown to this shim")
    embedder = model
    key = f"{hf_repo}/{hf_file}" if hf_file else hf_repo or ""
    if model is None and key in EMBEDDERS:
        if not embedding:
            raise Refused(f"{key} is an embedding model: it needs --embedding")
        bert, target = bert_substitute(key)
        embedder, model = str(bert), str(target)
    elif model is None and hf_repo is not None:
        model = embedder = str(substitute(hf_repo, hf_file))
    if model is None:
        # llama-server's router preset (no model): serve always has one, so the stand-in
        # serves; the tests starting it ask only what any server answers (CORS)
        model = str(local_model(ROUTER_STAND_IN))
    out = ["--target", model, "--parallel", str(slots), *out]
    if embedding:  # without it --pooling changes nothing llama-server answers
        size = embedding_ctx(ctx if unified or not ctx else ctx // slots, batch, ubatch)
        out += ["--embedding-model", str(embedder), "--embedding-ctx-size", str(size)]
        if pooling is not None:
            out += ["--pooling", pooling]
    if "--metrics" not in out:
        out.append("--no-metrics")  # llama-server serves /metrics only with --metrics
    if ctx:  # llama-server's --ctx-size is shared by the slots; serve's is per slot
        # --kv-unified: one pool any slot may fill; here each slot gets the whole size (more
        # memory, never less room for one request)
        # (at least 256: llama.cpp's smallest context, which serve asks for)
        out += ["--ctx-size", str(max(256, ctx if unified else ctx // slots))]
    if chat is not None:
        out += ["--chat-format", chat]
    if flash in ("on", "off"):
        out.append("--flash-attn" if flash == "on" else "--no-flash-attn")
    out += ["--mode", os.environ.get("PYRAMID_SHIM_MODE", "target")]
    if os.environ.get("PYRAMID_SHIM_STRICT", "0") == "1":
        # greedy answers as plain decoding whatever the batch, but no prompt-prefix reuse
        # (llama-server reuses the prompt cache, and its tests count it)
        out.append("--strict-identity")
    if "--threads" not in out:
        out += ["--threads", os.environ.get("PYRAMID_SHIM_THREADS", "2")]
    return out


def main(argv: Sequence[str]) -> None:
    try:
        serve = translate(argv)
    except Refused as e:
        print(f"llama-server shim: {e}", file=sys.stderr)
        sys.exit(2)
    command = [sys.executable, "-m", "pyramid_gguf", "serve", *serve, "--log-level", "warning"]
    log = os.environ.get("PYRAMID_SHIM_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(" ".join(argv) + "\n  -> " + " ".join(command[1:]) + "\n")
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main(sys.argv[1:])
