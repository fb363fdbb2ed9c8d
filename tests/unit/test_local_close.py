"""Closing a local backend (#51, bug 5): its running generations are cancelled, not
waited for to their end, and the close waits a bounded time for them; a generation stuck
in a model call ends on the worker, which then closes the engine. Over the model-free
engine (``fakes.llama``)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fakes.llama import ENDLESS, ClosingEngine, ToyEngine, ToyEngineTarget, request
from kode.backends.base import FinishReason
from kode.backends.errors import BackendClosed
from kode.backends.local import LocalBackend
from kode.backends.speculative import CostCurve

STEP_S = 10.0


def local(
    engine: ToyEngine, executor: ThreadPoolExecutor, **options: float
) -> LocalBackend[ToyEngineTarget]:
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
