"""RoutingBackend: modes, latency budget, circuit breaker states (with an injected clock)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fakes.serving import FixedGeneration, LocalFactory, ScriptedRemote
from fakes.timing import SettableClock, until
from kode.backends.base import BackendKind, GenerationRequest
from kode.backends.errors import BackendError, RemoteBusyError, RemoteError
from kode.backends.router import BreakerState, CircuitBreaker, RoutingBackend

SECRET_PROMPT = "def secret_function_name():"
REQUEST = GenerationRequest(SECRET_PROMPT, 8)


def router(
    remote: ScriptedRemote,
    mode: BackendKind = BackendKind.AUTO,
    *,
    clock: SettableClock | None = None,
    budget_ms: int = 200,
) -> tuple[RoutingBackend, LocalFactory]:
    factory = LocalFactory()
    backend = RoutingBackend(
        factory,
        remote,
        mode,
        latency_budget_ms=budget_ms,
        failure_threshold=3,
        cooldown_s=30.0,
        clock=clock or SettableClock(1000.0),
        wall_clock=lambda: 0.0,
    )
    return backend, factory


async def text_of(generation: object) -> str:
    return "".join([chunk.text async for chunk in generation])  # type: ignore[attr-defined]


# -- the breaker alone ----------------------------------------------------------------


def test_breaker_opens_after_threshold_and_cools_down() -> None:
    clock = SettableClock(1000.0)
    breaker = CircuitBreaker(3, 30.0, clock=clock, wall_clock=lambda: 0.0)
    breaker.record_failure("a")
    breaker.record_failure("b")
    assert breaker.state is BreakerState.CLOSED
    breaker.record_success()  # resets the consecutive count
    for reason in "cde":
        breaker.record_failure(reason)
    assert breaker.state is BreakerState.OPEN
    assert "3 consecutive failures (last: e)" in breaker.describe()
    clock.now += 29.9
    assert not breaker.cooled_down()
    clock.now += 0.2
    assert breaker.cooled_down()
    breaker.begin_probe()
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.end_probe(healthy=False)
    assert breaker.state is BreakerState.OPEN
    assert not breaker.cooled_down()  # a failed probe starts a new cool-down
    clock.now += 30
    breaker.begin_probe()
    breaker.end_probe(healthy=True)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.failures == 0
    assert breaker.times_opened == 2


def test_breaker_rejects_zero_threshold() -> None:
    with pytest.raises(ValueError, match="threshold"):
        CircuitBreaker(0)


# -- modes ----------------------------------------------------------------------------


async def test_auto_uses_remote_when_it_answers_in_time() -> None:
    backend, factory = router(ScriptedRemote())
    generation = await backend.generate(REQUEST)
    assert await text_of(generation) == "remote text"
    assert generation.stats.route == "remote"
    assert generation.stats.route_reason.startswith("remote ok")
    assert factory.loads == 0  # the local model is never loaded when not needed
    assert backend.count_tokens("abcdef") == 3  # the remote's estimate until local is loaded


async def test_auto_falls_back_on_remote_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kode.router")
    remote = ScriptedRemote("error")
    backend, factory = router(remote)
    generation = await backend.generate(REQUEST)
    assert await text_of(generation) == "local text"
    assert generation.stats.route == "local"
    assert "RemoteBusyError" in generation.stats.route_reason
    assert generation.stats.route_reason.endswith("fell back to local")
    assert factory.loads == 1
    assert remote.generations[0].cancelled
    assert "route: local" in caplog.text
    assert SECRET_PROMPT not in caplog.text  # never log prompt text
    assert backend.count_tokens("a b c") == 3  # the local tokenizer once it is loaded


async def test_auto_falls_back_past_the_latency_budget() -> None:
    remote = ScriptedRemote("slow")
    backend, _ = router(remote, budget_ms=50)
    async with asyncio.timeout(5):
        generation = await backend.generate(REQUEST)
    assert generation.stats.route == "local"
    assert generation.stats.route_reason == "remote timed out after 50 ms: fell back to local"
    assert remote.generations[0].cancelled  # cancelled (and so aborted) remotely


async def test_remote_mode_surfaces_errors_and_local_mode_never_calls_remote() -> None:
    remote = ScriptedRemote("error")
    backend, factory = router(remote, BackendKind.REMOTE)
    generation = await backend.generate(REQUEST)
    assert generation.stats.route == "remote"
    with pytest.raises(RemoteBusyError):
        await text_of(generation)
    assert factory.loads == 0

    local_only, factory = router(remote, BackendKind.LOCAL)
    generation = await local_only.generate(REQUEST)
    assert await text_of(generation) == "local text"
    assert generation.stats.route_reason == "backend: local"
    assert len(remote.generations) == 1


def test_remote_modes_need_a_remote() -> None:
    with pytest.raises(BackendError, match="needs a remote"):
        RoutingBackend(LocalFactory(), None, BackendKind.AUTO)


async def test_mid_stream_error_surfaces_and_counts_as_a_failure() -> None:
    backend, _ = router(ScriptedRemote("mid-error"))
    generation = await backend.generate(REQUEST)
    chunks: list[str] = []

    async def drain() -> None:
        async for chunk in generation:  # type: ignore[attr-defined]
            chunks.append(chunk.text)  # noqa: PERF401 (kept up to the error)

    with pytest.raises(RemoteError, match="connection reset"):
        await drain()
    assert chunks == ["remote"]
    assert backend.breaker.failures == 1


async def test_leaving_early_cancels_the_remote_generation() -> None:
    remote = ScriptedRemote()
    backend, _ = router(remote)
    generation = await backend.generate(REQUEST)
    async for _chunk in generation:  # type: ignore[attr-defined]
        break
    # the loop closes the abandoned iterator: its finally cancels
    await until(lambda: remote.generations[0].cancelled)


# -- the breaker inside the router ----------------------------------------------------


async def test_circuit_open_half_open_closed() -> None:
    clock = SettableClock(1000.0)
    remote = ScriptedRemote("error")
    backend, factory = router(remote, clock=clock)
    for _ in range(3):
        generation = await backend.generate(REQUEST)
        assert generation.stats.route == "local"
    assert backend.breaker.state is BreakerState.OPEN

    # Open: remote not even tried.
    remote.behavior = "ok"
    generation = await backend.generate(REQUEST)
    assert generation.stats.route == "local"
    assert generation.stats.route_reason.startswith("circuit open since")
    assert len(remote.generations) == 3
    assert remote.probes == 0

    # Cool-down over, probe fails: still local, and a new cool-down starts.
    clock.now += 31
    remote.healthy = False
    generation = await backend.generate(REQUEST)
    assert generation.stats.route == "local"
    assert generation.stats.route_reason == "remote health probe failed: local"
    assert remote.probes == 1
    assert backend.breaker.state is BreakerState.OPEN
    generation = await backend.generate(REQUEST)
    assert generation.stats.route_reason.startswith("circuit open since")
    assert remote.probes == 1

    # Cool-down over again, probe succeeds: closed, remote used for this very request.
    clock.now += 31
    remote.healthy = True
    generation = await backend.generate(REQUEST)
    assert remote.probes == 2
    assert backend.breaker.state is BreakerState.CLOSED
    assert generation.stats.route == "remote"
    assert await text_of(generation) == "remote text"
    assert factory.loads == 1  # loaded once, reused
    counters = backend.counters.as_dict()["routing"]
    assert counters["routes"] == {"remote": 1, "local": 6, "fallback": 3}
    assert counters["timesOpened"] == 2


async def test_requests_during_a_probe_go_local() -> None:
    clock = SettableClock(1000.0)
    remote = ScriptedRemote("error")
    backend, _ = router(remote, clock=clock)
    for _ in range(3):
        await backend.generate(REQUEST)
    clock.now += 31
    release = asyncio.Event()

    async def slow_health(timeout_s: float = 1.0) -> bool:
        await release.wait()
        return True

    remote.health = slow_health  # type: ignore[method-assign]
    remote.behavior = "ok"
    probing = asyncio.create_task(backend.generate(REQUEST))
    await until(lambda: backend.breaker.state is BreakerState.HALF_OPEN)
    during = await backend.generate(REQUEST)
    assert during.stats.route == "local"
    assert "half-open" in during.stats.route_reason
    release.set()
    first = await probing
    assert first.stats.route == "remote"


async def test_aclose_closes_both() -> None:
    remote = ScriptedRemote("error")
    backend, factory = router(remote)
    await backend.generate(REQUEST)
    await backend.aclose()
    assert remote.closed
    assert factory.backend.closed


def test_fake_generation_is_a_generation() -> None:
    # keeps the helper honest: it is what the router hands back for local routes
    assert FixedGeneration(["a"]).stats.finish_reason is None
