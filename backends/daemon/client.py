"""A window's side of the shared engine: the ``Backend`` that ``kode lsp`` uses.

``SharedEngineBackend`` connects to the engine for its settings' model, and starts one
when none answers: the first window to take the start lock spawns ``kode engine run``
(detached, logging to the state folder), the others wait for its socket with backoff,
so windows opening at the same moment end with exactly one engine. If the engine dies
under a window, the next request starts it again, once; if that fails too, or no engine
can be started, the window says so once (``notify``, shown as ``window/showMessage``)
and loads the model in its own process, as before the shared engine existed.

What stays in the window: token counting (the GGUF's vocabulary only, a few MB, so a
keystroke never waits for the socket to count context lines) and an estimate of what
the engine holds for this window's prompts (``cached_prefix``, from what its
generations reported evaluating: the engine's own saved states may have been evicted
since, or another window's may serve more; it is an estimate, as the protocol says).

The wire session (``Connection``, ``EngineGeneration``, the hang watchdog) is in
``connection``; finding or starting the engine (``connect``, ``spawn_engine``,
``end_process``) in ``launch``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from kode.backends.base import (
    Backend,
    ChunkAssembly,
    FinishReason,
    GenerationRequest,
    PromptCache,
    TokenHealing,
)
from kode.backends.daemon.connection import SILENT_S, STALL_S, Connection, EngineGeneration
from kode.backends.daemon.launch import START_TIMEOUT_S, connect, end_process
from kode.backends.daemon.paths import EngineConfig, EnginePlace
from kode.backends.errors import BackendClosed, EngineError, describe
from kode.backends.kv_reuse import MOVED_REFRESH, plan_moved_tail, prefix_reach
from kode.backends.llama.kv_chunks import Assembler
from kode.backends.llama.runtime import LlamaModel
from kode.backends.worker import BackendCounters

log = logging.getLogger("kode.engine")

# How often a window restarts an engine that died under it before it falls back.
MAX_RESTARTS = 1
# Prompts of this window remembered for ``cached_prefix``.
_MIRRORED = 16

Notify = Callable[[str], None]


class Vocabulary(Protocol):
    """The model's tokenizer, loaded in the window (``LlamaModel(path, vocab_only=True)``)."""

    def tokenize(self, text: str, *, special: bool = True) -> list[int]: ...

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` spells (token healing)."""
        ...

    def close(self) -> None: ...


class KvMirror:
    """What this window's generations left evaluated in the engine, to estimate
    ``cached_prefix`` without a round trip: the evaluated tokens of recent prompts
    (longest common prefix), and the last prompt's suffix moved after an edit.

    >>> m = KvMirror()
    >>> m.remember([1, 2, 3, 4, 5], evaluated=5)
    >>> m.reach([1, 2, 3, 9])
    3
    """

    def __init__(self, size: int = _MIRRORED) -> None:
        self._size = size
        self._prompts: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self._last: tuple[int, ...] = ()

    def remember(self, tokens: list[int], evaluated: int) -> None:
        kept = tuple(tokens[: max(0, evaluated)])
        if not kept:
            return
        self._prompts.pop(kept, None)
        self._prompts[kept] = None
        while len(self._prompts) > self._size:
            self._prompts.popitem(last=False)
        self._last = kept

    def reach(self, tokens: list[int]) -> int:
        best = max((prefix_reach(p, tokens, None) for p in self._prompts), default=0)
        if len(self._last) >= 2:
            plan = plan_moved_tail(self._last, tokens, refresh=MOVED_REFRESH)
            if plan is not None:
                best = max(best, plan.keep + plan.length)
        return min(best, max(len(tokens) - 1, 0))


class SharedEngineBackend:
    """The ``Backend`` protocol over the shared engine (or, after a failure, over the
    in-process backend ``fallback`` loads)."""

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
        self.place = place
        self._vocab = vocab
        self.idle_s = idle_s
        self._load_fallback = fallback
        self._notify = notify
        self._timeout_s = timeout_s
        self.counters = BackendCounters()
        self.mirror = KvMirror()
        self._conn: Connection | None = None
        self._fallback: Backend | None = None
        self._lock = asyncio.Lock()
        self._kv: dict[str, int] = {}
        # What this window read into the engine's chunk store (the engine's own figures
        # in ``_chunks``, as its last answer reported them).
        self._chunk_mirror: Assembler | None = None
        if config.chunk_memory_mb and isinstance(vocab, LlamaModel):
            self._chunk_mirror = Assembler(vocab, config.chunk_memory_mb << 20)
        self._chunks: dict[str, int] | None = None
        self.restarts = 0
        self._closed = False
        self._spawn: Callable[[EngineConfig, EnginePlace], int] | None = None  # tests swap it
        self._end_hung: Callable[[int], None] = end_process  # tests swap it
        self.silent_s, self.stall_s = SILENT_S, STALL_S
        self._moving: set[asyncio.Future[None]] = set()

    # -- Backend protocol -----------------------------------------------------------------

    @property
    def name(self) -> str:
        if self._fallback is not None:
            return self._fallback.name
        return "llama.cpp" if self._conn is None else self._conn.welcome.engine

    @property
    def model_name(self) -> str:
        return self.config.model.name

    def count_tokens(self, text: str) -> int:
        return len(self._vocab.tokenize(text))

    def last_token_chars(self, text: str) -> int:
        """``TokenHealing``, answered in the window from the vocabulary (the engine's
        llama.cpp backend then constrains the generation's first tokens to spell the
        ``heal`` text the request carries): the characters of ``text``'s last token, 0
        when that token does not end on a character boundary."""
        if self._fallback is not None:
            if isinstance(self._fallback, TokenHealing):
                return self._fallback.last_token_chars(text)
            return 0
        tokens = self._vocab.tokenize(text, special=False)
        if not tokens:
            return 0
        try:
            last = self._vocab.piece(tokens[-1]).decode()
        except UnicodeDecodeError:
            return 0
        return len(last) if last and text.endswith(last) else 0

    async def generate(self, request: GenerationRequest) -> Any:
        if self._closed:
            raise BackendClosed("backend is closed")
        conn = await self._connection()
        if conn is None:
            assert self._fallback is not None
            return await self._fallback.generate(request)
        generation = conn.generate(request)
        generation.on_prompt = self._evaluated
        return generation

    async def health(self, timeout_s: float = 1.0) -> bool:
        if self._fallback is not None:
            return await self._fallback.health(timeout_s)
        conn = self._conn
        if conn is None or conn.closed:
            return False
        try:
            await conn.status(timeout_s)
        except (EngineError, TimeoutError):
            return False
        return True

    async def aclose(self) -> None:
        """Cancel and await the generations being moved (and the restart they wait for),
        then close; a closed backend starts nothing and answers ``BackendClosed``."""
        if self._closed:
            return
        self._closed = True
        moving = list(self._moving)
        for task in moving:
            task.cancel()
        await asyncio.gather(*moving, return_exceptions=True)
        if self._conn is not None:
            await self._conn.close()
        if self._fallback is not None:
            await self._fallback.aclose()
        self._vocab.close()

    # -- PromptCache, KvMemoryReport, EngineReport -------------------------------------------

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        if self._fallback is not None:
            if isinstance(self._fallback, PromptCache):
                return self._fallback.cached_prefix(prompt)
            return 0, self.count_tokens(prompt)
        tokens = self._vocab.tokenize(prompt)
        return self.mirror.reach(tokens), len(tokens)

    def assembled_prefix(self, prompt: str) -> tuple[int, int]:
        """``ChunkAssembly``, from what this window read into the engine's store (what
        other windows read there is not counted; what the engine dropped is)."""
        if self._fallback is not None:
            if isinstance(self._fallback, ChunkAssembly):
                return self._fallback.assembled_prefix(prompt)
            return 0, self.count_tokens(prompt)
        tokens = self._vocab.tokenize(prompt)
        if self._chunk_mirror is None:
            return 0, len(tokens)
        left = self._chunk_mirror.left(tokens, self.mirror.reach(tokens))
        return (0 if left is None else len(tokens) - left), len(tokens)

    @property
    def chunk_store(self) -> dict[str, int] | None:
        if self._fallback is not None:
            return self._fallback.chunk_store if isinstance(self._fallback, ChunkAssembly) else None
        if self._chunk_mirror is None:
            return None
        return self._chunks or {
            "bytes": 0,
            "tokens": 0,
            "budgetBytes": self._chunk_mirror.store.budget,
        }

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """The prefill speed the engine measured for earlier windows (``PrefillSpeed``)."""
        if self._fallback is not None or self._conn is None:
            return None
        return self._conn.welcome.prefill_tokens_per_s

    @property
    def kv_memory(self) -> dict[str, int]:
        """The engine's saved-state memory as its last answer to this window reported it."""
        return dict(self._kv)

    @property
    def engine_info(self) -> dict[str, Any]:
        conn = self._conn
        if self._fallback is not None:
            return {"kind": "inProcess", "pid": os.getpid(), "fallback": True}
        return {
            "kind": "shared",
            "pid": None if conn is None else conn.welcome.pid,
            "socket": str(self.place.socket),
            "connected": conn is not None and not conn.closed,
            "restarts": self.restarts,
        }

    # -- the connection -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to (or start) the engine; on failure, fall back and say why."""
        async with self._lock:
            if self._conn is None and self._fallback is None:
                await self._open_or_fall_back()

    async def _connection(self) -> Connection | None:
        async with self._lock:
            if self._closed:
                raise BackendClosed("backend is closed")
            if self._fallback is not None:
                return None
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            if conn is not None:
                if self.restarts >= MAX_RESTARTS:
                    await self._fall_back(
                        f"the shared Kode engine stopped again (it was restarted "
                        f"{self.restarts} time); see {self.place.log}"
                    )
                    return None
                self.restarts += 1
                log.warning("the Kode engine (pid %d) is gone; starting it again", conn.welcome.pid)
            return await self._open_or_fall_back()

    async def _open_or_fall_back(self) -> Connection | None:
        try:
            self._conn = await connect(
                self.config,
                self.place,
                idle_s=self.idle_s,
                timeout_s=self._timeout_s,
                on_end=self._ended,
                spawn=self._spawn,
                silent_s=self.silent_s,
                stall_s=self.stall_s,
            )
            self._conn.on_lost = self._lost
            self._conn.on_hung = self._end_hung
        except (EngineError, OSError) as exc:
            await self._fall_back(describe(exc))
            return None
        log.info("using the Kode engine pid %d on %s", self._conn.welcome.pid, self.place.socket)
        return self._conn

    async def _fall_back(self, why: str) -> None:
        self._notify(
            f"Kode: the shared engine is not available ({why}); this window loads its own "
            "copy of the model"
        )
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        self._fallback = await self._load_fallback()

    def _lost(self, generations: list[EngineGeneration]) -> bool:
        """The engine died before these produced anything: run them on a restarted one
        (once per window, as any restart), else on the window's own model, so that the
        keystroke is still answered."""
        if self._closed:
            return False

        async def move() -> None:
            try:
                conn = await self._connection()
            except asyncio.CancelledError:  # the window closes
                for generation in generations:
                    generation.fail(BackendClosed("backend is closed"))
                raise
            except Exception as exc:  # closed, or the fallback could not load
                for generation in generations:
                    generation.fail(exc)
                return
            for generation in generations:
                if conn is not None:
                    conn.adopt(generation)
                elif self._fallback is not None:  # the user was told, once
                    generation.run_on(self._fallback)
                else:
                    generation.fail(EngineError("the shared Kode engine stopped"))

        task = asyncio.ensure_future(move())
        self._moving.add(task)
        task.add_done_callback(self._moving.discard)
        return True

    def _prompt_tokens(self, generation: EngineGeneration) -> list[int]:
        if generation.tokens is None:
            generation.tokens = self._vocab.tokenize(generation.request.prompt)
        return generation.tokens

    def _evaluated(self, generation: EngineGeneration) -> None:
        """The first token came: the engine holds the whole prompt now. Known at once, not
        at the generation's end, so that what the window prepares next (``cached_prefix``)
        never re-does a prompt that a generation still running (or being cancelled) has
        already evaluated."""
        tokens = self._prompt_tokens(generation)
        self.mirror.remember(tokens, len(tokens))

    def _ended(self, generation: EngineGeneration) -> None:
        stats = generation.stats
        self.counters.record(stats, generation.decode_calls, read=generation.request.read_chunks)
        if generation.request.read_chunks:
            if self._chunk_mirror is not None and stats.finish_reason is FinishReason.LENGTH:
                self._chunk_mirror.note_read(self._prompt_tokens(generation))
        elif stats.prompt_tokens:
            tokens = self._prompt_tokens(generation)
            self.mirror.remember(tokens, stats.reused_prompt_tokens + stats.evaluated_prompt_tokens)
        if generation.kv is not None:
            self._kv = generation.kv
        if generation.chunks is not None:
            self._chunks = generation.chunks
