"""The names monitor where a target picks: every decoding method picks under the same
mask, so speculation stays lossless against plain constrained decoding, greedy and
sampled, and what comes after ``receiver.`` is one of its members."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pytest
from kode.backends.base import SpeculationMethod
from kode.backends.guided import Guide
from kode.backends.monitor import Monitor, Names, VocabIndex
from kode.backends.speculative import AdaptivePolicy, CostCurve, NgramDrafter, TokenTree
from kode.backends.steppers import (
    Draft,
    DraftModelStepper,
    NgramStepper,
    PlainStepper,
    Prefilled,
    Probs,
    Stepper,
)

PIECES = [
    b"<eos>", b"os", b".", b".pa", b"path", b"pa", b"th", b"sep", b"(", b")", b"pathx",
    b".join", b"join", b" ", b"x", b".x", b"\n", b"y = ", b"getcwd", b"get", b"cwd",
    b"foo", b"bar", b".foo", b"+",
]  # fmt: skip
V = len(PIECES)
INDEX = VocabIndex(PIECES, lambda t: t == 0)
MEMBERS = {"os": ("path", "sep", "getcwd"), "os.path": ("join",)}
IDENT = re.compile(rb"\bos\.(\w+)")


class ToyTarget:
    """A ``steppers.Target`` whose logits after a history are pseudo-random (seeded by
    the history), and which, like the llama.cpp target, picks under a ``Guide``. Its
    model likes ``os``, dots and invented names (``pathx``, ``foo``)."""

    trees = True
    near_tie = 0.0

    def __init__(self, guide: Guide | None, temperature: float = 0.0, seed: int = 0) -> None:
        self.guide, self.temperature = guide, temperature
        self.rng = np.random.default_rng(seed)
        self.tokens: list[int] = []
        self.rows: list[npt.NDArray[np.float64]] = []

    def _logits(self, history: Sequence[int]) -> npt.NDArray[np.float64]:
        noise = np.random.default_rng(hash(tuple(history)) % 2**32).normal(size=V)
        last = history[-1]
        if last == 1:  # os: a dot, or an invented ``.foo``, ``.x``
            noise[[2, 23, 15, 3]] += 2.0
        elif last == 2:  # a dot: an invented name, or a member
            noise[[10, 21, 14, 4, 7]] += 2.0
        else:
            noise[[1, 13, 8]] += 1.5
        noise[0] -= 6.0
        return noise

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Prefilled:
        self.tokens = list(prompt)
        self.rows = [self._logits(self.tokens)]
        if self.guide is not None:
            self.guide.prompt()
        return Prefilled(0)

    def evaluate(self, tree: TokenTree) -> None:
        paths: list[list[int]] = []
        for i, token in enumerate(tree.tokens):
            parent = tree.parents[i]
            paths.append([*(paths[parent] if parent >= 0 else []), token])
        self.rows = [self._logits([*self.tokens, *p]) for p in paths]
        if self.guide is not None:
            self.guide.tree(tree)

    def _row(self, row: int) -> npt.NDArray[np.float64]:
        logits = self.rows[row]
        return logits if self.guide is None else self.guide.logits(row, logits)

    def probs(self, rows: int) -> Probs:
        out = []
        for i in range(rows):
            z = self._row(i).astype(np.float64) / max(self.temperature, 1e-6)
            p = np.exp(z - z.max())
            out.append(p / p.sum())
        return np.stack(out)

    def pick(self, row: int) -> int:
        if self.temperature <= 0:
            return int(np.argmax(self._row(row)))
        return int(self.rng.choice(V, p=self.probs(len(self.rows))[row]))

    def margin(self, row: int) -> float:
        return float("inf")

    def pick_among(self, row: int, allowed: Sequence[int]) -> int:
        raise AssertionError("not healing here")

    def commit(self, tree: TokenTree, accepted: int, branch: int) -> None:
        kept = [tree.tokens[r] for r in tree.branch_rows(branch)[: accepted + 1]]
        self.tokens.extend(kept)
        if self.guide is not None:
            self.guide.commit(kept)

    def synchronize(self) -> None:
        return None


class InventingDraft:
    """A draft model that always proposes ``.pathx.foo os``: invented names."""

    def draft(self, history: list[int], max_draft: int, p_min: float) -> Draft:
        return Draft([2, 10, 23, 13, 1][:max_draft])


UNMADE = {"os": {"sep": 3.0, "getcwd": 1.0}}  # likely names where ``os.`` begins a line


def guide(line: str = "y = os", unmade: bool = False) -> Guide:
    if unmade:  # ``os`` as if it were ``self`` in ``__init__``: free where a line begins
        return Guide(Monitor(INDEX, Names("os.", MEMBERS, ("os",), UNMADE)))
    return Guide(Monitor(INDEX, Names(line, MEMBERS)))


def decode(stepper: Stepper, target: ToyTarget, n: int = 60) -> list[int]:
    target.prefill([17, 1], lambda: False, 0)
    out = [target.pick(-1)]
    while len(out) < n:
        out.extend(stepper.step(out[-1]))
    return out[:n]


def text(tokens: Sequence[int]) -> bytes:
    return b"".join(PIECES[t] for t in tokens)


def plain(guided: bool, temperature: float = 0.0, seed: int = 0, unmade: bool = False) -> list[int]:
    target = ToyTarget(guide(unmade=unmade) if guided else None, temperature, seed)
    return decode(PlainStepper(target), target)


def members_after_dots(tokens: Sequence[int]) -> list[bytes]:
    return IDENT.findall(b"y = os" + text(tokens))


def test_unguided_invents_and_guided_does_not() -> None:
    wild = members_after_dots(plain(False))
    assert any(m not in (b"path", b"sep", b"getcwd") for m in wild)  # the toy invents
    tame = members_after_dots(plain(True))
    assert tame and all(m in (b"path", b"sep", b"getcwd") for m in tame)


@pytest.mark.parametrize(("temperature", "unmade"), [(0.0, False), (0.8, False), (0.0, True)])
def test_speculation_under_the_mask_equals_plain_constrained(
    temperature: float, unmade: bool
) -> None:
    reference = plain(True, temperature, seed=3, unmade=unmade)
    ngram_target = ToyTarget(guide(unmade=unmade), temperature, seed=3)
    # the drafter finds ``os.pathx.foo`` in a source: invented, and rejected where masked
    drafter = NgramDrafter()
    drafter.add_source([1, 2, 10, 23, 13, 1, 2, 10, 23, 13, 1, 2, 10, 23])
    curve = CostCurve({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.3})
    policy = AdaptivePolicy(curve, [SpeculationMethod.NGRAM], prior_accept=0.9)
    ngram = NgramStepper(ngram_target, drafter, policy, allow_plain=False)
    draft_target = ToyTarget(guide(unmade=unmade), temperature, seed=3)
    drafted = DraftModelStepper(draft_target, InventingDraft(), max_draft=4)
    if temperature == 0.0:  # sample-and-match consumes the generator like plain decoding
        assert decode(ngram, ngram_target) == reference
        assert ngram.stats.drafted > 0
        assert decode(drafted, draft_target) == reference
        assert drafted.stats.drafted > 0
    else:  # sampled: every method's text still obeys the mask
        for stepper, target in ((ngram, ngram_target), (drafted, draft_target)):
            got = members_after_dots(decode(stepper, target))
            assert all(m in (b"path", b"sep", b"getcwd") for m in got)


def test_guide_reports_what_fired() -> None:
    g = guide()
    target = ToyTarget(g)
    out = decode(PlainStepper(target), target)
    fired = g.monitor.fired
    assert fired.dereferences == len(members_after_dots(out)) > 0
    assert fired.names[0] == 3 and fired.steps >= fired.dereferences
    assert g.ms > 0.0


def test_where_an_attribute_is_made_the_unmade_names_weigh_the_pick() -> None:
    picks = []
    for unmade in (False, True):
        names = Names("os.", MEMBERS, ("os",), UNMADE if unmade else {})
        target = ToyTarget(Guide(Monitor(INDEX, names)))
        picks.append(decode(PlainStepper(target), target, n=1)[0])
    assert PIECES[picks[0]] not in (b"sep", b"get", b"getcwd")  # the toy's own choice
    assert PIECES[picks[1]] == b"sep"  # the name the class uses most and makes nowhere


def test_the_debug_log_says_how_many_names_weighed_never_which(
    caplog: pytest.LogCaptureFixture,
) -> None:
    g = Guide(Monitor(INDEX, Names("os.", MEMBERS, ("os",), {"os": {"sep": 1.0, "x": 1.0}})))
    g.prompt()
    with caplog.at_level(logging.DEBUG, logger="kode.backends.monitor"):
        g.logits(-1, np.zeros(V, dtype=np.float32))
        g.logits(-1, np.zeros(V, dtype=np.float32))
    assert [r.getMessage() for r in caplog.records] == ["names monitor weighed 2 names likely made"]


def test_a_guide_never_changes_the_logits_it_is_given() -> None:
    g = Guide(Monitor(INDEX, Names("os.", MEMBERS, ("os",), {"os": {"sep": 1.0}})))
    g.prompt()
    logits = np.zeros(V, dtype=np.float32)
    out = g.logits(-1, logits)
    assert (logits == 0).all() and out is not logits
    assert out[7] > out[4] and out[10] == out[4]  # sep weighed; nothing masked here
