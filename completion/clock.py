"""Time, passed in: the engine's waits (a quiet moment before background work, the
grace after a cancel, the pause before re-indexing) read it, so tests move it by hand
instead of sleeping (``ManualClock``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, seconds: float | None) -> None:
        """Until ``event`` is set or ``seconds`` passed (None: no limit)."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)


class ManualClock:
    """A clock that moves only when told (``advance``): every ``sleep`` ends once the
    time it waits for has come.

    >>> async def demo() -> list[str]:
    ...     clock, seen = ManualClock(), []
    ...     async def nap() -> None:
    ...         await clock.sleep(1.0)
    ...         seen.append(f"woke at {clock.now():g}")
    ...     task = asyncio.ensure_future(nap())
    ...     await asyncio.sleep(0)  # it starts sleeping at 0
    ...     await clock.advance(0.5)
    ...     seen.append("still asleep")
    ...     await clock.advance(0.5)
    ...     await task
    ...     return seen
    >>> asyncio.run(demo())
    ['still asleep', 'woke at 1']
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now + seconds, wake))
        await wake

    async def wait(self, event: asyncio.Event, seconds: float | None) -> None:
        if seconds is None:
            await event.wait()
            return
        waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self.sleep(seconds))]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    @property
    def sleepers(self) -> int:
        """How many tasks sleep on this clock (a test waits for a task to be asleep
        before it moves time on)."""
        return len(self._sleepers)

    async def advance(self, seconds: float) -> None:
        """Move time on, waking the sleepers whose time came, then let every task that
        can run do so (several rounds, so chains of wake-ups settle)."""
        self._now += seconds
        due = [(t, f) for t, f in self._sleepers if t <= self._now]
        self._sleepers = [(t, f) for t, f in self._sleepers if t > self._now]
        for _, wake in due:
            if not wake.done():
                wake.set_result(None)
        for _ in range(20):
            await asyncio.sleep(0)
