"""Stop rules and suffix trimming."""

from __future__ import annotations

import pytest
from kode.completion import syntax
from kode.completion.stops import MultilineMode, StopRules, indent_width
from kode.completion.templates import QWEN25_CODER


def rules(line_prefix: str, line_suffix: str = "", suffix: str = "", **kw: object) -> StopRules:
    return StopRules.build(
        line_prefix,
        line_suffix,
        line_suffix + suffix,
        stop_texts=QWEN25_CODER.stop_texts,
        **kw,  # type: ignore[arg-type]
    )


def test_never_is_one_line() -> None:
    r = rules("print(", ")", mode=MultilineMode.NEVER)
    assert r.single_line and not r.mid_line
    assert r.scan("x, y)\nmore").keep == len("x, y)")
    assert r.scan("x, y)\nmore").stop
    assert not r.scan("x, y").stop


def test_end_of_line_cursor_is_multi_line_unless_disabled() -> None:
    assert not rules("x = ").single_line and not rules("x = ").mid_line
    assert rules("x = ", mode=MultilineMode.NEVER).single_line
    always = rules("f(", ")", mode=MultilineMode.ALWAYS)
    assert not always.single_line and not always.mid_line


# The hole of HumanEval/31 as a random span: it starts mid-line and ends mid-word.
PRIME_PREFIX = "    for k in range(2, n - 1):\n        if"
PRIME_SUFFIX = "ue\n"
PRIME_FILL = " n % k == 0:\n            return False\n    return Tr"


def test_mid_line_fill_spans_lines_when_the_model_ends_it() -> None:
    r = rules("        if", "ue", "\n", max_lines=32)
    assert r.mid_line and not r.single_line
    assert not r.scan(PRIME_FILL).stop  # the model decides, not the line break
    assert r.finish(PRIME_FILL, ended=True) == PRIME_FILL


def test_mid_line_fill_falls_back_to_one_line_when_the_model_runs_on() -> None:
    r = rules("        if", "ue", "\n", max_lines=32)
    # max_tokens reached without the end token: only the first line is trusted.
    assert r.finish(PRIME_FILL, ended=False) == " n % k == 0:"
    long = "".join(f"x{i}\n" for i in range(40))
    cut = r.scan(long)
    assert cut.stop  # max_lines bounds the wait for the model
    assert r.finish(long, ended=True) == "x0"


def test_mid_line_shows_only_the_first_line_until_the_model_decides() -> None:
    r = rules("        if", "ue", "\n")
    assert r.provisional(PRIME_FILL) == " n % k == 0:"
    assert r.provisional(" n % k") == " n % k"


def test_mid_line_fill_keeps_the_break_and_indent_that_join_the_suffix() -> None:
    # The hole ends at the start of a line's code: its line break and indent are the seam.
    r = rules("    is_prime = Tr", "return is_prime", "\n")
    fill = "ue\n    for k in ks:\n        is_prime = False\n    "
    assert r.finish(fill, ended=True) == fill


def test_mid_line_fill_that_runs_into_the_suffix_is_cut_where_it_begins() -> None:
    r = rules("    if a < 0:\n        ", "area = a * a", "\n    return area\n")
    text = "return -1\n    area = a * a\n    return area\n"
    cut = r.scan(text)
    assert cut.stop and cut.joined
    assert r.finish(text) == "return -1\n    "


def test_mid_line_fill_may_close_brackets_opened_lines_before() -> None:
    # The hole ends a dict literal begun two lines up: a per-line bracket count would
    # call the "}" unmatched (measured: it rejected a passing fill), the parser does not.
    before = 'D = {\n    8: "Eight",\n    9: "N'
    after = "\nx = sorted(D)\n"
    fill = 'ine",\n}\ny = 1'
    fits = syntax.checker("python", before, after)
    r = rules('    9: "N', "", after)
    assert not r.mid_line  # nothing after the cursor on its line: the block rules apply
    r = rules('    9: "N', "  # nine", after)
    assert r.finish(fill + "  # nine", ended=True, fits=fits).startswith('ine",\n}')


def test_block_ends_at_dedent() -> None:
    r = rules("    ", suffix="\n\ndef other():\n    pass\n")
    text = "total = 0\n    for x in xs:\n        total += x\n    return total\ndef other"
    cut = r.scan(text)
    assert cut.stop
    assert text[: cut.keep] == "total = 0\n    for x in xs:\n        total += x\n    return total"


def test_block_opened_by_the_cursor_line_must_be_deeper() -> None:
    r = rules("def f():")
    text = "\n    return 1\n\nprint(f())"
    assert text[: r.scan(text).keep] == "\n    return 1\n"
    assert r.finish(text) == "\n    return 1"


def test_blank_line_prefix_takes_the_block_from_the_first_line() -> None:
    r = rules("", suffix="\n    return x\n")
    text = "    x = 1\n    y = 2\nz = 3"
    assert text[: r.scan(text).keep] == "    x = 1\n    y = 2"


def test_two_blank_lines_end_it() -> None:
    r = rules("x = ")
    text = "1\ny = 2\n\n\nz = 3"
    assert r.finish(text) == "1\ny = 2"


def test_running_into_the_suffix_stops_before_the_repeat() -> None:
    r = rules("    a = 1", suffix="\n    return a + b\n")
    text = "\n    b = 2\n    return a + b\n"
    cut = r.scan(text)
    assert cut.stop and text[: cut.keep] == "\n    b = 2"


def test_special_token_text_ends_the_completion() -> None:
    r = rules("x = ")
    assert r.finish("42<|endoftext|>junk") == "42"
    assert r.scan("42<|file_sep|>").stop


def test_max_lines() -> None:
    r = rules("", max_lines=2)
    text = "a\nb\nc\nd\n"
    assert text[: r.scan(text).keep] == "a\nb"


@pytest.mark.parametrize(
    ("line_prefix", "line_suffix", "generated", "shown"),
    [
        ("foo(", ")", "a, b)", "a, b"),  # duplicated closer trimmed
        ("foo(", ")", "bar()", "bar()"),  # the ) belongs to bar(
        ("x = [1, ", "]", "2, 3]", "2, 3"),
        ("int f(", ");", "int a);", "int a"),
        ("if x", ":", " > 0:", " > 0"),  # punctuation-only overlap
        ("name = ", "value", "value", "value"),  # letters are never trimmed
        ("print(", ")", ")", ""),
    ],
)
def test_trimming_text_that_duplicates_the_suffix(
    line_prefix: str, line_suffix: str, generated: str, shown: str
) -> None:
    assert rules(line_prefix, line_suffix).finish(generated) == shown


def test_indent_width_counts_tabs() -> None:
    assert indent_width("\t  x") == 6
    assert indent_width("") == 0


def test_a_multi_line_fill_must_not_parse_worse_than_its_first_line() -> None:
    before = "def clamp(v, lo, hi):\n    if v < lo:\n        return lo\n    "
    after = "v\n"
    fits = syntax.checker("python", before, after)
    assert fits is not None
    r = rules("    ", "v", "\n")
    good = "elif v > hi:\n        return hi\n    return "
    assert r.finish(good, ended=True, fits=fits) == good
    # Indented one level too shallow: the document breaks; its first line alone does not.
    bad = "if v > hi:\n    return hi\n    return "
    assert not fits(bad) and fits("if v > hi: ")
    assert r.finish(bad, ended=True, fits=fits) == "if v > hi:"


def test_a_seam_that_indents_the_suffix_wrongly_loses_its_blanks() -> None:
    # HumanEval/56 cut mid-indentation (span set, seed 0): the model wrote the next
    # line's indentation too, and the suffix brings its own; as written the document
    # breaks (the ``if`` indented 10 instead of 8), without the two blanks it parses.
    before = "def ok(s):\n    depth = 0\n    for c in s:\n        if c == '(':\n"
    before += "            depth += 1\n        else:\n      "
    after = "        if depth < 0:\n            return False\n    return depth == 0\n"
    fits = syntax.checker("python", before, after)
    assert fits is not None
    r = rules("      ", "        if depth < 0:", after[after.index("\n") :])
    fill = "      depth -= 1\n  "
    assert not fits(fill) and fits("      depth -= 1\n")
    assert r.finish(fill, ended=True, fits=fits) == "      depth -= 1\n"
    # A seam that joins as written keeps every blank (its indentation is the suffix's).
    r = rules("    is_prime = Tr", "return is_prime", "\n")
    fill = "ue\n    for k in ks:\n        is_prime = False\n    "
    source = "def f(ks):\n    is_prime = Tr"
    fits = syntax.checker("python", source, "return is_prime\n")
    assert fits is not None and fits(fill)
    assert r.finish(fill, ended=True, fits=fits) == fill


def test_a_fill_that_ran_on_past_the_hole_is_cut_where_it_joins_the_suffix() -> None:
    # HumanEval/6 cut from ``max(depth, |`` to ``depth -=| 1`` (span set, seed 1): the
    # model wrote the hole, the `` 1`` and the suffix's next line, then ran on.
    before = "def deepest(s):\n    depth = max_depth = 0\n    for c in s:\n"
    before += "        if c == '(':\n            depth += 1\n            max_depth = max(depth, "
    after = " 1\n\n    return max_depth\n"
    fits = syntax.checker("python", before, after)
    r = rules("            max_depth = max(depth, ", " 1", after[after.index("\n") :])
    fill = "max_depth)\n        else:\n            depth -="
    ran_on = fill + " 1\n    return max_depth\n\n\ndef other():\n    pass\n"
    assert r.finish(ran_on, ended=False, fits=fits) == fill
    # Where it goes on with other code than the suffix's, only its first line is kept.
    other = fill + " 1\n    print(depth)\n    return max_depth\n"
    assert r.finish(other, ended=False, fits=fits) == "max_depth)"
    # Nor where the document would not parse with the fill cut there.
    broken = "max_depth\n        else:\n            depth -= 1\n    return max_depth\n"
    assert r.finish(broken, ended=False, fits=fits) == "max_depth"


def test_a_fill_that_ran_on_past_the_end_of_the_suffix_keeps_what_fills_the_hole() -> None:
    # HumanEval/0's hole ends before `` False``, the function's last word; the model
    # wrote ``return False`` and then a new function.
    before = "def close(xs, t):\n    for a in xs:\n        for b in xs:\n     "
    after = " False\n"
    fits = syntax.checker("python", before, after)
    r = rules("     ", " False", "\n")
    fill = "       if a != b and abs(a - b) < t:\n                return True\n    return"
    text = fill + " False\n\n\ndef far(xs):\n    return xs\n"
    assert r.finish(text, ended=False, fits=fits) == fill


def test_fill_checks_exist_only_for_languages_kode_parses() -> None:
    assert syntax.checker("plaintext", "", "") is None  # others: test_structural_stops
    assert syntax.python_parses("if x:\n    y = 1\n")
    assert not syntax.python_parses("if x:\ny = 1\n")
    assert not syntax.python_parses("x = '\0'")  # null bytes: ValueError, not a crash


def test_the_fill_check_parses_only_the_statement_around_the_cursor() -> None:
    before = "import os\n\n\ndef f(x):\n    if x:\n        "
    after = "\n    return x\n\n\nbroken = (\n"  # an unrelated error further down
    fits = syntax.checker("python", before, after)
    assert fits is not None
    assert fits("x += 1") and not fits("x +=")
    huge = "x = 1\n" + "y = [\n" + "    1,\n" * 20_000
    assert syntax.checker("python", huge, "]\n") is None  # too long for the event loop


def test_a_blank_that_separates_the_fill_from_the_next_word_is_kept() -> None:
    """HumanEval/35 as a random span: ``for e in `` must keep its space before ``l:``."""
    r = rules(" ", "l:", "\n        if e > m:\n")
    assert r.finish("   for e in ", ended=True) == "   for e in "
    assert rules("x = ", "").finish("1  ") == "1"  # end of line: trailing blanks go
    assert rules("f(", ")").finish("a ") == "a"  # punctuation follows: they go too


# HumanEval/123 as a random span: the cursor ends a line of an ``else`` body, and the
# hole holds that line's end and a whole ``while`` loop one level out; the suffix goes on
# inside the loop's body.
COLLATZ_BEFORE = "def f(n):\n    if n % 2 == 0:\n        odd = []\n    else:\n        odd ="
COLLATZ_AFTER = "\n        if n % 2 == 1:\n            odd.append(n)\n    return odd\n"
COLLATZ_FILL = " [n]\n    while n > 1:\n        n = n // 2\n   "


def collatz_rules() -> StopRules:
    return rules("        odd =", "", COLLATZ_AFTER)


def collatz_fits() -> syntax.FillCheck:
    fits = syntax.lazy_checker("python", COLLATZ_BEFORE, COLLATZ_AFTER)
    assert fits is not None
    return fits


def test_a_dedent_that_opens_the_suffixs_block_goes_on_but_shows_only_its_first_part() -> None:
    r = collatz_rules()
    assert r.suffix_indent == 8 and not r.mid_line
    for end in range(len(" [n]\n"), len(COLLATZ_FILL) + 1):
        cut = r.scan(COLLATZ_FILL[:end])
        assert not cut.stop, end  # the dedent may be the hole's own code
        assert r.provisional(COLLATZ_FILL[:end]).rstrip() == " [n]"


def test_the_model_ending_such_a_fill_keeps_it_whole_if_the_document_parses() -> None:
    r, fits = collatz_rules(), collatz_fits()
    whole = COLLATZ_FILL.rstrip()
    assert r.finish(COLLATZ_FILL, ended=True, fits=fits) == whole
    assert fits(whole)
    # Not ended by the model (max_tokens, a cancel): cut at the dedent, as before.
    assert r.finish(COLLATZ_FILL, ended=False, fits=fits) == " [n]"
    # No parser for the language: cut at the dedent.
    assert r.finish(COLLATZ_FILL, ended=True, fits=None) == " [n]"
    # Ended, but the document does not parse with it.
    broken = " [n]\n    while n > 1:\n        n = (n // 2\n"
    assert r.finish(broken, ended=True, fits=fits) == " [n]"


def test_such_a_fill_that_runs_into_the_suffix_is_cut_where_it_starts() -> None:
    r = collatz_rules()
    text = COLLATZ_FILL.rstrip() + "\n        if n % 2 == 1:\n            odd.append(n)\n"
    cut = r.scan(text)
    assert cut.stop and cut.joined and cut.fallback == len(" [n]")
    assert r.finish(text, fits=collatz_fits()) == COLLATZ_FILL.rstrip()


def test_other_dedents_still_end_the_block_at_once() -> None:
    r = collatz_rules()
    # A new top-level definition is the model writing on past the hole.
    assert r.scan(" [n]\ndef g():\n").stop
    # A dedented line that opens no block.
    assert r.scan(" [n]\n    n = 1\n").stop
    # The suffix's next line is not deeper than the dedent: the block ended.
    flat = rules("        odd =", "", "\n    return odd\n")
    assert flat.scan(" [n]\n    while n > 1:\n").stop
    # A second dedent below the opened block ends it; the first cut is kept.
    past = " [n]\n    while n > 1:\n        n -= 1\nx = 1\n"
    cut = r.scan(past)
    assert cut.stop and cut.fallback == len(" [n]")
    assert r.finish(past, ended=True, fits=collatz_fits()) == " [n]"
