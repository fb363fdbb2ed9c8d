"""Retrieval for the cursor on fixture projects: import resolution to the right file,
ranking, budgets, stable order between keystrokes; and the context's use of it. No model."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest
from fakes.projects import constants_project, write
from hypothesis import given, settings
from hypothesis import strategies as st
from kode.completion.context import Budget, gather
from kode.completion.documents import Document
from kode.completion.project import retrieval
from kode.completion.project.index_worker import Definition, python_definitions, read_text
from kode.completion.project.outline import Measure, MemberFacts, rank_members, render_outline
from kode.completion.project.retrieval import (
    Binding,
    Retrieved,
    Retriever,
    Source,
    best_window,
    definition_excerpt,
    python_imports,
    resolve_relative,
    select,
)
from kode.completion.project.workspace import IndexLimits, WorkspaceIndex
from kode.completion.templates import Snippet

GEOMETRY = '''"""Shapes."""

import math

TAU_QUILL = 2 * math.pi


def circle_area_quill(radius):
    """Area of a circle."""
    return math.pi * radius**2


def square_area_brisk(side):
    return side * side


class Polygon:
    def perimeter(self):
        return sum(self.sides)
'''

DECOY = '''"""Another module with a name that is not imported."""


def circle_area_quill_decoy(radius):
    return 0
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write(tmp_path, "shapes/__init__.py", "")
    write(tmp_path, "shapes/geometry.py", GEOMETRY)
    write(tmp_path, "shapes/decoy.py", DECOY)
    write(tmp_path, "shapes/sub/__init__.py", "")
    write(tmp_path, "shapes/sub/deep.py", "def deep_helper():\n    return 1\n")
    return tmp_path


def retriever(root: Path) -> Retriever:
    index = WorkspaceIndex([root], IndexLimits(in_child=False))
    index.build()
    return Retriever(index, lambda p: read_text(p, 1_000_000))


def cursor_at_end(text: str) -> tuple[str, int]:
    return text, len(text)


def test_python_imports_bind_modules_and_names() -> None:
    text = (
        "import os, json as j\nimport a.b.c\nfrom . import geometry\n"
        "from ..sub.deep import deep_helper as dh\nfrom .x import (\n    one,\n    two as t,\n)\n"
    )
    got = python_imports(text, "pkg.inner.mod")
    assert got["os"] == Binding("os") and got["j"] == Binding("json")
    assert got["a"] == Binding("a")
    assert got["geometry"] == Binding("pkg.inner", "geometry")
    assert got["dh"] == Binding("pkg.sub.deep", "deep_helper")
    assert got["one"] == Binding("pkg.inner.x", "one") and got["t"] == Binding("pkg.inner.x", "two")


def test_relative_imports_resolve_from_a_package_and_a_module() -> None:
    assert resolve_relative(".util", "pkg.mod") == "pkg.util"
    assert resolve_relative(".util", "pkg", is_package=True) == "pkg.util"
    assert resolve_relative("..", "a.b.c") == "a"
    assert resolve_relative("...", "a.b") is None  # above the top
    assert resolve_relative("os.path", None) == "os.path"


def test_module_import_brings_the_modules_outline_and_named_members(project: Path) -> None:
    app = write(
        project,
        "shapes/app.py",
        "from shapes import geometry\n\n\ndef report(r):\n    total = geometry.TAU_QUILL * r\n"
        "    area = geometry.",
    )
    text, offset = cursor_at_end(app.read_text())
    got = retriever(project).retrieve(app, text, offset, 4000)
    files = {r.file.name for r in got}
    assert "geometry.py" in files and "app.py" not in files  # never the file itself
    outlines = [r for r in got if r.source is Source.OUTLINE]
    assert outlines and "def circle_area_quill(radius):" in outlines[0].snippet.text
    assert outlines[0].snippet.path == "shapes/geometry.py"
    definitions = [r.snippet.text for r in got if r.source is Source.DEFINITION]
    assert any(d.startswith("TAU_QUILL = ") for d in definitions)
    # The decoy defines a similar name but is not imported: its definition stays out.
    assert all("decoy" not in r.file.name or r.source is Source.WINDOW for r in got)


def test_from_import_resolves_to_the_defining_file(project: Path) -> None:
    app = write(
        project,
        "shapes/sub/use.py",
        "from .deep import deep_helper\nfrom ..geometry import square_area_brisk\n\n"
        "x = deep_helper() + square_area_brisk(2)\n",
    )
    text, offset = cursor_at_end(app.read_text())
    got = retriever(project).retrieve(app, text, offset, 4000)
    found = {(r.file.name, r.snippet.text.split("\n", 1)[0]) for r in got}
    assert ("deep.py", "def deep_helper():") in found
    assert ("geometry.py", "def square_area_brisk(side):") in found


def test_nothing_for_an_empty_index_or_budget(tmp_path: Path, project: Path) -> None:
    empty = WorkspaceIndex([tmp_path / "nothing"], IndexLimits(in_child=False))
    assert Retriever(empty, lambda p: None).retrieve(None, "import x\n", 9, 1000) == []
    assert retriever(project).retrieve(None, "from shapes import geometry\n", 10, 0) == []


def test_budget_is_respected_and_best_sources_sit_last(project: Path) -> None:
    app = write(project, "shapes/app.py", "from shapes import geometry\n\ngeometry.TAU_QUILL\n")
    text, offset = cursor_at_end(app.read_text())
    for budget in (120, 300, 600, 4000):
        got = retriever(project).retrieve(app, text, offset, budget)
        assert sum(len(r.snippet.text) + len(r.snippet.path) + 16 for r in got) <= budget
        scores = [r.score for r in got]
        assert scores == sorted(scores)
        assert got[-1].source is Source.DEFINITION  # the named member, nearest the cursor


def test_the_best_piece_sits_nearest_the_cursor(tmp_path: Path) -> None:
    """Prompt order is the pieces' score, the best last: a definition found only by name
    (a guess) comes before the outline of a module the code imports, and the outline of
    the module used most before the others'. Before, every definition came after every
    outline, and outlines came in path order."""
    write(tmp_path, "pkg/__init__.py", "")
    spare = "class Spare:\n    pass\n"
    write(tmp_path, "pkg/aaa.py", "def first_helper_quill(x):\n    return x\n" + spare)
    write(tmp_path, "pkg/zzz.py", "def parse_pattern_quill(text):\n    return text\n" + spare)
    write(tmp_path, "pkg/consts.py", "MAXREPEAT_LIMIT = 9\n")
    text = (
        "from . import aaa, zzz\n\n\ndef compile_pattern(pattern):\n"
        "    limit = MAXREPEAT_LIMIT\n    aaa.first_helper_quill(pattern)\n"
        "    pattern = zzz.parse_pattern_quill(pattern)\n    pattern = zzz.\n"
    )
    main = write(tmp_path, "pkg/main.py", text)
    got = retriever(tmp_path).retrieve(main, text, len(text), 4000)
    assert [r.score for r in got] == sorted(r.score for r in got)
    kinds = [(r.source.name, r.file.name) for r in got]
    assert kinds.index(("DEFINITION", "consts.py")) < kinds.index(("OUTLINE", "aaa.py"))
    assert kinds.index(("OUTLINE", "aaa.py")) < kinds.index(("OUTLINE", "zzz.py"))


def test_a_module_used_just_above_the_cursor_joins_the_outline(tmp_path: Path) -> None:
    """Of more imported modules than the outline takes, those the last lines use rank
    first: ``from . import type_f`` on the line above the cursor, six other modules each
    used three times further up (sympy's ``cartan_type.py``). Before, every use counted
    the same wherever it was, and ``type_f``, used once, was left out."""
    write(tmp_path, "pkg/__init__.py", "")
    for k in "abcdefg":
        text = f"class Type{k.upper()}Quill:\n    pass\n\n\nclass Helper{k.upper()}:\n    pass\n"
        write(tmp_path, f"pkg/type_{k}.py", text)
    head = "from . import type_a, type_b, type_c, type_d, type_e, type_g\n\n\ndef kind(n, k):\n"
    uses = "".join(
        f"    if k == '{k}':\n        return type_{k}.Type{k.upper()}Quill(n), type_{k}\n"
        for k in "abcdeg"
    )
    filler = "    n = n + 1\n" * 18
    text = head + uses + filler + "    if k == 'f':\n        from . import type_f\n        return "
    main = write(tmp_path, "pkg/cartan.py", text)
    got = retriever(tmp_path).retrieve(main, text, len(text), 4000)
    outlined = {r.file.name for r in got if r.source is Source.OUTLINE}
    assert "type_f.py" in outlined and len(outlined) == 6


def test_snippets_stay_the_same_while_a_line_is_typed(project: Path) -> None:
    """Typing inside a line changes the snippets only when a typed name resolves, so the
    cached prompt (snippets first) is reused keystroke after keystroke."""
    head = "from shapes import geometry\n\n\ndef report(r):\n    x = r * 2\n"
    line = "    area = geometry.circle_area_quill(r) + len(str(r))"
    r = retriever(project)
    seen: list[tuple[tuple[str, str], ...]] = []
    for i in range(len("    "), len(line) + 1):
        text = head + line[:i]
        got = r.retrieve(None, text, len(text), 2000)
        key = tuple((x.snippet.path, x.snippet.text) for x in got)
        if not seen or seen[-1] != key:
            seen.append(key)
    assert len(seen) <= 3, [len(k) for k in seen]


def test_language_agnostic_lookup_by_name(tmp_path: Path) -> None:
    write(
        tmp_path, "web/util.ts", "export function formatPriceQuill(v: number) {\n  return v;\n}\n"
    )
    main = write(tmp_path, "web/main.ts", "const shown = formatPriceQuill(total);\n")
    text = main.read_text()
    got = retriever(tmp_path).retrieve(main, text, len(text), 2000)
    assert [r.file.name for r in got if r.source is Source.DEFINITION] == ["util.ts"]


def test_similar_windows_rank_the_matching_file_first(tmp_path: Path) -> None:
    body = "\n".join(
        f"value_{i} = compute_invoice_total(ledger_entries, tax_rate_{i})" for i in range(5)
    )
    write(tmp_path, "billing.py", "# billing\n" + body + "\n")
    write(tmp_path, "noise.py", "def unrelated():\n    return 42\n" * 5)
    main = write(tmp_path, "main.py", "import os\n")
    query = "total = compute_invoice_total(ledger_entries, tax_rate)\n" * 3 + "\n"
    got = retriever(tmp_path).retrieve(main, query, len(query), 2000)
    windows = [r for r in got if r.source is Source.WINDOW]
    assert windows and windows[0].file.name == "billing.py"


def test_definition_excerpt_stops_at_the_next_definition() -> None:
    defs = python_definitions(GEOMETRY)
    excerpt = definition_excerpt(GEOMETRY, defs["circle_area_quill"], 1000)
    assert excerpt.startswith("def circle_area_quill(radius):")
    assert "square_area_brisk" not in excerpt and "return math.pi" in excerpt


def test_outline_ranks_members_by_the_code_around_the_cursor() -> None:
    """The name is not written yet: the words around the hole, rare among the module's
    names, point to it; a private name used nowhere else, and one the file already
    writes, count less; a neighbour of a member the file uses counts more."""
    a, b = Path("a.py"), Path("b.py")
    defs = [
        (a, Definition("parse_content_type_header", 0, "def parse_content_type_header(value):")),
        (
            a,
            Definition(
                "parse_content_disposition_header",
                1,
                "def parse_content_disposition_header(value):",
            ),
        ),
        (a, Definition("_private_helper", 2, "def _private_helper():")),
        (a, Definition("get_address", 3, "def get_address(value):")),
        (b, Definition("WS_1000_NORMAL_CLOSURE", 10, "WS_1000_NORMAL_CLOSURE = 1000")),
        (b, Definition("WS_1011_INTERNAL_ERROR", 12, "WS_1011_INTERNAL_ERROR = 1011")),
        (b, Definition("HTTP_200_OK", 40, "HTTP_200_OK = 200")),
    ]
    query = {"content": 1.0, "disposition": 1.0, "header": 1.0, "value": 0.5}
    facts = {a: MemberFacts(), b: MemberFacts(used_lines=frozenset({10}))}
    ranked = [m.definition.name for m in rank_members(defs, query, facts, {"get_address"})]
    assert ranked[0] == "parse_content_disposition_header"
    assert ranked.index("WS_1011_INTERNAL_ERROR") < ranked.index("HTTP_200_OK")
    assert ranked[-2:] == ["get_address", "_private_helper"]
    # Used in other files of the workspace, a private name is API after all.
    counts = {"_private_helper": 4}
    facts = {a: MemberFacts(files_with=counts), b: MemberFacts(files_with=counts)}
    ranked = [m.definition.name for m in rank_members(defs, {}, facts)]
    assert ranked[0] == "_private_helper"


def test_outline_fits_the_budget_in_file_order(project: Path) -> None:
    app = write(
        project,
        "shapes/app.py",
        "from shapes import geometry\n\n\ndef polygon_perimeter(p):\n    \n",
    )
    text = app.read_text()
    offset = text.index("    \n") + 4
    for budget in (60, 120, 4000):
        got = retriever(project).retrieve(app, text, offset, budget)
        outlines = [r for r in got if r.source is Source.OUTLINE]
        assert sum(len(r.snippet.text) + len(r.snippet.path) + 16 for r in got) <= budget
        if budget >= 120:
            lines = outlines[0].snippet.text.splitlines()
            assert "class Polygon:" in lines  # "polygon" is written above the cursor
            if budget == 4000:
                assert lines == [
                    "TAU_QUILL = 2 * math.pi",
                    "def circle_area_quill(radius):",
                    "def square_area_brisk(side):",
                    "class Polygon:",
                ]
    assert render_outline([Definition("x", 0, "y" * 300)]) == "y" * 100 + "\n"


def test_retrieval_doctests() -> None:
    assert doctest.testmod(retrieval).failed == 0


def test_a_large_open_document_enters_the_prompt_in_part() -> None:
    """Before, an open document over the snippet budget was dropped whole."""
    filler = "".join(f"def filler_{i}(a):\n    return a + {i}\n\n" for i in range(200))
    wanted = "def parse_ledger_quill(ledger):\n    return ledger.entries\n"
    big = Document(
        "file:///p/big.py", filler[: len(filler) // 2] + wanted + filler[len(filler) // 2 :]
    )
    doc = Document("file:///p/main.py", "entries = parse_ledger_quill(ledger)\nx = ")

    def count(text: str) -> int:
        return len(text.split()) + 1

    ctx = gather(doc, len(doc.text), count, Budget(200, 10, 120), others=[big])
    [snippet] = ctx.snippets
    assert "parse_ledger_quill" in snippet.text
    assert sum(count(line) for line in snippet.text.splitlines(keepends=True)) <= 120


def test_retrieved_pieces_fit_their_budget_and_skip_what_is_open() -> None:
    shown = Document("file:///p/geometry.py", GEOMETRY)
    doc = Document("file:///p/main.py", "x = ")

    def item(text: str, line: int) -> Retrieved:
        return Retrieved(Source.DEFINITION, Path("/p/g.py"), line, Snippet("p/g.py", text))

    retrieved = [item("def square_area_brisk(side):\n", 1), item("z = 1\n" * 40, 2)]

    def count(text: str) -> int:
        return len(text.split()) + 1

    ctx = gather(doc, 4, count, Budget(50, 10, 500, 40), others=[shown], retrieved=retrieved)
    texts = [s.text for s in ctx.snippets]
    assert texts[0] == GEOMETRY  # the open document, whole
    assert "def square_area_brisk(side):\n" not in texts[1:]  # already in the prompt
    assert texts[1].startswith("z = 1\n") and sum(count(t) for t in texts[1].splitlines()) <= 40


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(
        st.sampled_from(["alpha beta", "gamma_delta", "x = 1", "", "epsilon zeta"]), max_size=60
    ),
    query=st.sets(st.sampled_from(["alpha", "beta", "gamma_delta", "epsilon", "zeta", "x"])),
    max_chars=st.integers(min_value=1, max_value=400),
)
def test_best_window_is_a_run_of_whole_lines_within_the_limit(
    lines: list[str], query: set[str], max_chars: int
) -> None:
    text = "".join(line + "\n" for line in lines)
    start, window, score = best_window(text, query, max_chars, lines=5)
    assert 0.0 <= score <= 1.0
    assert len(window) <= max_chars
    assert text.startswith(window) if start == 0 else window in text
    if window and len(window.split("\n", 1)[0]) < max_chars:
        assert window.endswith("\n")


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.tuples(
            st.sampled_from(list(Source)), st.integers(0, 5), st.integers(0, 300), st.floats(0, 5)
        ),
        max_size=12,
    ),
    max_chars=st.integers(0, 1500),
)
def test_select_fits_the_budget_in_prompt_order_without_duplicates(
    items: list[tuple[Source, int, int, float]], max_chars: int
) -> None:
    candidates = [
        Retrieved(source, Path(f"/w/f{line % 3}.py"), line, Snippet("f.py", "y" * size), score)
        for source, line, size, score in items
    ]
    chosen = select(candidates, max_chars)
    assert sum(len(r.snippet.text) + len(r.snippet.path) + 16 for r in chosen) <= max_chars
    assert [r.order for r in chosen] == sorted(r.order for r in chosen)
    assert len({(r.file, r.line) for r in chosen}) == len(chosen)


def dense_count(text: str) -> int:
    """A tokenizer for which constants are dear: every run of digits or letters and
    every other character is a token (an outline of numeric constants runs ~2 characters
    a token, prose and code ~4)."""
    return len(re.findall(r"[A-Za-z]+|\d|[^\sA-Za-z\d]", text)) + 1


def test_retrieval_chosen_by_real_tokens_fits_and_keeps_the_definitions(tmp_path: Path) -> None:
    """Chosen by characters, the outline of constants alone overran the token budget; by
    the model's tokens (``Measure.tokens``) the pieces fit it and the definitions of the
    names used at the cursor are among them."""
    app = constants_project(tmp_path)
    text = app.read_text()
    measure = Measure.tokens(dense_count)
    for budget in (120, 256, 512):
        got = retriever(tmp_path).retrieve(app, text, len(text), budget, measure=measure)
        assert sum(dense_count(r.snippet.text) + 8 for r in got) <= budget
        definitions = [r.snippet.text for r in got if r.source is Source.DEFINITION]
        assert any("run_until_first_complete_quill" in d for d in definitions), budget
        assert any(r.source is Source.OUTLINE for r in got), budget
    # The outline still takes up to its share (60%) of what the definitions leave.
    got = retriever(tmp_path).retrieve(app, text, len(text), 512, measure=measure)
    outline = sum(dense_count(r.snippet.text) + 8 for r in got if r.source is Source.OUTLINE)
    assert 0.3 * 512 <= outline <= 0.6 * 512


def test_an_overlong_piece_early_in_the_prompt_no_longer_pushes_the_best_out() -> None:
    """What overruns the budget is cut from the worst piece, not from the prompt's end
    (where the best sit): before, an outline chosen by characters took all 512 tokens and
    the definitions after it were dropped."""
    doc = Document("file:///p/endpoints.py", "code = status.")
    outline = Retrieved(
        Source.OUTLINE,
        Path("/p/status.py"),
        -1,
        Snippet("status.py", "".join(f"WS_{1000 + i} = {1000 + i}\n" for i in range(80))),
        3.2,
    )
    defs = [
        Retrieved(
            Source.DEFINITION,
            Path("/p/concurrency.py"),
            line,
            Snippet("concurrency.py", f"async def helper_{line}(*args):\n    return args\n"),
            4.0,
        )
        for line in (0, 10)
    ]
    window = Retrieved(Source.WINDOW, Path("/p/other.py"), 3, Snippet("other.py", "x = 1\n"), 0.2)
    retrieved = [window, outline, *defs]  # prompt order
    ctx = gather(doc, len(doc.text), dense_count, Budget(50, 10, 0, 120), retrieved=retrieved)
    paths = [s.path for s in ctx.snippets]
    assert paths == ["status.py", "concurrency.py", "concurrency.py"]  # order kept
    assert [s.text for s in ctx.snippets[1:]] == [d.snippet.text for d in defs]  # whole
    assert ctx.snippets[0].text.startswith("WS_1000 = 1000\n")  # cut to whole lines
    assert sum(dense_count(s.text) + 8 for s in ctx.snippets) <= 120
    # When everything fits, nothing changes: every piece, in the order given.
    roomy = gather(doc, len(doc.text), dense_count, Budget(50, 10, 0, 4000), retrieved=retrieved)
    assert [s.text for s in roomy.snippets] == [r.snippet.text for r in retrieved]
