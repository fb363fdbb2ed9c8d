"""A model-free llama engine under ``LocalBackend`` and its worker (no llama.cpp):
``ToyEngine`` counts model calls and records every batch's rows, its ``ToyEngineTarget``s
choose their next token by ``rule`` (a toy greedy model that depends on a generation's
own tokens only), ``ClosingEngine`` says when a model call began and when the backend
closed it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence

import numpy as np
from kode.backends.base import GenerationRequest, Sampling, SpeculationMethod
from kode.backends.errors import BackendError
from kode.backends.speculative import TokenTree
from kode.backends.steppers import Prefilled, Probs, Stepper, step_each

STOP = 0
CHUNK = 4  # prompt tokens per prompt batch


def rule(history: Sequence[int]) -> int:
    """The toy model's greedy choice: depends on this generation's own tokens only."""
    return (history[-1] * 7 + len(history)) % 23 + 1  # never STOP


class ToyEngine:
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

    def text_stream(self) -> ToyEngineText:
        return ToyEngineText()

    def pieces(self) -> list[bytes]:
        return []

    def target(self, sampling: Sampling, guide: object = None) -> ToyEngineTarget:
        if self.fail_target:
            raise RuntimeError("no target for def secret():")  # may quote the prompt
        return ToyEngineTarget(self)

    def refuse(self, method: SpeculationMethod) -> str | None:
        return None

    def draft(self, target: ToyEngineTarget) -> object:
        raise NotImplementedError

    def lookahead(self, target: ToyEngineTarget, sources: Sequence[Sequence[int]]) -> Stepper:
        raise NotImplementedError

    def step_together(self, steps: Sequence[tuple[ToyEngineTarget, int]]) -> list[int]:
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


class ToyEngineText:
    """The engine's text stream: a token is one letter."""

    def push(self, token: int) -> str:
        return chr(ord("a") + token % 26)

    def flush(self) -> str:
        return ""


class ToyEngineTarget:
    """A generation's place in the ``ToyEngine``: its prompt in batches of ``CHUNK``
    tokens, its next token by ``rule``."""

    trees = False
    rng = np.random.default_rng(0)
    near_tie = 1.0

    def __init__(self, engine: ToyEngine) -> None:
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


def request(prompt: str, n: int) -> GenerationRequest:
    """A request the worker decodes plainly (no speculation)."""
    return GenerationRequest(prompt, n, speculation=SpeculationMethod.NONE)


ENDLESS = 10**9  # tokens: a generation that ends only when cancelled


class ClosingEngine(ToyEngine):
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

    def step_together(self, steps: Sequence[tuple[ToyEngineTarget, int]]) -> list[int]:
        time.sleep(self.delay_s)
        return super().step_together(steps)

    def close(self) -> None:
        self.closed.set()
