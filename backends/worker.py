"""What the local backends share: generations run on a worker thread, consumed async.

The worker thread pushes ``TokenChunk``s (then ``None``, or an exception) through an
asyncio queue with ``call_soon_threadsafe``; the consumer iterates a ``WorkerGeneration``.
Cancelling sets a ``threading.Event`` the worker checks before every step.

A run is a generator (``WorkerRun.decode``, ``LocalRun.steps``) that the worker steps
(``Live``): it pauses between two prompt batches and before each decoding step, so
that one worker thread can advance several generations in turn, and it asks for its
plain decoding steps (``Plain``) instead of taking them, so that the worker can evaluate
several generations' steps in one batch (``LocalBackend``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from kode.backends.base import (
    FinishReason,
    GenerationRequest,
    GenerationStats,
    SpeculationMethod,
    TokenChunk,
)
from kode.backends.chunks import ChunkQueue, drain
from kode.backends.errors import BackendError
from kode.backends.speculative import AdaptivePolicy, CostCurve, NgramDrafter
from kode.backends.speculative.policy import CostTracker
from kode.backends.steppers import PlainStepper, Stepper


@dataclass(slots=True)
class BackendCounters:
    """Totals since the backend started (read by tests, benchmarks and ``kode/stats``)."""

    generations: int = 0
    cancelled: int = 0
    decode_calls: int = 0  # target calls the generations took part in, prompt batches included
    generation_steps: int = 0  # target steps after prompts
    batched_steps: int = 0  # of them, steps shared with other generations (one batch)
    steps_after_cancel: int = 0
    prompt_tokens: int = 0
    prompt_tokens_reused: int = 0
    prompt_tokens_evaluated: int = 0
    completion_tokens: int = 0
    chunk_reads: int = 0  # texts read into the chunk store (no completion)
    chunk_read_tokens: int = 0
    last: GenerationStats = field(default_factory=GenerationStats)

    def record(self, stats: GenerationStats, decode_calls: int, *, read: bool = False) -> None:
        """Add one finished generation (``decode_calls``: target calls it took part in).
        ``read``: it read text into the chunk store (``GenerationRequest.read_chunks``),
        counted apart: it is no completion."""
        if read:
            self.chunk_reads += 1
            self.chunk_read_tokens += stats.evaluated_prompt_tokens
            self.decode_calls += decode_calls
            return
        self.generations += 1
        self.cancelled += stats.finish_reason is FinishReason.CANCELLED
        self.decode_calls += decode_calls
        self.generation_steps += stats.decode_steps
        self.batched_steps += stats.batched_steps
        self.steps_after_cancel += stats.steps_after_cancel
        self.prompt_tokens += stats.prompt_tokens
        self.prompt_tokens_reused += stats.reused_prompt_tokens
        self.prompt_tokens_evaluated += stats.evaluated_prompt_tokens
        self.completion_tokens += stats.completion_tokens
        self.last = stats

    def as_dict(self) -> dict[str, Any]:
        last = self.last
        return {
            "generations": self.generations,
            "cancelled": self.cancelled,
            "decodeCalls": self.decode_calls,
            "generationSteps": self.generation_steps,
            "batchedSteps": self.batched_steps,
            "stepsAfterCancel": self.steps_after_cancel,
            "promptTokens": self.prompt_tokens,
            "promptTokensReused": self.prompt_tokens_reused,
            "promptTokensEvaluated": self.prompt_tokens_evaluated,
            "completionTokens": self.completion_tokens,
            "chunkReads": self.chunk_reads,
            "chunkReadTokens": self.chunk_read_tokens,
            "last": {
                "promptTokens": last.prompt_tokens,
                "reusedPromptTokens": last.reused_prompt_tokens,
                "evaluatedPromptTokens": last.evaluated_prompt_tokens,
                "movedPromptTokens": last.moved_prompt_tokens,
                "assembledPromptTokens": last.assembled_prompt_tokens,
                "completionTokens": last.completion_tokens,
                "decodeSteps": last.decode_steps,
                "batchedSteps": last.batched_steps,
                "stepsAfterCancel": last.steps_after_cancel,
                "finishReason": None if last.finish_reason is None else str(last.finish_reason),
                "ttftMs": round(last.ttft_ms, 1),
                "totalMs": round(last.total_ms, 1),
                "speculation": {
                    "method": last.speculation.method,
                    "steps": last.speculation.steps,
                    "drafted": last.speculation.drafted,
                    "accepted": last.speculation.accepted,
                    "acceptedMean": round(last.speculation.accepted_mean, 3),
                },
            },
        }


class NgramLearning:
    """What n-gram speculation learns across one backend's generations: acceptance
    (``auto``'s policy, and a separate one for ``speculation=ngram``, which drafts
    whenever it can and must not teach ``auto``), batch costs as the machine delivers
    them, the drafter's index, and earlier completions as draft sources."""

    def __init__(self, curve: CostCurve) -> None:
        self.policy = AdaptivePolicy(curve, [SpeculationMethod.NGRAM], max_draft=8)
        self.forced_policy = AdaptivePolicy(curve, [SpeculationMethod.NGRAM], max_draft=8)
        self.costs = CostTracker(curve.ms_by_rows, fixed=curve.fixed)
        self.drafter = NgramDrafter(min_n=2, max_n=4)
        self.history: deque[list[int]] = deque(maxlen=16)  # earlier completions (tokens)

    def drafter_for(self, sources: Iterable[Sequence[int]]) -> NgramDrafter:
        """The drafter, its sources set to ``sources`` and the earlier completions."""
        self.drafter.clear_sources()
        for src in (*sources, *self.history):
            self.drafter.add_source(src)
        return self.drafter

    def policy_for(self, auto: bool) -> AdaptivePolicy:
        return self.policy if auto else self.forced_policy

    def remember(self, generated: list[int]) -> None:
        """Keep a finished completion as a draft source for the next ones."""
        if len(generated) >= 4:
            self.history.append(generated)


class WorkerJob:
    """State shared between one generation's worker run and its async consumer (made on
    the event loop: ``done`` is one of its futures)."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.queue: ChunkQueue = asyncio.Queue()
        self.cancel_event = threading.Event()
        self.stats = GenerationStats()
        self.steps_at_cancel: int | None = None
        self.done: asyncio.Future[None] = loop.create_future()

    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def emit(self, item: TokenChunk | BaseException | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def close(self) -> None:
        """The run ended: the stream ends and ``done`` resolves (worker thread)."""
        self.emit(None)
        self.loop.call_soon_threadsafe(_resolve, self.done)


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class WorkerGeneration:
    """Handle of one generation running on a backend's worker thread."""

    def __init__(self, job: WorkerJob) -> None:
        self._job = job
        self._done = job.done

    @property
    def stats(self) -> GenerationStats:
        return self._job.stats

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        try:
            async with aclosing(drain(self._job.queue)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            # Leaving the loop early (break, exception, task cancel) stops the worker.
            self._job.cancel_event.set()

    async def cancel(self) -> None:
        self._job.cancel_event.set()
        await asyncio.shield(self._done)

    async def wait(self) -> GenerationStats:
        await asyncio.shield(self._done)
        return self._job.stats


@dataclass(frozen=True, slots=True)
class Plain:
    """What a run yields when it wants one plain decoding step: ``root`` evaluated at the
    end of its cache. The worker sends back the token picked after it, or None when the
    generation was cancelled before the step (nothing was evaluated). A run yields None
    to pause: the worker sends None back when it is the run's turn again."""

    root: int


Steps = Generator[Plain | None, int | None, None]


class Run(Protocol):
    """One generation as a backend executes it on its worker thread."""

    def steps(self) -> Steps: ...

    def account(self) -> None: ...


class WorkerRun:
    """What the local backends' runs share once the prompt is in: streaming tokens out
    as text, the decode loop (stop token, ``max_tokens``, cancel before every step) and
    the timing. A subclass turns tokens into text (``text_of``, ``text_tail``)."""

    def __init__(self, job: WorkerJob) -> None:
        self.job = job
        self.stats = job.stats
        self.start = time.perf_counter()
        self.generated: list[int] = []

    def text_of(self, token: int) -> str:
        raise NotImplementedError

    def text_tail(self) -> str:
        """Text still held back (an incomplete UTF-8 sequence) when generation ends."""
        raise NotImplementedError

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.start) * 1000.0

    def emit(self, token: int) -> None:
        stats = self.stats
        if stats.completion_tokens == 0:
            stats.ttft_ms = self.elapsed_ms()
        stats.completion_tokens += 1
        self.generated.append(token)
        self.job.emit(TokenChunk(self.text_of(token), (token,)))

    def finish(self, reason: FinishReason) -> None:
        tail = self.text_tail()
        if tail:
            self.job.emit(TokenChunk(tail, ()))
        self.stats.finish_reason = reason

    def decode(
        self,
        first: Sequence[int],
        stepper: Stepper,
        is_stop: Callable[[int], bool],
        share: Callable[[], bool] = lambda: False,
    ) -> Steps:
        """Emit ``first`` (from the prompt's logits: one token, or the constrained ones of
        token healing, all but the last already evaluated), then step until a stop token,
        ``max_tokens`` or a cancel; a step in flight when the cancel came is counted.

        A plain stepper's steps are asked of the worker (``Plain``), which may evaluate
        them in one batch with other generations'; any other stepper steps itself after
        a pause (speculation verifies its own batches, one generation at a time), except
        while ``share()`` says that this step should rather be a plain one in the
        common batch (``auto`` beside another generation)."""
        stats, job = self.stats, self.job
        max_tokens = job.request.max_tokens
        plain = isinstance(stepper, PlainStepper) and stepper.tracker is None
        pending = list(first)
        produced = 0
        while True:
            for token in pending:
                if is_stop(token):
                    self.finish(FinishReason.END)
                    return
                self.emit(token)
                produced += 1
                if produced >= max_tokens:
                    self.finish(FinishReason.LENGTH)
                    return
            if job.cancelled():
                self.finish(FinishReason.CANCELLED)
                return
            if plain or share():
                picked = yield Plain(pending[-1])
                if picked is None:  # cancelled while it waited for the batch
                    self.finish(FinishReason.CANCELLED)
                    return
                stepper.stats.steps += 1
                pending = [picked]
            else:
                yield None
                if job.cancelled():
                    self.finish(FinishReason.CANCELLED)
                    return
                pending = stepper.step(pending[-1])
            stats.decode_steps += 1
            stats.speculation = stepper.stats
            if job.cancelled():
                stats.steps_after_cancel += 1


R = TypeVar("R", bound=Run)


class Live(Generic[R]):
    """A run as the worker steps it: ``advance`` runs it to its next pause (``want``:
    None, or the ``Plain`` step it waits for) or its end (``ended``); then ``close``
    updates its counters and closes its stream, however it ended. Errors reach the
    consumer, never get lost."""

    def __init__(self, job: WorkerJob, run: R) -> None:
        self.job, self.run = job, run
        self._steps = run.steps()
        self.want: Plain | None = None
        self.ended = False

    def advance(self, value: int | None = None, error: BaseException | None = None) -> None:
        """Send ``value`` (or throw ``error``) into the run and let it go on to its next
        pause or its end."""
        try:
            if error is not None:
                self.want = self._steps.throw(error)
            else:
                self.want = self._steps.send(value)
            return
        except StopIteration:
            pass
        except BaseException as exc:
            self.job.stats.finish_reason = FinishReason.ERROR
            self.job.emit(exc if isinstance(exc, BackendError) else _unexpected(exc))
        self.ended = True
        self.want = None

    def close(self) -> None:
        try:
            self.run.account()
        finally:
            self.job.close()


def fail(job: WorkerJob, exc: BaseException) -> None:
    """End a job that has no run (making its run failed): its consumer gets the error
    once, then the end of its stream, instead of waiting for ever."""
    job.stats.finish_reason = FinishReason.ERROR
    job.emit(exc if isinstance(exc, BackendError) else _unexpected(exc))
    job.close()


def _unexpected(exc: BaseException) -> BackendError:
    """An unexpected error, named by its type only: its text may quote the prompt,
    which is everyone's code (a UnicodeEncodeError's repr carries the whole prompt),
    and the message reaches logs and the editor."""
    return BackendError(f"the local backend failed unexpectedly ({type(exc).__name__})")
