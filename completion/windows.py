"""Which window of the document a generation reads, and its prompt.

The full window is the context budget around the cursor (prefix, suffix, other open
documents, project context). On a small CPU evaluating all of it at a fresh place takes
seconds, so a keystroke may spend at most ``firstAnswerMs`` evaluating prompt tokens at
the measured prefill speed (``PrefillRate``). The rule, in order (``decide``):

1. No budget (``firstAnswerMs: 0``), no speed known yet, or a backend without a prompt
   cache: the full window.
2. The full window, if what it still needs to evaluate fits the budget.
2a. The full window assembled from chunks read earlier (``chunkMemoryMb``), if what
   assembling it evaluates fits.
3. The full window with the project context it was prepared with, if the newly
   retrieved context changed (a name typed on the line resolved) and that one fits:
   the new snippets are prepared in the background for the next keystrokes.
4. The largest short window remembered for the document (answered or prepared lately,
   its KV state kept by the backend) that still holds the cursor and fits.
5. A new short window sized to fit, remembered for the next keystrokes.

Background preparation (``to_prepare``) works towards the full window: the full one
assembled if that fits a reading pause (``PREPARE_HORIZON_S``) and what a keystroke at
the pause's end may evaluate (``firstAnswerMs``; an assembly stopped by a keystroke
keeps the chunks it placed, so the keystroke evaluates only the rest) and evaluating it
whole does not; else first a window that fits the pause when the full one does not, then
the full one, assembled where that evaluates fewer tokens than evaluating it (on a slow
or busy machine assembling may not fit the pause either, yet it still costs the least).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kode.backends.base import Backend, ChunkAssembly, PrefillRate, PromptCache, TokenHealing
from kode.backends.errors import SettingsError
from kode.completion import context as ctxmod
from kode.completion import healing
from kode.completion.documents import Document, DocumentStore, file_name, scrub
from kode.completion.project.retrieval import Retrieved
from kode.completion.settings import Settings
from kode.completion.templates import TEMPLATES, FimTemplate, render

log = logging.getLogger("kode.completion")

# What a person reading before typing gives the machine: a prepared window is sized to be
# evaluated within this (3 s of reading buys ~300 tokens of the 1.5B on 2 cores).
PREPARE_HORIZON_S = 2.5
# Short windows remembered per document (their KV states are kept by the backend).
SHORT_WINDOWS = 3
# Context lines whose token counts are kept (``count_tokens``): the full windows of a
# few documents; lines of 40 characters take ~3 MB.
COUNTED_LINES = 16384
# The smallest window a keystroke answers from, whatever the budget allows.
MIN_WINDOW_TOKENS = 16
# Tokens of the FIM template itself (special tokens, the file path, the repo name) and
# slack for line-wise counting, which can undercount the joined prompt by a few tokens.
_PROMPT_OVERHEAD = 64


@dataclass(frozen=True, slots=True)
class Choice:
    """The window a keystroke answers from, and why (in sizes only)."""

    ctx: ctxmod.CompletionContext
    kind: str  # full | full, assembled | full, prepared snippets | short, remembered | short, new
    left: int = 0  # prompt tokens still to evaluate
    allowed: int | None = None  # what fits firstAnswerMs (None: no budget)
    full_left: int = 0  # what the full window would evaluate

    @property
    def short(self) -> bool:
        return self.kind.startswith("short")

    @property
    def assemble(self) -> bool:
        return self.kind == "full, assembled"


def decide(
    full_left: int,
    allowed: int | None,
    kept_left: int | None,
    known_lefts: Sequence[int],
    assembled_left: int | None = None,
) -> tuple[str, int | None]:
    """The rule of the module docstring, on sizes alone: which window (and for a
    remembered one, its index in ``known_lefts``, largest window first).

    >>> decide(900, 100, None, [40, 8])
    ('short, remembered', 0)
    >>> decide(900, 100, 60, []), decide(900, 100, 60, [], assembled_left=90)
    (('full, prepared snippets', None), ('full, assembled', None))
    >>> decide(90, 100, None, []), decide(900, None, None, []), decide(900, 30, None, [40])
    (('full', None), ('full', None), ('short, new', None))
    """
    if allowed is None or full_left <= allowed:
        return "full", None
    if assembled_left is not None and assembled_left <= allowed:
        return "full, assembled", None
    if kept_left is not None and kept_left <= allowed:
        return "full, prepared snippets", None
    for i, left in enumerate(known_lefts):
        if left <= allowed:
            return "short, remembered", i
    return "short, new", None


class Windows:
    """The windows and prompts of one window's documents: the full window's anchor per
    document (kept stable while typing), the short windows remembered, and the project
    context each document's window was last evaluated with."""

    def __init__(
        self, settings: Callable[[], Settings], documents: DocumentStore, rate: PrefillRate
    ) -> None:
        self._settings = settings
        self.documents = documents
        self.rate = rate
        self._anchors: dict[str, int] = {}
        self._short: dict[str, list[tuple[int, ctxmod.Budget]]] = {}
        self._evaluated_retrieval: dict[str, tuple[Retrieved, ...]] = {}
        self._counter: Callable[[str], int] | None = None
        self._counter_owner: Backend | None = None
        self.assembled = 0  # keystrokes and prefetches answered from assembled windows

    def forget(self, uri: str) -> None:
        self._anchors.pop(uri, None)
        self._short.pop(uri, None)
        self._evaluated_retrieval.pop(uri, None)

    def kept_documents(self) -> set[str]:
        """The documents something is kept for (open ones only)."""
        return {*self._anchors, *self._short, *self._evaluated_retrieval}

    def _forget_closed(self) -> None:
        """Forget the documents no longer open: what is kept per document is bounded by
        the open documents even where ``forget`` was not called (a document closed
        because an edit could not be read)."""
        for uri in [u for u in self.kept_documents() if u not in self.documents]:
            self.forget(uri)

    # -- prompts ---------------------------------------------------------------------------

    def count_tokens(self, backend: Backend) -> Callable[[str], int]:
        """Token counts of context lines, cached: per keystroke only one line changes."""
        if self._counter is None or self._counter_owner is not backend:
            self._counter = lru_cache(maxsize=COUNTED_LINES)(backend.count_tokens)
            self._counter_owner = backend
        return self._counter

    def template(self) -> FimTemplate:
        name = self._settings().template
        try:
            return TEMPLATES[name]
        except KeyError:
            raise SettingsError(
                f"unknown template {name!r}; known: {', '.join(TEMPLATES)}"
            ) from None

    def heal(self, ctx: ctxmod.CompletionContext, backend: Backend) -> str:
        """The end of the prefix to heal (``completion/healing.py``), if any."""
        if not self._settings().token_healing or not isinstance(backend, TokenHealing):
            return ""
        return healing.heal_text(ctx.line_prefix, backend.last_token_chars)

    def prompt(self, uri: str, ctx: ctxmod.CompletionContext, heal: str = "") -> str:
        """The prompt for ``ctx``, its prefix without the ``heal`` text at its end."""
        # Document text is scrubbed when stored; the URI (path, repo name) is not.
        return scrub(
            render(
                self.template(),
                ctx.prefix[: len(ctx.prefix) - len(heal)],
                ctx.suffix,
                path=ctx.path,
                repo=repo_name(uri),
                snippets=ctx.snippets,
            )
        )

    def to_evaluate(self, uri: str, ctx: ctxmod.CompletionContext, backend: Backend) -> int:
        """Prompt tokens a generation from ``ctx`` would still evaluate (0 if unknown)."""
        if not isinstance(backend, PromptCache):
            return 0
        cached, total = backend.cached_prefix(self.prompt(uri, ctx, self.heal(ctx, backend)))
        return total - cached

    def to_assemble(self, uri: str, ctx: ctxmod.CompletionContext, backend: Backend) -> int | None:
        """Prompt tokens the window of ``ctx`` assembled from stored chunks would still
        evaluate; None without a chunk store (``chunkMemoryMb``) or where assembling it
        would take nothing from the store."""
        if not self._settings().chunk_memory_mb or not isinstance(backend, ChunkAssembly):
            return None
        taken, total = backend.assembled_prefix(self.prompt(uri, ctx, self.heal(ctx, backend)))
        return total - taken if taken else None

    # -- windows ---------------------------------------------------------------------------

    def full(
        self,
        uri: str,
        doc: Document,
        offset: int,
        backend: Backend,
        retrieved: tuple[Retrieved, ...] = (),
    ) -> ctxmod.CompletionContext:
        settings = self._settings()
        ctx = ctxmod.gather(
            doc,
            offset,
            self.count_tokens(backend),
            prompt_budget(settings, settings.max_tokens),
            others=self.documents.others(uri) if settings.snippet_tokens else (),
            anchor=self._anchors.get(uri),
            retrieved=retrieved,
        )
        self._anchors[uri] = ctx.prefix_start_line
        self._forget_closed()
        return ctx

    def short(
        self, uri: str, doc: Document, offset: int, backend: Backend, tokens: int
    ) -> ctxmod.CompletionContext:
        """A window of about ``tokens`` prompt tokens around the cursor, no other files;
        remembered for this document so the next keystrokes reuse its cache."""
        budget = ctxmod.Budget(
            prefix_tokens=max(MIN_WINDOW_TOKENS, tokens * 4 // 5),
            suffix_tokens=min(self._settings().suffix_tokens, tokens // 5),
            snippet_tokens=0,
        )
        ctx = ctxmod.gather(doc, offset, self.count_tokens(backend), budget, anchor=None)
        kept = [w for w in self._short.get(uri, []) if w[1] != budget]
        self._short[uri] = [(ctx.prefix_start_line, budget), *kept][:SHORT_WINDOWS]
        return ctx

    def known(
        self, uri: str, doc: Document, offset: int, backend: Backend
    ) -> list[ctxmod.CompletionContext]:
        """This document's remembered short windows that still hold the cursor, largest
        first."""
        found = []
        for anchor, budget in self._short.get(uri, []):
            ctx = ctxmod.gather(doc, offset, self.count_tokens(backend), budget, anchor=anchor)
            if ctx.prefix_start_line == anchor:
                found.append((budget.prefix_tokens, ctx))
        return [ctx for _, ctx in sorted(found, key=lambda f: -f[0])]

    def for_request(
        self,
        uri: str,
        doc: Document,
        offset: int,
        backend: Backend,
        retrieved: tuple[Retrieved, ...] = (),
    ) -> Choice:
        """The window a keystroke answers from (the rule of the module docstring)."""
        previous = self._evaluated_retrieval.get(uri)
        full = self.full(uri, doc, offset, backend, retrieved)
        budget_ms = self._settings().first_answer_ms
        allowed = self.rate.tokens_within(budget_ms) if budget_ms else None
        if allowed is None or not isinstance(backend, PromptCache):
            self._evaluated_retrieval[uri] = retrieved
            return Choice(full, "full")
        allowed = max(allowed, MIN_WINDOW_TOKENS)
        left = self.to_evaluate(uri, full, backend)
        kept, kept_left = None, None
        if left > allowed and previous is not None and previous != retrieved:
            kept = self.full(uri, doc, offset, backend, previous)
            kept_left = self.to_evaluate(uri, kept, backend)
        known: list[ctxmod.CompletionContext] = []
        known_lefts: list[int] = []
        if left > allowed and (kept_left is None or kept_left > allowed):
            for ctx in self.known(uri, doc, offset, backend):
                known.append(ctx)
                known_lefts.append(self.to_evaluate(uri, ctx, backend))
                if known_lefts[-1] <= allowed:
                    break  # the largest that fits: the rest are not needed
        assembled_left = self.to_assemble(uri, full, backend) if left > allowed else None
        kind, index = decide(left, allowed, kept_left, known_lefts, assembled_left)
        if kind == "full":
            self._evaluated_retrieval[uri] = retrieved
            choice = Choice(full, kind, left, allowed)
        elif kind == "full, assembled":
            assert assembled_left is not None
            self._evaluated_retrieval[uri] = retrieved
            self.assembled += 1
            choice = Choice(full, kind, assembled_left, allowed, left)
        elif kind == "full, prepared snippets":
            assert kept is not None
            assert kept_left is not None
            choice = Choice(kept, kind, kept_left, allowed, left)
        elif index is not None:
            choice = Choice(known[index], kind, known_lefts[index], allowed, left)
        else:
            ctx = self.short(uri, doc, offset, backend, allowed)
            choice = Choice(ctx, kind, allowed, allowed, left)
        _log_window(uri, choice)
        return choice

    def to_prepare(
        self,
        uri: str,
        doc: Document,
        offset: int,
        backend: Backend,
        retrieved: tuple[Retrieved, ...],
    ) -> Choice | None:
        """What background preparation evaluates next at the cursor; None once the full
        window is evaluated."""
        full = self.full(uri, doc, offset, backend, retrieved)
        left = self.to_evaluate(uri, full, backend)
        if left <= 1:
            self._evaluated_retrieval[uri] = retrieved
            return None
        horizon = self.rate.tokens_within(PREPARE_HORIZON_S * 1000)
        if horizon is None or not self._settings().first_answer_ms or left <= horizon:
            self._evaluated_retrieval[uri] = retrieved
            return Choice(full, "full", left, horizon)
        assembled_left = self.to_assemble(uri, full, backend)
        # A keystroke at the pause's end finishes a stopped assembly within its own
        # budget: the full window then, where a short one first would answer from less.
        key = self.rate.tokens_within(self._settings().first_answer_ms) or 0
        ready = assembled_left is not None and assembled_left <= horizon + key
        # Assembling evaluates the least even past that (left > horizon here), so once
        # a short window is ready it is the way to the full window too.
        ready = ready or any(
            self.to_evaluate(uri, ctx, backend) <= 1
            for ctx in self.known(uri, doc, offset, backend)
        )
        if ready:
            self._evaluated_retrieval[uri] = retrieved
            if assembled_left is not None and assembled_left < left:
                return Choice(full, "full, assembled", assembled_left, horizon, left)
            return Choice(full, "full", left, horizon)
        short = self.short(uri, doc, offset, backend, horizon)
        return Choice(short, "short, new", horizon, horizon, left)


def _log_window(uri: str, choice: Choice) -> None:
    """Which window a keystroke answers from, in sizes only (``kode -vv lsp``)."""
    if log.isEnabledFor(logging.DEBUG) and choice.allowed is not None:
        also = f"; the full window would evaluate {choice.full_left}" if choice.full_left else ""
        log.debug(
            "window for %s: %s, %d prompt tokens to evaluate, %d fit firstAnswerMs%s",
            file_name(uri),
            choice.kind,
            choice.left,
            choice.allowed,
            also,
        )


def prompt_budget(settings: Settings, max_tokens: int) -> ctxmod.Budget:
    """The context budget, shrunk in proportion so that prompt plus ``max_tokens`` fits
    ``contextSize``: otherwise every long file answers "context overflow".

    >>> prompt_budget(Settings(context_size=1024), 128)
    Budget(prefix_tokens=403, suffix_tokens=25, snippet_tokens=201, retrieval_tokens=201)
    """
    parts = (
        settings.prefix_tokens,
        settings.suffix_tokens,
        settings.snippet_tokens,
        settings.retrieval_tokens,
    )
    room = settings.context_size - max_tokens - _PROMPT_OVERHEAD
    scale = min(1.0, max(room, 1) / sum(parts))
    prefix, suffix, snippets, retrieval = (int(n * scale) for n in parts)
    return ctxmod.Budget(max(1, prefix), suffix, snippets, retrieval)


def repo_name(uri: str) -> str:
    """The repository name shown to the model: the folder holding the file."""
    parent = Path(ctxmod.prompt_path(uri)).parent.name
    return parent or "workspace"
