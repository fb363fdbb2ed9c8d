"""A window's side of the shared engine: ``SharedEngineBackend``, the ``Backend`` that
``kode lsp`` uses.

One backend is current at a time and the client forwards to it. First the shared engine
(``engine_backend.EngineBackend``: it connects, starting an engine when none answers,
and starts it again once if it dies under the window). When the engine cannot be had,
the window says so once (``notify``, shown as ``window/showMessage``) and loads the
model in its own process, as before the shared engine existed (``InProcessFallback``);
it stays there. Generations a dying engine never started move to whichever is current
then, so that the keystroke is still answered.

Closing cancels and awaits every task the client started (a connection being made, an
engine being started again, generations being moved); a closed client starts nothing
and answers ``BackendClosed``.

The wire session (``Connection``, ``EngineGeneration``, the hang watchdog) is in
``connection``; finding or starting the engine (``connect``, ``spawn_engine``,
``end_process``) in ``launch``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from kode.backends.base import (
    Backend,
    ChunkAssembly,
    Counters,
    Generation,
    GenerationRequest,
    KvMemoryReport,
    PrefillSpeed,
    PromptCache,
    TokenHealing,
)
from kode.backends.daemon.connection import EngineGeneration
from kode.backends.daemon.engine_backend import EngineBackend, Vocabulary
from kode.backends.daemon.launch import START_TIMEOUT_S
from kode.backends.daemon.paths import EngineConfig, EnginePlace
from kode.backends.errors import BackendClosed, BackendError, EngineError, describe

Notify = Callable[[str], None]
T = TypeVar("T")

CLOSED = "this window closed its Kode backend"


class Current(Protocol):
    """What the client forwards to: the shared engine, or the window's own model."""

    @property
    def name(self) -> str: ...

    async def ready(self) -> None:
        """Able to generate, or ``EngineError`` saying why not (then the client falls back)."""
        ...

    def take(self, generation: EngineGeneration) -> None:
        """Run ``generation``, which a dead engine never started."""
        ...

    async def generate(self, request: GenerationRequest) -> Generation: ...

    async def health(self, timeout_s: float = 1.0) -> bool: ...

    async def aclose(self) -> None: ...

    def last_token_chars(self, text: str) -> int: ...

    def cached_prefix(self, prompt: str) -> tuple[int, int]: ...

    def assembled_prefix(self, prompt: str) -> tuple[int, int]: ...

    @property
    def chunk_store(self) -> dict[str, int] | None: ...

    @property
    def prefill_tokens_per_s(self) -> float | None: ...

    @property
    def kv_memory(self) -> dict[str, int]: ...

    @property
    def engine_info(self) -> dict[str, Any]: ...


class InProcessFallback:
    """The window's own copy of the model, after the shared engine could not be had. What
    the client offers beyond ``Backend`` is answered by it where it has the feature, else
    as by a backend without it (nothing cached, no chunk store, no healing)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @property
    def name(self) -> str:
        return self.backend.name

    async def ready(self) -> None:
        return None

    def take(self, generation: EngineGeneration) -> None:
        generation.run_on(self.backend)

    async def generate(self, request: GenerationRequest) -> Generation:
        return await self.backend.generate(request)

    async def health(self, timeout_s: float = 1.0) -> bool:
        return await self.backend.health(timeout_s)

    async def aclose(self) -> None:
        await self.backend.aclose()

    def last_token_chars(self, text: str) -> int:
        b = self.backend
        return b.last_token_chars(text) if isinstance(b, TokenHealing) else 0

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        b = self.backend
        if isinstance(b, PromptCache):
            return b.cached_prefix(prompt)
        return 0, b.count_tokens(prompt)

    def assembled_prefix(self, prompt: str) -> tuple[int, int]:
        b = self.backend
        if isinstance(b, ChunkAssembly):
            return b.assembled_prefix(prompt)
        return 0, b.count_tokens(prompt)

    @property
    def chunk_store(self) -> dict[str, int] | None:
        return self.backend.chunk_store if isinstance(self.backend, ChunkAssembly) else None

    @property
    def prefill_tokens_per_s(self) -> float | None:
        b = self.backend
        return b.prefill_tokens_per_s if isinstance(b, PrefillSpeed) else None

    @property
    def kv_memory(self) -> dict[str, int]:
        return self.backend.kv_memory if isinstance(self.backend, KvMemoryReport) else {}

    @property
    def engine_info(self) -> dict[str, Any]:
        return {"kind": "inProcess", "pid": os.getpid(), "fallback": True}


class SharedEngineBackend:
    """The ``Backend`` protocol (and ``TokenHealing``, ``PromptCache``, ``ChunkAssembly``,
    ``PrefillSpeed``, ``KvMemoryReport``, ``EngineReport``) over the shared engine, or,
    after a failure, over the in-process backend ``fallback`` loads. ``engine`` is the
    shared engine's side, kept after a fall back (its restarts, its counters)."""

    def __init__(
        self,
        config: EngineConfig,
        place: EnginePlace,
        vocab: Vocabulary,
        *,
        idle_s: float,
        fallback: Callable[[], Awaitable[Backend]],
        notify: Notify,
        timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.config = config
        self._vocab = vocab
        self._load_fallback = fallback
        self._notify = notify
        self.engine = EngineBackend(
            config, place, vocab, idle_s=idle_s, on_lost=self._lost, timeout_s=timeout_s
        )
        self._current: Current = self.engine
        self._lock = asyncio.Lock()  # one connection or fall back at a time
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- Backend protocol -----------------------------------------------------------------

    @property
    def counters(self) -> Counters:
        """The engine's generations (a fallback counts its own)."""
        return self.engine.counters

    @property
    def name(self) -> str:
        return self._current.name

    @property
    def model_name(self) -> str:
        return self.config.model.name

    def count_tokens(self, text: str) -> int:
        return len(self._vocab.tokenize(text))

    async def generate(self, request: GenerationRequest) -> Generation:
        current = await self._ready()
        return await current.generate(request)

    async def health(self, timeout_s: float = 1.0) -> bool:
        return await self._current.health(timeout_s)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._current.aclose()
        self._vocab.close()

    # -- what the current backend answers -----------------------------------------------

    def last_token_chars(self, text: str) -> int:
        return self._current.last_token_chars(text)

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        return self._current.cached_prefix(prompt)

    def assembled_prefix(self, prompt: str) -> tuple[int, int]:
        return self._current.assembled_prefix(prompt)

    @property
    def chunk_store(self) -> dict[str, int] | None:
        return self._current.chunk_store

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return self._current.prefill_tokens_per_s

    @property
    def kv_memory(self) -> dict[str, int]:
        return self._current.kv_memory

    @property
    def engine_info(self) -> dict[str, Any]:
        return self._current.engine_info

    # -- which backend is current ---------------------------------------------------------

    async def start(self) -> None:
        """Connect to (or start) the engine; on failure, fall back and say why."""
        await self._ready()

    async def _ready(self) -> Current:
        """The current backend, able to generate: the engine connected (started again
        if it died), else the fallback loaded. ``BackendClosed`` once closed, also when
        the window closes while it waits."""
        async with self._lock:
            self._refuse_closed()
            readying = self._own(self._make_ready())
            try:
                current = await readying
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closed and (task is None or not task.cancelling()):
                    raise BackendClosed(CLOSED) from None  # ended by ``aclose``, not the caller
                raise
            self._refuse_closed()
            return current

    async def _make_ready(self) -> Current:
        try:
            await self._current.ready()
        except EngineError as exc:
            await self._fall_back(describe(exc))
        return self._current

    async def _fall_back(self, why: str) -> None:
        self._notify(
            f"Kode: the shared engine is not available ({why}); this window loads its own "
            "copy of the model"
        )
        await self.engine.aclose()
        self._current = InProcessFallback(await self._load_fallback())

    def _refuse_closed(self) -> None:
        if self._closed:
            raise BackendClosed(CLOSED)

    def _own(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` as a task that ``aclose`` cancels and awaits."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _lost(self, generations: list[EngineGeneration]) -> bool:
        """The engine died before these produced anything: run them on a restarted one
        (once per window, as any restart), else on the window's own model, so that the
        keystroke is still answered; not once the window closes."""
        if self._closed:
            return False
        self._own(self._move(generations))
        return True

    async def _move(self, generations: list[EngineGeneration]) -> None:
        try:
            current = await self._ready()
        except asyncio.CancelledError:
            _fail(generations, BackendClosed(CLOSED))
            raise
        except Exception as exc:  # closed, or the fallback could not load: it reaches the user
            _fail(generations, exc)
            return
        for generation in generations:
            try:
                current.take(generation)
            except BackendError as exc:
                generation.fail(exc)


def _fail(generations: list[EngineGeneration], exc: BaseException) -> None:
    for generation in generations:
        generation.fail(exc)
