"""Process-wide llama.cpp state: backend start-up, log sink, build and CPU facts, quantizing."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import llama_cpp

from ..core.errors import UserError

_lock = threading.Lock()
_ready = False
_captured = threading.local()


def _log(level: int, text: bytes, user_data: Any) -> None:
    """llama.cpp log sink: silent unless PYRAMID_GGUF_VERBOSE is set; kept by
    :func:`captured_log` on the thread that asked."""
    log = getattr(_captured, "log", None)
    if log is not None and text:
        log.append(text)
    if os.environ.get("PYRAMID_GGUF_VERBOSE"):
        print(text.decode("utf-8", errors="replace"), end="", flush=True)


_quiet_log = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(_log)


def in_log_callback(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside the log callback, called from llama.cpp.

    An exception raised there cannot leave it: ctypes prints and drops it, so a Ctrl-C that
    Python handles inside the callback (as it does while llama.cpp loads a model) must be
    delivered again later (``cli/interrupts.py``).
    """
    while frame is not None:
        if frame.f_code is _log.__code__:
            return True
        frame = frame.f_back
    return False


def init_backend() -> None:
    """Start llama.cpp's backends once per process, logs routed to :func:`_quiet_log`."""
    global _ready
    with _lock:
        if not _ready:
            llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _ready = True


@contextmanager
def captured_log() -> Iterator[list[bytes]]:
    """The log lines llama.cpp writes from this thread inside the block (a model load logs
    from the loading thread), in a list filled as they come."""
    init_backend()
    llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))  # ours, whoever set one since
    log: list[bytes] = []
    outer = getattr(_captured, "log", None)
    _captured.log = log
    try:
        yield log
    finally:
        _captured.log = outer


def system_info() -> str:
    """llama.cpp's feature line (``CPU : SSE3 = 1 | ... | AMX_INT8 = 1 | REPACK = 1 |``)."""
    init_backend()
    raw = llama_cpp.llama_print_system_info()
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def build_id() -> str:
    """Which llama.cpp this is: llama-cpp-python's version and the build's feature line."""
    return f"llama-cpp-python {llama_cpp.__version__}; {system_info().strip()}"


def supports_gpu_offload() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU of this machine. Not
    ``llama_supports_gpu_offload`` alone: that also says yes for a CPU build with the RPC
    backend, whose devices are other machines' (``native/rpc.py``)."""
    init_backend()
    found = devices()
    if found:
        return any(gpu for gpu, _, _ in found)
    return bool(llama_cpp.llama_supports_gpu_offload())


#: ggml's device types that are GPUs (``GGML_BACKEND_DEVICE_TYPE_GPU`` and ``_IGPU``).
_GPU_TYPES = (1, 2)


def devices() -> list[tuple[bool, str, int]]:
    """Every device llama.cpp's backends report: ``(is a GPU, description, total memory in
    bytes)``; a CUDA card's description is its name (``NVIDIA GeForce RTX 4060 Laptop GPU``).
    Read through ggml's device registry (``ggml_backend_dev_*``), which llama-cpp-python does
    not wrap; empty where the libraries do not export it. RPC servers' devices are not this
    machine's and are left out."""
    init_backend()
    lib = llama_cpp.llama_cpp._lib
    try:
        count, get = lib.ggml_backend_dev_count, lib.ggml_backend_dev_get
        kind, describe = lib.ggml_backend_dev_type, lib.ggml_backend_dev_description
        memory = lib.ggml_backend_dev_memory
    except AttributeError:
        return []
    count.restype, get.restype, get.argtypes = ctypes.c_size_t, ctypes.c_void_p, [ctypes.c_size_t]
    kind.restype, kind.argtypes = ctypes.c_int, [ctypes.c_void_p]
    describe.restype, describe.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    size_p = ctypes.POINTER(ctypes.c_size_t)
    memory.restype, memory.argtypes = None, [ctypes.c_void_p, size_p, size_p]
    dev_name = lib.ggml_backend_dev_name
    dev_name.restype, dev_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    out = []
    for i in range(count()):
        dev = get(i)
        if (dev_name(dev) or b"").startswith(b"RPC"):
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        memory(dev, ctypes.byref(free), ctypes.byref(total))
        name = (describe(dev) or b"").decode("utf-8", "replace").strip()
        out.append((kind(dev) in _GPU_TYPES, name, int(total.value)))
    return out


def gpu_device() -> tuple[str, int] | None:
    """The first GPU of :func:`devices`: its name and total memory in bytes; None on a CPU
    build."""
    return next(((name, total) for gpu, name, total in devices() if gpu), None)


def quantize(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: int, *, threads: int
) -> None:
    """``llama_model_quantize``, requantizing allowed; ``ftype`` is a ``LLAMA_FTYPE_*`` value."""
    init_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise UserError(f"llama.cpp could not quantize {src} (code {rc})")


def ftype_names() -> dict[str, int]:
    """Type names for :func:`quantize` (``Q4_0`` -> ``LLAMA_FTYPE_MOSTLY_Q4_0``)."""
    prefix = "LLAMA_FTYPE_MOSTLY_"
    return {
        name[len(prefix) :]: int(getattr(llama_cpp, name))
        for name in dir(llama_cpp)
        if name.startswith(prefix)
    }


class Override(ctypes.Structure):
    """``struct llama_model_tensor_buft_override`` (llama.h): tensors whose name matches
    ``pattern`` (a regex) load into buffer type ``buft``; an array ends with a NULL pattern."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]
