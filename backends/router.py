"""Choosing between the remote server and the local model, per generation.

``RoutingBackend`` is a ``Backend`` in front of a remote backend and a lazily loaded
local one:

- ``local``: every generation runs locally;
- ``remote``: every generation runs remotely, and remote errors reach the caller;
- ``auto``: remote first, but its first token must come within the latency budget;
  past the budget, or on a remote error, the remote request is cancelled (and
  aborted) and the same request runs locally. After ``failure_threshold``
  consecutive failures a circuit breaker opens and sends everything local; after
  ``cooldown_s`` the next request probes the remote's health endpoint (half-open)
  and only a healthy answer closes the breaker again.

Each generation's ``stats.route`` says where it ran and ``stats.route_reason`` why;
the decision is logged at INFO (never the prompt). The clock is injected so tests
can step through the breaker's states without sleeping.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from kode.backends.base import (
    Backend,
    BackendKind,
    Generation,
    GenerationRequest,
    GenerationStats,
    TokenChunk,
)
from kode.backends.errors import BackendError, RemoteError
from kode.backends.remote.clients import estimate_tokens

log = logging.getLogger("kode.router")

LocalFactory = Callable[[], Awaitable[Backend]]
Clock = Callable[[], float]


class BreakerState(enum.StrEnum):
    CLOSED = "closed"  # remote in use
    OPEN = "open"  # remote skipped until the cool-down ends
    HALF_OPEN = "half-open"  # a health probe is deciding


class CircuitBreaker:
    """Opens after ``threshold`` consecutive failures; a probe closes it after a cool-down.

    ``clock`` measures the cool-down (monotonic seconds); ``wall_clock`` only dates
    the opening for messages.
    """

    def __init__(
        self,
        threshold: int = 3,
        cooldown_s: float = 30.0,
        *,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        if threshold < 1:
            raise ValueError("threshold must be at least 1")
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._wall = wall_clock
        self.state = BreakerState.CLOSED
        self.failures = 0  # consecutive
        self.last_failure = ""
        self.opened_at = 0.0
        self.opened_wall = 0.0
        self.times_opened = 0

    def record_success(self) -> None:
        self.failures = 0
        self.state = BreakerState.CLOSED

    def record_failure(self, reason: str) -> None:
        self.failures += 1
        self.last_failure = reason
        if self.state is not BreakerState.OPEN and (
            self.state is BreakerState.HALF_OPEN or self.failures >= self.threshold
        ):
            self._open()

    def _open(self) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = self._clock()
        self.opened_wall = self._wall()
        self.times_opened += 1
        log.warning("remote circuit opened: %s", self.describe())

    def cooled_down(self) -> bool:
        return self.state is BreakerState.OPEN and (
            self._clock() - self.opened_at >= self.cooldown_s
        )

    def begin_probe(self) -> None:
        self.state = BreakerState.HALF_OPEN

    def end_probe(self, healthy: bool) -> None:
        if healthy:
            log.info("remote circuit closed: health probe succeeded")
            self.record_success()
        else:
            self.last_failure = "health probe failed"
            self._open()

    def describe(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.opened_wall))
        return (
            f"circuit open since {since} after {self.failures} consecutive failure"
            f"{'s' if self.failures != 1 else ''} (last: {self.last_failure})"
        )


class RoutingBackend:
    """A ``Backend`` that routes each generation to the remote or the local backend."""

    def __init__(
        self,
        local_factory: LocalFactory,
        remote: Backend | None,
        mode: BackendKind,
        *,
        latency_budget_ms: int = 1500,
        failure_threshold: int = 3,
        cooldown_s: float = 30.0,
        probe_timeout_s: float = 1.0,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        if remote is None and mode is not BackendKind.LOCAL:
            raise BackendError(f"backend {mode.value!r} needs a remote server")
        self.mode = mode
        self.remote = remote
        self.latency_budget_ms = latency_budget_ms
        self.probe_timeout_s = probe_timeout_s
        self.breaker = CircuitBreaker(
            failure_threshold, cooldown_s, clock=clock, wall_clock=wall_clock
        )
        self._clock = clock
        self._local_factory = local_factory
        self._local: Backend | None = None
        self._local_lock = asyncio.Lock()
        self.routes = {"remote": 0, "local": 0, "fallback": 0}

    # -- Backend protocol -------------------------------------------------------------

    @property
    def name(self) -> str:
        if self.remote is None or self.mode is BackendKind.LOCAL:
            return self._local.name if self._local is not None else "local"
        if self.mode is BackendKind.REMOTE:
            return self.remote.name
        return f"auto({self.remote.name}|local)"

    @property
    def model_name(self) -> str:
        if self.remote is not None and self.mode is not BackendKind.LOCAL:
            return self.remote.model_name
        return self._local.model_name if self._local is not None else "(local model not loaded)"

    def count_tokens(self, text: str) -> int:
        if self._local is not None:
            return self._local.count_tokens(text)
        if self.remote is not None:
            return self.remote.count_tokens(text)
        return estimate_tokens(text)

    @property
    def local(self) -> Backend | None:
        """The local backend, if it has been loaded."""
        return self._local

    @property
    def counters(self) -> _RouterCounters:
        return _RouterCounters(self)

    async def health(self, timeout_s: float = 1.0) -> bool:
        """The remote's health where only the remote serves; else the local model can."""
        if self.mode is BackendKind.REMOTE and self.remote is not None:
            return await self.remote.health(timeout_s)
        return True

    async def load_local(self) -> Backend:
        """The local backend, loaded through the factory on first use."""
        async with self._local_lock:
            if self._local is None:
                log.info("loading the local backend")
                self._local = await self._local_factory()
            return self._local

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.mode is BackendKind.LOCAL or self.remote is None:
            return await self._run_local(request, "backend: local", fallback=False)
        if self.mode is BackendKind.REMOTE:
            generation = await self.remote.generate(request)
            _mark(generation.stats, BackendKind.REMOTE, "backend: remote")
            self.routes["remote"] += 1
            return generation
        return await self._auto(request, self.remote)

    async def aclose(self) -> None:
        if self.remote is not None:
            await self.remote.aclose()
        async with self._local_lock:
            if self._local is not None:
                await self._local.aclose()
                self._local = None

    # -- auto -------------------------------------------------------------------------

    async def _auto(self, request: GenerationRequest, remote: Backend) -> Generation:
        breaker = self.breaker
        if breaker.state is BreakerState.HALF_OPEN:
            return await self._run_local(
                request, "circuit half-open: remote health is being probed"
            )
        if breaker.state is BreakerState.OPEN:
            if not breaker.cooled_down():
                return await self._run_local(request, breaker.describe())
            breaker.begin_probe()
            healthy = False
            try:
                healthy = await remote.health(self.probe_timeout_s)
            finally:
                breaker.end_probe(healthy)
            if not healthy:
                return await self._run_local(request, "remote health probe failed: local")

        budget_ms = self.latency_budget_ms
        start = self._clock()
        generation: Generation | None = None
        chunks: AsyncIterator[TokenChunk] | None = None
        first: TokenChunk | None = None
        try:
            async with asyncio.timeout(budget_ms / 1000.0):
                generation = await remote.generate(request)
                chunks = aiter(generation)
                try:
                    first = await anext(chunks)
                except StopAsyncIteration:
                    first = None
        except TimeoutError:
            if generation is not None:
                await generation.cancel()
            reason = f"remote timed out after {budget_ms} ms"
            breaker.record_failure(reason)
            return await self._run_local(request, f"{reason}: fell back to local", fallback=True)
        except RemoteError as exc:
            if generation is not None:
                await generation.cancel()
            reason = f"remote failed ({type(exc).__name__}: {exc})"
            breaker.record_failure(reason)
            return await self._run_local(request, f"{reason}: fell back to local", fallback=True)
        except BaseException:
            if generation is not None:
                await generation.cancel()
            raise
        breaker.record_success()
        waited_ms = (self._clock() - start) * 1000.0
        reason = f"remote ok (first token after {waited_ms:.0f} ms)"
        _mark(generation.stats, BackendKind.REMOTE, reason)
        self.routes["remote"] += 1
        log.info("route: remote (%s)", reason)
        assert chunks is not None
        return _PrimedGeneration(generation, chunks, first, breaker)

    async def _run_local(
        self, request: GenerationRequest, reason: str, *, fallback: bool = False
    ) -> Generation:
        local = await self.load_local()
        generation = await local.generate(request)
        _mark(generation.stats, BackendKind.LOCAL, reason)
        self.routes["local"] += 1
        self.routes["fallback"] += fallback
        log.info("route: local (%s)", reason)
        return generation


def _mark(stats: GenerationStats, route: BackendKind, reason: str) -> None:
    stats.route = route
    stats.route_reason = reason


class _PrimedGeneration:
    """A remote generation whose first chunk the router already read."""

    def __init__(
        self,
        inner: Generation,
        chunks: AsyncIterator[TokenChunk],
        first: TokenChunk | None,
        breaker: CircuitBreaker,
    ) -> None:
        self._inner = inner
        self._chunks = chunks
        self._first = first
        self._breaker = breaker
        self._exhausted = first is None

    @property
    def stats(self) -> GenerationStats:
        return self._inner.stats

    async def __aiter__(self) -> AsyncGenerator[TokenChunk]:
        finished = self._exhausted
        try:
            if self._first is not None:
                first, self._first = self._first, None
                yield first
            if not self._exhausted:
                try:
                    async for chunk in self._chunks:
                        yield chunk
                except RemoteError as exc:
                    self._breaker.record_failure(f"remote failed mid-stream ({exc})")
                    raise
                self._exhausted = True
            finished = True
        finally:
            if not finished:  # left early: stop the remote request
                await self._inner.cancel()

    async def cancel(self) -> None:
        await self._inner.cancel()

    async def wait(self) -> GenerationStats:
        return await self._inner.wait()


class _RouterCounters:
    """The local backend's counters (if loaded) plus routing totals, for ``kode/stats``."""

    def __init__(self, router: RoutingBackend) -> None:
        self._router = router

    @property
    def generations(self) -> int:
        """Generations routed (a fallback counts once, as local)."""
        return self._router.routes["remote"] + self._router.routes["local"]

    def as_dict(self) -> dict[str, Any]:
        router = self._router
        local, remote = router.local, router.remote
        out: dict[str, Any] = {} if local is None else dict(local.counters.as_dict())
        out["routing"] = {
            "mode": router.mode.value,
            "routes": dict(router.routes),
            "breaker": router.breaker.state.value,
            "consecutiveFailures": router.breaker.failures,
            "timesOpened": router.breaker.times_opened,
            "remote": None if remote is None else remote.counters.as_dict(),
        }
        return out
