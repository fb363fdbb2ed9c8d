"""The local backend's worker stepping several generations at once, over a model-free
engine (no llama.cpp): plain steps of the generations that run together are evaluated in
one batch, each generation gets the text it gets alone, prompts are evaluated between
the others' steps, a cancel ends only its own generation within one step and gives its
place back, an engine error reaches every generation of the batch, and ``auto`` decodes
plainly in the batch while another generation runs."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fakes.llama import STOP, ToyEngine, ToyEngineTarget, request, rule
from kode.backends.base import FinishReason, GenerationRequest, SpeculationMethod
from kode.backends.errors import BackendError
from kode.backends.local import LocalBackend
from kode.backends.speculative import CostCurve
from kode.backends.worker import Plain, WorkerJob, WorkerRun


def backend(engine: ToyEngine) -> LocalBackend[ToyEngineTarget]:
    executor = ThreadPoolExecutor(max_workers=1)
    return LocalBackend(engine, executor, curve=CostCurve({1: 1.0}), owns_executor=True)


async def run(b: LocalBackend[ToyEngineTarget], prompt: str, n: int) -> list[int]:
    generation = await b.generate(request(prompt, n))
    return [t async for chunk in generation for t in chunk.token_ids]


def alone(prompt: str, n: int) -> list[int]:
    history = [ord(c) % 23 + 1 for c in prompt]
    out = []
    for _ in range(n):
        out.append(rule(history))
        history.append(out[-1])
    return out


async def collect(generation: object) -> list[int]:
    return [t async for chunk in generation for t in chunk.token_ids]  # type: ignore[attr-defined]


async def test_two_generations_decode_in_one_batch_with_the_texts_of_each_alone() -> None:
    # Both are asked for before the model takes a step (the gate), as when two windows
    # type at once: however the machine schedules the worker, they meet in a batch.
    gate = threading.Event()
    engine = ToyEngine(width=2, gate=gate)
    b = backend(engine)
    try:
        first = await b.generate(request("def area(r):", 12))
        second = await b.generate(request("x = [1, 2,", 20))
        gate.set()
        a, c = await asyncio.gather(collect(first), collect(second))
        assert a == alone("def area(r):", 12) and c == alone("x = [1, 2,", 20)
        assert engine.batches and set(engine.batches) == {2}
        assert b.counters.batched_steps == 2 * len(engine.batches)
        assert engine.released == 2
        # every call counted once per generation that took part in it
        assert b.counters.decode_calls == engine.calls + len(engine.batches)
    finally:
        await b.aclose()


async def test_width_one_runs_one_generation_at_a_time_in_arrival_order() -> None:
    engine = ToyEngine(width=1)
    b = backend(engine)
    try:
        a, c = await asyncio.gather(run(b, "first", 5), run(b, "second", 5))
        assert a == alone("first", 5) and c == alone("second", 5)
        assert not engine.batches
        firsts = [i for i, what in enumerate(engine.log) if what == "p2"]
        assert firsts[0] > max(i for i, what in enumerate(engine.log) if what == "p1")
    finally:
        await b.aclose()


async def test_a_prompt_is_evaluated_between_the_steps_of_a_running_generation() -> None:
    engine = ToyEngine(width=2, delay_s=0.002)
    b = backend(engine)
    try:
        long = await b.generate(request("ab", 400))
        while long.stats.completion_tokens < 3:
            await asyncio.sleep(0.001)
        short = await run(b, "a prompt of several batches", 3)  # 7 prompt batches
        assert short == alone("a prompt of several batches", 3)
        assert long.stats.finish_reason is None  # it did not wait for the long one
        await long.cancel()
        log = engine.log
        second = [i for i, what in enumerate(log) if what == "p2"]
        assert len(second) == 7
        between = log[second[0] : second[-1]]
        assert between.count("s1") == 6  # the first stepped between the prompt's batches
        assert "s2" in log[second[-1] :]  # then both decoded in one batch
    finally:
        await b.aclose()


async def test_a_cancel_mid_batch_ends_its_generation_alone_and_gives_its_place_back() -> None:
    engine = ToyEngine(width=2)
    b = backend(engine)
    try:
        doomed = await b.generate(request("doomed", 400))
        other = asyncio.ensure_future(run(b, "other", 40))
        seen = 0
        async for chunk in doomed:
            seen += len(chunk.token_ids)
            if seen >= 5 and engine.batches:
                break  # leaving the loop cancels
        await asyncio.wait_for(doomed.cancel(), 5)
        stats = doomed.stats
        assert stats.finish_reason is FinishReason.CANCELLED
        assert stats.steps_after_cancel <= 1 and stats.completion_tokens < 400
        assert await other == alone("other", 40)
        assert engine.released == 2
        assert await run(b, "third", 4) == alone("third", 4)  # its place serves the next
    finally:
        await b.aclose()


async def test_an_engine_error_in_a_batch_reaches_every_generation_of_it() -> None:
    engine = ToyEngine(width=2, gate=threading.Event())
    b = backend(engine)
    try:
        first = await b.generate(request("one", 50))
        second = await b.generate(request("two", 50))
        engine.fail_next = True  # the first batch that steps both fails
        assert engine.gate is not None
        engine.gate.set()
        for generation in (first, second):
            with pytest.raises(BackendError, match="the model failed"):
                async for _ in generation:
                    pass
        assert engine.released == 2
        assert await run(b, "after", 3) == alone("after", 3)
    finally:
        await b.aclose()


async def test_a_run_that_cannot_start_ends_with_its_error_and_the_next_runs() -> None:
    # Making a run (the engine's target) fails for one generation: its caller gets the
    # error once, named by type only (the text may quote the prompt), instead of waiting
    # for ever; the worker goes on with the next.
    engine = ToyEngine(width=2)
    b = backend(engine)
    try:
        engine.fail_target = True
        generation = await b.generate(request("def secret():", 5))
        with pytest.raises(BackendError, match=r"unexpectedly \(RuntimeError\)") as caught:
            async for _ in generation:
                pass
        assert "secret" not in str(caught.value)
        assert generation.stats.finish_reason is FinishReason.ERROR
        engine.fail_target = False
        assert await run(b, "after", 3) == alone("after", 3)
    finally:
        await b.aclose()


class Speculating:
    """A stepper that is not plain: one token per step, on its own."""

    def __init__(self, target: ToyEngineTarget) -> None:
        from kode.backends.base import SpeculationStats

        self.target = target
        self.stats = SpeculationStats(method=SpeculationMethod.AUTO)
        self.steps = 0

    def step(self, root: int) -> list[int]:
        self.steps += 1
        self.stats.steps += 1
        self.target.tokens.append(root)
        return [rule(self.target.tokens)]


def test_a_speculating_run_shares_the_batch_while_told_to() -> None:
    """``WorkerRun.decode``: a stepper that is not plain steps itself (after a pause),
    except while ``share()`` is true: then it asks the worker for a plain step."""

    async def main() -> None:
        job = WorkerJob(GenerationRequest("p", 6), asyncio.get_running_loop())
        run = WorkerRun(job)
        run.text_of = lambda token: "x"  # type: ignore[method-assign]
        run.text_tail = lambda: ""  # type: ignore[method-assign]
        target = ToyEngineTarget(ToyEngine(width=2))
        target.tokens = [1, 2]
        stepper = Speculating(target)
        crowded = iter([False, True, True, False, False])
        steps = run.decode([3], stepper, lambda t: t == STOP, lambda: next(crowded))
        wants = [steps.send(None)]
        while True:
            try:
                wants.append(steps.send(5 if isinstance(wants[-1], Plain) else None))
            except StopIteration:
                break
        assert [isinstance(w, Plain) for w in wants] == [False, True, True, False, False]
        assert stepper.steps == 3 and stepper.stats.steps == 5
        assert job.stats.decode_steps == 5 and job.stats.completion_tokens == 6

    asyncio.run(main())
