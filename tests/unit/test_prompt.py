"""Context gathering within a token budget, and FIM prompt rendering."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from kode.completion.context import Budget, _join_from, gather, prompt_path
from kode.completion.documents import Document, Position, split_lines
from kode.completion.templates import QWEN25_CODER, FimOrder, FimTemplate, Snippet, render


def words(text: str) -> int:
    """A deterministic stand-in tokenizer: one token per whitespace-separated word + 1."""
    return len(text.split()) + 1


def test_render_psm_plain_and_with_repository_context() -> None:
    assert (
        render(QWEN25_CODER, "def add(a, b):\n    ", "\n")
        == "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n<|fim_middle|>"
    )
    prompt = render(
        QWEN25_CODER,
        "x = ",
        "\n",
        path="pkg/main.py",
        repo="proj",
        snippets=[Snippet("pkg/util.py", "def helper(): ...")],
    )
    assert prompt == (
        "<|repo_name|>proj\n<|file_sep|>pkg/util.py\ndef helper(): ...\n"
        "<|file_sep|>pkg/main.py\n<|fim_prefix|>x = <|fim_suffix|>\n<|fim_middle|>"
    )


def test_templates_are_data_spm_order_is_a_value_not_code() -> None:
    spm = FimTemplate("x", "<P>", "<S>", "<M>", order=FimOrder.SPM)
    assert render(spm, "pre", "suf") == "<S>suf<P>pre<M>"


def test_gather_splits_prefix_and_suffix_at_the_cursor() -> None:
    doc = Document("file:///p/a.py", "line one\nline two\nhello world\nafter\n")
    offset = doc.offset_at(Position(2, 5))
    ctx = gather(doc, offset, words, Budget(100, 100, 0))
    assert ctx.prefix == "line one\nline two\nhello"
    assert ctx.suffix == " world\nafter\n"
    assert (ctx.line_prefix, ctx.line_suffix) == ("hello", " world")
    assert ctx.path == "p/a.py"


def test_prefix_budget_keeps_whole_lines_nearest_the_cursor() -> None:
    lines = [f"w{i} " * 3 for i in range(50)]
    doc = Document("file:///a.py", "\n".join(lines))
    offset = len(doc.text)
    ctx = gather(doc, offset, words, Budget(prefix_tokens=20, suffix_tokens=0, snippet_tokens=0))
    kept = ctx.prefix.split("\n")
    assert kept[-1] == lines[-1]
    assert sum(words(line + "\n") for line in kept[:-1]) + words(kept[-1]) <= 20
    assert ctx.prefix_start_line == 50 - len(kept)


def test_prefix_window_stays_anchored_while_typing() -> None:
    doc = Document("file:///a.py", "\n".join(f"a b c {i}" for i in range(40)) + "\n")
    budget = Budget(prefix_tokens=30, suffix_tokens=0, snippet_tokens=0)
    first = gather(doc, len(doc.text), words, budget)
    doc.apply_change(doc.text + "x")
    second = gather(doc, len(doc.text), words, budget, anchor=first.prefix_start_line)
    assert second.prefix_start_line == first.prefix_start_line
    # Once the budget overflows the window moves, leaving headroom for what comes next.
    doc.apply_change(doc.text + " y" * 40)
    third = gather(doc, len(doc.text), words, budget, anchor=first.prefix_start_line)
    assert third.prefix_start_line > first.prefix_start_line


def test_a_new_window_leaves_room_to_type_a_line() -> None:
    doc = Document("file:///a.py", "\n".join(f"a b c {i}" for i in range(400)) + "\n")
    budget = Budget(prefix_tokens=200, suffix_tokens=0, snippet_tokens=0)
    first = gather(doc, len(doc.text), words, budget)
    assert sum(words(line) for line in first.prefix.split("\n")) <= 180
    doc.apply_change(doc.text + "x = compute ( a , b , c ) + offset * scale - 1")
    second = gather(doc, len(doc.text), words, budget, anchor=first.prefix_start_line)
    assert second.prefix_start_line == first.prefix_start_line


def test_suffix_budget_and_giant_lines_are_cut() -> None:
    doc = Document("file:///a.py", "x" + "\n".join(["s t u"] * 20))
    ctx = gather(doc, 1, words, Budget(prefix_tokens=10, suffix_tokens=9, snippet_tokens=0))
    assert ctx.suffix.count("\n") == 2
    giant = Document("file:///b.py", "y " * 1000)
    ctx = gather(giant, len(giant.text), words, Budget(10, 0, 0))
    assert 0 < len(ctx.prefix) <= 20


def test_snippets_that_fit_are_included_in_stable_order() -> None:
    others = [
        Document("file:///p/z.py", "def z(): pass"),
        Document("file:///p/big.py", "w " * 500),
        Document("file:///p/a.py", "def a(): pass"),
    ]
    doc = Document("file:///p/main.py", "x")
    ctx = gather(doc, 1, words, Budget(10, 10, 30), others=others)
    assert [s.path for s in ctx.snippets] == ["p/a.py", "p/z.py"]


def test_uri_to_path_is_short_and_unquoted() -> None:
    assert prompt_path("file:///home/u/proj/pkg/my%20mod.py") == "pkg/my mod.py"
    assert prompt_path("untitled:Untitled-1") == "Untitled-1"


@given(st.lists(st.tuples(st.text("ab \t", max_size=5), st.sampled_from(["\n", "\r\n", "\r"]))))
def test_the_prefix_window_starts_exactly_at_its_first_line(parts: list[tuple[str, str]]) -> None:
    """Line ``k`` of the text before the cursor starts where the first ``k`` lines and
    their terminators (any of LSP's three) end."""
    # A line may be empty, but "\r" and a "\n" after it would make one terminator.
    parts = [
        (line or "x", end) if i and parts[i - 1][1] == "\r" else (line, end)
        for i, (line, end) in enumerate(parts)
    ]
    before = "".join(line + end for line, end in parts) + "tail"
    lines = split_lines(before)
    for k in range(len(lines)):
        expected = before[sum(len(line) + len(end) for line, end in parts[:k]) :]
        assert _join_from(before, lines, k) == expected
