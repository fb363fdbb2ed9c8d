"""What a backend is: a prompt goes in, an async stream of token chunks comes out.

A backend never sees documents, cursors or editors; ``completion/`` builds the prompt
text and decides when to stop. A caller stops a generation early by calling
``Generation.cancel()`` (or by leaving ``async for`` and calling ``aclose()``); the
backend then stops within one decode (or verify) step and frees what it held.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from kode.backends.monitor import Names


class SpeculationMethod(enum.StrEnum):
    """How a backend may guess tokens ahead of the target model."""

    AUTO = "auto"  # n-gram drafts only where the measured cost curve says they pay
    NONE = "none"
    NGRAM = "ngram"
    LOOKAHEAD = "lookahead"
    DRAFT = "draft"
    REMOTE = "remote"  # the remote server's own (EAGLE, n-gram): reported, not chosen here


class BackendKind(enum.StrEnum):
    """Where generations run (the ``backend`` setting; a router's mode)."""

    LOCAL = "local"
    REMOTE = "remote"
    AUTO = "auto"  # remote within a latency budget, else local


class FinishReason(enum.StrEnum):
    """Why a generation ended."""

    LENGTH = "length"  # max_tokens reached
    END = "end"  # the model produced an end-of-generation token
    CANCELLED = "cancelled"  # the caller cancelled (superseded, stop rule, client cancel)
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters. ``temperature == 0`` means greedy (the default)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One prompt to continue.

    ``prompt`` is the full prompt text, special tokens included (they are parsed).
    ``draft_sources`` are extra texts in which n-gram drafting may look for
    continuations (the suffix, other open documents, earlier completions).
    ``moved_kv_drift``: the local llama.cpp engine may reuse cached prompt entries that
    only moved after an edit (the FIM suffix after a keystroke) while at most this many
    edited tokens went unseen by them; 0 evaluates every changed position exactly.
    ``background``: work no one waits for yet (reading a file ahead, preparing the
    cursor's window, a prefetch); a backend shared by several windows runs a keystroke's
    request before it and may pause it. ``document`` names the document it is for (its
    URI), so that a newer request for the same document replaces an older one.
    ``names``: the receivers whose members are known at the cursor (the names monitor,
    ``backends/monitor.py``): after ``receiver.`` the next identifier must be one of
    them. Only a backend that implements ``TokenHealing`` (sees every logit) applies it;
    others ignore it.
    ``heal`` (token healing): the prompt ends just before this text, which the
    generation must begin with; its first token(s) are constrained to spell it
    (``backends/heal_index.py``) and are emitted like any other. Only a backend that
    implements ``TokenHealing`` accepts a non-empty ``heal``.
    ``assemble``: the window may be assembled from chunks of text read earlier
    (``backends/llama/kv_chunks.py``) where that evaluates fewer tokens; the entries it
    takes did not see what precedes them (an approximation the caller chose: the full
    window would not be ready in time otherwise). ``read_chunks``: generate nothing;
    read ``prompt`` (whole lines of a file, starting and ending where chunks do) into
    the engine's chunk store. Backends without a chunk store ignore both.
    """

    prompt: str
    max_tokens: int
    sampling: Sampling = Sampling()
    speculation: SpeculationMethod = SpeculationMethod.AUTO
    draft_sources: Sequence[str] = ()
    moved_kv_drift: int = 0
    background: bool = False
    document: str = ""
    heal: str = ""
    names: Names | None = None
    assemble: bool = False
    read_chunks: bool = False


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Newly generated text. ``text`` may be empty while a UTF-8 sequence is split."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(slots=True)
class SpeculationStats:
    """What speculation did during one generation."""

    method: SpeculationMethod = SpeculationMethod.NONE
    steps: int = 0  # target verify/decode calls during generation
    drafted: int = 0  # draft tokens proposed to the target
    accepted: int = 0  # draft tokens the target confirmed
    near_ties: int = 0  # verify batches cut short at a near tie (``auto``, greedy)

    @property
    def accepted_mean(self) -> float:
        """Mean tokens produced per target step (1.0 = no gain from speculation)."""
        return 0.0 if self.steps == 0 else (self.accepted + self.steps) / self.steps


@dataclass(slots=True)
class GenerationStats:
    """Counters for one generation; filled in while it runs, final after it ends."""

    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt tokens whose KV entries were reused
    evaluated_prompt_tokens: int = 0  # prompt tokens actually evaluated
    moved_prompt_tokens: int = 0  # of the reused: entries moved after an edit (approximate)
    assembled_prompt_tokens: int = 0  # of the reused: taken from stored chunks (approximate)
    completion_tokens: int = 0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0  # start -> first generated token available
    total_ms: float = 0.0
    decode_steps: int = 0  # target model calls after the prompt
    steps_after_cancel: int = 0  # target model calls that began after cancel() was requested
    # Target model calls it took part in, prompt batches included; a decoding step
    # evaluated in one batch with other generations' counts for each of them.
    model_calls: int = 0
    batched_steps: int = 0  # decoding steps shared with another generation's (one batch)
    monitor_fired: int = 0  # dereferences where the names monitor constrained the name
    monitor_picks: int = 0  # picks made under its mask (verify rows included)
    monitor_ms: float = 0.0  # time spent judging rows and masking logits
    finish_reason: FinishReason | None = None
    speculation: SpeculationStats = field(default_factory=SpeculationStats)
    route: BackendKind | None = None  # which backend served it (LOCAL or REMOTE), set by a router
    route_reason: str = ""  # why (e.g. "remote timed out after 1500 ms")
    worker: str = ""  # the server that generated it, as it names itself (X-Kode-Worker)

    @property
    def ms_per_token(self) -> float:
        """Decode time per generated token, prompt processing excluded."""
        n = self.completion_tokens
        return 0.0 if n == 0 else (self.total_ms - self.ttft_ms) / max(n - 1, 1)


# The synthetic prompt (no user code) timed at start-up to learn the prefill speed: by a
# window that loads its own model, or by a shared engine before it welcomes any window.
PREFILL_PROBE = "".join(
    f"def step_{i}(value, scale={i}):\n    return value * scale + {i}\n\n" for i in range(12)
)


class PrefillRate:
    """Prompt tokens per second this machine evaluates, learned from its generations
    (an exponential moving average); ``fixed`` pins it (tests, benchmarks)."""

    def __init__(self, tokens_per_s: float | None = None, *, fixed: bool = False) -> None:
        self.value = tokens_per_s
        self.fixed = fixed

    def observe(self, stats: GenerationStats) -> None:
        n, ms = stats.evaluated_prompt_tokens, stats.prefill_ms
        if self.fixed or n < 64 or ms <= 0:
            return
        rate = n / (ms / 1000.0)
        self.value = rate if self.value is None else 0.7 * self.value + 0.3 * rate

    def tokens_within(self, ms: float) -> int | None:
        """How many prompt tokens fit in ``ms``; None while the speed is unknown."""
        return None if self.value is None else int(self.value * ms / 1000.0)


class Generation(Protocol):
    """A running generation: iterate it for chunks, cancel it to stop it."""

    @property
    def stats(self) -> GenerationStats:
        """Counters, final once the generation ended."""
        ...

    def __aiter__(self) -> AsyncIterator[TokenChunk]: ...

    async def cancel(self) -> None:
        """Stop generating within one step and wait until resources are released."""
        ...

    async def wait(self) -> GenerationStats:
        """Wait for the generation to end (without cancelling it)."""
        ...


class Counters(Protocol):
    """Totals since a backend started, for ``kode/stats`` and ``kode serve``'s metrics."""

    @property
    def generations(self) -> int: ...

    def as_dict(self) -> dict[str, Any]:
        """The totals as JSON (camelCase keys)."""
        ...


class Backend(Protocol):
    """Turns prompts into tokens."""

    @property
    def counters(self) -> Counters: ...

    @property
    def name(self) -> str:
        """Short backend kind, e.g. ``"llama.cpp"``."""
        ...

    @property
    def model_name(self) -> str:
        """Human-readable name of the loaded model."""
        ...

    def count_tokens(self, text: str) -> int:
        """Number of tokens ``text`` takes in this backend's model (special tokens parsed)."""
        ...

    async def generate(self, request: GenerationRequest) -> Generation:
        """Start a generation. Waits for any earlier generation on the same context."""
        ...

    async def health(self, timeout_s: float = 1.0) -> bool:
        """Whether the backend can serve now (a remote one asks its server)."""
        ...

    async def aclose(self) -> None:
        """Release the model and every context."""
        ...


@runtime_checkable
class PromptCache(Protocol):
    """A backend that keeps evaluated prompts (KV cache, saved states) and can say how
    much of a prompt it would not need to evaluate again."""

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        """``(tokens of prompt already evaluated, tokens in prompt)``; an estimate, read
        without waiting for a running generation."""
        ...


@runtime_checkable
class ChunkAssembly(Protocol):
    """A backend that keeps chunks of text read earlier and can assemble a window from
    them (``GenerationRequest.assemble``, ``read_chunks``)."""

    def assembled_prefix(self, prompt: str) -> tuple[int, int]:
        """``(tokens of prompt an assembled window would not evaluate, tokens in
        prompt)``, the first 0 where assembling would take nothing from the store; an
        estimate, like ``cached_prefix``."""
        ...

    @property
    def chunk_store(self) -> dict[str, int] | None:
        """``chunks``, ``bytes``, ``budgetBytes``, ``tokens``, ``hits``, ``misses``,
        ``evictions``, ``assembled``, ``readTokens``; None without a store."""
        ...


@runtime_checkable
class KvMemoryReport(Protocol):
    """A backend that keeps evaluated prompts of other places in host memory."""

    @property
    def kv_memory(self) -> dict[str, int]:
        """``states``, ``bytes``, ``budgetBytes``, ``tokens``, ``saves``, ``restores``,
        ``evictions``."""
        ...


@runtime_checkable
class EngineReport(Protocol):
    """A backend that can say which engine process answers it (``kode/stats``)."""

    @property
    def engine_info(self) -> dict[str, Any]:
        """``kind`` (``shared`` or ``inProcess``), ``pid``, and for a shared engine its
        ``socket``, whether it is ``connected`` and how many ``restarts`` it took."""
        ...


@runtime_checkable
class Progress(Protocol):
    """A backend whose work can be seen advancing while a generation runs (the shared
    engine's heartbeat carries it, so a window tells a slow engine from a hung one)."""

    @property
    def progress(self) -> int:
        """A count that grows with every step of work (model calls, prompt batches)."""
        ...


@runtime_checkable
class PrefillSpeed(Protocol):
    """A backend that already measured how fast this machine evaluates prompts."""

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """Prompt tokens per second (None: not measured yet)."""
        ...


@runtime_checkable
class TokenHealing(Protocol):
    """A backend that can constrain a generation's first tokens (``GenerationRequest.heal``):
    a local engine, which sees every logit. A remote server cannot, so it does not heal."""

    def last_token_chars(self, text: str) -> int:
        """How many characters at the end of ``text`` its last token spells (0: none, or
        this model cannot heal)."""
        ...


@runtime_checkable
class Concurrent(Protocol):
    """A backend that runs several generations at once (a local engine decoding them in
    one batch): a scheduler may start up to ``width`` before the first ends."""

    @property
    def width(self) -> int:
        """How many generations it runs at once (1: one at a time)."""
        ...
