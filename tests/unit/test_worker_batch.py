"""The local backend's worker stepping several generations at once, over a model-free
engine (no llama.cpp): plain steps of the generations that run together are evaluated in
one batch, each generation gets the text it gets alone, prompts are evaluated between
the others' steps, a cancel ends only its own generation within one step and gives its
place back, an engine error reaches every generation of the batch, and ``auto`` decodes
plainly in the batch while another generation runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from kode.backends.base import FinishReason, GenerationRequest, Sampling, SpeculationMethod
from kode.backends.errors import BackendError
from kode.backends.local import LocalBackend
from kode.backends.speculative import CostCurve, TokenTree
from kode.backends.steppers import Prefilled, Probs, Stepper, step_each
from kode.backends.worker import Plain, WorkerJob, WorkerRun

STOP = 0
CHUNK = 4  # prompt tokens per prompt batch


def rule(history: Sequence[int]) -> int:
    """The toy model's greedy choice: depends on this generation's own tokens only."""
    return (history[-1] * 7 + len(history)) % 23 + 1  # never STOP


class Engine:
    """Shared by the targets: counts model calls, records every batch's rows."""

    name = "fake"
    model_name = "fake.gguf"
    n_ctx = 4096
    heals = False

    def __init__(
        self, width: int, gate: threading.Event | None = None, delay_s: float = 0.0
    ) -> None:
        self.width = width
        self.delay_s = delay_s
        self.calls = 0
        self.batches: list[int] = []  # rows of every step_together
        self.prefills = 0
        self.fail_next = False
        self.fail_target = False
        self.gate = gate  # when given, every model call waits for it (a slow model)
        self.released = 0
        self.log: list[str] = []  # "p<n>" prompt batch of generation n, "s<rows>" a step

    def call(self, what: str) -> None:
        if self.gate is not None:
            self.gate.wait(5)
        time.sleep(self.delay_s)
        self.calls += 1
        self.log.append(what)

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return [ord(c) % 23 + 1 for c in text]

    def is_stop(self, token: int) -> bool:
        return token == STOP

    def text_stream(self) -> Text:
        return Text()

    def pieces(self) -> list[bytes]:
        return []

    def target(self, sampling: Sampling, guide: object = None) -> Target:
        if self.fail_target:
            raise RuntimeError("no target for def secret():")  # may quote the prompt
        return Target(self)

    def refuse(self, method: SpeculationMethod) -> str | None:
        return None

    def draft(self, target: Target) -> object:
        raise NotImplementedError

    def lookahead(self, target: Target, sources: Sequence[Sequence[int]]) -> Stepper:
        raise NotImplementedError

    def step_together(self, steps: Sequence[tuple[Target, int]]) -> list[int]:
        if len(steps) == 1:
            return step_each(steps)
        if self.fail_next:
            self.fail_next = False
            raise BackendError("the model failed")
        self.call(f"s{len(steps)}")
        self.batches.append(len(steps))
        out = []
        for target, root in steps:
            target.tokens.append(root)
            out.append(rule(target.tokens))
        return out

    def logit_gaps(self, prompt: str, tokens: Sequence[int]) -> list[float]:
        return []

    def close(self) -> None:
        return None


class Text:
    def push(self, token: int) -> str:
        return chr(ord("a") + token % 26)

    def flush(self) -> str:
        return ""


class Target:
    trees = False
    rng = np.random.default_rng(0)
    near_tie = 1.0

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tokens: list[int] = []
        self._rows: list[list[int]] = []
        engine.prefills += 1
        self.number = engine.prefills

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Prefilled:
        raise AssertionError("the worker uses prefill_steps")

    def prefill_steps(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Generator[None, None, Prefilled]:
        self.tokens = []
        for i in range(0, len(prompt), CHUNK):
            if i:
                yield
            self.engine.call(f"p{self.number}")
            self.tokens.extend(prompt[i : i + CHUNK])
        self._rows = [list(self.tokens)]
        return Prefilled(0)

    def release(self) -> None:
        self.engine.released += 1

    def evaluate(self, tree: TokenTree) -> None:
        self.engine.call("s1")
        self._rows = [[*self.tokens, *tree.tokens[: i + 1]] for i in range(tree.n_rows)]

    def pick(self, row: int) -> int:
        return rule(self._rows[row])

    def margin(self, row: int) -> float:
        return float("inf")

    def pick_among(self, row: int, allowed: Sequence[int]) -> int:
        return allowed[0]

    def probs(self, rows: int) -> Probs:
        raise NotImplementedError

    def commit(self, tree: TokenTree, accepted: int, branch: int) -> None:
        self.tokens.extend(tree.tokens[: accepted + 1])

    def synchronize(self) -> None:
        return None


def backend(engine: Engine) -> LocalBackend[Target]:
    executor = ThreadPoolExecutor(max_workers=1)
    return LocalBackend(engine, executor, curve=CostCurve({1: 1.0}), owns_executor=True)


def request(prompt: str, n: int) -> GenerationRequest:
    return GenerationRequest(prompt, n, speculation=SpeculationMethod.NONE)


async def run(b: LocalBackend[Target], prompt: str, n: int) -> list[int]:
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
    engine = Engine(width=2, gate=gate)
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
    engine = Engine(width=1)
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
    engine = Engine(width=2, delay_s=0.002)
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
    engine = Engine(width=2)
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
    engine = Engine(width=2, gate=threading.Event())
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
    engine = Engine(width=2)
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

    def __init__(self, target: Target) -> None:
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
        target = Target(Engine(width=2))
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
