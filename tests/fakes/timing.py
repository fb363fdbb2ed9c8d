"""Waiting without sleeping for a time: for a condition (``until``), for the completion
engine's background work (``settled``); and a clock the test sets (``SettableClock``)."""

from __future__ import annotations

import asyncio

from kode.completion.engine import CompletionEngine


async def until(condition: object, seconds: float = 10.0) -> None:
    """Wait for ``condition`` to hold, never for a time: ``seconds`` only turns a hang
    into a failure (a loaded machine is slow, never wrong)."""
    async with asyncio.timeout(seconds):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def settled(engine: CompletionEngine, seconds: float = 10.0) -> None:
    """Wait until the engine's background tasks (read-ahead, prefetch, a suggestion being
    dropped) and its preparation have ended: after it, a check that something did *not*
    happen holds without sleeping. On a ``ManualClock``, advance it first."""
    async with asyncio.timeout(seconds):
        while engine.background or engine.preparation.preparing:
            task = engine.preparation.task
            pending = [*engine.background.pending(), *([task] if task is not None else [])]
            await asyncio.wait(pending)


class SettableClock:
    """A ``() -> float`` clock that reads ``now``, which only the test moves."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
