"""The next edit where it repeats a change made inside strings or comments, or one that
repeats only with narrower context than the finder's first pattern."""

from __future__ import annotations

from kode.completion.edits.repeat import RepeatKind
from test_edit_repeat import Session


def test_a_change_inside_a_string_repeats_in_a_string_with_other_arguments() -> None:
    session = Session(
        "r = get('https://github.com/')\n"
        "print(r.status_code)\n"
        "r = get('https://github.com/', allow_redirects=False)\n"
    )
    session.edit("'https://github.com/'", "'http://github.com/'")
    edit = session.propose()
    assert edit is not None and edit.kind is RepeatKind.WORDS
    assert session.line_of(edit) == 2
    assert session.applied(edit).endswith("r = get('http://github.com/', allow_redirects=False)\n")


def test_a_change_inside_a_comment_repeats_in_the_next_comment_with_its_neighbours() -> None:
    session = Session(
        "FileContent = Union[\n"
        "    # file (or text)\n"
        "    FileTypes,\n"
        "    # (filename, file (or text))\n"
        "    Tuple[str, FileTypes],\n"
        "    # plain text here stays\n"
        ")\n"
    )
    session.edit("(or text)", "(or bytes)")
    edit = session.propose()
    assert edit is not None and session.line_of(edit) == 3
    assert "# (filename, file (or bytes))" in session.applied(edit)
    session.accept(edit)
    assert session.propose() is None  # "plain text here" has not the neighbours "or ... )"


def test_a_code_name_changed_in_a_docstring_is_changed_in_the_code() -> None:
    session = Session(
        "def test_pager():\n"
        '    """Spying on ``MaybeStripAnsi.write`` records what was sent."""\n'
        "    real_write = impl.MaybeStripAnsi.write\n"
    )
    session.edit("MaybeStripAnsi", "_PagerWriter")
    edit = session.propose()
    assert edit is not None
    assert session.applied(edit).endswith("    real_write = impl._PagerWriter.write\n")


def test_a_comment_wrapped_anew_is_no_edit_to_repeat() -> None:
    session = Session(
        "    # Else, absence of value is interpreted as a variable is\n"
        "    # not set, so proceed.\n"
        "x = 1\n"
        "    # not found: the default\n"
    )
    start = session.text.index(" is\n")
    end = session.text.index("not set")
    session.replace(start, end, "\n    # is ")
    assert session.text.startswith("    # Else, absence of value is interpreted as a variable\n")
    assert session.propose() is None


def test_a_dotted_name_replaced_in_one_signature_repeats_inside_another_ones_brackets() -> None:
    session = Session(
        "def key(value: typing.AnyStr, encoding: str = None) -> bytes:\n"
        "    pass\n"
        "def headers(\n"
        "    items: typing.Iterable[typing.Tuple[typing.AnyStr, typing.AnyStr]]\n"
        "):\n"
        "    pass\n"
    )
    session.edit("typing.AnyStr", "StrOrBytes")
    edit = session.propose()
    assert edit is not None and session.line_of(edit) == 3
    assert "typing.Iterable[typing.Tuple[StrOrBytes, StrOrBytes]]" in session.applied(edit)


def test_a_deleted_await_repeats_where_another_token_came_before_it() -> None:
    session = Session(
        "async def test_a():\n"
        "    context = await config.load_context()\n"
        "async def test_b():\n"
        "    with raises(IOError):\n"
        "        await config.load_context()\n"
    )
    session.edit("await config", "config")
    edit = session.propose()
    assert edit is not None and session.line_of(edit) == 4
    assert session.applied(edit).endswith("        config.load_context()\n")


def test_a_single_replaced_name_gets_no_narrower_pattern() -> None:
    """``area(w, h)`` -> ``area(w, depth)`` is no rename (``depth`` exists already, no
    binding): the narrower context must not turn every ``h)`` into ``depth)``."""
    session = Session("depth = 3\na = area(w, h)\nb = other(x, h)\n")
    session.edit("h)", "depth)")
    assert session.propose() is None
