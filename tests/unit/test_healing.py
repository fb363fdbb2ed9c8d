"""Token healing without a model: the vocabulary index, the constrained first steps over a
toy target, the prompt side, and the engine asking for it and stripping it."""

from __future__ import annotations

import doctest
from collections.abc import Callable, Sequence

import numpy as np
from fakes.completion import URI, ScriptedBackend, engine_for
from kode.backends import heal_index as backend_healing
from kode.backends.base import GenerationRequest
from kode.backends.heal_index import HealIndex
from kode.backends.speculative import TokenTree
from kode.backends.steppers import Prefilled, Probs, heal
from kode.completion.documents import Position
from kode.completion.healing import after_heal, heal_text

PIECES = [b"p", b"pro", b"process", b"property", b"ro", b"r", b"o", b"cess", b"<eos>", b"", b"x"]
P, PRO, PROCESS, PROPERTY, RO, R, OH, CESS, EOS, EMPTY, X = range(len(PIECES))


def test_the_index_doctest_runs() -> None:
    assert doctest.testmod(backend_healing).failed == 0


def test_allowed_tokens_spell_the_text_or_start_it() -> None:
    index = HealIndex(PIECES, skip=lambda token: token == EOS)
    assert sorted(index.allowed(b"pro")) == [P, PRO, PROCESS, PROPERTY]
    assert sorted(index.allowed(b"ro")) == [RO, R]
    assert sorted(index.allowed(b"o")) == [OH]
    assert index.allowed(b"") == []  # nothing left to spell: no constraint
    assert index.allowed(b"<e") == []  # a skipped (control) token never fits
    assert index.allowed(b"q") == []
    assert index.rest(b"pro", P) == b"ro"
    assert index.rest(b"ro", R) == b"o"
    assert index.rest(b"pro", PROPERTY) == b""


class PreferringTarget:
    """A ``steppers.Target`` over ``PIECES`` that always prefers the tokens in ``order``
    (first first), whatever the history; records what it evaluated."""

    trees = False
    rng = np.random.default_rng(0)

    def __init__(self, order: Sequence[int]) -> None:
        self.order = list(order)
        self.tokens: list[int] = []
        self.evaluated: list[int] = []

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Prefilled:
        self.tokens = list(prompt)
        return Prefilled(0)

    def evaluate(self, tree: TokenTree) -> None:
        self.evaluated.extend(tree.tokens)

    def pick(self, row: int) -> int:
        return self.order[0]

    def pick_among(self, row: int, allowed: Sequence[int]) -> int:
        return next(token for token in self.order if token in allowed)

    def probs(self, rows: int) -> Probs:
        raise NotImplementedError

    def commit(self, tree: TokenTree, accepted: int, branch: int) -> None:
        self.tokens.extend(tree.tokens[: accepted + 1])

    def synchronize(self) -> None:
        return None


def test_heal_takes_the_models_best_token_among_those_that_fit() -> None:
    index = HealIndex(PIECES, skip=lambda token: token == EOS)
    target = PreferringTarget([X, PROPERTY, PROCESS, P])  # unconstrained, it would say "x"
    target.prefill([1, 2], lambda: False, 0)
    assert heal(target, index, b"pro", 16, lambda: False) == [PROPERTY]
    assert target.evaluated == []  # one token spelled it: it is the next root


def test_heal_spells_over_several_tokens_keeping_the_stepper_contract() -> None:
    index = HealIndex(PIECES, skip=lambda token: token == EOS)
    target = PreferringTarget([X, P, R, OH, CESS])
    target.prefill([1, 2], lambda: False, 0)
    out = heal(target, index, b"pro", 16, lambda: False)
    assert out == [P, R, OH]
    assert b"".join(PIECES[t] for t in out) == b"pro"
    assert target.tokens == [1, 2, *out[:-1]]  # all but the root are in the cache


def test_heal_stops_at_the_token_limit_and_on_cancel() -> None:
    index = HealIndex(PIECES)
    target = PreferringTarget([P, R, OH])
    target.prefill([1], lambda: False, 0)
    assert heal(target, index, b"pro", 2, lambda: False) == [P, R]
    target.prefill([1], lambda: False, 0)
    assert heal(target, index, b"pro", 16, lambda: True) == [P]


def test_heal_text_is_the_last_token_of_a_word_under_the_cursor() -> None:
    def tokens_of(n: int) -> Callable[[str], int]:
        return lambda _text: n

    assert heal_text("x = self.pro", tokens_of(4)) == ".pro"
    assert heal_text("    ret", tokens_of(3)) == "ret"
    assert heal_text("print(", tokens_of(1)) == ""  # not inside a word
    assert heal_text("x = a ", tokens_of(1)) == ""
    assert heal_text("x = self.pro", tokens_of(0)) == ""  # the backend cannot tell
    assert heal_text("ab", tokens_of(5)) == ""  # a token longer than the line: no


def test_after_heal_strips_the_spelled_text() -> None:
    assert after_heal(".process(x)", ".pro") == "cess(x)"
    assert after_heal(".pr", ".pro") == ""  # still spelling it
    assert after_heal(".pro", ".pro") == ""
    assert after_heal("x + 1", ".pro") == ""  # never spelled it: nothing, not a wrong fill
    assert after_heal("x + 1", "") == "x + 1"


class HealingBackend(ScriptedBackend):
    """A scripted backend that says its tokens are whole words after a dot or a space."""

    def last_token_chars(self, text: str) -> int:
        cut = max(text.rfind("."), text.rfind(" "))
        return len(text) - cut


async def test_engine_heals_a_cursor_inside_a_word_and_shows_what_follows() -> None:
    backend = HealingBackend([".pro", "cess(", "items)", "\n"])
    engine = engine_for(backend, tokenHealing=True)
    engine.documents.open(URI, "def f(self, items):\n    return self.pro\n", 1)
    result = await engine.complete(URI, Position(1, 19))
    request: GenerationRequest = backend.requests[0]
    assert request.heal == ".pro"
    assert "return self<|fim_suffix|>" in request.prompt  # the prefix ends before ".pro"
    assert result.text == "cess(items)"


async def test_engine_does_not_heal_when_off_or_not_mid_word_or_not_able() -> None:
    backend = HealingBackend(["items)"])
    engine = engine_for(backend, tokenHealing=False)
    engine.documents.open(URI, "def f(self, items):\n    return self.pro\n", 1)
    result = await engine.complete(URI, Position(1, 19))
    assert backend.requests[0].heal == "" and "self.pro<|fim_suffix|>" in backend.requests[0].prompt
    assert result.text == "items)"

    backend = HealingBackend(["items)"])
    engine = engine_for(backend, tokenHealing=True)
    engine.documents.open(URI, "def f(self, items):\n    return len(\n", 1)
    await engine.complete(URI, Position(1, 15))
    assert backend.requests[0].heal == ""  # after "(": nothing to heal

    plain = ScriptedBackend(["cess()"])  # no TokenHealing (a remote server): the prompt as is
    engine = engine_for(plain, tokenHealing=True)
    engine.documents.open(URI, "def f(self, items):\n    return self.pro\n", 1)
    result = await engine.complete(URI, Position(1, 19))
    assert plain.requests[0].heal == "" and result.text == "cess()"
