"""The model-free next edit: a rename or a substitution repeated at its next place."""

from __future__ import annotations

import doctest

from kode.completion.edits import repeat
from kode.completion.edits.history import EditHistory
from kode.completion.edits.repeat import RepeatEdit, RepeatKind, propose_repeat
from kode.completion.edits.tokens import tokenize

URI = "file:///w/a.py"


class Session:
    """A document, its edit history, and a cursor: edits are made by replacing a piece
    of text (found by ``find``, its ``nth`` occurrence) a second apart."""

    def __init__(self, text: str, uri: str = URI, history: EditHistory | None = None) -> None:
        self.text, self.uri = text, uri
        self.history = history if history is not None else EditHistory()
        self.now, self.cursor = 0.0, 0

    def edit(self, find: str, replacement: str, *, at: str = "") -> None:
        """Replace the first ``find`` (at or after the first ``at``, if given)."""
        start = self.text.index(find, self.text.index(at) if at else 0)
        self.replace(start, start + len(find), replacement)

    def accept(self, edit: RepeatEdit | None) -> None:
        assert edit is not None
        self.replace(edit.start, edit.end, edit.text)

    def replace(self, start: int, end: int, replacement: str) -> None:
        self.now += 2.0
        self.history.record_offsets(
            self.uri, self.text, start, end, replacement, version=1, now=self.now
        )
        self.text = self.text[:start] + replacement + self.text[end:]
        self.cursor = start + len(replacement)

    def propose(self, cursor: int | None = None) -> RepeatEdit | None:
        at = self.cursor if cursor is None else cursor
        return propose_repeat(self.history.hunks(), self.uri, self.text, at)

    def applied(self, edit: RepeatEdit | None) -> str:
        assert edit is not None
        return self.text[: edit.start] + edit.text + self.text[edit.end :]

    def line_of(self, edit: RepeatEdit | None) -> int:
        assert edit is not None
        return self.text.count("\n", 0, edit.start)


RENAME_SOURCE = """\
def scale(n, factor):
    number = n * factor
    if n > 10:
        print("n is big", n)
    return number + n
"""


def test_a_rename_is_repeated_at_the_next_use_then_the_one_after() -> None:
    session = Session(RENAME_SOURCE)
    session.edit("n", "size", at="(")  # the parameter
    edit = session.propose()
    at = session.text.index("n * factor")
    assert edit == RepeatEdit(at, at + 1, "size", RepeatKind.RENAME)
    assert session.line_of(edit) == 1
    seen = []
    while (edit := session.propose()) is not None:  # accept each, as a user would
        seen.append(session.line_of(edit))
        session.accept(edit)
        assert len(seen) < 10
    assert seen == [1, 2, 3, 4]
    assert session.text == RENAME_SOURCE.replace("(n,", "(size,").replace(
        "= n *", "= size *"
    ).replace("if n >", "if size >").replace('big", n)', 'big", size)').replace("+ n\n", "+ size\n")


def test_a_rename_touches_whole_names_only() -> None:
    session = Session(RENAME_SOURCE + "obj.n = n_items = 'n'\n")
    session.edit("n", "size", at="(")
    for _ in range(4):
        session.accept(session.propose())
    # ``number``, ``obj.n``, ``n_items`` and the ``n`` in strings are other things.
    assert session.propose() is None
    assert "number" in session.text and "obj.n = n_items = 'n'" in session.text
    assert '"n is big"' in session.text


def test_a_name_half_typed_is_no_rename_unless_at_a_binding() -> None:
    session = Session("print(count)\nreturn count\n")
    session.edit("count", "coun")  # backspace, then a pause
    assert session.propose() is None
    session = Session("count = 0\nreturn count\n")
    session.edit("count", "counter")  # at the binding: a rename
    assert session.applied(session.propose()) == "counter = 0\nreturn counter\n"


def test_a_rename_goes_back_before_the_cursor_when_nothing_is_after_it() -> None:
    session = Session("total = n + 1\nreturn total\nn = 5\n")
    session.edit("n", "count", at="n = 5")  # the binding on the last line
    edit = session.propose()
    assert session.line_of(edit) == 0
    assert session.applied(edit).startswith("total = count + 1\n")


def test_a_rename_of_a_member_follows_members_only() -> None:
    session = Session("self.n = 1\nn = self.n + other.n\n")
    session.edit("n", "size", at="self.")
    edit = session.propose()
    assert session.applied(edit) == "self.size = 1\nn = self.size + other.n\n"


def test_the_other_use_on_the_line_just_edited_is_proposed() -> None:
    session = Session("n = n + 1\n")
    session.edit("n", "count")
    assert session.applied(session.propose()) == "count = count + 1\n"


def test_a_changed_use_is_no_rename_when_the_new_name_exists_elsewhere() -> None:
    # Using ``b`` instead of ``a`` at one place is a fix, not a rename of every ``a``.
    session = Session("a = 1\nb = 2\nprint(a)\nreturn a\n")
    session.edit("a", "b", at="print(")
    assert session.propose() is None


def test_an_added_argument_is_repeated_at_the_next_call() -> None:
    source = (
        "x = area(w)\n"
        "other(w)\n"
        "y = area(w2, h2)\n"
        "z = area(\n"
        "    w3\n"
        ")\n"
        "t = area(\n"
        "    w4,\n"
        ")\n"
        "r = area(w5, unit)\n"
    )
    session = Session(source)
    session.edit("area(w)", "area(w, unit)")
    edit = session.propose()
    assert edit is not None and edit.kind is RepeatKind.SUBSTITUTION
    assert (edit.end - edit.start, edit.text) == (0, ", unit")  # inserted, nothing replaced
    assert session.applied(edit).splitlines()[2] == "y = area(w2, h2, unit)"
    session.edit("area(w2, h2)", "area(w2, h2, unit)")
    edit = session.propose()
    assert session.applied(edit).split("\n")[3:6] == ["z = area(", "    w3, unit", ")"]
    session.edit("w3", "w3, unit", at="z = ")
    # ``area(w5, unit)`` already has it; where a trailing comma ends the list
    # (``area(w4,)``), where the argument goes is a matter of layout: not guessed.
    assert session.propose() is None


def test_an_argument_added_first_and_a_changed_argument() -> None:
    session = Session("log(msg)\nlog(other)\n")
    session.edit("log(msg)", "log(level, msg)")
    assert session.applied(session.propose()) == "log(level, msg)\nlog(level, other)\n"
    session = Session("f(a, 1)\nf(b, 1)\nf(c, 2)\n")
    session.edit("f(a, 1)", "f(a, 2)")
    assert session.applied(session.propose()) == "f(a, 2)\nf(b, 2)\nf(c, 2)\n"


def test_a_call_rewritten_as_an_index() -> None:
    session = Session("a = d.get(key)\nb = d.get(other_key)\nc = e.get(key)\n")
    session.edit(".get(key)", "[key]")
    edit = session.propose()
    assert session.applied(edit) == "a = d[key]\nb = d[other_key]\nc = e.get(key)\n"


def test_a_word_inserted_before_a_call_and_an_argument_removed() -> None:
    session = Session("a = fetch(x)\nb =  fetch(y)\n")
    session.edit("= fetch", "= await fetch")
    assert session.applied(session.propose()) == "a = await fetch(x)\nb =  await fetch(y)\n"
    session = Session("f(a, verbose)\nf(\n    b,\n    verbose\n)\n")
    session.edit("f(a, verbose)", "f(a)")
    assert session.applied(session.propose()) == "f(a)\nf(\n    b)\n"


def test_a_fixed_substitution_where_the_new_name_exists() -> None:
    session = Session("a, b = 1, 2\nprint(a)\nreturn a\nprint(a)\n")
    session.edit("print(a)", "print(b)")
    edit = session.propose()
    assert session.applied(edit) == "a, b = 1, 2\nprint(b)\nreturn a\nprint(b)\n"


def test_nothing_is_proposed_when_nothing_repeats() -> None:
    session = Session("def f(n):\n    return 1\n")
    session.edit("n", "count")  # no other use
    assert session.propose() is None
    session = Session("x = compute(a)\ny = 2\n")
    session.edit("compute(a)", "compute(a, b)")  # no other call
    assert session.propose() is None
    session = Session("x = 1\n\nz = 3\n")
    session.edit("\n\n", "\ny = x + 2\n")  # a new line of code: the model's job
    assert session.propose() is None
    assert propose_repeat((), URI, "x = 1\n", 0) is None
    session = Session("f(a,b)\nf(c,d)\n")
    session.edit("a,b", "a, b")  # only spaces
    assert session.propose() is None


def test_no_reversal_after_an_undo() -> None:
    session = Session("def f(n):\n    return n\n")
    session.edit("n", "count")
    assert session.propose() is not None
    session.edit("count", "n")  # undo, after a pause
    assert session.propose() is None
    session.edit("n", "count")  # and a redo reads the same: say nothing
    assert session.propose() is None


def test_never_an_edit_that_undoes_a_recent_one() -> None:
    session = Session("a = 1\nuse(b)\nkeep = 0\nb = 2\nprint(b)\n")
    session.edit("b", "a", at="use(")  # not a rename: ``a`` exists; a change of one use
    session.edit("keep", "kept")
    session.edit("b", "a", at="b = 2")  # a binding now: rename b -> a
    # ``print(b)`` may become ``print(a)``; nothing turns the ``a`` of ``use(a)`` back.
    assert session.applied(session.propose()).endswith("a = 2\nprint(a)\n")
    session.edit("a", "b", at="a = 2")  # rename back at the binding: the reverse...
    # ...of the first edit at ``use(a)`` is never proposed, and of the one just undone
    # neither: nothing.
    assert session.propose() is None


def test_the_history_must_be_of_the_text() -> None:
    session = Session("def f(n):\n    return n\n")
    session.edit("n", "count")
    stale = session.text.replace("count", "cnt")
    assert propose_repeat(session.history.hunks(), URI, stale, 0) is None


def test_a_rename_continues_in_another_document() -> None:
    history = EditHistory()
    a = Session("def area(r):\n    return r\n", "file:///w/a.py", history)
    a.edit("area", "surface")
    b = "from a import area\n\nprint(area(2))\n"
    edit = propose_repeat(history.hunks(), "file:///w/b.py", b, cursor=0)
    assert edit is not None and b[edit.start : edit.end] == "area" and edit.start == 14


def test_unicode_names_and_text() -> None:
    source = 'größe = 1\nlabel = "😀 größe"\nprint(größe, "😀")\nfläche = größe * 2\n'
    session = Session(source)
    session.edit("größe", "länge")
    edit = session.propose()
    # The use in the string is skipped; offsets are code points.
    assert session.applied(edit).splitlines()[2] == 'print(länge, "😀")'
    session.edit("größe", "länge", at="print(")
    assert session.applied(session.propose()).splitlines()[3] == "fläche = länge * 2"


def test_multi_line_documents_and_a_cursor_far_away() -> None:
    body = "".join(f"    step{i}(ctx)\n" for i in range(40))
    session = Session("def run(ctx):\n" + body)
    session.edit("ctx", "context", at="run(")
    edit = session.propose(cursor=session.text.index("step21"))
    assert edit is not None and (session.line_of(edit), edit.text) == (22, "context")
    assert session.text[edit.start : edit.end] == "ctx"
    assert session.line_of(session.propose(cursor=len(session.text))) == 40


def test_tokens() -> None:
    assert [t.text for t in tokenize("a.b->c :: d?.e == f != 'x'")] == [
        "a", ".", "b", "->", "c", "::", "d", "?.", "e", "==", "f", "!=", "'x'",
    ]  # fmt: skip


def test_worked_examples() -> None:
    result = doctest.testmod(repeat)
    assert result.attempted > 0 and result.failed == 0


def test_an_older_hunk_repeats_when_it_is_the_nearest_match_after_the_cursor() -> None:
    # A signature changed, then its body: the next signature repeats the older hunk.
    source = (
        "class A:\n"
        "    def complete(self, ctx, args, incomplete):\n"
        "        return find(ctx, args, incomplete)\n"
        "\n"
        "class B:\n"
        "    def complete(self, ctx, args, incomplete):\n"
        "        return find(ctx, args, incomplete) + more\n"
    )
    session = Session(source)
    session.edit("ctx, args, incomplete):", "ctx, incomplete):")
    session.edit("find(ctx, args, incomplete)", "find(ctx, incomplete)")
    edit = session.propose()
    assert session.applied(edit).splitlines()[5] == "    def complete(self, ctx, incomplete):"
    session.accept(edit)
    # And then the newest one again, the body below.
    assert session.applied(session.propose()).splitlines()[6] == (
        "        return find(ctx, incomplete) + more"
    )


def test_an_older_hunk_is_never_proposed_before_the_cursor() -> None:
    session = Session("f(a)\nx = 1\nf(b)\ny = 2\n")
    session.edit("f(b)", "f(b, c)")
    session.edit("y = 2", "y = 3")
    # ``f(a)`` is above: only the newest hunk goes back up, and it has no repeat.
    assert session.propose() is None


def test_names_in_comments_are_not_renamed() -> None:
    session = Session(
        "import shutil\n# shutil has it\nx = getattr(shutil, 'a')\n", "file:///w/c.py"
    )
    session.edit("shutil", "sh", at="x = ")
    session.edit("shutil", "sh")  # the import, last: a confirmed rename
    edit = session.propose()
    assert edit is None or "# shutil has it" in session.applied(edit)
    js = Session("let n = 1; // n counts\nuse(n)\n", "file:///w/c.js")
    js.edit("n", "count")
    assert js.applied(js.propose()) == "let count = 1; // n counts\nuse(count)\n"
    assert [t.kind.value for t in tokenize("a // b", "file:///w/c.py")] == [
        "name", "symbol", "name",
    ]  # fmt: skip


def test_an_import_replaced_by_another_is_no_rename() -> None:
    session = Session("import typing\n\nx: typing.List[int] = []\n")
    session.edit("typing", "json")
    assert session.propose() is None


def test_a_member_of_self_renamed_follows_self_only() -> None:
    session = Session("self.n = 1\nn = self.n + other.n\n")
    session.edit("n", "size", at="self.")
    assert session.applied(session.propose()) == "self.size = 1\nn = self.size + other.n\n"
    session = Session("a.n = 1\nb = c.n\n")
    session.edit("n", "size", at="a.")  # another object's: any receiver
    assert session.applied(session.propose()) == "a.size = 1\nb = c.size\n"


def test_a_use_and_a_member_renamed_together_rename_both() -> None:
    session = Session("self.protocol = protocol\n\nreturn Response(protocol=protocol)\n")
    session.edit("self.protocol = protocol", "self.http_version = http_version")
    edit = session.propose()
    assert session.applied(edit).endswith("Response(http_version=http_version)\n")


def test_lines_added_after_a_token_of_context_are_no_pattern() -> None:
    session = Session("import a\nimport b\nwith a.progress():\n    pass\n")
    session.edit("import b\n", "import b\nimport c\n")  # a new line: new code
    assert session.propose() is None


def test_the_uses_in_one_statement_are_renamed_at_once() -> None:
    session = Session(
        "def f(protocol):\n    g(protocol=protocol,\n      x=protocol)\n    h(protocol)\n"
    )
    session.edit("protocol", "http_version")
    edit = session.propose()
    assert session.applied(edit).splitlines()[1:] == [
        "    g(http_version=http_version,",
        "      x=http_version)",
        "    h(protocol)",
    ]


def test_a_deleted_line_is_deleted_where_it_stands_again() -> None:
    source = (
        "def a(\n    hooks=None,\n    config=None,\n    verify=True,\n):\n"
        "def b(\n    hooks=None,\n        config=None,\n    prefetch=None,\n):\n"
    )
    session = Session(source)
    session.edit("    config=None,\n", "")
    edit = session.propose()
    assert edit is not None and edit.kind is RepeatKind.LINES
    assert session.applied(edit) == (
        "def a(\n    hooks=None,\n    verify=True,\n):\n"
        "def b(\n    hooks=None,\n    prefetch=None,\n):\n"
    )


def test_a_plain_deleted_line_is_no_pattern() -> None:
    session = Session("f(\n    a,\n)\ng(\n    b,\n)\n")
    session.edit("\n)\ng", "\ng")  # ``)`` deleted: too plain to repeat
    assert session.propose() is None


def test_an_inserted_line_goes_next_to_the_same_anchor_with_its_indentation() -> None:
    source = (
        "    assert response.json() == {}\n\n"
        "def test_b():\n"
        "        assert response.json() == {}\n\n"
    )
    session = Session(source)
    session.edit("{}\n\n", "{}\n    assert len(response.history) == 0\n\n")
    edit = session.propose()
    assert edit is not None and edit.kind is RepeatKind.LINES
    assert session.applied(edit).endswith(
        "        assert response.json() == {}\n        assert len(response.history) == 0\n\n"
    )
    session.accept(edit)
    assert session.propose() is None  # each anchor has it now


def test_an_inserted_block_of_lines_is_no_pattern() -> None:
    source = "x = compute(a)\n\nx = compute(b)\n"
    session = Session(source)
    session.edit("(a)\n", "(a)\nif x:\n    log(x)\n    raise ValueError(x)\n")
    assert session.propose() is None


def test_uses_on_adjacent_lines_are_one_edit_where_the_hunk_was_made_so() -> None:
    source = (
        "a = click.helpers.f\nb = click.helpers.g\n\nc = click.helpers.f\nd = click.helpers.g\n"
    )
    session = Session(source)
    session.edit(
        "a = click.helpers.f\nb = click.helpers.g", "a = click.termui.f\nb = click.termui.g"
    )
    edit = session.propose()
    assert session.applied(edit) == source.replace("helpers", "termui")


def test_an_argument_added_to_a_call_on_self_follows_self_calls_only() -> None:
    source = (
        "        await self.send_data(stream_id, data)\n"
        "        self.state.send_data(stream_id, data)\n"
        "        await self.send_data(other, data)\n"
    )
    session = Session(source)
    session.edit("send_data(stream_id, data)", "send_data(stream_id, data, timeout)")
    assert session.applied(session.propose()).splitlines()[1:] == [
        "        self.state.send_data(stream_id, data)",
        "        await self.send_data(other, data, timeout)",
    ]


def test_a_change_at_the_end_of_a_line_repeats_at_the_end_of_a_line() -> None:
    source = "[a]\ndeps = sphinx\ncommands = sphinx-build -W\n[b]\ndeps = sphinx\n"
    session = Session(source, "file:///w/tox.ini")
    session.edit("deps = sphinx", "deps = -r docs/requirements.txt")
    edit = session.propose()
    assert session.applied(edit).endswith(
        "commands = sphinx-build -W\n[b]\ndeps = -r docs/requirements.txt\n"
    )


def test_an_inserted_line_is_not_proposed_above_the_cursor() -> None:
    source = "    x = f(a)\n\n    x = f(b)\n\n    x = f(a)\n"
    session = Session(source)
    session.edit("x = f(a)\n", "x = f(a)\n    log(x, 1)\n", at="f(b)")
    assert session.propose() is None  # the other ``x = f(a)`` is above: lines go top down


def test_the_same_line_elsewhere_changes_the_same_way() -> None:
    source = "    raise Fail(f(\n        x\n    ))\n\n    raise Fail(g(\n        y\n        ))\n"
    session = Session(source)
    session.edit("    ))", "    ), param, ctx)")
    edit = session.propose()
    assert session.applied(edit).endswith("        y\n        ), param, ctx)\n")
    session = Session('    "pool.request",\n    x = 1\n    "pool.request",\n')
    session.edit('"pool.request"', '"pool.handle_request"')
    assert session.applied(session.propose()).endswith('    "pool.handle_request",\n')


def test_a_plain_line_changed_is_no_pattern() -> None:
    session = Session("a = [\n    1,\n],\nb = [\n    2,\n],\n")
    session.edit("],", "},")
    assert session.propose() is None
    session = Session("    return True\nx = 1\n    return True\n")
    session.edit("return True", "return")
    assert session.propose() is None


def test_lines_added_in_a_rewrite_repeat_only_where_the_layout_is_the_same() -> None:
    source = (
        "    context = make_context(cert=(pem_file, key_file))\n"
        "    context = make_context(\n        cert=(pem_file, other_key_file)\n    )\n"
    )
    session = Session(source)
    session.edit(
        "make_context(cert=(pem_file, key_file))",
        "Context()\n    context.load_chain(pem_file, key_file)",
    )
    assert session.propose() is None  # written over two lines there: not guessed


def test_a_parameter_renamed_renames_its_stored_attribute() -> None:
    session = Session("def f(\n    protocol: str,\n):\n    self.protocol = protocol\n")
    session.edit("protocol", "http_version")
    edit = session.propose()
    assert session.applied(edit).endswith("    self.http_version = http_version\n")


def test_spaces_replaced_in_the_hunk_are_replaced_where_it_repeats() -> None:
    session = Session("A serious business.\n\nAll serious  business.\n", "file:///w/a.md")
    session.edit("serious business", "serious-business")
    assert session.applied(session.propose()).endswith("All serious-business.\n")


def test_a_substitution_is_not_proposed_above_the_cursor() -> None:
    session = Session("x = f(a)\ny = 2\nz = f(b)\n")
    session.edit("f(b)", "f(b, c)")
    assert session.propose() is None  # ``f(a)`` is above, where the person has been


def test_a_hunk_of_two_changes_repeats_where_both_match_in_one_statement() -> None:
    source = (
        "A = Callable[\n    [typing.Dict[str, Any]], typing.Coroutine[None, None, None]\n]\n"
        "B = Callable[\n    [typing.Dict[str, Any], Recv], typing.Coroutine[None, None, None]\n]\n"
        "C = typing.Dict[str, Any]\n"
    )
    session = Session(source)
    session.edit(
        "[typing.Dict[str, Any]], typing.Coroutine[None, None, None]",
        "[typing.MutableMapping[str, Any]], typing.Awaitable[None]",
    )
    edit = session.propose()
    assert session.applied(edit).splitlines()[4:] == [
        "    [typing.MutableMapping[str, Any], Recv], typing.Awaitable[None]",
        "]",
        "C = typing.Dict[str, Any]",  # one of the two changes alone: not proposed
    ]


def test_thousands_of_places_the_nearest_after_the_cursor_and_before_it() -> None:
    body = "".join(f"    x{i} = g(ctx)\n" for i in range(3000))
    session = Session("def run(ctx):\n" + body)
    session.edit("ctx", "context", at="run(")
    cursor = session.text.index("x2500 =")
    edit = session.propose(cursor=cursor)
    assert edit is not None and session.line_of(edit) == 2501
    edit = session.propose(cursor=len(session.text))  # nothing after: the last use
    assert edit is not None and session.line_of(edit) == 3000


def test_an_edit_taken_back_at_once_is_not_proposed_again_until_made_anew() -> None:
    """A proposal taken (Tab) and undone within the grouping pause leaves no hunk (rule 3
    of the history), but is remembered as undone: the next request proposes the other
    use, not the one just taken back; the same rename made by hand later counts again."""
    history = EditHistory()
    text = "def f(w, h):\n    a = w * 2\n    b = w + h\n    return a + b\n"

    def replace(start: int, end: int, new: str, now: float) -> None:
        nonlocal text
        history.record_offsets(URI, text, start, end, new, version=1, now=now)
        text = text[:start] + new + text[end:]

    replace(6, 7, "width", 0.0)  # the rename at the parameter
    first = propose_repeat(history.hunks(), URI, text, 11, history.undone(URI))
    assert first is not None and text[first.start : first.end] == "w"
    assert text.count("\n", 0, first.start) == 1
    replace(first.start, first.end, first.text, 5.0)  # taken with Tab...
    replace(first.start, first.start + len(first.text), "w", 5.4)  # ...and undone at once
    assert [h.before for h in history.hunks()] == ["def f(w, h):"]  # no hunk of the pair
    again = propose_repeat(history.hunks(), URI, text, first.start, history.undone(URI))
    assert again is None or text.count("\n", 0, again.start) != 1, "proposed again"

    # the same edit made by hand after all: the rename goes on from there
    replace(first.start, first.end, "width", 9.0)
    after = propose_repeat(history.hunks(), URI, text, first.start + 5, history.undone(URI))
    assert after is not None and text.count("\n", 0, after.start) == 2
