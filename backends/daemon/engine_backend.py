"""The window's backend over the shared engine: ``EngineBackend``.

It connects to the engine for its settings' model, and starts one when none answers
(``launch.connect``: the first window to take the start lock spawns ``kode engine run``,
the others wait for its socket). If the engine dies under the window, the next request
starts it again, once; when the engine cannot be had (it cannot start, or it died once
more), ``ready`` raises ``EngineError`` saying why, and the window's client
(``client.SharedEngineBackend``) loads the model in its own process instead.

What stays in the window: token counting (the GGUF's vocabulary only, a few MB, so a
keystroke never waits for the socket to count context lines) and an estimate of what
the engine holds for this window's prompts (``cached_prefix``, from what its
generations reported evaluating: the engine's own saved states may have been evicted
since, or another window's may serve more; it is an estimate, as the protocol says).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from kode.backends.base import FinishReason, GenerationRequest
from kode.backends.daemon.connection import SILENT_S, STALL_S, Connection, EngineGeneration
from kode.backends.daemon.launch import START_TIMEOUT_S, connect, end_process
from kode.backends.daemon.paths import EngineConfig, EnginePlace
from kode.backends.errors import EngineError, describe
from kode.backends.kv_reuse import MOVED_REFRESH, plan_moved_tail, prefix_reach
from kode.backends.llama.kv_chunks import Assembler
from kode.backends.llama.runtime import LlamaModel
from kode.backends.worker import BackendCounters

log = logging.getLogger("kode.engine")

# How often a window restarts an engine that died under it before it falls back.
MAX_RESTARTS = 1
# Prompts of this window remembered for ``cached_prefix``.
_MIRRORED = 16

Lost = Callable[[list[EngineGeneration]], bool]


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


class EngineBackend:
    """Generations run in the shared engine, over one connection at a time.

    ``on_lost`` takes over the generations a dying engine never started (the client
    runs them on a restarted engine or on its fallback). ``spawn``, ``end_hung`` and the
    watchdog's ``silent_s`` and ``stall_s`` are read at each connection (tests set them).
    """

    def __init__(
        self,
        config: EngineConfig,
        place: EnginePlace,
        vocab: Vocabulary,
        *,
        idle_s: float,
        on_lost: Lost,
        timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.place = place
        self._vocab = vocab
        self.idle_s = idle_s
        self._on_lost = on_lost
        self._timeout_s = timeout_s
        self.counters = BackendCounters()
        self.mirror = KvMirror()
        self._conn: Connection | None = None
        self._kv: dict[str, int] = {}
        # What this window read into the engine's chunk store (the engine's own figures
        # in ``_chunks``, as its last answer reported them).
        self._chunk_mirror: Assembler | None = None
        if config.chunk_memory_mb and isinstance(vocab, LlamaModel):
            self._chunk_mirror = Assembler(vocab, config.chunk_memory_mb << 20)
        self._chunks: dict[str, int] | None = None
        self.restarts = 0
        self.spawn: Callable[[EngineConfig, EnginePlace], int] | None = None  # None: the real
        self.end_hung: Callable[[int], None] = end_process
        self.silent_s, self.stall_s = SILENT_S, STALL_S

    # -- the connection -------------------------------------------------------------------

    async def ready(self) -> None:
        """Connected, to an engine that answers now or to one started (again, after it
        died, at most ``MAX_RESTARTS`` times); else ``EngineError`` says why not. One
        caller at a time (the client's lock)."""
        conn = self._conn
        if conn is not None and not conn.closed:
            return
        if conn is not None:
            if self.restarts >= MAX_RESTARTS:
                raise EngineError(
                    f"the shared Kode engine stopped again (it was restarted "
                    f"{self.restarts} time); see {self.place.log}"
                )
            self.restarts += 1
            log.warning("the Kode engine (pid %d) is gone; starting it again", conn.welcome.pid)
        try:
            conn = await connect(
                self.config,
                self.place,
                idle_s=self.idle_s,
                timeout_s=self._timeout_s,
                on_end=self._ended,
                spawn=self.spawn,
                silent_s=self.silent_s,
                stall_s=self.stall_s,
            )
        except OSError as exc:
            raise EngineError(describe(exc)) from exc
        conn.on_lost = self._on_lost
        conn.on_hung = self.end_hung
        self._conn = conn
        log.info("using the Kode engine pid %d on %s", conn.welcome.pid, self.place.socket)

    def _open(self) -> Connection:
        if self._conn is None:
            raise EngineError("this window is not connected to the Kode engine")
        return self._conn

    def take(self, generation: EngineGeneration) -> None:
        """Run ``generation``, which a dead engine never started, on this one."""
        self._open().adopt(generation)

    # -- Backend protocol -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return "llama.cpp" if self._conn is None else self._conn.welcome.engine

    async def generate(self, request: GenerationRequest) -> EngineGeneration:
        generation = self._open().generate(request)
        generation.on_prompt = self._evaluated
        return generation

    async def health(self, timeout_s: float = 1.0) -> bool:
        conn = self._conn
        if conn is None or conn.closed:
            return False
        try:
            await conn.status(timeout_s)
        except (EngineError, TimeoutError):
            return False
        return True

    async def aclose(self) -> None:
        """Close the connection (its generations fail as ``BackendClosed``); the engine
        goes on for the other windows."""
        if self._conn is not None:
            await self._conn.close()

    # -- TokenHealing, PromptCache, ChunkAssembly, PrefillSpeed, reports --------------------

    def last_token_chars(self, text: str) -> int:
        """Answered in the window from the vocabulary (the engine's llama.cpp backend then
        constrains the generation's first tokens to spell the ``heal`` text the request
        carries): the characters of ``text``'s last token, 0 when that token does not end
        on a character boundary."""
        tokens = self._vocab.tokenize(text, special=False)
        if not tokens:
            return 0
        try:
            last = self._vocab.piece(tokens[-1]).decode()
        except UnicodeDecodeError:
            return 0
        return len(last) if last and text.endswith(last) else 0

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        tokens = self._vocab.tokenize(prompt)
        return self.mirror.reach(tokens), len(tokens)

    def assembled_prefix(self, prompt: str) -> tuple[int, int]:
        """From what this window read into the engine's store (what other windows read
        there is not counted; what the engine dropped is)."""
        tokens = self._vocab.tokenize(prompt)
        if self._chunk_mirror is None:
            return 0, len(tokens)
        left = self._chunk_mirror.left(tokens, self.mirror.reach(tokens))
        return (0 if left is None else len(tokens) - left), len(tokens)

    @property
    def chunk_store(self) -> dict[str, int] | None:
        if self._chunk_mirror is None:
            return None
        return self._chunks or {
            "bytes": 0,
            "tokens": 0,
            "budgetBytes": self._chunk_mirror.store.budget,
        }

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """The prefill speed the engine measured for earlier windows."""
        return None if self._conn is None else self._conn.welcome.prefill_tokens_per_s

    @property
    def kv_memory(self) -> dict[str, int]:
        """The engine's saved-state memory as its last answer to this window reported it."""
        return dict(self._kv)

    @property
    def engine_info(self) -> dict[str, Any]:
        conn = self._conn
        return {
            "kind": "shared",
            "pid": None if conn is None else conn.welcome.pid,
            "socket": str(self.place.socket),
            "connected": conn is not None and not conn.closed,
            "restarts": self.restarts,
        }

    # -- what the engine reports ----------------------------------------------------------

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
