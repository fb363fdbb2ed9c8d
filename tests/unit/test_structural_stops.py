"""Structural stops (``StopRules.structural``) and fill checks in other languages."""

from __future__ import annotations

import pytest
from kode.completion import syntax
from kode.completion.stops import StopRules
from kode.completion.templates import QWEN25_CODER


def rules(line_prefix: str, line_suffix: str = "", suffix: str = "", **kw: object) -> StopRules:
    return StopRules.build(
        line_prefix,
        line_suffix,
        line_suffix + suffix,
        stop_texts=QWEN25_CODER.stop_texts,
        structural=True,
        **kw,  # type: ignore[arg-type]
    )


def test_a_first_line_that_wrote_the_rest_of_the_cursor_line_ends_the_fill() -> None:
    r = rules("    x = foo(", ")", "\n    return x\n")
    text = "a, b)\n    y = 2\n"
    cut = r.scan(text)
    assert cut.stop and text[: cut.keep] == "a, b)"
    assert r.finish(text) == "a, b"
    # What the rules without structural stops show once the model ran on: the same.
    before = StopRules.build("    x = foo(", ")", ")\n    return x\n")
    assert not before.scan(text).stop and before.finish(text + "z = 3\n" * 40) == "a, b"
    # The rest holds a word: cut where it begins, as where a fill runs into the suffix.
    r = rules("    x = ", "foo(y)", "\n    return x\n")
    assert r.finish("z + foo(y)\n    more") == "z + "


def test_a_later_line_that_ends_with_the_rest_of_the_cursor_line_ends_the_hole() -> None:
    # HumanEval/142 as a random span (seed 23): the hole is ``ppend(lst[i]**2)\n        elif
    # i``; the model wrote the whole ``elif`` line, its own blanks around ``%``.
    r = rules("            result.a", " % 4 == 0 and i%3 != 0:", "\n            result.append(x)\n")
    text = "ppend(lst[i]**2)\n        elif i % 4 == 0 and i % 3 != 0:\n            result.app"
    cut = r.scan(text)
    assert cut.stop and cut.joined
    assert text[: cut.keep] == "ppend(lst[i]**2)\n        elif i"
    assert r.finish(text) == "ppend(lst[i]**2)\n        elif i"
    # HumanEval/140 (seed 23): a rest that starts the line's end, no blank before it.
    r = rules("        elif text[i", '== " ":', "\n            end += 1\n")
    text = '(text):\n        if text[i] == " ":\n            start = end\n'
    assert r.finish(text) == "(text):\n        if text[i] "
    # Not: a rest too short to tell, a line that is the rest alone, another ending.
    assert not rules("    f(x", "):", "\n    y = 1\n").scan("\n    g(a):\n    z").stop
    assert not rules("    x = (", "a + b)", "\n").scan("1\n    a + b)\n").stop
    assert not rules("    x = (", "a + b)", "\n").scan("1,\n    a + c)\n").stop


def test_a_mid_line_fill_the_model_ends_still_spans_lines() -> None:
    r = rules("        if", "ue", "\n")
    fill = " n % k == 0:\n            return False\n    return Tr"
    assert not any(r.scan(fill[:end]).stop for end in range(1, len(fill) + 1))
    assert r.finish(fill, ended=True) == fill


def test_a_mid_line_fill_may_repeat_a_short_line_of_the_suffix() -> None:
    # HumanEval/124 as a random span (1.5B passed it): ``return False`` is the suffix's
    # next line, the hole's second one, and a line before the cursor.
    r = rules(
        "        if month in [1,3] and day < 1 or day ",
        "    if month == 2 and day > 29:",
        "\n            return False\n    return True\n",
        prefix="def valid(month, day):\n    if day < 1:\n        return False\n",
    )
    fill = "> 31:\n            return False\n        if month in [4,6] and day < 1 or day > 30:"
    fill += "\n            return False\n    "
    assert not r.scan(fill).stop


def test_a_mid_line_fill_that_starts_a_new_definition_ends() -> None:
    r = rules("    y = f(x", " + 1", "\n    return y\n")
    assert not r.scan(")\n    z = 2\n}\n").stop  # a closing bracket may end the hole's block
    text = ")\n    z = 2\ndef g():\n"
    assert r.scan(text).stop
    assert r.finish(text) == ")"
    assert not r.scan(")\n    z = 2\ndef g():").stop  # the line is not complete yet


def test_after_a_dedent_that_opened_the_suffixs_block_its_closing_ends_the_fill() -> None:
    after = "\n        if n % 2 == 1:\n            odd.append(n)\n    return odd\n"
    r = rules("        odd =", "", after)
    text = " [n]\n    while n > 1:\n        n = n // 2\n    return odd\n"
    cut = r.scan(text)
    assert cut.stop and cut.fallback == len(" [n]")
    assert r.finish(text, ended=False) == " [n]"
    # An ``else:`` at that indentation opens another block: generation goes on.
    assert not r.scan(" [n]\n    while n > 1:\n        n -= 1\n    else:\n").stop
    # Without structural stops the model is left to end it.
    plain = StopRules.build("        odd =", "", after)
    assert not plain.scan(text).stop


def _parses(language: str) -> None:
    pytest.importorskip("tree_sitter_language_pack")  # the ``structure`` extra
    assert syntax.has_parser(language)


@pytest.mark.parametrize(
    ("language", "before", "after", "good", "bad"),
    [
        (
            "typescript",
            "function f(x: number): number {\n  const y = g(",
            ");\n  return y;\n}\n",
            "\n    x,\n    1",
            "x, 1\n  }\n  h(0",
        ),
        (
            "javascript",
            "const f = (x) => {\n  const y = g(",
            ");\n  return y;\n};\n",
            "x,\n    1",
            "x, 1\n  }\n  h(0",
        ),
        (
            "go",
            "func f(x int) int {\n\ty := g(",
            ")\n\treturn y\n}\n",
            "x,\n\t\t1",
            "x, 1\n\t}\n\th(0",
        ),
        (
            "rust",
            "fn f(x: i32) -> i32 {\n    let y = g(",
            ");\n    y\n}\n",
            "\n        x,\n        1",
            "x, 1\n    }\n    h(0",
        ),
    ],
)
def test_a_mid_line_fill_spans_lines_only_where_it_parses_in_every_language(
    language: str, before: str, after: str, good: str, bad: str
) -> None:
    _parses(language)
    fits = syntax.checker(language, before, after)
    assert fits is not None and fits(good) and not fits(bad)
    line_prefix = before.rsplit("\n", 1)[-1]
    line_suffix, _, rest = after.partition("\n")
    r = rules(line_prefix, line_suffix, "\n" + rest)
    assert r.finish(good, ended=True, fits=fits) == good
    # Its first line parses, the whole does not: the first line is shown.
    assert r.finish(bad, ended=True, fits=fits) == "x, 1"
    # Without tree-sitter (``structuralStops`` off) only Python is judged.
    assert syntax.checker(language, before, after, tree_sitter=False) is None


def test_the_fill_check_of_a_brace_language_parses_only_the_function_around_the_cursor() -> None:
    _parses("go")
    before = "package main\n\nfunc f() int {\n\treturn "
    after = "\n}\n\nfunc broken( {\n"  # an unrelated error further down
    fits = syntax.checker("go", before, after)
    assert fits is not None and fits("1") and not fits("1 +")


def test_prose_and_unknown_languages_are_not_judged() -> None:
    assert syntax.checker("plaintext", "a", "b") is None
    assert syntax.checker("markdown", "a", "b") is None
    assert syntax.checker("no-such-language", "a", "b") is None


def test_a_fill_that_writes_the_suffixs_second_and_third_lines_ran_into_the_suffix() -> None:
    suffix = "\n    b = compute(2)\n    c = compute(3)\n    return c\n"
    r = rules("    ", "", suffix)
    text = "a = 1\n    b = compute(22)\n    c = compute(3)\n    return c\n"
    assert not r.scan(text[: -len("return c\n")]).stop  # one line of them is not enough
    cut = r.scan(text)
    assert cut.stop and r.finish(text[: cut.keep]) == "a = 1\n    b = compute(22)"
    # Short lines (``}``, ``else {``) are too common to tell.
    assert rules("    ", "", "\n    x()\n    }\n    else {\n").later_suffix_lines == ()
    plain = StopRules.build("    ", "", suffix)
    assert not plain.scan(text).stop


def test_a_mid_line_fill_waits_at_most_twelve_lines_for_the_model_to_end_it() -> None:
    r = rules("    y = f(x", " + 1", "\n    return y\n")
    eleven = ")\n" + "".join(f"    z{i} = {i}\n" for i in range(10))  # 11 line breaks
    assert not r.scan(eleven).stop
    twelve = eleven + "    z10 = 10\n"
    assert r.scan(twelve).stop and r.finish(twelve) == ")"
    plain = StopRules.build("    y = f(x", " + 1", " + 1\n    return y\n", max_lines=32)
    assert not plain.scan(twelve).stop


def test_a_mid_line_fill_that_writes_a_new_next_line_of_the_suffix_ran_into_it() -> None:
    # inspect.py:1101 cut mid-line (1.5B): the fill wrote the suffix's next line and ran
    # on for 128 tokens.
    after = "b_frame\n    if isframe(object):\n        object = object.f_code\n"
    text = "ect):\n        object = object.__code__\n    if isframe(object):\n"
    new = StopRules.build(
        "    if isfunction(obj", "b_frame", after, structural=True, prefix="def f(obj):\n"
    )
    assert new.next_line_distinct and new.scan(text).stop
    assert new.finish(text) == "ect):"
    seen = "def f(obj):\n    if isframe(object):\n        pass\n"
    repeated = StopRules.build(
        "    if isfunction(obj", "b_frame", after, structural=True, prefix=seen
    )
    assert not repeated.next_line_distinct and not repeated.scan(text).stop


@pytest.mark.parametrize(
    "line",
    ["    def getcanvas(self):", "  export async function g() {", "    pub(crate) fn g() {"],
)
def test_a_mid_line_fill_that_starts_a_definition_further_out_ends(line: str) -> None:
    r = rules("        x = f(", "y)", "\n        return x\n")
    text = "a, b\n        z = 1\n" + line + "\n"
    assert r.scan(text).stop and r.finish(text) == "a, b"
    # At the cursor's own depth a definition may be the hole's (a nested function).
    assert not r.scan("a, b\n        def g():\n").stop
