"""The Kode language server: LSP in, ``completion`` calls out. No model state lives here.

Requests and notifications handled:

- ``initialize`` (settings from ``initializationOptions``), ``initialized`` (warms up
  the model in the background), ``workspace/didChangeConfiguration``;
- ``textDocument/didOpen|didChange|didClose`` (full and incremental sync);
- the workspace index (``completion/workspace.py``): the folders from ``initialize``,
  ``textDocument/didSave``, ``workspace/didChangeWatchedFiles`` (a watcher for every
  file is registered when the client allows it) and ``workspace/didChangeWorkspaceFolders``;
- ``textDocument/inlineCompletion`` (LSP 3.18), an ``async`` handler: pygls cancels
  its task on ``$/cancelRequest`` and answers -32800, and the engine stops the
  generation within one decode step;
- ``kode/stats``: backend counters and the active settings (for status bars and tests).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import msgspec
from kode.completion import settings as settings_mod
from kode.completion.backend_factory import load_backend
from kode.completion.documents import Position, Range
from kode.completion.engine import (
    BackendFactory,
    BackendPool,
    CompletionEngine,
    PartialCallback,
    Superseded,
)
from kode.lsp.errors import to_lsp_error
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

log = logging.getLogger("kode.lsp")

VERSION = "0.1.0"
STATS_METHOD = "kode/stats"
PARTIAL_METHOD = "kode/inlineCompletionPartial"


class KodeProtocol(LanguageServerProtocol):
    """pygls' protocol, answering requests whose params cannot be read.

    pygls logs such a request and drops it, leaving the client waiting forever; LSP
    wants an error response (-32602), which this sends before the message is dropped.
    """

    def structure_message(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if "id" in data and "method" in data:
                message = f"invalid params for {data['method']}: {exc.__cause__ or exc}"
                self._send_response(
                    data["id"], error=JsonRpcInvalidParams(message).to_response_error()
                )
            raise


class KodeServer(LanguageServer):
    """pygls server holding one ``CompletionEngine``."""

    def __init__(self, backend_factory: BackendFactory | None = None) -> None:
        super().__init__(
            "kode",
            VERSION,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            protocol_cls=KodeProtocol,
        )
        self.pool = BackendPool(load_backend)
        self.engine = CompletionEngine(backend_factory or self.pool.get)
        self._pending_messages: list[str] = []
        self.workspace_roots: list[Path] = []
        self._warmup: asyncio.Task[Any] | None = None

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Log only: a failed request already got its error response."""
        log.error("%s: %s", getattr(source, "__name__", source), error)

    def apply_settings(self, raw: Any) -> list[str]:
        parsed, problems = settings_mod.parse(raw)
        self.engine.update_settings(parsed)
        return problems

    def report_problems(self, problems: list[str]) -> None:
        for problem in problems:
            log.warning("setting rejected: %s", problem)
            self.window_show_message(
                types.ShowMessageParams(type=types.MessageType.Warning, message=f"Kode: {problem}")
            )


def build_server(backend_factory: BackendFactory | None = None) -> KodeServer:
    server = KodeServer(backend_factory)

    @server.feature(types.INITIALIZE)
    def initialize(params: types.InitializeParams) -> None:
        server._pending_messages = server.apply_settings(params.initialization_options)
        server.workspace_roots = _workspace_roots(params)

    @server.feature(types.INITIALIZED)
    def initialized(params: types.InitializedParams) -> None:
        server.report_problems(server._pending_messages)
        server._pending_messages = []
        if server.engine.settings.enabled:
            server._warmup = asyncio.ensure_future(_warm_up(server))
            server.engine.open_workspace(server.workspace_roots)
            if server.engine.workspace is not None:
                _watch_files(server)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(params: types.DidSaveTextDocumentParams) -> None:
        server.engine.files_changed([(params.text_document.uri, False)])

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(params: types.DidChangeWatchedFilesParams) -> None:
        deleted = types.FileChangeType.Deleted
        server.engine.files_changed([(c.uri, c.type == deleted) for c in params.changes])

    @server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    def did_change_workspace_folders(params: types.DidChangeWorkspaceFoldersParams) -> None:
        event = params.event
        removed = {_uri_path(f.uri) for f in event.removed}
        roots = [r for r in server.workspace_roots if r not in removed]
        roots += [p for f in event.added if (p := _uri_path(f.uri)) is not None]
        server.workspace_roots = roots
        server.engine.open_workspace(roots)

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(params: types.DidChangeConfigurationParams) -> None:
        server.report_problems(server.apply_settings(params.settings))

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: types.DidOpenTextDocumentParams) -> None:
        doc = params.text_document
        server.engine.documents.open(doc.uri, doc.text, doc.version, doc.language_id)
        server.engine.document_opened(doc.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: types.DidChangeTextDocumentParams) -> None:
        changes: list[tuple[str, Range | None]] = []
        for change in params.content_changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                r = change.range
                changes.append(
                    (
                        change.text,
                        Range(
                            Position(r.start.line, r.start.character),
                            Position(r.end.line, r.end.character),
                        ),
                    )
                )
            else:
                changes.append((change.text, None))
        uri = params.text_document.uri
        if uri not in server.engine.documents:
            log.warning("didChange for a document that is not open: %s", uri)
            return
        server.engine.documents.change(uri, params.text_document.version, changes)
        server.engine.document_changed(uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    async def did_close(params: types.DidCloseTextDocumentParams) -> None:
        await server.engine.cancel(params.text_document.uri)
        server.engine.documents.close(params.text_document.uri)

    @server.feature(
        types.TEXT_DOCUMENT_INLINE_COMPLETION,
        types.InlineCompletionOptions(),
    )
    async def inline_completion(
        params: types.InlineCompletionParams,
    ) -> types.InlineCompletionList | None:
        engine = server.engine
        if not engine.settings.enabled:
            return types.InlineCompletionList(items=[])
        pos = Position(params.position.line, params.position.character)
        uri = params.text_document.uri
        on_partial = None
        if engine.settings.partial_completions and uri in engine.documents:
            on_partial = _partial_sender(server, server.protocol.msg_id, uri, params.position)
        try:
            result = await engine.complete(uri, pos, on_partial=on_partial)
        except Superseded:
            return types.InlineCompletionList(items=[])
        except Exception as exc:
            raise to_lsp_error(exc) from exc
        if not result.text:
            return types.InlineCompletionList(items=[])
        item = types.InlineCompletionItem(
            insert_text=result.text,
            range=types.Range(params.position, params.position),
        )
        log.info(
            "completion %s v%s: %d tokens, ttft %.0f ms, %.1f ms/token, total %.0f ms",
            _short(params.text_document.uri),
            result.version,
            result.stats.completion_tokens,
            result.stats.ttft_ms,
            result.stats.ms_per_token,
            result.total_ms,
        )
        return types.InlineCompletionList(items=[item])

    @server.feature(STATS_METHOD)
    def stats(params: Any) -> dict[str, Any]:
        backend = server.pool.current
        counters = getattr(backend, "counters", None)
        return {
            "backend": None if backend is None else backend.name,
            "model": None if backend is None else backend.model_name,
            "counters": None if counters is None else counters.as_dict(),
            "engine": {
                "typedAheadHits": server.engine.typed_ahead_hits,
                "prefetches": server.engine.prefetches,
                "readAheads": server.engine.read_aheads,
            },
            "settings": msgspec.to_builtins(server.engine.settings),
            "workspace": _index_stats(server),
        }

    @server.feature(types.SHUTDOWN)
    async def shutdown(params: Any) -> None:
        await server.engine.aclose()
        await server.pool.aclose()

    return server


def _partial_sender(
    server: KodeServer, request_id: object, uri: str, position: types.Position
) -> PartialCallback:
    """Send ``kode/inlineCompletionPartial`` for one request (see docs/protocol.md)."""
    version = server.engine.documents.get(uri).version

    def send(text: str) -> None:
        server.protocol.notify(
            PARTIAL_METHOD,
            {
                "requestId": request_id,
                "textDocument": {"uri": uri, "version": version},
                "position": {"line": position.line, "character": position.character},
                "text": text,
            },
        )

    return send


async def _warm_up(server: KodeServer) -> None:
    """Load (and on first use, install) the model now rather than on the first keystroke."""
    try:
        await server.engine.backend()
    except Exception as exc:
        log.error("could not load the model: %s", exc)
        server.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Error, message=f"Kode: {exc}")
        )


def _index_stats(server: KodeServer) -> dict[str, Any] | None:
    """Counts only: the index never reports paths or text."""
    index = server.engine.workspace
    if index is None:
        return None
    stats = index.stats
    return {
        "files": stats.files,
        "words": stats.words,
        "postings": stats.postings,
        "approxBytes": stats.approx_bytes,
        "complete": stats.complete,
        "truncated": stats.truncated,
        "skipped": {
            "ignored": stats.skipped_ignored,
            "binary": stats.skipped_binary,
            "large": stats.skipped_large,
        },
    }


def _uri_path(uri: str) -> Path | None:
    parsed = urlparse(uri)
    return Path(url2pathname(parsed.path)) if parsed.scheme == "file" else None


def _workspace_roots(params: types.InitializeParams) -> list[Path]:
    """The workspace folders, else the (deprecated) root URI, else the root path."""
    if params.workspace_folders:
        found = [_uri_path(f.uri) for f in params.workspace_folders]
        return [p for p in found if p is not None]
    if params.root_uri:
        root = _uri_path(params.root_uri)
        return [] if root is None else [root]
    return [Path(params.root_path)] if params.root_path else []


def _watch_files(server: KodeServer) -> None:
    """Ask the client to report file changes under the workspace (if it can be asked)."""
    caps = server.client_capabilities.workspace
    watched = None if caps is None else caps.did_change_watched_files
    if watched is None or not watched.dynamic_registration:
        return
    options = types.DidChangeWatchedFilesRegistrationOptions(
        watchers=[types.FileSystemWatcher(glob_pattern="**/*")]
    )
    registration = types.Registration(
        id="kode-workspace-index",
        method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
        register_options=options,
    )
    server.client_register_capability(types.RegistrationParams(registrations=[registration]))


def _short(uri: str) -> str:
    return uri.rsplit("/", 1)[-1]
