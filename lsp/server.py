"""The Kode language server: LSP in, ``completion`` calls out. No model state lives here.

Requests and notifications handled:

- ``initialize`` (settings from ``initializationOptions``), ``initialized`` (warms up
  the model in the background), ``workspace/didChangeConfiguration``;
- ``textDocument/didOpen|didChange|didClose`` (full and incremental sync);
- the workspace index (``completion/project/workspace.py``): the folders from ``initialize``,
  ``textDocument/didSave``, ``workspace/didChangeWatchedFiles`` (a watcher for every
  file is registered when the client allows it) and ``workspace/didChangeWorkspaceFolders``;
- ``textDocument/inlineCompletion`` (LSP 3.18), an ``async`` handler: pygls cancels
  its task on ``$/cancelRequest`` and answers -32800, and the engine stops the
  generation within one decode step;
- ``kode/stats``: backend counters and the active settings (for status bars and tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from threading import Event
from typing import Any, BinaryIO, ClassVar

from kode.backends.defaults import KODE_VERSION
from kode.backends.errors import BackendClosed, DocumentError, Superseded, describe
from kode.completion import settings as settings_mod
from kode.completion.backend_factory import BackendPool, load_backend
from kode.completion.documents import Position, Range, file_name, file_path
from kode.completion.edits.next_edits import NextEdit
from kode.completion.engine import BackendFactory, CompletionEngine
from kode.completion.settings import Settings
from kode.completion.suggestion import PartialCallback
from kode.lsp import framing
from kode.lsp.errors import to_lsp_error
from kode.lsp.stats import stats_report
from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
)
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import JsonRPCRequestMessage, LanguageServerProtocol

log = logging.getLogger("kode.lsp")

STATS_METHOD = "kode/stats"
PARTIAL_METHOD = "kode/inlineCompletionPartial"
CURSOR_METHOD = "kode/didMoveCursor"
INLINE_EDIT_METHOD = "kode/inlineEdit"  # the next edit (docs/protocol.md)
# ``shutdown`` is answered within SHUTDOWN_S, whatever is still closing (a model being
# loaded, an engine that does not answer); after ``exit``, or the end of the client's
# stream, the process is gone within EXIT_S, whatever threads still run (a read stuck
# in a hung filesystem, a generation's last step): an editor that closes leaves nothing.
SHUTDOWN_S = 5.0
EXIT_S = 1.0


class _HideSource(logging.Filter):
    """pygls logs message bodies and params: every response (completions), a failed
    notification's params (a whole didOpen). Unless ``logPrompts`` is on, those
    arguments are replaced; the rest of each line (method, id) stays."""

    HIDDEN = "(not logged: logPrompts is off)"
    # pygls' format string -> which of its arguments may quote code
    QUOTING: ClassVar[dict[str, tuple[int, ...]]] = {
        "Sending data: %s": (0,),
        "Failed to handle notification %r: %s": (1,),
        "Failed to handle request %s %s %s": (2,),
        "Unable to deserialize message\n%s": (0,),
        'Unknown message "%s"': (0,),
        "Sending notification: '%s' %s": (1,),
        'Sending request with id "%s": %s %s': (2,),
        'Received result for message "%s": %s': (1,),
        'Received error response to message "%s": %s': (1,),
        "Client response for %s received: %s": (0, 1),
    }

    def __init__(self) -> None:
        super().__init__()
        self.log_prompts = False

    def filter(self, record: logging.LogRecord) -> bool:
        hide = self.QUOTING.get(str(record.msg))
        if hide and not self.log_prompts and isinstance(record.args, tuple):
            record.args = tuple(
                self.HIDDEN if i in hide else arg for i, arg in enumerate(record.args)
            )
        return True


_hide_source = _HideSource()
logging.getLogger("pygls.protocol.json_rpc").addFilter(_hide_source)


class KodeProtocol(LanguageServerProtocol):
    """pygls' protocol, answering what pygls leaves unanswered.

    - A request whose params cannot be read: pygls logs it and drops it, leaving the
      client waiting forever; LSP wants an error response (-32602), sent here.
    - A body that is not JSON but shows a request id: -32700 (``lsp.framing``).
    - A request after ``shutdown``: pygls drops it with a log line; LSP wants
      InvalidRequest (-32600).
    - A request without ``params`` (JSON-RPC allows it): pygls fails to read it.
    """

    def handle_event(self, event: framing.Event) -> None:
        """One event of ``framing.FrameParser``; never raises (the reader goes on)."""
        if isinstance(event, framing.ParseError):
            log.warning("a message could not be read as JSON (%s)", event.reason)
            if event.request_id is not None:
                parse = JsonRpcParseError(f"Kode could not read the message: {event.reason}")
                self._send_response(event.request_id, error=parse.to_response_error())
            return
        if isinstance(event, framing.Rejected):
            log.warning("message refused: %s", _describe(event.error))
            return
        if not hasattr(event.value, "jsonrpc"):
            log.warning("dropped a JSON value that is not a JSON-RPC message")
            if isinstance(event.value, dict) and isinstance(event.value.get("id"), int | str):
                invalid = JsonRpcInvalidRequest("not a JSON-RPC 2.0 message")
                self._send_response(event.value["id"], error=invalid.to_response_error())
            return
        try:
            self.handle_message(event.value)
        except Exception as exc:
            log.error("could not handle a message: %s", _describe(exc))

    def handle_message(self, message: Any) -> None:
        request = isinstance(message, JsonRPCRequestMessage)
        if self._shutdown and request and message.method != types.EXIT:
            error = JsonRpcInvalidRequest(
                f"the server is shutting down; {message.method} is not served"
            )
            self._send_response(message.id, error=error.to_response_error())
            return
        super().handle_message(message)

    def structure_message(self, data: dict[str, Any]) -> Any:
        if "method" in data and "params" not in data and "jsonrpc" in data:
            data = {**data, "params": None}  # JSON-RPC lets params be left out; pygls not
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            method = data.get("method")
            if "id" in data and method is not None:
                message = f"invalid params for {method}: {exc.__cause__ or exc}"
                self._send_response(
                    data["id"], error=JsonRpcInvalidParams(message).to_response_error()
                )
            elif method == types.TEXT_DOCUMENT_DID_CHANGE:
                # lsprotocol refuses a negative position; dropping the edit would leave
                # our text different from the editor's for good. Clamp it as LSP clamps
                # positions past the end, and say so if even that cannot be read.
                clamped = _clamp_positions(data)
                if clamped is not None:
                    with contextlib.suppress(JsonRpcException):
                        result = super().structure_message(clamped)
                        log.warning("didChange with a negative position: clamped to 0")
                        return result
                if isinstance(self._server, KodeServer):
                    self._server.out_of_sync(data)
            raise


class KodeServer(LanguageServer):
    """pygls server holding one ``CompletionEngine``."""

    frame_idle_s = framing.IDLE_S  # tests shorten it

    def __init__(self, backend_factory: BackendFactory | None = None) -> None:
        super().__init__(
            "kode",
            KODE_VERSION,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            protocol_cls=KodeProtocol,
        )
        self.pool = BackendPool(functools.partial(load_backend, notify=self.notice))
        self.engine = CompletionEngine(backend_factory or self.pool.get)
        self.pending_messages: list[str] = []  # settings problems, told once initialized
        self.told: set[str] = set()  # completion failures shown to the user (tell_once)
        self.workspace_roots: list[Path] = []
        self.warmup: asyncio.Task[Any] | None = None
        self.initialized = False  # ``initialized`` came: settings may start work now
        self._watching = False  # the file watchers are registered
        self._own_process = False  # served by ``start_io``/``start_tcp``: may end it
        self._exit_timer: threading.Timer | None = None

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Log only: a failed request already got its error response."""
        log.error("%s: %s", getattr(source, "__name__", source), _describe(error))

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """pygls' stdio server, reading through ``lsp.framing`` (resynchronising)."""
        self._stop_event = Event()
        self._own_process = True
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        read = framing.stdin_reader(stdin or sys.stdin.buffer, self.thread_pool)
        try:
            asyncio.run(self._serve(read))
        except BrokenPipeError:
            log.error("the connection to the client is lost; shutting down")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.exit_soon()
            self.shutdown()  # type: ignore[no-untyped-call]

    def start_tcp(self, host: str, port: int) -> None:
        """pygls' TCP server (one client), reading through ``lsp.framing``."""
        self._stop_event = Event()
        self._own_process = True

        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.protocol.set_writer(writer)
            await self._serve(framing.stream_reader(reader))
            self.shutdown()  # type: ignore[no-untyped-call]

        async def main() -> None:
            self._server = await asyncio.start_server(connection, host, port)
            async with self._server:
                await self._server.serve_forever()

        try:
            with contextlib.suppress(asyncio.CancelledError):
                asyncio.run(main())
        finally:
            self.exit_soon()

    async def _serve(self, read: Callable[[], Awaitable[bytes]]) -> None:
        protocol = self.protocol
        assert isinstance(protocol, KodeProtocol)
        parser = framing.FrameParser(json.JSONDecoder(object_hook=protocol.structure_message))
        stop = self._stop_event
        await framing.serve(
            read,
            protocol,
            parser,
            stopped=lambda: stop is None or stop.is_set(),
            idle_s=self.frame_idle_s,
        )
        self.exit_soon()  # the client's stream ended: nothing more will be asked

    def exit_soon(self) -> None:
        """End this process within ``EXIT_S``: the clean ending goes on meanwhile, and
        whatever it would wait for (a thread in a read, in a generation's step, in a
        model's load; ``asyncio.run`` and the interpreter join such threads) is not
        waited for. Only a process this server owns (``start_io``, ``start_tcp``),
        never a test's that serves it in its own loop."""
        if not self._own_process or self._exit_timer is not None:
            return
        code = 0 if getattr(self.protocol, "_shutdown", False) else 1  # LSP: 1 unasked
        self._exit_timer = threading.Timer(EXIT_S, _end_process, args=(code,))
        self._exit_timer.daemon = True
        self._exit_timer.start()

    def apply_settings(self, raw: Any) -> list[str]:
        before = self.engine.settings
        parsed, problems = settings_mod.parse(raw)
        self.engine.update_settings(parsed)
        _hide_source.log_prompts = parsed.log_prompts
        self.told.clear()  # new settings may fail differently, or the same way again
        if self.initialized:
            self.start_work(before)
        return problems

    def start_work(self, before: Settings | None) -> None:
        """Start what the settings ask for and ``before`` (the settings until now; None at
        ``initialized``) did not: the model's warm-up once completion is turned on, the
        workspace index (and its file watchers) once it is wanted or its limits change,
        or its end once it is not wanted any more."""
        now = self.engine.settings
        turned_on = now.enabled and (before is None or not before.enabled)
        if turned_on and (self.warmup is None or self.warmup.done()):
            self.warmup = asyncio.ensure_future(_warm_up(self))
        if before is not None and _index_key(before) == _index_key(now):
            return
        if not (now.enabled and now.workspace_index):
            if before is not None:
                self.engine.close_workspace()
            return
        self.engine.open_workspace(self.workspace_roots)
        if self.engine.workspace is not None and not self._watching:
            self._watching = True
            _watch_files(self)

    def out_of_sync(self, data: dict[str, Any]) -> None:
        """A didChange could not be read: this document's text here no longer matches
        the editor's, so stop completing it until it is reopened, and say so."""
        params = data.get("params")
        document = params.get("textDocument") if isinstance(params, dict) else None
        uri = document.get("uri") if isinstance(document, dict) else None
        if not isinstance(uri, str) or uri not in self.engine.documents:
            return
        self.engine.close_document(uri)  # its generation too: nothing will show there
        self.window_show_message(
            types.ShowMessageParams(
                type=types.MessageType.Warning,
                message=f"Kode: an edit to {file_name(uri)} could not be read; completions "
                "stop there until the file is closed and reopened",
            )
        )

    def tell_once(self, message: str) -> bool:
        """Show a completion failure (``window/showMessage``) unless it was shown since
        the last success or settings change; True if shown now. A failure that repeats
        on every keystroke (an unreachable server, a context that cannot fit) is told
        once, as an error answer plus a message; its repeats answer an empty list."""
        if message in self.told:
            return False
        self.told.add(message)
        log.error("completion failed: %s", message)
        self.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Error, message=message)
        )
        return True

    def notice(self, message: str) -> None:
        """Tell the user something about the engine (e.g. that this window fell back to
        its own copy of the model)."""
        log.warning("%s", message)
        self.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Warning, message=message)
        )

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
        server.pending_messages = server.apply_settings(params.initialization_options)
        server.workspace_roots = _workspace_roots(params)

    @server.feature(types.INITIALIZED)
    def initialized(params: types.InitializedParams) -> None:
        server.report_problems(server.pending_messages)
        server.pending_messages = []
        server.initialized = True
        server.start_work(None)

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
        removed = {file_path(f.uri) for f in event.removed}
        roots = [r for r in server.workspace_roots if r not in removed]
        roots += [p for f in event.added if (p := file_path(f.uri)) is not None]
        server.workspace_roots = roots
        settings = server.engine.settings
        if settings.enabled and settings.workspace_index:
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
        server.engine.apply_changes(uri, params.text_document.version, changes)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: types.DidCloseTextDocumentParams) -> None:
        # Synchronous like didOpen, so the two run in the order they came: VS Code sends
        # close and open of one URI together when a file's language mode changes.
        server.engine.close_document(params.text_document.uri)

    @server.feature(CURSOR_METHOD)
    def did_move_cursor(params: Any) -> None:
        """``{"textDocument": {"uri"}, "position": {"line", "character"}}``: the cursor
        settled there; prepare that place (docs/protocol.md). Malformed params are
        ignored: a notification has no answer to carry an error."""
        try:
            uri = params.textDocument.uri
            line, character = int(params.position.line), int(params.position.character)
        except (AttributeError, TypeError, ValueError):
            log.warning("%s: malformed params ignored", CURSOR_METHOD)
            return
        if isinstance(uri, str) and line >= 0 and character >= 0:
            server.engine.cursor_moved(uri, Position(line, character))

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
        # The editor's completion list has an item selected: complete as if it were
        # accepted, and answer with that item extended (an editor shows nothing else then).
        info = params.context.selected_completion_info
        selected = None
        if info is not None:
            start, end = info.range.start, info.range.end
            replaced = Range(
                Position(start.line, start.character), Position(end.line, end.character)
            )
            selected = (replaced, info.text)
        on_partial = None
        if engine.settings.partial_completions and uri in engine.documents:
            on_partial = _partial_sender(server, server.protocol.msg_id, uri, params.position, info)
        try:
            result = await engine.complete(uri, pos, on_partial=on_partial, selected=selected)
        except (Superseded, BackendClosed):  # obsolete: a newer request, new settings
            return types.InlineCompletionList(items=[])
        except DocumentError as exc:  # this request's own fault: answer it, every time
            raise to_lsp_error(exc) from None
        except Exception as exc:  # the model, the remote server, the settings
            error = to_lsp_error(exc)
            if not server.tell_once(error.message):
                return types.InlineCompletionList(items=[])  # told already
            raise error from None  # the cause's text may quote source code
        server.told.clear()  # working again: a later failure is news
        if not result.text:
            return await _next_edit_item(server, uri, pos)
        item = types.InlineCompletionItem(
            insert_text=result.text,
            range=types.Range(params.position, params.position),
        )
        if info is not None:
            item = types.InlineCompletionItem(insert_text=info.text + result.text, range=info.range)
        log.info(
            "completion %s v%s: %d tokens, ttft %.0f ms, %.1f ms/token, total %.0f ms",
            file_name(params.text_document.uri),
            result.version,
            result.stats.completion_tokens,
            result.stats.ttft_ms,
            result.stats.ms_per_token,
            result.total_ms,
        )
        return types.InlineCompletionList(items=[item])

    @server.feature(INLINE_EDIT_METHOD)
    async def inline_edit(params: Any) -> dict[str, Any]:
        """``{"textDocument": {"uri", "version"?}, "position"}`` -> ``{"edits": [...]}``
        (shaped like Copilot's ``textDocument/copilotInlineEdit``; docs/protocol.md). An
        empty list: nothing to suggest, next edits off, or a version the editor left."""
        try:
            document, position = params.textDocument, params.position
            uri = document.uri
            version = getattr(document, "version", None)
            pos = Position(int(position.line), int(position.character))
            if not isinstance(uri, str) or not (version is None or isinstance(version, int)):
                raise TypeError
        except (AttributeError, TypeError, ValueError):
            raise JsonRpcInvalidParams(
                f"{INLINE_EDIT_METHOD}: expected textDocument.uri, textDocument.version "
                "and position.line/character"
            ) from None
        if not server.engine.settings.enabled:
            return {"edits": []}
        try:
            edit = await server.engine.next_edit(uri, pos, version)
        except DocumentError as exc:
            raise to_lsp_error(exc) from None
        return {"edits": [] if edit is None else [_edit_json(edit)]}

    @server.feature(STATS_METHOD)
    def stats(params: Any) -> dict[str, Any]:
        return stats_report(server.engine, server.pool.current)

    @server.feature(types.SHUTDOWN)
    async def shutdown(params: Any) -> None:
        try:
            async with asyncio.timeout(SHUTDOWN_S):
                await _close(server)
        except TimeoutError:
            log.warning("closing took more than %.0f s; the rest ends with the process", SHUTDOWN_S)

    @server.feature(types.EXIT)
    def on_exit(params: Any) -> None:
        server.exit_soon()

    return server


async def _close(server: KodeServer) -> None:
    warmup = server.warmup
    if warmup is not None and not warmup.done():
        warmup.cancel()  # nothing to tell the user about a window that is closing
        with contextlib.suppress(asyncio.CancelledError):
            await warmup
    await server.engine.aclose()
    await server.pool.aclose()


def _end_process(code: int) -> None:
    """``EXIT_S`` after ``exit`` the process is still there: something it would wait
    for still runs. Said once in the log, then the process ends without waiting."""
    others = (threading.current_thread(), threading.main_thread())
    running = [t.name for t in threading.enumerate() if t not in others]
    log.warning("ending the process; still running: %s", ", ".join(sorted(running)) or "-")
    for stream in (sys.stderr, sys.stdout):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _partial_sender(
    server: KodeServer,
    request_id: object,
    uri: str,
    position: types.Position,
    selected: types.SelectedCompletionInfo | None,
) -> PartialCallback:
    """Send ``kode/inlineCompletionPartial`` for one request (see docs/protocol.md): the
    text to insert at ``position``, or with a selected completion item, that item's text
    and what follows, to replace its ``range``."""
    version = server.engine.documents.get(uri).version
    params: dict[str, Any] = {
        "requestId": request_id,
        "textDocument": {"uri": uri, "version": version},
        "position": {"line": position.line, "character": position.character},
    }
    prefix = ""
    if selected is not None:
        start, end = selected.range.start, selected.range.end
        params["range"] = {
            "start": {"line": start.line, "character": start.character},
            "end": {"line": end.line, "character": end.character},
        }
        prefix = selected.text

    def send(text: str) -> None:
        server.protocol.notify(PARTIAL_METHOD, {**params, "text": prefix + text})

    return send


async def _warm_up(server: KodeServer) -> None:
    """Load (and on first use, install) the model now rather than on the first keystroke,
    and learn this machine's prefill speed."""
    try:
        await server.engine.warm_up()
    except BackendClosed:
        pass  # the settings changed meanwhile: the new backend warms up on first use
    except Exception as exc:  # told once: the first completion failing the same way is quiet
        server.tell_once(to_lsp_error(exc).message)


def _edit_json(edit: NextEdit) -> dict[str, Any]:
    start, end = edit.range.start, edit.range.end
    return {
        "textDocument": {"uri": edit.uri, "version": edit.version},
        "range": {
            "start": {"line": start.line, "character": start.character},
            "end": {"line": end.line, "character": end.character},
        },
        "text": edit.text,
    }


async def _next_edit_item(
    server: KodeServer, uri: str, pos: Position
) -> types.InlineCompletionList:
    """No completion at the cursor: the next edit, where it replaces text on the cursor's
    own line, as a standard inline completion item with a ``range`` (any client shows
    it); the completion wins where there is one."""
    edit = await server.engine.next_edit(uri, pos)
    if edit is None or not edit.on_line(pos.line):
        return types.InlineCompletionList(items=[])
    start, end = edit.range.start, edit.range.end
    replaced = types.Range(
        types.Position(start.line, start.character), types.Position(end.line, end.character)
    )
    return types.InlineCompletionList(
        items=[types.InlineCompletionItem(insert_text=edit.text, range=replaced)]
    )


def _clamp_positions(data: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of a didChange message with negative range numbers set to 0; None if it
    has none (or is not shaped like a didChange)."""
    try:
        copy = json.loads(json.dumps(data))
        changed = False
        for change in copy["params"]["contentChanges"]:
            for end in ("start", "end"):
                position = change.get("range", {}).get(end, {})
                for key in ("line", "character"):
                    if isinstance(position.get(key), int) and position[key] < 0:
                        position[key] = 0
                        changed = True
    except (KeyError, TypeError, AttributeError, ValueError):
        return None
    return copy if changed else None


def _describe(exc: BaseException) -> str:
    """``errors.describe``; pygls' own protocol errors carry no source either."""
    return str(exc) if isinstance(exc, JsonRpcException) else describe(exc)


def _workspace_roots(params: types.InitializeParams) -> list[Path]:
    """The workspace folders, else the (deprecated) root URI, else the root path."""
    if params.workspace_folders:
        found = [file_path(f.uri) for f in params.workspace_folders]
        return [p for p in found if p is not None]
    if params.root_uri:
        root = file_path(params.root_uri)
        return [] if root is None else [root]
    return [Path(params.root_path)] if params.root_path else []


def _index_key(settings: Settings) -> tuple[bool, int, int]:
    """What the workspace index is built from, of the settings."""
    wanted = settings.enabled and settings.workspace_index
    return (wanted, settings.index_max_files, settings.index_max_file_bytes)


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
