"""The names monitor without a model: which tokens survive after ``receiver.``."""

from __future__ import annotations

import dataclasses

import numpy as np
from kode.backends.monitor import UNMADE_WEIGHT, Monitor, Names, Prior, VocabIndex, dereference

PIECES = [
    b"<eos>",  # 0 stop
    b"os",  # 1
    b".",  # 2
    b".pa",  # 3
    b"path",  # 4
    b"pa",  # 5
    b"th",  # 6
    b"sep",  # 7
    b"(",  # 8
    b"path(",  # 9
    b"pathx",  # 10 invented: a member's name continued
    b".join",  # 11
    b"join",  # 12
    b" ",  # 13
    b"self",  # 14
    b"x",  # 15
    b".x",  # 16
    b"\n",  # 17
    b"sepx",  # 18
    b"_",  # 19
    b"_private",  # 20
]
INDEX = VocabIndex(PIECES, lambda t: t == 0)
MEMBERS = {"os": ("path", "sep", "_private"), "os.path": ("join",), "self": ("x",)}


def allowed(line: str, generated: bytes = b"", **kw: tuple[str, ...]) -> list[int] | None:
    mask = Monitor(INDEX, Names(line, MEMBERS, **kw)).allowed(generated)
    return None if mask is None else np.flatnonzero(mask).tolist()


def test_after_the_dot_only_members_and_their_prefixes() -> None:
    assert allowed("y = os.") == [0, 4, 5, 7, 9, 19, 20]  # path, pa, sep, path(, _, _private
    assert allowed("y = os.pa") == [0, 6]  # th
    # a whole name: it may end (a non-identifier character) but not go on (``pathx``)
    assert allowed("y = os.path") == [0, 2, 8, 11, 13, 17]
    assert allowed("y = os.sep") == [0, 2, 3, 8, 11, 13, 16, 17]  # os.sep's own dot is free


def test_a_dot_token_after_a_known_receiver_is_judged_after_its_dot() -> None:
    free = allowed("y = os")
    assert free is not None and 3 in free and 2 in free  # ``.pa`` spells ``path``
    assert 11 not in free and 16 not in free  # ``.join``, ``.x``: not members of os
    assert 1 in free and 10 in free  # not a dot: free (``os`` may be a longer name)
    after = allowed("y = os.path")
    assert after is not None and 11 in after and 3 not in after  # os.path has join only


def test_nothing_constrained_where_nothing_is_known() -> None:
    assert allowed("y = np.") is None  # an unknown receiver: free
    assert allowed("y = os.zz") is None  # a part no member begins: the user's own
    assert allowed("y = 'os.") is None  # in a string
    assert allowed("y = 1  # os.") is None  # in a comment
    assert allowed("from os.") is None  # an import wants modules
    assert allowed("y = f().os.") is None  # not a static receiver
    assert allowed("y = os.path(") is None


def test_the_generated_text_counts_across_lines() -> None:
    assert allowed("", b"a = 1\nb = os.pa") == [6]
    assert allowed("b = os.", b"path\nc = ") is None


def test_the_model_may_not_stop_mid_name_or_after_its_own_dot() -> None:
    # stopping at once shows nothing, so it stays allowed after what the user typed;
    # after what the model wrote, only a complete member may end the generation
    typed = allowed("y = os.")
    assert typed is not None and 0 in typed
    assert allowed("y = os", b".") == [4, 5, 7, 9, 19, 20]  # ``os.`` then stop: no
    assert allowed("y = os", b".pa") == [6]  # ``os.pa`` then stop: an invented name
    assert allowed(
        "y = os",
        b".pa",
    ) == allowed("", b"y = os.pa")
    assert allowed("y = os", b".path") == [0, 2, 8, 11, 13, 17]  # complete: it may end
    before = allowed("y = os", b"")
    assert before is not None and 0 in before


def test_self_may_name_a_new_attribute_where_it_begins_a_statement() -> None:
    assert allowed("        self.", open_at_start=("self",)) is None
    assert allowed("        y = self.", open_at_start=("self",)) == [0, 15]
    assert allowed("        self.") == [0, 15]


def test_monitor_counts_dereferences_not_rows() -> None:
    monitor = Monitor(INDEX, Names("y = os", MEMBERS))
    for generated in (b"", b".", b".", b".pa"):  # one dereference, asked four times
        monitor.allowed(generated)
    assert monitor.allowed(b".path + 1") is None
    assert monitor.fired.dereferences == 1 and monitor.fired.names == [3]
    assert monitor.fired.steps == 4


def test_dereference() -> None:
    assert dereference("    return self._cache.ge") == ("self._cache", "ge")
    assert dereference("x = '#' + os.") == ("os", "")
    assert dereference("x = a.b().c.") is None
    assert dereference("x = [1, 2].") is None


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


def test_the_prior_mixes_into_the_model_at_its_weight() -> None:
    logits = np.log(np.array([0.6, 0.3, 0.1], dtype=np.float32))  # tokens 0, 1, 2
    prior = Prior((np.array([1]), np.array([2])), np.array([0.75, 0.25]))
    mixed = logits.copy()
    prior.mix(mixed)
    w = UNMADE_WEIGHT
    expected = (1 - w) * np.array([0.6, 0.3, 0.1]) + w * np.array([0, 0.75, 0.25])
    assert np.allclose(_softmax(mixed), expected, atol=1e-6)
    assert np.isclose(np.log(np.exp(mixed).sum()), 0.0, atol=1e-6)  # the mass unchanged
    assert int(np.argmax(mixed)) == 1  # unsure model: the likely name wins
    sure = np.log(np.array([0.95, 0.04, 0.01], dtype=np.float32))
    prior.mix(sure)
    assert int(np.argmax(sure)) == 0  # a sure model overrules the prior


def test_a_names_share_spreads_over_its_spellings_as_the_model_spells_it() -> None:
    logits = np.log(np.array([0.5, 0.4, 0.1], dtype=np.float32))  # 1 and 2 spell one name
    prior = Prior((np.array([1, 2]),), np.array([1.0]))
    prior.mix(logits)
    w = UNMADE_WEIGHT
    expected = (1 - w) * np.array([0.5, 0.4, 0.1]) + w * np.array([0, 0.8, 0.2])
    assert np.allclose(_softmax(logits), expected, atol=1e-6)


def test_masked_names_give_their_share_to_the_others() -> None:
    logits = np.array([0.0, -np.inf, 0.0], dtype=np.float32)
    prior = Prior((np.array([1]), np.array([2])), np.array([0.5, 0.5]))
    prior.mix(logits)
    assert logits[1] == -np.inf
    assert np.allclose(_softmax(logits), [0.35, 0.0, 0.65], atol=1e-6)


def test_where_self_makes_an_attribute_the_unmade_names_weigh_it_unmasked() -> None:
    unmade = {"self": {"sep": 2.0, "x": 1.0, "gone": 5.0}}  # read in the class, made nowhere
    names = Names("        self.", MEMBERS, ("self",), unmade)
    monitor = Monitor(INDEX, names)
    assert monitor.allowed(b"") is None
    prior = monitor.prior(b"")
    assert prior is not None and prior.group is None
    spelled = [
        (ids.tolist(), float(s)) for ids, s in zip(prior.spellings, prior.shares, strict=True)
    ]
    assert spelled == [([7], 2 / 3), ([15], 1 / 3)]  # ``gone``: no token spells it
    assert monitor.prior(b"x = 1") is None and monitor.fired.weighed == 1
    # not where a statement begins, nor at a receiver that is not open there
    assert Monitor(INDEX, dataclasses.replace(names, line="        y = self.")).prior(b"") is None
    assert Monitor(INDEX, Names("os.", MEMBERS, (), {"os": {"sep": 1.0}})).prior(b"") is None


def test_after_the_receiver_itself_the_prior_weighs_only_the_tokens_that_begin_with_a_dot() -> None:
    monitor = Monitor(INDEX, Names("    os", MEMBERS, ("os",), {"os": {"path": 1.0}}))
    prior = monitor.prior(b"")
    assert prior is not None and prior.group is not None
    assert [ids.tolist() for ids in prior.spellings] == [[2, 3]]  # ``.``, ``.pa``
    logits = np.zeros(len(PIECES), dtype=np.float32)
    prior.mix(logits)
    assert logits[1] == 0.0 and logits[13] == 0.0  # no dot: as the model had it
    dots = np.flatnonzero(prior.group)
    assert np.isclose(np.exp(logits[dots]).sum(), len(dots))  # the dots' mass kept
    assert logits[3] > logits[11]  # ``.pa`` (path, likely made) over ``.join``
