"""What the model sees: the prefix and suffix around the cursor, within a token budget,
plus other open documents as repository context when they fit.

The prefix window's first line is *anchored*: once chosen it stays put while the
user types, until the prefix outgrows the budget. A moving first line would change
the prompt's first tokens and throw away the whole KV cache on every keystroke.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from kode.completion.documents import LINE_BREAK, Document, split_lines
from kode.completion.project.index_worker import words
from kode.completion.project.outline import SNIPPET_HEADER_TOKENS
from kode.completion.project.retrieval import Retrieved, best_window
from kode.completion.templates import Snippet

CountTokens = Callable[[str], int]

# When the window must move, leave this share of the budget free for what the user types next.
_HEADROOM = 0.25
# A new window (no anchor yet) leaves this much: filled to the brim, the first typed token
# moved it and the whole prompt was evaluated again (seen in large files: 819 of 824
# tokens re-evaluated one line further down); a tenth lets a person type a few lines.
_FIRST_HEADROOM = 0.1
_CHARS_PER_TOKEN_FLOOR = 2  # for cutting a single giant line, never fewer chars per token
_QUERY_LINES = 30  # lines before the cursor that choose the part of a large open document
_MIN_PART_TOKENS = 48  # a part of an open document smaller than this is not worth its header
_MIN_CUT_TOKENS = 16  # a retrieved piece cut to fewer tokens than this is left out


@dataclass(frozen=True, slots=True)
class Budget:
    """Prompt tokens for each part of the context. No defaults of its own but "none" for
    project context: the settings (completion/settings.py) own the users' defaults, and
    completion/windows.py turns them into budgets."""

    prefix_tokens: int
    suffix_tokens: int
    snippet_tokens: int
    # Project context from the workspace index (retrieval.py); 0, when not given: none.
    retrieval_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CompletionContext:
    prefix: str
    suffix: str
    line_prefix: str  # text between the start of the cursor's line and the cursor
    line_suffix: str  # text between the cursor and the end of its line
    prefix_start_line: int  # first document line in the prefix window (the anchor)
    snippets: tuple[Snippet, ...]
    path: str


def prompt_path(uri: str) -> str:
    """The path a prompt shows for a URI (its last two segments, never a local path):
    ``file:///home/u/proj/pkg/mod.py`` -> ``pkg/mod.py``. The local path of a ``file:``
    URI is ``documents.file_path``."""
    parsed = urlparse(uri)
    path = unquote(parsed.path) if parsed.scheme else uri
    parts = [p for p in path.split("/") if p]
    return "/".join(parts[-2:]) if parts else uri


def gather(
    doc: Document,
    offset: int,
    count_tokens: CountTokens,
    budget: Budget,
    *,
    others: Sequence[Document] = (),
    anchor: int | None = None,
    retrieved: Sequence[Retrieved] = (),
) -> CompletionContext:
    """Context for a completion at string index ``offset`` of ``doc``.

    ``anchor``: the prefix start line used for the previous request on this document,
    kept if the prefix from there still fits the budget. ``retrieved``: project context
    in prompt order (``retrieval.Retriever``), fitted to ``budget.retrieval_tokens`` after
    the open documents; pieces of documents already in the prompt whole are left out.
    """
    before, after = doc.text[:offset], doc.text[offset:]
    before_lines = split_lines(before)
    after_lines = split_lines(after)
    line_prefix, line_suffix = before_lines[-1], after_lines[0]
    cursor_line = len(before_lines) - 1

    prefix, start = _prefix_window(before, before_lines, cursor_line, count_tokens, budget, anchor)
    suffix = _suffix_window(after_lines, count_tokens, budget.suffix_tokens)
    query = words("\n".join(before_lines[-_QUERY_LINES:]))
    snippets = _snippets(others, count_tokens, budget.snippet_tokens, query)
    snippets += _project_snippets(retrieved, snippets, count_tokens, budget.retrieval_tokens)
    return CompletionContext(
        prefix=prefix,
        suffix=suffix,
        line_prefix=line_prefix,
        line_suffix=line_suffix,
        prefix_start_line=start,
        snippets=snippets,
        path=prompt_path(doc.uri),
    )


def _prefix_window(
    before: str,
    lines: list[str],
    cursor_line: int,
    count_tokens: CountTokens,
    budget: Budget,
    anchor: int | None,
) -> tuple[str, int]:
    limit = budget.prefix_tokens

    def cost(i: int) -> int:
        return count_tokens(lines[i] if i == cursor_line else lines[i] + "\n")

    if anchor is not None and 0 <= anchor <= cursor_line:
        used = 0
        for i in range(cursor_line, anchor - 1, -1):  # early exit once over budget
            used += cost(i)
            if used > limit:
                break
        else:
            return _join_from(before, lines, anchor), anchor
    # Fill to (1 - headroom) of the budget so the window need not move for a while.
    target = int(limit * (1 - (_FIRST_HEADROOM if anchor is None else _HEADROOM)))
    used, start = cost(cursor_line), cursor_line
    if used > limit:
        # One giant line: keep its end, roughly within budget.
        return lines[-1][-limit * _CHARS_PER_TOKEN_FLOOR :], cursor_line
    while start > 0:
        step = cost(start - 1)
        if used + step > target:
            break
        start -= 1
        used += step
    return _join_from(before, lines, start), start


def _join_from(before: str, lines: list[str], start: int) -> str:
    """``before`` from the start of line ``start`` (original line terminators kept);
    ``lines`` is ``split_lines(before)``."""
    if start == 0:
        return before
    if "\r" not in before:  # one character per terminator: add the lengths up (C speed)
        return before[sum(map(len, lines[:start])) + start :]
    for number, match in enumerate(LINE_BREAK.finditer(before), 1):
        if number == start:
            return before[match.end() :]
    return ""


def _suffix_window(lines: list[str], count_tokens: CountTokens, limit: int) -> str:
    if limit <= 0:
        return ""
    kept: list[str] = []
    used = 0
    for i, line in enumerate(lines):
        piece = line if i == len(lines) - 1 else line + "\n"
        cost = count_tokens(piece)
        if used + cost > limit:
            if i == 0:  # the rest of the cursor line always counts, cut if need be
                kept.append(line[: limit * _CHARS_PER_TOKEN_FLOOR])
            break
        kept.append(piece)
        used += cost
    return "".join(kept)


def _snippets(
    others: Sequence[Document],
    count_tokens: CountTokens,
    limit: int,
    query: Set[str] = frozenset(),
) -> tuple[Snippet, ...]:
    """Other documents, most recently used first chosen, emitted in a stable (URI) order
    so that switching files does not reorder the cached prompt. A document over the
    budget that is left enters in part: its 20-line window most like the lines before
    the cursor (``retrieval.best_window``), cut to fit; before, it was dropped whole, so
    no open file over 512 tokens ever reached the prompt."""
    chosen: list[tuple[str, Snippet]] = []
    used = 0
    for doc in others:
        if not doc.text.strip():
            continue
        cost = count_tokens(doc.text) + 8  # + the file header
        if used + cost <= limit:
            chosen.append((doc.uri, Snippet(prompt_path(doc.uri), doc.text)))
            used += cost
            continue
        left = limit - used - 8
        if left < _MIN_PART_TOKENS:
            continue
        _, part, _ = best_window(doc.text, query, left * 4)
        part = _fit(part, count_tokens, left)
        if part.strip():
            chosen.append((doc.uri, Snippet(prompt_path(doc.uri), part)))
            used += count_tokens(part) + 8
    chosen.sort(key=lambda item: item[0])
    return tuple(snippet for _, snippet in chosen)


def _project_snippets(
    retrieved: Sequence[Retrieved],
    open_snippets: Sequence[Snippet],
    count_tokens: CountTokens,
    limit: int,
) -> tuple[Snippet, ...]:
    """Retrieved pieces that fit ``limit`` tokens, in the order given (the retriever's
    stable prompt order), skipping text the open documents already put in the prompt.

    The engine's retriever chooses by the same tokens, so everything usually fits. What
    does not is settled best first (``Retrieved.score``: definitions of the names the
    code uses, then the outline, then definitions by name, then windows): a piece that
    no longer fits whole is cut to whole lines, and the worst go first. Before, pieces
    were fitted in prompt order and cut from the end, which is where the best sit
    (definitions, nearest the cursor): an outline of numeric constants chosen by
    characters took the whole budget and every definition after it was dropped."""
    if limit <= 0:
        return ()
    present = [s.text for s in open_snippets]
    items = [r for r in retrieved if not any(r.snippet.text in shown for shown in present)]
    costs = [count_tokens(r.snippet.text) + SNIPPET_HEADER_TOKENS for r in items]
    if sum(costs) <= limit:
        return tuple(r.snippet for r in items)
    texts: list[str | None] = [None] * len(items)
    left = limit
    best_first = sorted(range(len(items)), key=lambda i: (-items[i].score, i))
    for i in best_first:
        if costs[i] <= left:
            texts[i] = items[i].snippet.text
            left -= costs[i]
            continue
        if left - SNIPPET_HEADER_TOKENS < _MIN_CUT_TOKENS:
            continue  # too little room to cut it to: a smaller, worse piece may fit whole
        part = _fit(items[i].snippet.text, count_tokens, left - SNIPPET_HEADER_TOKENS)
        if part.strip():
            texts[i] = part
        break  # the rest of the budget went to this piece: the worse ones are left out
    return tuple(
        Snippet(r.snippet.path, text) for r, text in zip(items, texts, strict=True) if text
    )


def _fit(text: str, count_tokens: CountTokens, limit: int) -> str:
    """``text`` cut to whole lines that fit ``limit`` tokens."""
    if limit <= 0:
        return ""
    kept: list[str] = []
    used = 0
    for line in text.splitlines(keepends=True):
        cost = count_tokens(line)
        if used + cost > limit:
            break
        kept.append(line)
        used += cost
    return "".join(kept)
