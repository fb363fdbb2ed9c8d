from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kode.backends import kv_reuse
from kode.backends.kv_reuse import plan_moved_tail

MIDDLE = 0  # stands for <|fim_middle|>, the last token, always evaluated again


def test_docstring_examples() -> None:
    assert doctest.testmod(kv_reuse).failed == 0


def test_typing_mid_prefix_moves_the_suffix() -> None:
    old = [1, 2, 3, 50, 51, 52, 53, MIDDLE]
    new = [1, 2, 3, 7, 8, 50, 51, 52, 53, MIDDLE]
    plan = plan_moved_tail(old, new, min_tail=4)
    assert plan is not None
    assert (plan.keep, plan.old_tail, plan.new_tail, plan.length) == (3, 3, 5, 4)
    assert plan.refreshed == 0
    assert plan.drift == 2


def test_refuses_small_tails_and_big_inserts() -> None:
    old = [1, 2, 50, 51, MIDDLE]
    new = [1, 2, 9, 50, 51, MIDDLE]
    assert plan_moved_tail(old, new, min_tail=3) is None
    assert plan_moved_tail(old, new, min_tail=2) is not None
    big = [1, 2, *range(100, 140), 50, 51, MIDDLE]
    assert plan_moved_tail(old, big, min_tail=2, max_insert=32) is None
    assert plan_moved_tail(old, big, min_tail=2, max_insert=40) is not None


def test_appending_is_left_to_prefix_reuse() -> None:
    assert plan_moved_tail([1, 2, 3, MIDDLE], [1, 2, 3, 4, 5, MIDDLE]) is None
    with pytest.raises(ValueError, match="min_tail"):
        plan_moved_tail([1], [1], min_tail=0)


@given(
    head=st.lists(st.integers(1, 6), max_size=12),
    cut=st.lists(st.integers(1, 6), max_size=6),
    insert=st.lists(st.integers(1, 6), max_size=6),
    tail=st.lists(st.integers(1, 6), max_size=12),
)
def test_plan_rebuilds_the_new_prompt(
    head: list[int], cut: list[int], insert: list[int], tail: list[int]
) -> None:
    old = [*head, *cut, *tail, MIDDLE]
    new = [*head, *insert, *tail, MIDDLE]
    plan = plan_moved_tail(old, new, min_tail=1, max_insert=64)
    if plan is None:
        return
    # What the runtime does: keep old[:keep], evaluate new[keep:new_tail], move the tail.
    rebuilt = [*old[: plan.keep], *new[plan.keep : plan.new_tail]]
    rebuilt += old[plan.old_tail : plan.old_tail + plan.length]
    assert [*rebuilt, new[-1]] == new
    assert plan.old_tail + plan.length == len(old) - 1
    assert plan.length >= 1 and plan.keep <= plan.old_tail and plan.keep <= plan.new_tail


def test_refresh_re_evaluates_the_head_of_the_tail() -> None:
    old = [1, 2, 50, 51, 52, 53, 54, MIDDLE]
    new = [1, 2, 9, 50, 51, 52, 53, 54, MIDDLE]
    plan = plan_moved_tail(old, new, min_tail=2, refresh=2)
    assert plan is not None
    assert (plan.keep, plan.old_tail, plan.new_tail, plan.length) == (2, 4, 5, 3)
    assert plan.inserted == 3  # the typed token and the two refreshed ones
    assert plan.drift == 1  # only the typed token went unseen
    assert plan_moved_tail(old, new, min_tail=4, refresh=2) is None  # too little left


# -- saved states: which one to bring back, and when to keep the current one ---------------

tokens = st.lists(st.integers(0, 3), max_size=30)


@given(tokens, tokens, st.one_of(st.none(), st.integers(0, 30)))
def test_prefix_reach_is_the_exact_common_prefix(
    cached: list[int], prompt: list[int], stale_from: int | None
) -> None:
    n = kv_reuse.prefix_reach(cached, prompt, stale_from)
    assert cached[:n] == prompt[:n]
    assert n <= len(cached) and n <= len(prompt)
    if stale_from is not None:
        assert n <= stale_from
    elif n < min(len(cached), len(prompt)):
        assert cached[n] != prompt[n]


@given(st.integers(0, 500), st.lists(st.integers(0, 500), max_size=8), st.integers(1, 64))
def test_choose_state_brings_back_only_a_clearly_better_state(
    current: int, saved: list[int], min_gain: int
) -> None:
    pick = kv_reuse.choose_state(current, saved, min_gain=min_gain)
    if pick is None:
        assert all(s < current + min_gain for s in saved)
    else:
        assert saved[pick.index] == pick.common == max(saved)
        assert pick.common >= current + min_gain


def test_worth_saving_keeps_places_not_keystrokes() -> None:
    assert kv_reuse.worth_saving(1200, 40, 1150)  # another document or a far place
    assert not kv_reuse.worth_saving(1200, 900, 1150)  # a keystroke: the suffix only moves
    assert not kv_reuse.worth_saving(100, 60, 90)  # little would be lost
    assert not kv_reuse.worth_saving(0, 0, 0)  # nothing held


held = st.builds(
    lambda reach, extra, prompt, used: kv_reuse.Held(reach, reach + extra, prompt, used),
    st.integers(0, 500),
    st.integers(0, 500),
    st.integers(0, 1000),
    st.integers(0, 50),
)


@given(st.lists(held, min_size=1, max_size=4), st.lists(st.integers(0, 1000), max_size=6))
def test_choose_slot_takes_the_best_sequence_and_loses_as_little_as_it_can(
    free: list[kv_reuse.Held], saved: list[int]
) -> None:
    """The chosen sequence serves within ``min_gain`` of the best; of those it loses
    nothing if one can (empty, or holding a prefix of the prompt), else it is the least
    recently used; a saved state comes back only when it serves ``min_gain`` more, and
    then the best one; with one sequence the rule is the single-sequence one."""
    choice = kv_reuse.choose_slot(free, saved)
    chosen = free[choice.slot]
    top = max(h.reach for h in free)
    assert chosen.reach >= top - 32
    near = [h for h in free if h.reach >= top - 32]
    if any(h.length == h.reach for h in near):
        assert chosen.length == chosen.reach
    else:
        assert chosen.used == min(h.used for h in near)
    pick = kv_reuse.choose_state(chosen.reach, saved)
    assert choice.state == (None if pick is None else pick.index)
    if choice.state is None:
        assert choice.save == kv_reuse.worth_saving(chosen.length, chosen.reach, chosen.prompt_len)
    else:
        assert choice.save == (chosen.length >= 64)
    if len(free) == 1:
        assert choice.slot == 0


def test_choose_slot_needs_a_free_sequence() -> None:
    with pytest.raises(ValueError, match="no free sequence"):
        kv_reuse.choose_slot([], [])
