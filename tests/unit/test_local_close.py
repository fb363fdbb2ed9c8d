"""Closing a local backend (#51, bug 5): its running generations are cancelled, not
waited for to their end, and the close waits a bounded time for them; a generation stuck
in a model call ends on the worker, which then closes the engine. Over the model-free
engine of the batch tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from kode.backends.base import FinishReason
from kode.backends.errors import BackendClosed
from kode.backends.local import LocalBackend
from kode.backends.speculative import CostCurve
from test_worker_batch import Engine, Target, request

STEP_S = 10.0
ENDLESS = 10**9  # tokens: a generation that ends only when cancelled


class ClosingEngine(Engine):
    """Says when a model call began and when the backend closed it (worker thread); a
    context that fits any generation, each step taking a millisecond."""

    n_ctx = 2**40

    def __init__(self, width: int, gate: threading.Event | None = None) -> None:
        super().__init__(width, gate, delay_s=0.001)
        self.closed = threading.Event()
        self.called = threading.Event()  # a model call began

    def call(self, what: str) -> None:
        self.called.set()
        super().call(what)

    def step_together(self, steps: Sequence[tuple[Target, int]]) -> list[int]:
        time.sleep(self.delay_s)
        return super().step_together(steps)

    def close(self) -> None:
        self.closed.set()


def local(engine: Engine, executor: ThreadPoolExecutor, **options: float) -> LocalBackend[Target]:
    return LocalBackend(engine, executor, curve=CostCurve({1: 1.0}), owns_executor=True, **options)


async def test_closing_cancels_the_running_generations_and_refuses_new_ones() -> None:
    engine = ClosingEngine(width=2)
    executor = ThreadPoolExecutor(max_workers=1)
    backend = local(engine, executor)
    generation = await backend.generate(request("def area(r):", ENDLESS))
    try:
        assert await asyncio.to_thread(engine.called.wait, STEP_S)  # it runs
        await asyncio.wait_for(backend.aclose(), STEP_S)
        assert generation.stats.finish_reason is FinishReason.CANCELLED
        assert engine.closed.is_set()  # after the generation ended, on the worker
        with pytest.raises(BackendClosed):
            await backend.generate(request("x", 1))
    finally:
        await asyncio.wait_for(generation.cancel(), STEP_S)
        await asyncio.wait_for(asyncio.to_thread(executor.shutdown), STEP_S)


async def test_closing_waits_a_bounded_time_for_a_generation_stuck_in_a_model_call() -> None:
    """The model call never returns while the window closes: the close returns after its
    bound; the generation ends (cancelled) when the call returns, then the engine closes
    and the worker thread ends."""
    gate = threading.Event()  # every model call waits for it
    engine = ClosingEngine(width=1, gate=gate)
    executor = ThreadPoolExecutor(max_workers=1)
    backend = local(engine, executor, close_wait_s=0.01)
    generation = await backend.generate(request("def area(r):", ENDLESS))
    try:
        await asyncio.wait_for(backend.aclose(), STEP_S)
        assert not engine.closed.is_set()  # the worker is still in the model call
        gate.set()
        await asyncio.wait_for(generation.wait(), STEP_S)
        assert generation.stats.finish_reason is FinishReason.CANCELLED
        assert await asyncio.wait_for(asyncio.to_thread(engine.closed.wait, STEP_S), STEP_S)
    finally:
        gate.set()
        await asyncio.wait_for(generation.cancel(), STEP_S)
        await asyncio.wait_for(asyncio.to_thread(executor.shutdown), STEP_S)
