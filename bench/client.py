"""The editor side of the LSP benchmarks: a real ``kode lsp`` process over stdio with a
pygls client, as an editor window runs it.

``LspClient`` holds what every LSP benchmark sends and reads: start (initialize with
``initializationOptions``) and stop, documents opened, changed and closed, the cursor
(``kode/didMoveCursor``), inline completion requests and ``kode/stats``. The keystroke
replays (``bench/latency.py`` and the scenarios built on it) and the engine benchmark's
windows (``Window`` here) are built on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from kode.bench import harness
from kode.bench.tasks import REPO_ROOT

CURSOR_METHOD = "kode/didMoveCursor"
PARTIAL_METHOD = "kode/inlineCompletionPartial"
STATS_METHOD = "kode/stats"
CANCELLED = -32800  # LSP's RequestCancelled error code


class LspClient:
    """One ``kode lsp`` and the pygls client that drives it."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        from pygls.lsp.client import LanguageClient

        self.client = LanguageClient("kode-bench", "0.1.0")
        self.env = env  # the server's environment (None: this process's)
        self._ids = 0

    @property
    def pid(self) -> int:
        server = self.client._server
        assert server is not None
        return int(server.pid)

    def next_id(self, prefix: str) -> str:
        """A request id unique in this client: ``prefix-N``."""
        self._ids += 1
        return f"{prefix}-{self._ids}"

    async def start(
        self,
        options: dict[str, Any],
        *,
        args: Sequence[str] = ("lsp",),
        root_uri: str | None = None,
    ) -> None:
        """Start ``kode ARGS`` (``kode lsp`` and its options) and initialize it with
        ``options`` (the editor's ``initializationOptions``), ``root_uri`` the workspace."""
        from lsprotocol import types

        await self.client.start_io(*harness.kode_command(*args), cwd=str(REPO_ROOT), env=self.env)
        await self.client.initialize_async(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                process_id=None,
                root_uri=root_uri,
                initialization_options=options,
            )
        )
        self.client.initialized(types.InitializedParams())

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Shut the server down politely, killing it if it does not go."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.shutdown_async(None), timeout_s)
            self.client.exit(None)
        server = self.client._server
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.stop(), timeout_s)  # type: ignore[no-untyped-call]
        if server is not None and server.returncode is None:
            server.kill()
            await server.wait()

    async def stats(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The server's ``kode/stats`` reply, as plain dicts."""
        reply = plain(
            await asyncio.wait_for(
                self.client.protocol.send_request_async(STATS_METHOD, {}), timeout_s
            )
        )
        return reply if isinstance(reply, dict) else {}

    async def wait_calibrated(self, tries: int = 300) -> None:
        """Wait (up to ``tries`` times 0.1 s) until the engine has learnt the prefill
        speed, which it measures right after the model loads."""
        for _ in range(tries):
            if ((await self.stats()).get("engine") or {}).get("prefillTokensPerS"):
                return
            await asyncio.sleep(0.1)

    def open(self, uri: str, text: str, version: int = 1) -> None:
        from lsprotocol import types

        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=uri, language_id="python", version=version, text=text
                )
            )
        )

    def close(self, uri: str) -> None:
        from lsprotocol import types

        self.client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )

    def change(self, uri: str, version: int, text: str, at: tuple[int, int] | None) -> None:
        """``didChange``: ``text`` inserted at ``at`` (line, character), or the whole
        document when ``at`` is None."""
        from lsprotocol import types

        change: types.TextDocumentContentChangeEvent
        if at is None:
            change = types.TextDocumentContentChangeWholeDocument(text=text)
        else:
            where = types.Position(line=at[0], character=at[1])
            change = types.TextDocumentContentChangePartial(
                range=types.Range(start=where, end=where), text=text
            )
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[change],
            )
        )

    def cancel(self, msg_id: str) -> None:
        from lsprotocol import types

        self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))

    def move_cursor(self, uri: str, line: int, character: int) -> None:
        """Kode's own notification: the cursor rests here (read ahead of the keys)."""
        self.client.protocol.notify(
            CURSOR_METHOD,
            {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}},
        )

    def request(
        self, uri: str, line: int, character: int, msg_id: str, *, invoked: bool = False
    ) -> asyncio.Future[Any]:
        """An inline completion request (triggered automatically, as on a keystroke, or
        ``invoked`` by the user)."""
        from lsprotocol import types

        kind = types.InlineCompletionTriggerKind
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=types.InlineCompletionContext(
                trigger_kind=kind.Invoked if invoked else kind.Automatic
            ),
        )
        future = self.client.protocol.send_request(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id
        )
        return asyncio.wrap_future(future)


def items(result: Any) -> list[str]:
    """Insert texts of an inlineCompletion result (a list object, a bare list, None)."""
    if result is None:
        return []
    found = getattr(result, "items", result)
    out: list[str] = []
    for item in found or []:
        text = getattr(item, "insert_text", None)
        if text is None and isinstance(item, dict):
            text = item.get("insertText")
        if isinstance(text, str):
            out.append(text)
        elif text is not None:
            out.append(str(getattr(text, "value", "")))
    return out


def plain(value: Any) -> Any:
    """pygls hands unknown results over as attribute objects; make them dicts."""
    if hasattr(value, "_asdict"):  # pygls.protocol.Object is a namedtuple
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: plain(v) for k, v in vars(value).items()}
    return value


class Window(LspClient):
    """An editor window that types at the end of its documents (``kode bench engine``
    and the shared engine's tests): it keeps each document's text and version."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        super().__init__(env)
        self.shown: list[str] = []
        self._versions: dict[str, int] = {}
        self._texts: dict[str, str] = {}

        def show(params: Any) -> None:
            self.shown.append(params.message)

        self.client.feature("window/showMessage")(show)

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self._versions[uri], self._texts[uri] = version, text
        super().open(uri, text, version)

    def end_of(self, uri: str) -> tuple[int, int]:
        """The position after the last character of ``uri``."""
        lines = self._texts[uri].split("\n")
        return len(lines) - 1, len(lines[-1].encode("utf-16-le")) // 2

    def type(self, uri: str, text: str) -> None:
        """Append ``text`` to ``uri`` (an incremental ``didChange`` at its end)."""
        at = self.end_of(uri)
        self._versions[uri] += 1
        self._texts[uri] += text
        self.change(uri, self._versions[uri], text, at)

    def replace(self, uri: str, text: str) -> None:
        """Set the whole text of ``uri`` (a full-document ``didChange``)."""
        self._versions[uri] += 1
        self._texts[uri] = text
        self.change(uri, self._versions[uri], text, None)

    def request(
        self,
        uri: str,
        line: int,
        character: int,
        msg_id: str | None = None,
        *,
        invoked: bool = True,
    ) -> asyncio.Future[Any]:
        """A completion the user asked for (``invoked``) at (line, character)."""
        return super().request(uri, line, character, msg_id or self.next_id("c"), invoked=invoked)

    async def complete(self, uri: str, line: int, character: int, timeout_s: float) -> str:
        """The first suggestion at (line, character), "" for none."""
        result = await asyncio.wait_for(self.request(uri, line, character), timeout_s)
        got = items(result)
        return got[0] if got else ""

    async def stats(self, timeout_s: float | None = 60.0) -> dict[str, Any]:
        return await super().stats(timeout_s)

    async def stop(self, timeout_s: float = 20.0) -> None:
        await super().stop(timeout_s)
