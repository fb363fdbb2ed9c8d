"""llama.cpp's process-wide state: the library initialised once (its log quietened, an
install built without this CPU's instruction sets said once) and the one thread that runs
every llama.cpp call that computes. ``runtime`` builds models and contexts on top."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import llama_cpp
from kode.backends.llama import build_flags

_log = logging.getLogger(__name__)
_LOG_CALLBACK: object = None  # keep the ctypes callback alive
_BACKEND_READY = threading.Lock()
_backend_initialised = False


def init_library() -> None:
    """Initialise llama.cpp once per process, its stderr chatter silenced (it would drown
    the LSP log) unless ``KODE_LLAMA_VERBOSE`` is set."""
    global _LOG_CALLBACK, _backend_initialised
    with _BACKEND_READY:
        if _backend_initialised:
            return
        if not os.environ.get("KODE_LLAMA_VERBOSE"):

            @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator,unused-ignore]
            def _ignore(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
                return None

            _LOG_CALLBACK = _ignore
            llama_cpp.llama_log_set(_ignore, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_initialised = True
        _say_unused_instructions()


def _say_unused_instructions() -> None:
    """Warn once if llama.cpp was built without instruction sets this CPU has (an install
    from before ``build_flags`` chose them, or a wheel built elsewhere)."""
    flags = build_flags.cpu_flags_here()
    if flags is None:
        return
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    missing = build_flags.unused(info, flags)
    if missing:
        gain = ""
        if "AVX512" in missing:
            gain = " (AVX-512 made prompt evaluation 1.4-1.5x faster on Kode's development machine)"
        _log.warning(
            "llama.cpp was built without %s, which this CPU has%s; to rebuild it for this"
            " machine: %s",
            ", ".join(missing),
            gain,
            build_flags.rebuild_command(sys.executable, llama_cpp.__version__),
        )


_THREAD_LOCK = threading.Lock()
_thread: ThreadPoolExecutor | None = None


def llama_thread() -> ThreadPoolExecutor:
    """The one OS thread on which this process runs every llama.cpp call that computes.

    llama-cpp-python's wheels are built with OpenMP (libgomp), which gives each calling
    thread its own team of worker threads, and those teams spin-wait. Once a second
    thread has run a graph, the first one decodes slower for the rest of the process,
    even after the second context is freed: measured on the 2-core dev machine, the
    1.5B's plain decode went from 31.5 to 41-44 ms per token after one
    ``Llama.generate`` on another thread, and stayed at 34 ms when that generate ran
    on this thread instead. So every model, context and generation goes through here;
    work for different models queues up, which on a few cores costs nothing it would
    not cost anyway.
    """
    global _thread
    with _THREAD_LOCK:
        if _thread is None:
            _thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kode-llama")
        return _thread
