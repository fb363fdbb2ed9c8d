"""Test helpers for the shared engine: real ``kode lsp`` windows (pygls clients over
stdio) and the engine processes of one test's folder, found through ``/proc``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The 0.5B, answering quickly and never from another process's model.
SMALL = {
    "model": "small",
    "readAhead": False,
    "prefetch": False,
    "workspaceIndex": False,
    "firstAnswerMs": 0,
    "maxTokens": 16,
}


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    state = _state(pid)
    return state is not None and state != "Z"


def engine_pids(folder: Path) -> list[int]:
    """Live ``kode engine run`` processes whose ``XDG_RUNTIME_DIR`` is ``folder``."""
    found = []
    want = f"XDG_RUNTIME_DIR={folder}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if b"engine" not in cmdline or b"run" not in cmdline:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if want in environ and alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def stop_engines(folder: Path, timeout_s: float = 20.0) -> list[int]:
    """SIGTERM every engine of ``folder``; the pids still running after ``timeout_s``
    (then killed)."""
    pids = engine_pids(folder)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    stubborn = [p for p in pids if alive(p)]
    for pid in stubborn:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return stubborn


def wait_until(predicate: Any, timeout_s: float, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


class Window:
    """One ``kode lsp`` process with a pygls client, as an editor window runs it."""

    def __init__(self) -> None:
        from pygls.lsp.client import LanguageClient

        self.client = LanguageClient("kode-test", "0.1.0")
        self.shown: list[str] = []
        self._n = 0

        def show(params: Any) -> None:
            self.shown.append(params.message)

        self.client.feature("window/showMessage")(show)

    @property
    def pid(self) -> int:
        server = self.client._server
        assert server is not None
        return int(server.pid)

    async def start(self, options: dict[str, Any]) -> None:
        from lsprotocol import types

        await self.client.start_io(sys.executable, "-m", "kode.cli.main", "lsp", cwd=str(REPO))
        await self.client.initialize_async(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                process_id=None,
                root_uri=None,
                initialization_options=options,
            )
        )
        self.client.initialized(types.InitializedParams())

    def open(self, uri: str, text: str) -> None:
        from lsprotocol import types

        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=uri, language_id="python", version=1, text=text
                )
            )
        )

    def request(self, uri: str, line: int, character: int) -> asyncio.Future[Any]:
        from lsprotocol import types

        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Invoked
            ),
        )
        self._n += 1
        future = self.client.protocol.send_request(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=f"c{self._n}"
        )
        return asyncio.wrap_future(future)

    async def complete(self, uri: str, line: int, character: int, timeout_s: float) -> str:
        result = await asyncio.wait_for(self.request(uri, line, character), timeout_s)
        items = getattr(result, "items", None) or []
        return str(items[0].insert_text) if items else ""

    async def stats(self) -> dict[str, Any]:
        reply = await asyncio.wait_for(
            self.client.protocol.send_request_async("kode/stats", {}), 30
        )
        return _plain(reply)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.shutdown_async(None), 20)
            self.client.exit(None)
        server = self.client._server
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.stop(), 20)  # type: ignore[no-untyped-call]
        if server is not None and server.returncode is None:
            server.kill()
            await server.wait()


def _plain(value: Any) -> Any:
    """pygls' attribute objects as plain dicts and lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: _plain(v) for k, v in vars(value).items()}
    return value
