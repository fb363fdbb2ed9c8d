"""Issue #51's bugs a user meets in the language server: each has its regression test here
(bugs 1, 2 and 4; bug 3 is the VS Code extension's, bug 5 the backends'). The server runs
in this event loop behind its real reading loop (``lsp_wire.Wire``) with a scripted
backend, except one test that drives the real ``kode lsp`` with the 0.5B model."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from lsp_wire import FailingBackend, Wire, did_open, frame, inline, notification, request
from scripted import ScriptedBackend, until

QUIET = {"readAhead": False, "prefetch": False}
URI = "file:///project/pkg/main.py"


def items(reply: dict[str, Any]) -> list[str]:
    assert "result" in reply, reply
    return [item["insertText"] for item in reply["result"]["items"]]


def did_close(uri: str) -> dict[str, Any]:
    return notification("textDocument/didClose", {"textDocument": {"uri": uri}})


# Bug 1: didClose was async and didOpen sync, so the close ran after the reopening.


async def test_a_close_and_open_in_one_read_leave_the_document_open() -> None:
    async with Wire(FailingBackend()) as wire:
        await wire.initialize(QUIET)
        wire.send(did_open(URI, "value = "))
        # What VS Code sends when a file's language mode changes: both in one read.
        wire.send(did_close(URI), did_open(URI, "value = ", version=2), inline(1, URI, 0, 8))
        assert items(await wire.response(1)) == [" = 1"]
        assert URI in wire.server.engine.documents


@pytest.mark.model
def test_the_real_server_completes_after_a_close_and_open_in_one_write() -> None:
    """``kode lsp`` itself over a pipe, with the 0.5B model."""
    options = {**QUIET, "model": "small", "maxTokens": 8, "firstAnswerMs": 0}
    init = request(0, "initialize", {"capabilities": {}, "initializationOptions": options})
    proc = subprocess.Popen(
        [sys.executable, "-m", "kode.cli.main", "lsp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    watchdog = threading.Timer(240, proc.kill)  # whatever happens, the process ends
    watchdog.start()
    assert proc.stdin is not None and proc.stdout is not None
    try:

        def send(*messages: dict[str, Any]) -> None:
            assert proc.stdin is not None
            proc.stdin.write(b"".join(frame(m) for m in messages))  # one write
            proc.stdin.flush()

        def reply(n: int) -> dict[str, Any]:
            assert proc.stdout is not None
            while True:
                message = _read_frame(proc.stdout)
                if message.get("id") == n and "method" not in message:
                    return message

        send(init)
        assert reply(0)["id"] == 0
        send(notification("initialized", {}))
        text = "def add(a, b):\n    return "
        send(did_open(URI, text))
        send(did_close(URI), did_open(URI, text, version=2), inline(1, URI, 1, 11))
        answer = reply(1)
        assert "error" not in answer, answer
        assert answer["result"]["items"], answer  # the document is open: the model answered
        send(request(2, "shutdown"))
        assert reply(2)["id"] == 2
        send(notification("exit", None))
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def _read_frame(stream: Any) -> dict[str, Any]:
    length = None
    while (line := stream.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    assert length is not None, "the server closed its output"
    message: dict[str, Any] = json.loads(stream.read(length))
    return message


# Bug 2: settings turned on after start never built the workspace index.


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "helpers.py").write_text("def helper():\n    return 1\n", encoding="utf-8")
    return tmp_path.resolve()


@pytest.mark.parametrize("off", [{"enabled": False}, {"workspaceIndex": False}])
async def test_settings_turned_on_later_build_the_index(root: Path, off: dict[str, Any]) -> None:
    async with Wire(FailingBackend()) as wire:
        wire.send(
            request(
                0,
                "initialize",
                {
                    "capabilities": {},
                    "rootUri": root.as_uri(),
                    "initializationOptions": {**QUIET, **off},
                },
            )
        )
        await wire.response(0)
        wire.send(notification("initialized", {}))
        wire.send(request(1, "kode/stats"))
        await wire.response(1)  # ``initialized`` was handled
        engine = wire.server.engine
        assert engine.workspace is None
        on = {**QUIET, "enabled": True, "workspaceIndex": True}
        wire.send(notification("workspace/didChangeConfiguration", {"settings": on}))
        wire.send(request(2, "kode/stats"))
        await wire.response(2)
        assert engine.workspace is not None
        assert engine.workspace.roots == (root,)
        # Turned off again: the index is closed and no longer read.
        off_again = {**QUIET, "workspaceIndex": False}
        wire.send(notification("workspace/didChangeConfiguration", {"settings": off_again}))
        wire.send(request(3, "kode/stats"))
        await wire.response(3)
        assert engine.workspace is None


# Bug 4: an edit that could not be read closed the document but left its generation running.


class SlowBackend(ScriptedBackend):
    """A scripted backend that is its own factory, as ``Wire`` takes one."""

    async def __call__(self, settings: object) -> SlowBackend:
        return self


async def test_an_unreadable_edit_stops_the_documents_generation() -> None:
    backend = SlowBackend(["a"] * 2000)
    async with Wire(backend) as wire:  # type: ignore[arg-type]
        await wire.initialize({**QUIET, "multiline": "always", "timeBudgetMs": 0})
        wire.send(did_open(URI, "value = "), inline(1, URI, 0, 8))
        await until(lambda: backend.generations)
        change = {
            "textDocument": {"uri": URI, "version": 2},
            "contentChanges": [{"range": {"start": "nowhere"}, "text": "Z"}],
        }
        wire.send(notification("textDocument/didChange", change))
        await wire.messages("window/showMessage")
        await until(lambda: backend.generations[0].cancelled)
        reply = await wire.response(1)  # answered, not left waiting on the generation
        assert "result" in reply or "error" in reply
