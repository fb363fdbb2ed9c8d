"""Project context: the workspace index a window builds, keeps up to date and retrieves
from (``workspace.py`` indexes, ``retrieval.py`` chooses; this room runs them).

The index is built in a thread that waits while the window's model generates
(``generation_started`` / ``generation_ended``), updated when files are saved, created
or deleted, and for an edited open document once the user pauses (``REINDEX_DELAY_S``).
A keystroke never waits for any of it: retrieval uses whatever is indexed so far.

The build and the updates run on daemon threads of their own, never on the event
loop's default executor: whatever a file of the workspace does to a read, it holds up
the index alone (not retrieval, which uses that executor), and closing the window never
waits for them (``close`` stops them; a daemon thread is not joined at exit).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from kode.backends.base import Backend, TokenHealing
from kode.backends.monitor import Names
from kode.completion.clock import Clock
from kode.completion.documents import Document, DocumentStore, file_path
from kode.completion.project.index_worker import read_text
from kode.completion.project.members import Resolver
from kode.completion.project.outline import Measure
from kode.completion.project.receivers import Receivers
from kode.completion.project.retrieval import Retrieved, Retriever
from kode.completion.project.workspace import IndexLimits, WorkspaceIndex
from kode.completion.settings import Settings

log = logging.getLogger("kode.completion")

# An edited document is re-indexed once the user pauses this long (not per keystroke).
REINDEX_DELAY_S = 1.0
# How often the index build, waiting for the model to be idle, looks at its cancel.
_POLL_IDLE_S = 0.25
# Characters of retrieved text asked for per token of ``retrievalTokens`` when no
# tokenizer is at hand (the engine otherwise chooses by the backend's own tokens).
_CHARS_PER_TOKEN = 4

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class ProjectContext:
    """The workspace index of one window, and retrieval from it."""

    def __init__(
        self,
        settings: Callable[[], Settings],
        documents: DocumentStore,
        spawn: Spawn,
        clock: Clock,
    ) -> None:
        self._settings = settings
        self.documents = documents
        self._spawn = spawn
        self._clock = clock
        self.index: WorkspaceIndex | None = None
        self._cancel: threading.Event | None = None
        self._updates: IndexUpdates | None = None
        # Generations of this window under way (suggestions and background work), and
        # an event for the index build's thread, set while there are none.
        self._generating = 0
        self._model_idle = threading.Event()
        self._model_idle.set()
        self._reindex: dict[str, int] = {}  # uri -> document version awaiting re-index
        self.receivers = Receivers(Resolver(self._module_path))
        self._names_failed: set[str] = set()  # the kinds of analysis error logged

    def _module_path(self, name: str) -> Path | None:
        return None if self.index is None else self.index.module_path(name)

    async def names(self, backend: Backend, doc: Document, offset: int, line: str) -> Names | None:
        """The receivers at the cursor whose members are known (the names monitor), for
        a Python document, with ``namesMonitor`` on and a backend that sees every logit
        (a local one: ``TokenHealing``); worked out in a thread (the first time a document's imports
        are read costs tens to hundreds of ms), cached by the text around the cursor's
        line. ``line``: the cursor's line before the generation's first character."""
        if not self._settings().names_monitor or doc.language_id != "python":
            return None
        if not isinstance(backend, TokenHealing):
            return None
        path = file_path(doc.uri)
        index = self.index
        module = (index.module_of(path) if index is not None and path else None) or ""
        package = path is not None and path.name == "__init__.py"
        try:
            return await asyncio.to_thread(
                self.receivers.names, doc.text, offset, line, module, package
            )
        except Exception as exc:  # an analysis bug costs the monitor, not the completion
            kind = type(exc).__name__
            if kind not in self._names_failed:  # once per kind: not at every key
                self._names_failed.add(kind)
                log.warning("names monitor: the analysis failed (%s); unwatched there", kind)
            return None

    def open(self, roots: list[Path]) -> None:
        """Index ``roots`` in a worker thread (setting ``workspaceIndex``)."""
        settings = self._settings()
        if not settings.workspace_index or not roots:
            return
        self.close()
        limits = IndexLimits(settings.index_max_files, settings.index_max_file_bytes)
        index = WorkspaceIndex(roots, limits)
        self.index = index
        self._cancel = cancel = threading.Event()
        self._updates = IndexUpdates(index)
        build = threading.Thread(
            target=self._build, args=(index, cancel), name="kode-index-build", daemon=True
        )
        build.start()

    def forget_index(self) -> None:
        """``close``, and read no more from the index (``workspaceIndex`` turned off)."""
        self.close()
        self.index = None
        self._updates = None

    def close(self) -> None:
        """Stop the index's build, its updates and its parsing child (the index stays
        readable); returns at once, whatever they are doing."""
        if self._cancel is not None:
            self._cancel.set()
        if self._updates is not None:
            self._updates.close()
        if self.index is not None:
            self.index.close()

    # -- the model's turns ---------------------------------------------------------------

    def generation_started(self) -> None:
        self._generating += 1
        self._model_idle.clear()

    def generation_ended(self, _task: asyncio.Future[None] | None = None) -> None:
        self._generating -= 1
        if self._generating == 0:
            self._model_idle.set()

    def _wait_model_idle(self, cancel: threading.Event) -> float:
        """In the index build's thread: wait while this window's model generates (or
        until the build is cancelled); the seconds waited."""
        if self._model_idle.is_set():
            return 0.0
        started = time.perf_counter()
        while not self._model_idle.wait(_POLL_IDLE_S) and not cancel.is_set():
            pass
        return time.perf_counter() - started

    def _build(self, index: WorkspaceIndex, cancel: threading.Event) -> None:
        """The build's thread."""
        try:
            stats = index.build(cancel, functools.partial(self._wait_model_idle, cancel))
        except Exception as exc:  # an unreadable tree must not take the server down
            log.error("workspace index failed: %s", type(exc).__name__)
            return
        if stats.truncated:
            end = " (a limit stopped it)"
        else:
            end = "" if stats.complete else " (stopped before the end)"
        log.info(
            "workspace index: %d files, %d words, ~%.1f MB, %.1f s (%.1f s of it waiting "
            "for the model)%s; skipped: %d not regular files, %d unreadable, %d too slow "
            "to parse",
            stats.files,
            stats.words,
            stats.approx_bytes / 1e6,
            stats.build_s,
            stats.paused_s,
            end,
            stats.skipped_special,
            stats.skipped_unreadable,
            stats.timed_out,
        )

    # -- keeping it up to date -----------------------------------------------------------

    def files_changed(self, changes: list[tuple[str, bool]]) -> None:
        """Saved, created, changed (``False``) or deleted (``True``) files, by URI."""
        updates = self._updates
        if updates is None:
            return
        for uri, deleted in changes:
            path = file_path(uri)
            if path is None:
                continue
            text = None if deleted or uri not in self.documents else self.documents.get(uri).text
            updates.put(path, deleted, text)

    def document_edited(self, uri: str) -> None:
        """Re-index an edited open document once its version stops changing."""
        if self.index is None or uri not in self.documents:
            return
        pending = uri in self._reindex
        self._reindex[uri] = self.documents.get(uri).version
        if not pending:
            self._spawn(self._reindex_when_idle(uri))

    async def _reindex_when_idle(self, uri: str) -> None:
        while True:
            version = self._reindex.get(uri)
            await self._clock.sleep(REINDEX_DELAY_S)
            if uri not in self.documents:
                self._reindex.pop(uri, None)
                return
            if self._reindex.get(uri) == version:
                break
        self._reindex.pop(uri, None)
        self.files_changed([(uri, False)])

    # -- retrieval -----------------------------------------------------------------------

    async def retrieve(
        self, uri: str, text: str, offset: int, counter: Callable[[str], int] | None = None
    ) -> tuple[Retrieved, ...]:
        """Project context for a cursor (setting ``retrievalTokens``), chosen in a worker
        thread by the model's token ``counter`` (characters without one, 4 a token); ()
        without a workspace index."""
        index = self.index
        tokens = self._settings().retrieval_tokens
        if index is None or tokens == 0 or len(index) == 0:
            return ()
        open_texts: dict[Path, str] = {}
        for other in self.documents.others(uri):
            path = file_path(other.uri)
            if path is not None:
                open_texts[path] = other.text
        limit = index.limits.max_file_bytes

        def read(path: Path) -> str | None:
            found = open_texts.get(path)
            return found if found is not None else read_text(path, limit)

        def work() -> tuple[Retrieved, ...]:
            path = file_path(uri)
            resolved = None if path is None else path.resolve()
            retriever = Retriever(index, read)
            if counter is None:
                return tuple(retriever.retrieve(resolved, text, offset, tokens * _CHARS_PER_TOKEN))
            measure = Measure.tokens(counter)
            return tuple(retriever.retrieve(resolved, text, offset, tokens, measure=measure))

        try:
            return await asyncio.to_thread(work)
        except Exception as exc:  # best effort: complete without project context
            log.debug("retrieval failed: %s", type(exc).__name__)
            return ()


class IndexUpdates:
    """The updates of one index, in order, on one daemon thread of their own.

    Latest wins per path: a file saved three times while an update waits is indexed
    once, as it is then. ``close`` stops the thread after the update under way (which
    the index's ``close`` cuts short)."""

    def __init__(self, index: WorkspaceIndex) -> None:
        self._index = index
        self._pending: dict[Path, tuple[bool, str | None]] = {}  # path -> deleted, text
        self._ready = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def put(self, path: Path, deleted: bool, text: str | None) -> None:
        with self._ready:
            if self._closed:
                return
            self._pending.pop(path, None)  # to the end of the line, with its latest state
            self._pending[path] = (deleted, text)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kode-index-updates", daemon=True
                )
                self._thread.start()
            self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._pending.clear()
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                path = next(iter(self._pending))
                deleted, text = self._pending.pop(path)
            try:
                if deleted:
                    self._index.remove(path)
                else:
                    self._index.update(path, text)
            except Exception as exc:  # one odd path must not end the updates
                log.warning("workspace index: an update failed (%s)", type(exc).__name__)
