"""What the local backends share: a generation run on a worker thread, consumed async.

The worker thread pushes ``TokenChunk``s (then ``None``, or an exception) through an
asyncio queue with ``call_soon_threadsafe``; the consumer iterates a ``WorkerGeneration``.
Cancelling sets a ``threading.Event`` the worker checks before every step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.base import FinishReason, GenerationRequest, GenerationStats, TokenChunk
from backends.errors import BackendError


@dataclass(slots=True)
class BackendCounters:
    """Totals since the backend started (read by tests, benchmarks and ``kode/stats``)."""

    generations: int = 0
    cancelled: int = 0
    decode_calls: int = 0  # every llama_decode on the target, prompt batches included
    generation_steps: int = 0  # target steps after prompts
    steps_after_cancel: int = 0
    prompt_tokens: int = 0
    prompt_tokens_reused: int = 0
    prompt_tokens_evaluated: int = 0
    completion_tokens: int = 0
    last: GenerationStats = field(default_factory=GenerationStats)

    def as_dict(self) -> dict[str, Any]:
        last = self.last
        return {
            "generations": self.generations,
            "cancelled": self.cancelled,
            "decodeCalls": self.decode_calls,
            "generationSteps": self.generation_steps,
            "stepsAfterCancel": self.steps_after_cancel,
            "promptTokens": self.prompt_tokens,
            "promptTokensReused": self.prompt_tokens_reused,
            "promptTokensEvaluated": self.prompt_tokens_evaluated,
            "completionTokens": self.completion_tokens,
            "last": {
                "promptTokens": last.prompt_tokens,
                "reusedPromptTokens": last.reused_prompt_tokens,
                "evaluatedPromptTokens": last.evaluated_prompt_tokens,
                "movedPromptTokens": last.moved_prompt_tokens,
                "completionTokens": last.completion_tokens,
                "decodeSteps": last.decode_steps,
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


class Job:
    """State shared between one generation's worker run and its async consumer."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue[TokenChunk | BaseException | None] = asyncio.Queue()
        self.cancel_event = threading.Event()
        self.stats = GenerationStats()
        self.steps_at_cancel: int | None = None

    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def emit(self, item: TokenChunk | BaseException | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class WorkerGeneration:
    """Handle of one generation running on a backend's worker thread."""

    def __init__(self, job: Job, done: asyncio.Future[None]) -> None:
        self._job = job
        self._done = done

    @property
    def stats(self) -> GenerationStats:
        return self._job.stats

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        try:
            while True:
                item = await self._job.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            # Leaving the loop early (break, exception, task cancel) stops the worker.
            self._job.cancel_event.set()

    async def cancel(self) -> None:
        self._job.cancel_event.set()
        await asyncio.shield(self._done)

    async def wait(self) -> GenerationStats:
        await asyncio.shield(self._done)
        return self._job.stats


class Run(Protocol):
    """One generation as a backend executes it on its worker thread."""

    def execute(self) -> None: ...

    def account(self) -> None: ...


def run_job(job: Job, run: Run) -> None:
    """Execute ``run`` on the worker thread: errors reach the consumer, never get lost;
    counters are updated and the stream is closed whatever happens."""
    try:
        run.execute()
    except BaseException as exc:
        job.stats.finish_reason = FinishReason.ERROR
        job.emit(exc if isinstance(exc, BackendError) else BackendError(repr(exc)))
    finally:
        run.account()
        job.emit(None)
